//! Shared test harness: a real `ferry serve` process on 127.0.0.1:0, killed
//! (by PID) when the guard drops, with its export in a private temp dir.
#![allow(dead_code)]

pub mod fuse;
pub mod gluster;
pub mod preload;
pub mod proxy;
pub mod restart;
pub mod scrape;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use ferry_client::{Client, Options};

pub const FERRY: &str = env!("CARGO_BIN_EXE_ferry");

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("ferry-test-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running server. `export` is the exported directory (unused with
/// `--memory`), `token` the token file clients must use.
pub struct Server {
    child: Child,
    pub port: u16,
    pub export: TempDir,
    pub state: TempDir,
    pub token_file: PathBuf,
}

impl Server {
    /// `ferry serve EXPORT --listen 127.0.0.1:0 --token-file T` plus `extra`.
    pub fn start(extra: &[&str]) -> Server {
        Server::start_env(extra, &[])
    }

    /// `start`, with `env` set for the server process.
    pub fn start_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        Server::start_with(extra, env, None)
    }

    /// `start`, the server run as `uid`:`gid` (no supplementary groups) on
    /// an export and a state directory of theirs, keeping its sessions in
    /// that state directory (root's home is not theirs).
    pub fn start_as(extra: &[&str], uid: u32, gid: u32) -> Server {
        Server::start_with(extra, &[], Some((uid, gid)))
    }

    fn start_with(extra: &[&str], env: &[(&str, &str)], user: Option<(u32, u32)>) -> Server {
        use std::os::unix::process::CommandExt;
        let export = TempDir::new("export");
        let state = TempDir::new("state");
        let token_file = state.path().join("token");
        let mut cmd = Command::new(FERRY);
        if let Some((uid, gid)) = user {
            for d in [export.path(), state.path()] {
                std::os::unix::fs::chown(d, Some(uid), Some(gid)).expect("chown the server's directories");
            }
            // `Command::uid` drops the supplementary groups too.
            cmd.uid(uid).gid(gid).env("HOME", state.path());
        }
        cmd.arg("serve");
        if user.is_some() && !extra.contains(&"--state-dir") {
            cmd.arg("--state-dir").arg(state.path().join("sessions"));
        }
        if !extra.contains(&"--memory") {
            cmd.arg(export.path());
        }
        // Tests run as root on files root owns: their root stays root,
        // unless a test asks for `--root-squash`.
        cmd.args(["--listen", "127.0.0.1:0", "--no-root-squash", "--token-file"])
            .arg(&token_file)
            .args(extra)
            .envs(env.iter().copied());
        // A file, not a pipe: a server logging many bad frames must never
        // block on a full pipe nobody reads.
        let log = std::fs::File::create(state.path().join("server.log")).expect("log file");
        cmd.stdout(Stdio::piped()).stderr(log);
        let mut child = cmd.spawn().expect("spawn ferry serve");
        let out = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line).expect("read listening line");
        let port = line
            .trim()
            .strip_prefix("listening on 127.0.0.1:")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        Server { child, port, export, state, token_file }
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `ferry://127.0.0.1:PORT` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("ferry://127.0.0.1:{}{}", self.port, path)
    }

    pub fn token(&self) -> Vec<u8> {
        std::fs::read_to_string(&self.token_file).expect("token file").trim().as_bytes().to_vec()
    }

    pub fn options(&self) -> Options {
        Options { token: Some(self.token()), ..Options::default() }
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.addr(), &self.options()).expect("connect")
    }

    /// `options` for a client that keeps its data on TCP even though the
    /// server is on its host: for tests of the TCP data path (read-ahead
    /// counts, connections cut by a proxy, copies kept for a lost server).
    pub fn tcp_options(&self) -> Options {
        Options { same_host: false, ..self.options() }
    }

    pub fn tcp_client(&self) -> Client {
        Client::connect(&self.addr(), &self.tcp_options()).expect("connect")
    }

    /// Runs `ferry ARGS` as a client of this server (token via env).
    pub fn ferry(&self, args: &[&str]) -> Output {
        self.ferry_env(args, &[])
    }

    pub fn ferry_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        Command::new(FERRY)
            .args(args)
            .envs(env.iter().copied())
            .env("FERRY_TOKEN_FILE", &self.token_file)
            .env_remove("FERRY_TOKEN")
            .output()
            .expect("run ferry")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// What the server has written to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.state.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads `path` of `c` to the end and in one positional read, checks both
/// against `data`, and returns the file.
pub fn read_both_ways(c: &Client, path: &str, data: &[u8]) -> ferry_client::File {
    use std::io::Read;
    let mut f = c.open(path, ferry_client::OpenOptions::new().read(true)).unwrap();
    let mut got = Vec::new();
    f.read_to_end(&mut got).unwrap();
    assert!(got == data, "sequential read differs");
    let mut whole = vec![0u8; data.len()];
    assert_eq!(f.read_at(&mut whole, 0).unwrap(), data.len());
    assert!(whole == data, "positional read differs");
    f
}

/// A seeded generator (`fastrand`), so a failure's seed reproduces it.
pub struct Rng(fastrand::Rng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(fastrand::Rng::with_seed(seed))
    }

    /// A number below `m` (0 for `m` 0).
    pub fn below(&mut self, m: u64) -> u64 {
        self.0.u64(..m.max(1))
    }

    /// An index below `n` (0 for `n` 0).
    pub fn index(&mut self, n: usize) -> usize {
        self.0.usize(..n.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0.u64(..)
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.0.fill(&mut v);
        v
    }
}

/// Deterministic pseudo-random bytes, so failures reproduce.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    Rng::new(seed).bytes(len)
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
