//! The `ferry` command: serve a directory, copy and inspect remote files,
//! mount them, measure.

mod bench;
mod commands;
mod compare;
mod mount;
mod run;
mod serve;
mod soak;

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
        /// A local path (any bytes, as Linux names are) or a ferry:// URL.
        src: std::ffi::OsString,
        dst: std::ffi::OsString,
    },
    /// Print a remote file.
    Cat { url: String },
    /// List remote directories (or files), like ls.
    Ls {
        /// Long format: mode, links, owner, size, time.
        #[arg(short = 'l')]
        long: bool,
        /// Also names starting with '.', and . and .. themselves.
        #[arg(short = 'a')]
        all: bool,
        #[arg(required = true, value_name = "URL")]
        urls: Vec<String>,
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
        #[arg(value_parser = ["cache", "bypass"])]
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
    let cli = Cli::parse();
    // The client library reads these from the environment, and the
    // processes `ferry run` starts inherit them (one thread here yet).
    if let Some(ca) = &cli.tls_ca {
        std::env::set_var("FERRY_TLS_CA", ca);
    }
    let tf = cli.token_file.as_deref();
    let result = match cli.cmd {
        Cmd::Serve(a) => serve::run(*a, tf),
        Cmd::Cp { recursive, src, dst } => commands::cp(tf, &src, &dst, recursive),
        Cmd::Cat { url } => commands::cat(tf, &url),
        Cmd::Ls { long, all, urls } => commands::ls(tf, &urls, long, all),
        Cmd::Stat { url } => commands::stat(tf, &url),
        Cmd::Mkdir { parents, url } => commands::mkdir(tf, &url, parents),
        Cmd::Rm { recursive, url } => commands::rm(tf, &url, recursive),
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
            eprintln!("ferry: {msg}");
            ExitCode::FAILURE
        }
    }
}
