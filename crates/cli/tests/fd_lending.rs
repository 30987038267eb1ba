//! The same-host descriptor lending (`FileFd`, PROTOCOL.md 8.7) against a
//! client that holds the token but is another local user: a probe process
//! run under another uid speaks raw frames (built with `ferry-proto`'s
//! encoder, nothing of the ferry client) on the server's Unix socket —
//! handshake, token, maybe `Caller` frames claiming other ids, `Open`,
//! `FileFd` — and reads every byte with `recvmsg`, keeping whatever
//! descriptors ride along. The server must lend only to a peer
//! (`SO_PEERCRED`) that is its own user (its real uid: a root server's
//! thread wears the caller's effective uid) or root; anyone else gets
//! `EPERM` and no descriptor, whatever ids its frames claim. The same
//! probe run as the server's own user gets the descriptor, so each refusal
//! here is the server's, not a probe that cannot receive one.
//!
//! These tests need root (to run probes and servers as other users); without
//! it they fail, they never skip.

mod common;

use std::io::{self, IoSliceMut, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::os::unix::net::{SocketAddr, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Server, TempDir};
use ferry_proto::{
    caps, client_proof, encode_groups, op, set_caller_slot, ErrorReply, Header, Reply, Request, FLAG_ERROR, HEADER_LEN,
    MIN_MAX_FRAME,
};
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags};

const NOBODY: u32 = 65534;
/// Two ordinary users with no entry in /etc/passwd (ids are all the kernel
/// needs): the owner of a non-root server, and a stranger to it.
const OWNER: u32 = 23111;
const STRANGER: u32 = 23112;
const SECRET: &[u8] = b"root's secret: 0600\n";
const EPERM: u32 = libc::EPERM as u32;
const PROBE_ENV: &str = "FERRY_LEND_PROBE";

fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "fd_lending needs root: its probes and servers run as other users; run the tests as root"
    );
}

// ---------------------------------------------------------------------------
// The probe: a process of the test binary itself, under another uid

/// What one probe asks: the server's Unix socket, the token, the file, and
/// the ids its `Caller` frame claims (none: requests name no caller).
struct Plan<'a> {
    addr: &'a str,
    token: &'a [u8],
    path: &'a str,
    writable: bool,
    claim: Option<(u32, u32)>,
}

/// What a probe saw.
#[derive(Debug)]
struct Seen {
    /// The probe's real and effective uid, gid and groups as it ran.
    ids: String,
    caller: String,
    open: String,
    file_fd: String,
    /// Descriptors that came with any byte the server sent.
    fds_received: usize,
    /// The kernel had to drop control messages (the buffer was too small).
    ctrunc: bool,
    /// Entries of /proc/self/fd after the reply, less before the request.
    proc_fds_delta: i64,
    /// Through the first received descriptor: where it points, its first bytes.
    fd_path: String,
    fd_data: String,
}

impl Seen {
    fn lent(&self) -> bool {
        self.file_fd.starts_with("ok") || self.fds_received > 0 || self.proc_fds_delta != 0 || self.ctrunc
    }
}

/// Runs the probe as `uid`:`gid` (no supplementary groups) with `plan`.
fn probe(bin: &Path, uid: u32, gid: u32, plan: &Plan<'_>) -> Seen {
    let claim = plan.claim.map(|(u, g)| format!("{u}:{g}")).unwrap_or_default();
    let mut cmd = Command::new(bin);
    cmd.args(["--ignored", "--exact", "probe_child", "--nocapture", "--test-threads=1"])
        .env(PROBE_ENV, plan.addr)
        .env("FERRY_LEND_TOKEN", String::from_utf8(plan.token.to_vec()).unwrap())
        .env("FERRY_LEND_PATH", plan.path)
        .env("FERRY_LEND_WRITABLE", if plan.writable { "1" } else { "0" })
        .env("FERRY_LEND_CLAIM", claim)
        .uid(uid)
        .gid(gid)
        .current_dir("/");
    // The copy's writable descriptor may live on for a moment in a child
    // another test thread forked meanwhile, until that child's exec.
    let mut tries = 0;
    let o = loop {
        match cmd.output() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            r => break r.expect("run the probe"),
        }
    };
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "probe as {uid}:{gid} failed:\n{out}\n{}", String::from_utf8_lossy(&o.stderr));
    let get = |k: &str| {
        out.lines()
            // libtest's "test probe_child ... " may begin the first line.
            .find_map(|l| l.split_once("PROBE ")?.1.strip_prefix(k)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("the probe said no {k}:\n{out}"))
            .to_string()
    };
    let seen = Seen {
        ids: get("ids"),
        caller: get("caller"),
        open: get("open"),
        file_fd: get("file_fd"),
        fds_received: get("fds_received").parse().unwrap(),
        ctrunc: get("ctrunc") == "1",
        proc_fds_delta: get("proc_fds_delta").parse().unwrap(),
        fd_path: get("fd_path"),
        fd_data: get("fd_data"),
    };
    // The probe really was that user: a probe left as root would be lent
    // descriptors and prove nothing about other users.
    assert_eq!(seen.ids, format!("{uid} {uid} {gid} {gid} []"), "the probe's ids: {seen:?}");
    seen
}

