//! The `ferry` command: serve a directory, copy and inspect remote files,
//! mount them, measure.

mod bench;
mod commands;
mod compare;
mod mount;
mod mount_helper;
mod names;
mod preserve;
mod run;
mod serve;
mod soak;
mod usage;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "ferry", version, about = "Remote file access at wire speed")]
struct Cli {
    /// Token file for authentication (default: FERRY_TOKEN_FILE, FERRY_TOKEN,
    /// then $XDG_CONFIG_HOME/ferry/token or ~/.config/ferry/token).
    #[arg(long, global = true)]
    token_file: Option<PathBuf>,
    /// Verify servers' TLS certificates against the CA certificates in
    /// FILE (PEM) and their host names, instead of trusting each server's
    /// first certificate (the same as FERRY_TLS_CA=FILE; `ferry mount` and
    /// `ferry run` pass it on).
    #[arg(long, global = true, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Export a directory (or an in-memory file system).
    Serve(Box<serve::ServeArgs>),
    /// Copy files; either side may be a ferry:// URL.
    Cp {
        /// Copy directories recursively.
        #[arg(short = 'r', short_alias = 'R', long)]
        recursive: bool,
        /// Keep mode, times and (as root) owner, as cp -p.
        #[arg(short = 'p', long)]
        preserve: bool,
        /// Archive, as cp -a: -r and -p, and symbolic links copied as links.
        #[arg(short = 'a', long)]
        archive: bool,
        /// A local path (any bytes, as Linux names are) or a ferry:// URL.
        src: std::ffi::OsString,
        dst: std::ffi::OsString,
    },
    /// Print a remote file.
    Cat { url: String },
    /// List remote directories (or files), like ls.
    // -h is ls's human sizes: help is --help only.
    #[command(disable_help_flag = true)]
    Ls {
        /// Long format: mode, links, owner, group, size, time.
        #[arg(short = 'l')]
        long: bool,
        /// Also names starting with '.', and . and .. themselves.
        #[arg(short = 'a')]
        all: bool,
        /// Sizes for people: 1.5K, 12M, 3.0G (with -l).
        #[arg(short = 'h', long = "human-readable")]
        human: bool,
        /// List the directories below too.
        #[arg(short = 'R', long)]
        recursive: bool,
        /// Long format with user and group ids as numbers.
        #[arg(short = 'n', long = "numeric-uid-gid")]
        numeric: bool,
        #[arg(long, action = clap::ArgAction::Help, help = "Print help")]
        help: Option<bool>,
        #[arg(required = true, value_name = "URL")]
        urls: Vec<String>,
    },
    /// Space used under a remote directory, like du (1K blocks, each
    /// hard-linked file once).
    #[command(disable_help_flag = true)]
    Du {
        /// Only the total.
        #[arg(short = 's', long)]
        summarize: bool,
        /// Sizes for people: 1.5K, 12M, 3.0G.
        #[arg(short = 'h', long = "human-readable")]
        human: bool,
        #[arg(long, action = clap::ArgAction::Help, help = "Print help")]
        help: Option<bool>,
        url: String,
    },
    /// Size and free space of the file system an export is on, like df.
    #[command(disable_help_flag = true)]
    Df {
        /// Sizes for people: 1.5K, 12M, 3.0G.
        #[arg(short = 'h', long = "human-readable")]
        human: bool,
        #[arg(long, action = clap::ArgAction::Help, help = "Print help")]
        help: Option<bool>,
        url: String,
    },
    /// Show a remote file's attributes.
    Stat { url: String },
    /// Create a remote directory.
    Mkdir {
        /// Create parents as needed; no error if it exists.
        #[arg(short = 'p')]
        parents: bool,
        url: String,
    },
    /// Remove a remote file, or a directory tree with -r.
    Rm {
        #[arg(short = 'r', short_alias = 'R')]
        recursive: bool,
        /// No error for what does not exist.
        #[arg(short = 'f', long)]
        force: bool,
        url: String,
    },
    /// Rename within one server.
    Mv { src: String, dst: String },
    /// The cache policy stored on the server for a file or directory
    /// (every client sees it): set cache|bypass, clear, or get (which
    /// prints the policy in force here and where it comes from).
    Cache {
        #[arg(value_parser = ["set", "clear", "get"])]
        verb: String,
        url: String,
        /// For set: cache or bypass.
        #[arg(value_parser = ["cache", "bypass"], required_if_eq("verb", "set"))]
        policy: Option<String>,
    },
    /// Mount a remote directory with FUSE.
    Mount(mount::MountArgs),
    /// Unmount a `ferry mount`.
    Umount { mountpoint: PathBuf },
    /// Run a program with remote directories visible under local paths
    /// (LD_PRELOAD; no root, no FUSE).
    Run(run::RunArgs),
    /// Measure throughput and latency against raw loopback limits.
    Bench(bench::BenchArgs),
    /// The papers' experiments, side by side with NFS, 9P, SMB and sshfs.
    Compare(compare::CompareArgs),
    /// Many clients at once against a server of its own, every byte
    /// checked, the server's memory and descriptors watched.
    Soak(soak::SoakArgs),
    /// Internal: `ferry run`'s trampoline for a program stored under a
    /// mount (runs with the library loaded).
    #[command(hide = true)]
    RunExec {
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Internal: the other end of the raw TCP measurements.
    #[command(hide = true)]
    BenchPeer { mode: String, addr: String, bytes: u64, path: Option<PathBuf> },
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(mount_helper::translate(std::env::args_os().collect()));
    // The client library reads these from the environment, and the
    // processes `ferry run` starts inherit them (one thread here yet).
    if let Some(ca) = &cli.tls_ca {
        std::env::set_var("FERRY_TLS_CA", ca);
    }
    let tf = cli.token_file.as_deref();
    let result = match cli.cmd {
        Cmd::Serve(a) => serve::run(*a, tf),
        Cmd::Cp { recursive, preserve, archive, src, dst } => {
            let o = commands::CpOpts { recursive: recursive || archive, preserve: preserve || archive, links: archive };
            commands::cp(tf, &src, &dst, o)
        }
        Cmd::Cat { url } => commands::cat(tf, &url),
        Cmd::Ls { long, all, human, recursive, numeric, urls, .. } => {
            commands::ls(tf, &urls, commands::LsOpts { long, all, human, recursive, numeric })
        }
        Cmd::Du { summarize, human, url, .. } => usage::du(tf, &url, summarize, human),
        Cmd::Df { human, url, .. } => usage::df(tf, &url, human),
        Cmd::Stat { url } => commands::stat(tf, &url),
        Cmd::Mkdir { parents, url } => commands::mkdir(tf, &url, parents),
        Cmd::Rm { recursive, force, url } => commands::rm(tf, &url, recursive, force),
        Cmd::Mv { src, dst } => commands::mv(tf, &src, &dst),
        Cmd::Cache { verb, url, policy } => commands::cache(tf, &verb, &url, policy.as_deref()),
        Cmd::Mount(a) => mount::mount(a, tf),
        Cmd::Umount { mountpoint } => mount::umount(&mountpoint),
        Cmd::Run(a) => run::run(a, tf),
        Cmd::RunExec { command } => run::exec(&command),
        Cmd::Bench(a) => bench::run(a, tf),
        Cmd::Compare(a) => compare::run(a, tf),
        Cmd::Soak(a) => soak::run(a),
        Cmd::BenchPeer { mode, addr, bytes, path } => bench::peer(&mode, &addr, bytes, path.as_deref()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("ferry: {}", without_os_error(&msg));
            ExitCode::FAILURE
        }
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
