//! The `ferry` command: serve a directory, copy and inspect remote files,
//! mount them, measure.

mod bench;
mod cli;
mod commands;
mod compare;
mod manual;
mod mount;
mod mount_helper;
mod names;
mod preserve;
mod run;
mod serve;
mod soak;
mod soak_idle;
mod sync;
mod usage;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Cmd, Conn, ServeToken};

/// The connection options given after the command, else before it; one
/// given before a command that has no use for it is an error, not ignored.
fn conn(top: &Conn, sub: Option<Conn>, name: &str) -> Result<Conn, String> {
    let sub = match sub {
        Some(c) => c,
        None => {
            for (given, opt) in [(top.token_file.is_some(), "--token-file"), (top.tls_ca.is_some(), "--tls-ca")] {
                if given {
                    return Err(format!("{opt} does not apply to `ferry {name}`"));
                }
            }
            return Ok(Conn::default());
        }
    };
    Ok(Conn {
        token_file: sub.token_file.or_else(|| top.token_file.clone()),
        tls_ca: sub.tls_ca.or_else(|| top.tls_ca.clone()),
    })
}

fn main() -> ExitCode {
    let Cli { token_file, tls_ca, cmd } = Cli::parse_from(mount_helper::translate(std::env::args_os().collect()));
    match dispatch(&Conn { token_file, tls_ca }, cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("ferry: {}", without_os_error(&msg));
            ExitCode::FAILURE
        }
    }
}

fn dispatch(top: &Conn, cmd: Cmd) -> Result<(), String> {
    // Each arm takes its connection options; those of a command that has
    // none must not have been given before it.
    let client = |c: Conn, name: &str| -> Result<Option<PathBuf>, String> {
        let c = conn(top, Some(c), name)?;
        // The client library reads this from the environment, and the
        // processes `ferry run` starts inherit it (one thread here yet).
        if let Some(ca) = &c.tls_ca {
            std::env::set_var("FERRY_TLS_CA", ca);
        }
        Ok(c.token_file)
    };
    let none = |name: &str| conn(top, None, name).map(|_| ());
    match cmd {
        Cmd::Serve { args, auth: ServeToken { token_file } } => {
            if top.tls_ca.is_some() {
                return Err("--tls-ca does not apply to `ferry serve` (a server checks no certificates)".into());
            }
            serve::run(*args, token_file.or_else(|| top.token_file.clone()).as_deref())
        }
        Cmd::Cp { recursive, preserve, archive, verbose, src, dst, conn } => {
            let tf = client(conn, "cp")?;
            let o = commands::CpOpts {
                recursive: recursive || archive,
                preserve: preserve || archive,
                links: archive,
                verbose,
            };
            commands::cp(tf.as_deref(), &src, &dst, o)
        }
        Cmd::Sync { delete, dry_run, checksum, verbose, src, dst, conn } => {
            let tf = client(conn, "sync")?;
            sync::sync(tf.as_deref(), &src, &dst, sync::SyncOpts { delete, dry_run, checksum, verbose })
        }
        Cmd::Cat { url, conn } => commands::cat(client(conn, "cat")?.as_deref(), &url),
        Cmd::Ls { long, all, human, recursive, numeric, urls, conn, .. } => {
            let tf = client(conn, "ls")?;
            commands::ls(tf.as_deref(), &urls, commands::LsOpts { long, all, human, recursive, numeric })
        }
        Cmd::Du { summarize, human, url, conn, .. } => {
            usage::du(client(conn, "du")?.as_deref(), &url, summarize, human)
        }
        Cmd::Df { human, url, conn, .. } => usage::df(client(conn, "df")?.as_deref(), &url, human),
        Cmd::Stat { url, conn } => commands::stat(client(conn, "stat")?.as_deref(), &url),
        Cmd::Mkdir { parents, url, conn } => commands::mkdir(client(conn, "mkdir")?.as_deref(), &url, parents),
        Cmd::Rm { recursive, force, url, conn } => commands::rm(client(conn, "rm")?.as_deref(), &url, recursive, force),
        Cmd::Mv { src, dst, conn } => commands::mv(client(conn, "mv")?.as_deref(), &src, &dst),
        Cmd::Cache { verb, url, policy, conn } => {
            commands::cache(client(conn, "cache")?.as_deref(), &verb, &url, policy.as_deref())
        }
        Cmd::Mount { args, conn } => mount::mount(args, client(conn, "mount")?.as_deref()),
        Cmd::Umount { mountpoint } => none("umount").and_then(|_| mount::umount(&mountpoint)),
        Cmd::Run { args, conn } => run::run(args, client(conn, "run")?.as_deref()),
        Cmd::RunExec { command } => run::exec(&command),
        Cmd::Bench(a) => none("bench").and_then(|_| bench::run(a)),
        Cmd::Compare(a) => none("compare").and_then(|_| compare::run(a)),
        Cmd::Soak(a) => none("soak").and_then(|_| soak::run(a)),
        Cmd::Completions { shell } => none("completions").and_then(|_| manual::completions(shell)),
        Cmd::Man { command, dir } => none("man").and_then(|_| manual::man(command.as_deref(), dir.as_deref())),
        Cmd::BenchPeer { mode, addr, bytes, path } => bench::peer(&mode, &addr, bytes, path.as_deref()),
    }
}

/// `io::Error`'s " (os error 2)" is for programmers: the text before it
/// says the same to users.
fn without_os_error(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    while let Some(i) = rest.find(" (os error ") {
        out.push_str(&rest[..i]);
        let after = &rest[i + " (os error ".len()..];
        match after.find(')') {
            Some(j) if j > 0 && after[..j].bytes().all(|b| b.is_ascii_digit()) => rest = &after[j + 1..],
            _ => {
                out.push_str(" (os error ");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn os_error_numbers_are_left_out() {
        let s = super::without_os_error("x: No such file or directory (os error 2)");
        assert_eq!(s, "x: No such file or directory");
        let s = super::without_os_error("a (connection failed: Connection refused (os error 111)); b");
        assert_eq!(s, "a (connection failed: Connection refused); b");
        assert_eq!(super::without_os_error("(os error x)"), "(os error x)");
    }
}