/// The test binary, copied where every user may run it (the build
/// directory need not be reachable by other users).
fn probe_bin(dir: &TempDir) -> PathBuf {
    let bin = dir.path().join("probe");
    std::fs::copy(std::env::current_exe().unwrap(), &bin).expect("copy the test binary");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// Not a test of its own: the probe the tests run as other users.
#[test]
#[ignore]
fn probe_child() {
    let addr = std::env::var(PROBE_ENV).expect("run by the fd_lending tests, as another user");
    let token = std::env::var("FERRY_LEND_TOKEN").unwrap().into_bytes();
    let path = std::env::var("FERRY_LEND_PATH").unwrap();
    let writable = std::env::var("FERRY_LEND_WRITABLE").unwrap() == "1";
    let claim = std::env::var("FERRY_LEND_CLAIM").unwrap();
    let say = |k: &str, v: &str| println!("PROBE {k}={v}");
    let (ru, eu) = (rustix::process::getuid().as_raw(), rustix::process::geteuid().as_raw());
    let (rg, eg) = (rustix::process::getgid().as_raw(), rustix::process::getegid().as_raw());
    let groups: Vec<u32> = rustix::process::getgroups().unwrap().iter().map(|g| g.as_raw()).collect();
    say("ids", &format!("{ru} {eu} {rg} {eg} {groups:?}"));

    let mut c = Raw::connect(&addr);
    c.handshake(&token);
    let slot = if claim.is_empty() {
        say("caller", "none");
        0
    } else {
        let (u, g) = claim.split_once(':').unwrap();
        let (u, g): (u32, u32) = (u.parse().unwrap(), g.parse().unwrap());
        let groups = encode_groups(&[g]);
        say("caller", &c.call(0, &Request::Caller { slot: 1, uid: u, gid: g, groups: &groups }).describe());
        1
    };
    let flags = if writable { libc::O_RDWR } else { libc::O_RDONLY } as u32;
    let opened = c.call(slot, &Request::Open { path: path.as_bytes(), flags, mode: 0 });
    say("open", &opened.describe());
    let Got::Ok(op, body) = opened else { panic!("the probe's open failed: {}", opened.describe()) };
    let handle = match Reply::decode(op, &body).unwrap() {
        Reply::Opened { handle, .. } | Reply::OpenedId { handle, .. } => handle,
        r => panic!("not an open reply: {r:?}"),
    };
    let before = proc_fds();
    let lent = c.call(slot, &Request::FileFd { handle });
    say("file_fd", &lent.describe());
    // Anything sent after the reply would have come with later bytes.
    let pong = c.call(0, &Request::Ping);
    assert!(matches!(pong, Got::Ok(..)), "PING after FileFd: {}", pong.describe());
    let after = proc_fds();
    say("fds_received", &c.fds.len().to_string());
    say("ctrunc", if c.ctrunc { "1" } else { "0" });
    say("proc_fds_delta", &(after as i64 - before as i64).to_string());
    match c.fds.first() {
        Some(fd) => {
            let f = std::fs::File::from(fd.try_clone().unwrap());
            let link = std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&f)));
            say("fd_path", &link.map_or_else(|e| format!("({e})"), |p| p.display().to_string()));
            let mut b = [0u8; 64];
            let n = f.read_at(&mut b, 0).unwrap_or(0);
            say("fd_data", &String::from_utf8_lossy(&b[..n]).escape_default().to_string());
        }
        None => {
            say("fd_path", "-");
            say("fd_data", "-");
        }
    }
    std::io::stdout().flush().unwrap();
}

