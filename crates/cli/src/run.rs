//! `ferry run`: start a program with the preload library and a mount table.
//!
//! The library finds its mounts in `FERRY_MOUNTS` and its token as every
//! client does; this command only sets those, `LD_PRELOAD`, and `exec`s.
//! A program stored under a mount (`ferry run -- /remote/prog`, or a `#!`
//! script there) is something only the library can run: then `ferry`
//! execs itself, library loaded, as a trampoline (`run-exec`) whose own
//! `exec` of the program goes through the library's `execve`.

use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use ferry_client::Url;

/// File name of the preload library, built beside the `ferry` binary.
const LIBRARY: &str = "libferry_preload.so";

#[derive(clap::Args)]
pub struct RunArgs {
    /// PREFIX=URL: make the remote directory URL visible at the local path
    /// PREFIX (repeatable).
    #[arg(long = "mount", value_name = "PREFIX=URL", required = true)]
    pub mounts: Vec<String>,
    /// The preload library (default: libferry_preload.so beside `ferry`, or
    /// in ../lib/ferry from it, where `make install` puts it).
    #[arg(long)]
    pub library: Option<PathBuf>,
    /// How long to try to reconnect to a server that went away before a
    /// call fails with EIO, in seconds (0: fail at once).
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub reconnect: f64,
    /// How long attributes fetched by a directory listing or a `stat` may
    /// answer later `stat`s, in seconds (0: ask the server every time).
    /// Changes by other clients show after at most this long.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub attr_timeout: f64,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Checks one `PREFIX=URL` and returns it normalised.
fn mount_entry(s: &str) -> Result<String, String> {
    let (prefix, url) = s.split_once('=').ok_or_else(|| format!("--mount {s}: expected PREFIX=URL"))?;
    if !prefix.starts_with('/') || prefix.trim_end_matches('/').is_empty() {
        return Err(format!("--mount {s}: PREFIX must be an absolute path other than /"));
    }
    if prefix.contains(';') || url.contains(';') {
        return Err(format!("--mount {s}: ';' is not allowed"));
    }
    let u = Url::parse(url).map_err(|e| format!("--mount {s}: {e}"))?;
    Ok(format!("{}={u}", prefix.trim_end_matches('/')))
}

/// The preload library: the one asked for, else beside `ferry` (a build
/// tree: target/release), else in `../lib/ferry` from it (`make install`).
fn library(explicit: Option<PathBuf>) -> Result<PathBuf, String> {
    let lib = match explicit {
        Some(p) => p,
        None => {
            let exe = std::env::current_exe().map_err(|e| format!("cannot find the ferry binary: {e}"))?;
            let dir = exe.parent().unwrap_or(Path::new("."));
            let installed = dir.join("../lib/ferry").join(LIBRARY);
            let beside = dir.join(LIBRARY);
            if !beside.is_file() && installed.is_file() {
                installed
            } else {
                beside
            }
        }
    };
    if !lib.is_file() {
        return Err(format!(
            "{}: preload library not found (build it with `cargo build --release`, install it with `make install`, \
             or pass --library)",
            lib.display()
        ));
    }
    // The loader needs an absolute path: the program may chdir.
    std::fs::canonicalize(&lib).map_err(|e| format!("{}: {e}", lib.display()))
}

pub fn run(a: RunArgs, token_file: Option<&Path>) -> Result<(), String> {
    for (name, v) in [("--reconnect", a.reconnect), ("--attr-timeout", a.attr_timeout)] {
        if !(v >= 0.0 && v.is_finite()) {
            return Err(format!("{name} {v}: expected seconds >= 0"));
        }
    }
    let table: Vec<String> = a.mounts.iter().map(|m| mount_entry(m)).collect::<Result<_, _>>()?;
    let lib = library(a.library)?;
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", lib.display()),
        _ => lib.display().to_string(),
    };
    let mut cmd = if under_mount(&a.command[0], &table) {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find the ferry binary: {e}"))?;
        let mut c = Command::new(exe);
        c.arg("run-exec").arg("--").args(&a.command);
        c
    } else {
        let mut c = Command::new(&a.command[0]);
        c.args(&a.command[1..]);
        c
    };
    cmd.env("LD_PRELOAD", preload).env("FERRY_MOUNTS", table.join(";")).env_remove("FERRY_CWD");
    cmd.env("FERRY_RECONNECT", a.reconnect.to_string()).env("FERRY_ATTR_TIMEOUT", a.attr_timeout.to_string());
    if let Some(t) = token_file {
        cmd.env("FERRY_TOKEN_FILE", t);
    }
    // Only returns on failure.
    let e = cmd.exec();
    Err(format!("{}: {e}", a.command[0]))
}

/// The trampoline: runs in a `ferry` process with the library loaded, so
/// this `exec` (std's `execvp`) is the library's, which runs remote
/// programs. Only returns on failure.
pub fn exec(command: &[String]) -> Result<(), String> {
    let (prog, args) = command.split_first().ok_or("run-exec: no command")?;
    let e = Command::new(prog).args(args).exec();
    Err(format!("{prog}: {e}"))
}

/// Is `prog` a path under one of the table's prefixes (`PREFIX=URL`)?
fn under_mount(prog: &str, table: &[String]) -> bool {
    if !prog.contains('/') {
        return false;
    }
    let abs = match std::env::current_dir() {
        Ok(cwd) => cwd.join(prog),
        Err(_) => PathBuf::from(prog),
    };
    // Lexically, as the library resolves paths.
    let mut norm = PathBuf::from("/");
    for c in abs.components() {
        match c {
            Component::Normal(n) => norm.push(n),
            Component::ParentDir => {
                norm.pop();
            }
            _ => {}
        }
    }
    table.iter().filter_map(|e| e.split_once('=')).any(|(prefix, _)| norm.starts_with(prefix))
}

#[cfg(test)]
mod tests {
    use super::under_mount;

    #[test]
    fn programs_under_a_mount() {
        let t = vec!["/remote=ferry://h:1/".to_string()];
        assert!(under_mount("/remote/prog", &t));
        assert!(under_mount("/remote", &t));
        assert!(under_mount("/x/../remote/bin/p", &t));
        assert!(!under_mount("/remotex/p", &t));
        assert!(!under_mount("/remote/../bin/sh", &t));
        assert!(!under_mount("bash", &t));
    }
}
