//! The command line: every subcommand and its options, in one table that
//! `--help`, `ferry help`, the shell completions and the man pages are all
//! made from (see `docs.rs`), so that none of them can say something the
//! parser does not accept.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::{bench, compare, mount, run, serve, soak};

const TOKEN_HELP: &str = "Token file for authentication (default: FERRY_TOKEN_FILE, FERRY_TOKEN, then \
                          $XDG_CONFIG_HOME/ferry/token or ~/.config/ferry/token)";
const TLS_CA_HELP: &str = "Verify servers' TLS certificates against the CA certificates in FILE (PEM) and \
                           their host names, instead of trusting each server's first certificate (the same \
                           as FERRY_TLS_CA=FILE)";

#[derive(Parser)]
#[command(
    name = "ferry",
    version,
    about = "Remote file access at wire speed",
    after_help = "`ferry help COMMAND` (or `ferry COMMAND --help`) shows a command's options and an example."
)]
pub struct Cli {
    /// The token file, for a command that takes --token-file (it may stand
    /// before the command, as here, or after it).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The CA certificates, for a command that takes --tls-ca (before the
    /// command or after it).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// The options of the commands that connect to servers as a client.
#[derive(Args, Default)]
#[command(next_help_heading = "Connection options")]
pub struct Conn {
    #[arg(long, value_name = "FILE", help = TOKEN_HELP)]
    pub token_file: Option<PathBuf>,
    #[arg(long, value_name = "FILE", help = TLS_CA_HELP)]
    pub tls_ca: Option<PathBuf>,
}

/// `ferry serve`'s own secret: a server verifies no certificates.
#[derive(Args, Default)]
#[command(next_help_heading = "Authentication")]
pub struct ServeToken {
    /// The secret clients must show: read from FILE, or made there (mode
    /// 0600) if missing (default: $XDG_CONFIG_HOME/ferry/token or
    /// ~/.config/ferry/token).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Export a directory (or an in-memory file system).
    #[command(after_help = "Example:\n  ferry serve --listen 127.0.0.1:7070 ~/data")]
    Serve {
        #[command(flatten)]
        args: Box<serve::ServeArgs>,
        #[command(flatten)]
        auth: ServeToken,
    },
    /// Copy files; either side may be a ferry:// URL.
    #[command(after_help = "Example:\n  ferry cp -a ./photos ferry://server:7070/backup/")]
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
        /// Say at the end how many files and bytes were copied, how fast
        /// (always said when stderr is a terminal).
        #[arg(short = 'v', long)]
        verbose: bool,
        /// What to copy: a local path (any bytes, as Linux names are) or a
        /// ferry:// URL.
        src: OsString,
        /// Where to: a local path or a ferry:// URL; into it if it is a
        /// directory.
        dst: OsString,
        #[command(flatten)]
        conn: Conn,
    },
    /// Make DST a copy of SRC, copying only what differs (like rsync -a).
    #[command(after_help = "A file is copied when DST lacks it or its size or modification time \
                            differs (--checksum: its bytes); modes, times and symbolic links are kept. \
                            Either side may be a ferry:// URL.\n\nExample:\n  ferry sync --delete ./photos \
                            ferry://server:7070/backup/photos")]
    Sync {
        /// Remove what DST has and SRC has not (not after an error).
        #[arg(long)]
        delete: bool,
        /// Say what would be copied and deleted; change nothing.
        #[arg(short = 'n', long)]
        dry_run: bool,
        /// Compare files of the same size by their bytes, not their times.
        #[arg(short = 'c', long)]
        checksum: bool,
        /// Say each copy and deletion on stdout, and the summary line at the
        /// end (always said when stderr is a terminal).
        #[arg(short = 'v', long)]
        verbose: bool,
        /// What to copy: a local path or a ferry:// URL (a directory: what
        /// it holds).
        src: OsString,
        /// Where to: a local path or a ferry:// URL, made if missing.
        dst: OsString,
        #[command(flatten)]
        conn: Conn,
    },
    /// Print a remote file.
    #[command(after_help = "Example:\n  ferry cat ferry://server:7070/notes.txt")]
    Cat {
        url: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// List remote directories (or files), like ls.
    // -h is ls's human sizes: help is --help only.
    #[command(disable_help_flag = true, after_help = "Example:\n  ferry ls -lh ferry://server:7070/")]
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
        #[command(flatten)]
        conn: Conn,
    },
    /// Space used under a remote directory, like du.
    #[command(
        disable_help_flag = true,
        after_help = "Sizes are 1K blocks, each hard-linked file counted once.\n\nExample:\n  ferry du -sh ferry://server:7070/datasets"
    )]
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
        #[command(flatten)]
        conn: Conn,
    },
    /// Size and free space of the file system an export is on, like df.
    #[command(disable_help_flag = true, after_help = "Example:\n  ferry df -h ferry://server:7070/")]
    Df {
        /// Sizes for people: 1.5K, 12M, 3.0G.
        #[arg(short = 'h', long = "human-readable")]
        human: bool,
        #[arg(long, action = clap::ArgAction::Help, help = "Print help")]
        help: Option<bool>,
        url: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Show a remote file's attributes.
    #[command(after_help = "Example:\n  ferry stat ferry://server:7070/notes.txt")]
    Stat {
        url: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Create a remote directory.
    #[command(after_help = "Example:\n  ferry mkdir -p ferry://server:7070/a/b/c")]
    Mkdir {
        /// Create parents as needed; no error if it exists.
        #[arg(short = 'p')]
        parents: bool,
        url: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Remove a remote file, or a directory tree with -r.
    #[command(after_help = "Example:\n  ferry rm -rf ferry://server:7070/tmp/old")]
    Rm {
        /// Remove directories and what they hold.
        #[arg(short = 'r', short_alias = 'R', long)]
        recursive: bool,
        /// No error for what does not exist.
        #[arg(short = 'f', long)]
        force: bool,
        url: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Rename within one server.
    #[command(after_help = "Example:\n  ferry mv ferry://server:7070/draft.txt ferry://server:7070/final.txt")]
    Mv {
        src: String,
        dst: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// The cache policy the server stores for a path: get, set or clear it.
    #[command(after_help = "Every client sees a policy set here; `get` prints the policy in force on this \
                            machine and where it comes from.\n\nExample:\n  ferry cache set \
                            ferry://server:7070/datasets cache")]
    Cache {
        #[arg(value_parser = ["set", "clear", "get"])]
        verb: String,
        url: String,
        /// For set: cache or bypass.
        #[arg(value_parser = ["cache", "bypass"], required_if_eq("verb", "set"))]
        policy: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Mount a remote directory with FUSE.
    #[command(after_help = "Example:\n  ferry mount --background ferry://server:7070/ ~/remote")]
    Mount {
        #[command(flatten)]
        args: mount::MountArgs,
        #[command(flatten)]
        conn: Conn,
    },
    /// Unmount a `ferry mount`.
    #[command(after_help = "Example:\n  ferry umount ~/remote")]
    Umount { mountpoint: PathBuf },
    /// Run a program with remote directories under local paths (no root, no FUSE).
    #[command(after_help = "Example:\n  ferry run --mount /data=ferry://server:7070/ -- ls -l /data")]
    Run {
        #[command(flatten)]
        args: run::RunArgs,
        #[command(flatten)]
        conn: Conn,
    },
    /// Measure throughput and latency against raw loopback limits.
    #[command(after_help = "Example:\n  ferry bench --size-mib 256 --runs 3")]
    Bench(bench::BenchArgs),
    /// The papers' experiments, side by side with NFS, 9P, SMB and sshfs.
    #[command(after_help = "Example:\n  ferry compare --baselines --out results/")]
    Compare(compare::CompareArgs),
    /// Many clients at once against a server of its own, every byte checked.
    #[command(after_help = "Example:\n  ferry soak --clients 50 --secs 30")]
    Soak(soak::SoakArgs),
    /// Print a shell completion script (bash, zsh or fish).
    #[command(after_help = "Example:\n  ferry completions bash > ~/.local/share/bash-completion/completions/ferry")]
    Completions {
        /// The shell the script is for.
        shell: crate::manual::Shell,
    },
    /// Print the manual page (roff), or write all of them into a directory.
    #[command(after_help = "Example:\n  ferry man | man -l -")]
    Man {
        /// The page of this command (default: ferry's own page).
        command: Option<String>,
        /// Write ferry.1 and a ferry-COMMAND.1 for each command into DIR.
        #[arg(long, value_name = "DIR", conflicts_with = "command")]
        dir: Option<PathBuf>,
    },
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