fn proc_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

// ---------------------------------------------------------------------------
// A raw client on a Unix socket

enum Got {
    Ok(u16, Vec<u8>),
    Err(u32, String),
}

impl Got {
    fn describe(&self) -> String {
        match self {
            Got::Ok(op, body) => match Reply::decode(*op, body) {
                Ok(Reply::FileFd { seq, writable }) => format!("ok seq {seq} writable {writable}"),
                Ok(_) => "ok".into(),
                Err(e) => format!("ok, undecodable: {e}"),
            },
            Got::Err(e, m) => format!("err {e} {m}"),
        }
    }
}

/// Every read is a `recvmsg` with room for many descriptors: any that the
/// server attaches to any byte lands in `fds`.
struct Raw {
    s: UnixStream,
    buf: Vec<u8>,
    fds: Vec<OwnedFd>,
    ctrunc: bool,
    next: u64,
}

impl Raw {
    fn connect(addr: &str) -> Raw {
        let s = match addr.strip_prefix("unix:@") {
            Some(name) => UnixStream::connect_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()),
            None => UnixStream::connect(addr.strip_prefix("unix:").expect("a unix: address")),
        }
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        Raw { s, buf: Vec::new(), fds: Vec::new(), ctrunc: false, next: 1 }
    }

    fn handshake(&mut self, token: &[u8]) {
        let cn: [u8; 32] = common::random_bytes(32, u64::from(std::process::id())).try_into().unwrap();
        let hello =
            Request::Hello { min_version: 1, max_version: 1, caps: caps::ALL, max_frame: MIN_MAX_FRAME, nonce: cn };
        let Got::Ok(o, body) = self.call(0, &hello) else { panic!("HELLO refused") };
        let Ok(Reply::Welcome(w)) = Reply::decode(o, &body) else { panic!("expected Welcome") };
        assert!(w.caps & caps::SAME_HOST != 0, "the server does not offer SAME_HOST: nothing to test");
        let auth = Request::Auth { proof: client_proof(token, &w.nonce, &cn) };
        let got = self.call(0, &auth);
        assert!(matches!(got, Got::Ok(..)), "AUTH: {}", got.describe());
    }

    fn call(&mut self, slot: u16, req: &Request<'_>) -> Got {
        let id = self.next;
        self.next += 1;
        let mut f = Vec::new();
        req.encode(id, &mut f);
        f.extend_from_slice(req.bulk());
        set_caller_slot(&mut f, slot);
        (&self.s).write_all(&f).expect("send a request");
        let (h, body) = self.frame();
        assert_eq!((h.op, h.id), (req.op(), id), "a reply to another request than {req:?}");
        if h.flags & FLAG_ERROR != 0 {
            let e = ErrorReply::decode(&body).expect("a decodable error reply");
            Got::Err(e.errno, e.message.to_string())
        } else {
            Got::Ok(h.op, body)
        }
    }

    fn frame(&mut self) -> (Header, Vec<u8>) {
        self.fill(HEADER_LEN);
        let h = Header::decode(self.buf[..HEADER_LEN].try_into().unwrap());
        assert!(h.len <= MIN_MAX_FRAME, "absurd reply length {}", h.len);
        self.fill(HEADER_LEN + h.len as usize);
        let body = self.buf[HEADER_LEN..HEADER_LEN + h.len as usize].to_vec();
        self.buf.drain(..HEADER_LEN + h.len as usize);
        (h, body)
    }

    fn fill(&mut self, n: usize) {
        while self.buf.len() < n {
            let mut chunk = [0u8; 4096];
            let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(64))];
            let mut anc = RecvAncillaryBuffer::new(&mut space);
            let got = rustix::net::recvmsg(
                self.s.as_fd(),
                &mut [IoSliceMut::new(&mut chunk)],
                &mut anc,
                RecvFlags::CMSG_CLOEXEC,
            );
            let got = match got {
                Err(rustix::io::Errno::INTR) => continue,
                r => r.map_err(io::Error::from).expect("recvmsg (a timeout: the server neither replied nor closed)"),
            };
            if got.flags.contains(ReturnFlags::CTRUNC) {
                self.ctrunc = true;
            }
            for m in anc.drain() {
                if let RecvAncillaryMessage::ScmRights(fds) = m {
                    self.fds.extend(fds);
                }
            }
            assert!(got.bytes > 0, "the server closed the connection");
            self.buf.extend_from_slice(&chunk[..got.bytes]);
        }
    }
}

// ---------------------------------------------------------------------------
// Servers and the checks

/// The server's Unix socket address, asked over TCP as a client finds it.
fn unix_addr(srv: &Server) -> String {
    let mut s = std::net::TcpStream::connect(srv.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let cn: [u8; 32] = common::random_bytes(32, 99).try_into().unwrap();
    let send = |s: &mut std::net::TcpStream, req: &Request<'_>, id: u64| {
        let mut f = Vec::new();
        req.encode(id, &mut f);
        s.write_all(&f).unwrap();
    };
    let read = |s: &mut std::net::TcpStream| {
        use std::io::Read;
        let mut hb = [0u8; HEADER_LEN];
        s.read_exact(&mut hb).unwrap();
        let h = Header::decode(&hb);
        let mut body = vec![0u8; h.len as usize];
        s.read_exact(&mut body).unwrap();
        assert!(h.flags & FLAG_ERROR == 0, "op {}: {:?}", h.op, ErrorReply::decode(&body));
        (h, body)
    };
    send(
        &mut s,
        &Request::Hello { min_version: 1, max_version: 1, caps: caps::ALL, max_frame: MIN_MAX_FRAME, nonce: cn },
        1,
    );
    let (h, body) = read(&mut s);
    let Ok(Reply::Welcome(w)) = Reply::decode(h.op, &body) else { panic!("expected Welcome") };
    send(&mut s, &Request::Auth { proof: client_proof(&srv.token(), &w.nonce, &cn) }, 2);
    read(&mut s);
    send(&mut s, &Request::LocalAddr, 3);
    let (h, body) = read(&mut s);
    let Ok(Reply::LocalAddr { addr, .. }) = Reply::decode(h.op, &body) else { panic!("expected LocalAddr") };
    assert_eq!(h.op, op::LOCAL_ADDR);
    let addr = String::from_utf8(addr.to_vec()).unwrap();
    assert!(addr.starts_with("unix:@"), "the server's own abstract socket (any local user may reach it): {addr}");
    addr
}

fn put(p: &Path, data: &[u8], uid: u32, mode: u32) {
    std::fs::write(p, data).unwrap();
    std::os::unix::fs::chown(p, Some(uid), Some(uid)).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The probe got the server's descriptor of `file`, with its data.
fn assert_lent(seen: &Seen, file: &Path, data: &[u8], what: &str) {
    assert!(seen.file_fd.starts_with("ok seq 0"), "{what}: FileFd {seen:?}");
    assert_eq!((seen.fds_received, seen.proc_fds_delta, seen.ctrunc), (1, 1, false), "{what}: {seen:?}");
    assert_eq!(seen.fd_path, file.display().to_string(), "{what}: {seen:?}");
    assert_eq!(seen.fd_data, String::from_utf8_lossy(data).escape_default().to_string(), "{what}: {seen:?}");
}

/// The probe was refused with `EPERM` and holds no descriptor.
fn assert_refused(seen: &Seen, what: &str) {
    assert!(seen.open.starts_with("ok"), "{what}: the open must succeed for the refusal to mean anything: {seen:?}");
    assert!(seen.file_fd.starts_with(&format!("err {EPERM} ")), "{what}: FileFd must be refused with EPERM: {seen:?}");
    assert!(!seen.lent(), "{what}: a descriptor was passed: {seen:?}");
    assert_eq!(seen.fd_path, "-", "{what}: {seen:?}");
}

/// A root server (as the tests run it: root stays root, `--no-root-squash`)
/// lends its descriptor of a root-only file to root, and to no one else:
/// not to nobody naming no caller (its requests act as root), nor claiming
/// uid 0 (acting as root) or its own uid (the thread then wears nobody's
/// euid, which a check of the effective uid took for the server's own).
#[test]
fn a_root_server_lends_to_root_only_whatever_another_user_claims() {
    require_root();
    let srv = Server::start(&[]);
    let file = srv.export.path().join("secret");
    put(&file, SECRET, 0, 0o600);
    // One nobody may open itself, for a claim of nobody's own ids.
    let shared = srv.export.path().join("shared");
    put(&shared, b"shared\n", 0, 0o666);
    let addr = unix_addr(&srv);
    let token = srv.token();
    let dir = TempDir::new("lend-probe");
    let bin = probe_bin(&dir);
    let plan = |path, writable, claim| Plan { addr: &addr, token: &token, path, writable, claim };

    let own = probe(&bin, 0, 0, &plan("/secret", false, None));
    assert_lent(&own, &file, SECRET, "root, the server's own user");
    let own_claiming = probe(&bin, 0, 0, &plan("/shared", true, Some((NOBODY, NOBODY))));
    assert!(own_claiming.caller.starts_with("ok"), "{own_claiming:?}");
    assert_lent(&own_claiming, &shared, b"shared\n", "root naming nobody as its caller");
    assert!(own_claiming.file_fd.ends_with("writable true"), "{own_claiming:?}");

    for (path, claim, writable, what) in [
        ("/secret", None, false, "nobody naming no caller"),
        ("/secret", None, true, "nobody naming no caller, for writing"),
        ("/secret", Some((0, 0)), false, "nobody claiming root"),
        ("/secret", Some((0, 0)), true, "nobody claiming root, for writing"),
        ("/shared", Some((NOBODY, NOBODY)), false, "nobody claiming its own ids"),
        ("/shared", Some((NOBODY, NOBODY)), true, "nobody claiming its own ids, for writing"),
    ] {
        let seen = probe(&bin, NOBODY, NOBODY, &plan(path, writable, claim));
        if claim.is_some() {
            assert!(seen.caller.starts_with("ok"), "{what}: the claim must be taken: {seen:?}");
        }
        assert_refused(&seen, what);
    }
    assert_eq!(std::fs::read(&file).unwrap(), SECRET);
    assert!(!srv.log().contains("panicked"), "server log: {}", srv.log());
}

/// With root squash on (the default), a claim of uid 0 acts as the
/// anonymous user — the peer's own uid here: still no descriptor.
#[test]
fn a_root_squashing_server_lends_nothing_to_a_squashed_claim_of_root() {
    require_root();
    let srv = Server::start(&["--root-squash"]);
    let file = srv.export.path().join("open");
    put(&file, b"anyone may read and write this\n", 0, 0o666);
    let addr = unix_addr(&srv);
    let token = srv.token();
    let dir = TempDir::new("lend-probe-squash");
    let bin = probe_bin(&dir);
    let plan = |claim| Plan { addr: &addr, token: &token, path: "/open", writable: true, claim };
    let own = probe(&bin, 0, 0, &plan(None));
    assert_lent(&own, &file, b"anyone may read and write this\n", "root");
    for (claim, what) in [(Some((0, 0)), "nobody claiming root, squashed"), (None, "nobody naming no caller")] {
        let seen = probe(&bin, NOBODY, NOBODY, &plan(claim));
        assert_refused(&seen, what);
    }
}

/// A server run by an ordinary user lends to that user (and root), not to
/// another ordinary user or nobody, who hold the same token.
#[test]
fn a_users_server_lends_to_that_user_and_root_only() {
    require_root();
    let srv = Server::start_as(&[], OWNER, OWNER);
    let file = srv.export.path().join("mine");
    put(&file, SECRET, OWNER, 0o600);
    let addr = unix_addr(&srv);
    let token = srv.token();
    let dir = TempDir::new("lend-probe-user");
    let bin = probe_bin(&dir);
    let plan = Plan { addr: &addr, token: &token, path: "/mine", writable: true, claim: None };
    assert_lent(&probe(&bin, OWNER, OWNER, &plan), &file, SECRET, "the server's user");
    assert_lent(&probe(&bin, 0, 0, &plan), &file, SECRET, "root");
    assert_refused(&probe(&bin, STRANGER, STRANGER, &plan), "another ordinary user");
    assert_refused(&probe(&bin, NOBODY, NOBODY, &plan), "nobody");
    // The same group is not the same user.
    assert_refused(&probe(&bin, STRANGER, OWNER, &plan), "another user of the server's group");
}
