//! Hostile clients of the server's identity handling (PROTOCOL.md 8.2,
//! 8.3, 8.8): a test client that holds the token and speaks raw frames to a
//! real `ferry serve` running as root on a directory, and tries to act as
//! root through the caller machinery.
//!
//! The trust model: a token holder may act as any non-root user, never as
//! root, when the server runs as root with root squash on (its default).
//! So with squash on:
//! - a session without `IDENTITY`, and a request with header flags 0, act
//!   as the anonymous user (65534:65534); a slot never named is refused
//!   (`ENOKEY`) for requests that name files;
//! - a `Caller` naming uid, gid or a group of 0xFFFFFFFF (-1, "unchanged"
//!   to `setresuid`) is refused, or acts as the anonymous user; uid 0, gid 0
//!   and group 0 become 65534; other ids (0xFFFFFFFE, 65534, ordinary) act
//!   as themselves;
//! - each request's ids are its own caller's, never left over from an
//!   earlier request (a `Lock`, a `SessionNew`, another caller);
//! - `Access` judges the caller; `Reopen` gives only what a fresh `Open` by
//!   that caller would, and only for a file the session held; `chmod` never
//!   falls back to root.
//!
//! Every attempt here must be refused (any error reply: errnos are not
//! pinned where the rules only say "refused"), or have an effect that the
//! anonymous user or the named caller could have; afterwards the export
//! outside `open/` (the one directory everyone may write) must be exactly
//! as it was, as the test process (root) sees it. The relevant cases run
//! again with `--no-root-squash`, where a claimed uid 0 is root but -1 ids,
//! leftover ids and missing slots still are not.
//!
//! These tests need root (to run a server that switches ids, and to make
//! files of other owners); without it they fail, they never skip.

mod common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{random_bytes, Rng, Server};
use ferry_proto::{
    caps, client_proof, encode_groups, lock, op, server_proof, set_caller_slot, Attr, DirEntry, ErrorReply, Header,
    Reply, Request, Target, FLAG_ERROR, HEADER_LEN, MIN_MAX_FRAME,
};

const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// The anonymous user and group (`--anon-uid`, `--anon-gid` defaults).
const ANON: u32 = 65534;
/// -1: "leave unchanged" to `setresuid`/`setresgid`/`chown`.
const NEG: u32 = u32::MAX;
/// An ordinary user.
const USER: u32 = 23001;
/// The group of `g23004.txt` (0640, root:TEAM).
const TEAM: u32 = 23004;

const SECRET: &[u8] = b"top secret: root only\n";
const O_RDONLY: u32 = libc::O_RDONLY as u32;
const O_WRONLY: u32 = libc::O_WRONLY as u32;
const O_RDWR: u32 = libc::O_RDWR as u32;
const O_DIRECTORY: u32 = libc::O_DIRECTORY as u32;
const O_CREAT: u32 = libc::O_CREAT as u32;
const R_OK: u32 = libc::R_OK as u32;
const W_OK: u32 = libc::W_OK as u32;
const ENOKEY: u32 = libc::ENOKEY as u32;
const EBADF: u32 = libc::EBADF as u32;
const RENAME_EXCHANGE: u32 = 2;

fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "hostile_identity needs root: the server must run as root (to switch ids per request) and the test must \
         make files of other owners; run the tests as root"
    );
}

// ---------------------------------------------------------------------------
// A raw client

/// What a request got.
#[derive(Debug)]
enum Out {
    Ok(Vec<u8>),
    Err(u32, String),
    /// The server ended the connection instead of replying (a refusal too).
    Closed,
}

impl Out {
    fn is_ok(&self) -> bool {
        matches!(self, Out::Ok(_))
    }

    fn body(&self) -> &[u8] {
        match self {
            Out::Ok(b) => b,
            _ => &[],
        }
    }

    fn describe(&self) -> String {
        match self {
            Out::Ok(b) => format!("success ({} bytes)", b.len()),
            Out::Err(e, m) => format!("errno {e} ({m})"),
            Out::Closed => "connection closed".into(),
        }
    }
}

static NONCES: AtomicU64 = AtomicU64::new(1);

/// An authenticated connection that sends one request at a time, each with
/// the caller slot the test chooses in its header `flags`. A connection the
/// server ended is made again (a new session, which knows no slots) at the
/// next request.
struct Conn {
    addr: String,
    token: Vec<u8>,
    offer: u64,
    s: Option<TcpStream>,
    next: u64,
    /// The capabilities in force (the `Welcome`'s).
    caps: u64,
    reconnects: u32,
    /// The `Caller`s sent, named again on a new connection.
    named: Vec<(u16, u32, u32, Vec<u32>)>,
}

impl Conn {
    fn new(server: &Server, offer: u64) -> Conn {
        let mut c = Conn {
            addr: server.addr(),
            token: server.token(),
            offer,
            s: None,
            next: 10,
            caps: 0,
            reconnects: 0,
            named: Vec::new(),
        };
        c.connect();
        c
    }

    fn connect(&mut self) {
        let mut s = TcpStream::connect(&self.addr).expect("connect to the server");
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        s.set_nodelay(true).unwrap();
        let cn: [u8; 32] = random_bytes(32, NONCES.fetch_add(1, Ordering::Relaxed)).try_into().unwrap();
        let hello =
            Request::Hello { min_version: 1, max_version: 1, caps: self.offer, max_frame: MIN_MAX_FRAME, nonce: cn };
        s.write_all(&frame(&hello, 1, 0)).expect("send HELLO");
        let (h, body) = read_frame(&mut s).expect("the server closed the connection instead of answering HELLO");
        assert!(h.flags & FLAG_ERROR == 0, "HELLO refused: {:?}", ErrorReply::decode(&body));
        let Ok(Reply::Welcome(w)) = Reply::decode(op::HELLO, &body) else { panic!("expected Welcome") };
        assert!(w.auth_required, "the test servers require the token");
        s.write_all(&frame(&Request::Auth { proof: client_proof(&self.token, &w.nonce, &cn) }, 2, 0))
            .expect("send AUTH");
        let (h, body) = read_frame(&mut s).expect("the server closed the connection instead of answering AUTH");
        assert!(h.flags & FLAG_ERROR == 0, "AUTH refused: {:?}", ErrorReply::decode(&body));
        let Ok(Reply::AuthOk { proof }) = Reply::decode(op::AUTH, &body) else { panic!("expected AuthOk") };
        assert_eq!(proof, server_proof(&self.token, &w.nonce, &cn), "server proof");
        self.caps = w.caps;
        self.s = Some(s);
    }

    fn identity(&self) -> bool {
        self.caps & caps::IDENTITY != 0
    }

    /// Sends `req` as the caller in `slot` (0: none named) and waits for
    /// its reply.
    fn call(&mut self, slot: u16, req: &Request<'_>) -> Out {
        if self.s.is_none() {
            // A server may end a connection to refuse a claim: the test
            // goes on with a new one, its slots named again (the claims
            // that ended it too; they are refused again where used).
            self.reconnects += 1;
            self.connect();
            for (slot, uid, gid, groups) in self.named.clone() {
                let g = encode_groups(&groups);
                let _ = self.call(0, &Request::Caller { slot, uid, gid, groups: &g });
            }
        }
        let id = self.next;
        self.next += 1;
        let s = self.s.as_mut().expect("connected");
        if s.write_all(&frame(req, id, slot)).is_err() {
            self.s = None;
            return Out::Closed;
        }
        match read_frame(s) {
            None => {
                self.s = None;
                Out::Closed
            }
            Some((h, body)) => {
                assert_eq!((h.op, h.id), (req.op(), id), "a reply to another request than {req:?}");
                if h.flags & FLAG_ERROR != 0 {
                    let e = ErrorReply::decode(&body).expect("decodable error reply");
                    Out::Err(e.errno, e.message.to_string())
                } else {
                    Reply::decode(h.op, &body).unwrap_or_else(|e| panic!("undecodable reply to {req:?}: {e}"));
                    Out::Ok(body)
                }
            }
        }
    }

    /// Binds `slot` to a claimed user (the reply is the test's business).
    fn name(&mut self, slot: u16, uid: u32, gid: u32, groups: &[u32]) -> Out {
        self.named.retain(|n| n.0 != slot);
        self.named.push((slot, uid, gid, groups.to_vec()));
        let g = encode_groups(groups);
        self.call(0, &Request::Caller { slot, uid, gid, groups: &g })
    }

    /// `name`, which must succeed (an ordinary caller).
    fn name_ok(&mut self, slot: u16, uid: u32, gid: u32, groups: &[u32]) {
        assert!(self.identity(), "a root server on a directory must offer IDENTITY");
        let r = self.name(slot, uid, gid, groups);
        assert!(r.is_ok(), "Caller {{ slot {slot}, uid {uid}, gid {gid}, groups {groups:?} }}: {}", r.describe());
    }

    fn open(&mut self, slot: u16, path: &str, flags: u32) -> Out {
        self.call(slot, &Request::Open { path: path.as_bytes(), flags, mode: 0o644 })
    }

    fn close(&mut self, handle: u64) {
        let _ = self.call(0, &Request::Close { handle });
    }

    fn ping(&mut self) {
        let r = self.call(0, &Request::Ping);
        assert!(r.is_ok(), "PING: {}", r.describe());
    }

    fn shutdown(&mut self) {
        if let Some(s) = self.s.take() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn frame(req: &Request<'_>, id: u64, slot: u16) -> Vec<u8> {
    let mut v = Vec::new();
    req.encode(id, &mut v);
    v.extend_from_slice(req.bulk());
    set_caller_slot(&mut v, slot);
    v
}

/// One frame, or `None` when the server closed. A timeout fails the test.
fn read_frame(s: &mut TcpStream) -> Option<(Header, Vec<u8>)> {
    let mut hb = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match s.read(&mut hb[got..]) {
            Ok(0) if got == 0 => return None,
            Ok(0) => panic!("connection closed in the middle of a reply header"),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset && got == 0 => return None,
            Err(e) => panic!("reading a reply header: {e} (a timeout: the server neither replied nor closed)"),
        }
    }
    let h = Header::decode(&hb);
    assert!(h.len <= MIN_MAX_FRAME + 4096, "absurd reply length {}", h.len);
    let mut body = vec![0u8; h.len as usize];
    s.read_exact(&mut body).unwrap_or_else(|e| panic!("reading a reply body of {} bytes: {e}", h.len));
    Some((h, body))
}

/// The handle and attributes of an `Opened`/`OpenedId` reply.
fn opened(op: u16, body: &[u8]) -> (u64, Attr, Vec<u8>) {
    match Reply::decode(op, body).expect("open reply") {
        Reply::Opened { handle, attr } => (handle, attr, Vec::new()),
        Reply::OpenedId { handle, attr, id } => (handle, attr, id.to_vec()),
        r => panic!("not an open reply: {r:?}"),
    }
}

fn dir_entries(op: u16, body: &[u8]) -> Vec<DirEntry> {
    match Reply::decode(op, body).expect("dir reply") {
        Reply::Dir { entries, .. } => entries,
        r => panic!("not a Dir reply: {r:?}"),
    }
}

fn lock_req(handle: u64, typ: u8) -> Request<'static> {
    Request::Lock { handle, owner: 77, start: 0, len: 0, pid: 77, kind: lock::POSIX, typ }
}

// ---------------------------------------------------------------------------
// The export

/// What the test process sees of one entry.
#[derive(Debug, PartialEq)]
struct Entry {
    mode: u32,
    uid: u32,
    gid: u32,
    content: Option<Vec<u8>>,
    link: Option<PathBuf>,
    xattrs: Vec<u8>,
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in a test path")
}

fn xattr_names(p: &Path) -> Vec<u8> {
    let c = cpath(p);
    let mut buf = vec![0u8; 8192];
    // SAFETY: `c` is a NUL-terminated path; `buf` is writable for its length.
    let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n >= 0, "llistxattr {}: {}", p.display(), io::Error::last_os_error());
    buf.truncate(n as usize);
    buf
}

/// The kernel's file handle of `p` as the server's ids carry it (handle
/// type, little-endian, then its bytes): a forged `Reopen` id.
fn file_id(p: &Path) -> Vec<u8> {
    #[repr(C)]
    struct Buf {
        bytes: u32,
        typ: libc::c_int,
        f: [u8; 128],
    }
    let c = cpath(p);
    let mut h = Buf { bytes: 128, typ: 0, f: [0; 128] };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `h` is a `file_handle` header followed by the 128 bytes its
    // `handle_bytes` announces; `c` is a NUL-terminated path; `mount_id`
    // is writable.
    let r = unsafe {
        libc::name_to_handle_at(libc::AT_FDCWD, c.as_ptr(), (&raw mut h).cast::<libc::file_handle>(), &mut mount_id, 0)
    };
    assert_eq!(r, 0, "name_to_handle_at {}: {}", p.display(), io::Error::last_os_error());
    [&h.typ.to_le_bytes()[..], &h.f[..(h.bytes as usize).min(128)]].concat()
}

/// Everything under `root` but `open/`, as root sees it.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Entry> {
    fn walk(root: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, Entry>) {
        let p = root.join(rel);
        let m = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let ft = m.file_type();
        out.insert(
            rel.to_path_buf(),
            Entry {
                mode: m.mode(),
                uid: m.uid(),
                gid: m.gid(),
                content: ft.is_file().then(|| fs::read(&p).unwrap()),
                link: ft.is_symlink().then(|| fs::read_link(&p).unwrap()),
                xattrs: xattr_names(&p),
            },
        );
        if ft.is_dir() {
            for e in fs::read_dir(&p).unwrap() {
                let name = e.unwrap().file_name();
                if rel.as_os_str().is_empty() && name == "open" {
                    continue;
                }
                walk(root, &rel.join(name), out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, Path::new(""), &mut out);
    out
}

fn chown(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid)).unwrap_or_else(|e| panic!("chown {}: {e}", p.display()));
}

fn set_mode(p: &Path, m: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

fn mode_of(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).mode() & 0o7777
}

fn owner_of(p: &Path) -> Option<(u32, u32)> {
    fs::symlink_metadata(p).ok().map(|m| (m.uid(), m.gid()))
}

fn file(p: &Path, data: &[u8], uid: u32, gid: u32, m: u32) {
    fs::write(p, data).unwrap();
    chown(p, uid, gid);
    set_mode(p, m);
}

fn dir(p: &Path, uid: u32, gid: u32, m: u32) {
    fs::create_dir(p).unwrap();
    chown(p, uid, gid);
    set_mode(p, m);
}

/// A server (squash on or off) on an export of root's files:
/// - `secret.txt` root:root 0600, `group0.txt` root:root 0640,
///   `g23004.txt` root:TEAM 0640, `world.txt` root:root 0644,
///   `suid.bin` root:root 04755;
/// - `private/` root 0700 with `inner.txt` 0644 (readable, if reachable);
/// - `dir744/` root 0744 (listable, not searchable by others) with
///   `a.txt` and `sub/`;
/// - `w/` root 0755 with root's 04777 files for the write tests;
/// - `open/` root 0777: anyone may create there.
struct Fx {
    server: Server,
    before: BTreeMap<PathBuf, Entry>,
    secret_id: Vec<u8>,
    inner_id: Vec<u8>,
}

impl Fx {
    fn new(squash: bool) -> Fx {
        require_root();
        let args: &[&str] = if squash { &["--root-squash", "--no-state"] } else { &["--no-state"] };
        let server = Server::start(args);
        let ex = server.export.path().to_path_buf();
        set_mode(&ex, 0o755);
        chown(&ex, 0, 0);
        file(&ex.join("secret.txt"), SECRET, 0, 0, 0o600);
        file(&ex.join("group0.txt"), b"root's group only\n", 0, 0, 0o640);
        file(&ex.join("g23004.txt"), b"group 23004 only\n", 0, TEAM, 0o640);
        file(&ex.join("world.txt"), b"anyone may read, root may write\n", 0, 0, 0o644);
        file(&ex.join("suid.bin"), b"#!/bin/sh\n", 0, 0, 0o4755);
        dir(&ex.join("private"), 0, 0, 0o700);
        file(&ex.join("private/inner.txt"), b"inside a 0700 directory\n", 0, 0, 0o644);
        dir(&ex.join("dir744"), 0, 0, 0o744);
        file(&ex.join("dir744/a.txt"), b"a\n", 0, 0, 0o644);
        dir(&ex.join("dir744/sub"), 0, 0, 0o755);
        dir(&ex.join("w"), 0, 0, 0o755);
        for n in ["lock.bin", "lock-write.bin", "lock-slot.bin", "session.bin", "slot.bin"] {
            file(&ex.join("w").join(n), b"0123456789", 0, 0, 0o4777);
        }
        dir(&ex.join("open"), 0, 0, 0o777);
        let secret_id = file_id(&ex.join("secret.txt"));
        let inner_id = file_id(&ex.join("private/inner.txt"));
        let before = snapshot(&ex);
        Fx { server, before, secret_id, inner_id }
    }

    fn ex(&self) -> &Path {
        self.server.export.path()
    }

    fn conn(&self) -> Conn {
        let c = Conn::new(&self.server, caps::ALL);
        assert!(c.identity(), "a root server on a directory must offer IDENTITY (caps {:#x})", c.caps);
        c
    }

    fn stat(&self, rel: &str) -> fs::Metadata {
        fs::symlink_metadata(self.ex().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    /// The export outside `open/` is as it was (but for `except`), and the
    /// server is alive.
    fn assert_unchanged(&mut self, except: &[&str]) {
        let now = snapshot(self.ex());
        let mut diffs = Vec::new();
        for (p, e) in &self.before {
            if except.iter().any(|x| p == Path::new(x)) {
                continue;
            }
            match now.get(p) {
                None => diffs.push(format!("{} was removed", p.display())),
                Some(n) if n != e => diffs.push(format!("{} changed: {e:?} -> {n:?}", p.display())),
                _ => {}
            }
        }
        for p in now.keys() {
            if !self.before.contains_key(p) {
                diffs.push(format!("{} was created (owner {:?})", p.display(), owner_of(&self.ex().join(p))));
            }
        }
        assert!(diffs.is_empty(), "the export changed outside open/:\n  {}", diffs.join("\n  "));
        assert!(self.server.alive(), "the server died; log:\n{}", self.server.log());
    }

    /// Nothing under `open/` belongs to uid 0 or gid 0 (for tests in which
    /// no caller may legitimately be root).
    fn assert_no_root_entries_in_open(&self) {
        let mut bad = Vec::new();
        for e in fs::read_dir(self.ex().join("open")).unwrap() {
            let e = e.unwrap();
            let m = fs::symlink_metadata(e.path()).unwrap();
            if m.uid() == 0 || m.gid() == 0 {
                bad.push(format!("open/{} is {}:{}", e.file_name().to_string_lossy(), m.uid(), m.gid()));
            }
        }
        assert!(bad.is_empty(), "entries of root's made by the client:\n  {}", bad.join("\n  "));
    }
}

// ---------------------------------------------------------------------------
// What a caller may do

/// What a probe accepts of a caller.
#[derive(Clone, Debug)]
struct Expect {
    label: String,
    /// Owners a new entry may have (refusal is always accepted unless
    /// `must_create`).
    owners: Vec<(u32, u32)>,
    /// An ordinary caller: its mkdir in the 0777 directory must work (so
    /// the owner check means something).
    must_create: bool,
    /// May read `g23004.txt` (its gid or groups hold TEAM).
    team_allowed: bool,
    /// Must be able to read it (an ordinary caller in TEAM).
    team_required: bool,
}

/// The expectation for a claimed (uid, gid, groups) on a server with or
/// without root squash: well-formed ids act as themselves (0 squashed to
/// the anonymous ids); a claim with a -1 in it is refused or acts as the
/// anonymous user (or, leniently, anonymous only where the -1 was; never
/// root, never a leftover id).
fn expect(label: &str, uid: u32, gid: u32, groups: &[u32], squash: bool) -> Expect {
    let sq = |id: u32| if id == 0 && squash { ANON } else { id };
    let groups: Vec<u32> = groups.iter().map(|&g| sq(g)).collect();
    if uid == NEG || gid == NEG || groups.contains(&NEG) {
        let u = if uid == NEG || sq(uid) == 0 { ANON } else { sq(uid) };
        let g = if gid == NEG || sq(gid) == 0 { ANON } else { sq(gid) };
        let mut owners = vec![(ANON, ANON)];
        if (u, g) != (ANON, ANON) {
            owners.push((u, g));
        }
        Expect {
            label: label.into(),
            owners,
            must_create: false,
            team_allowed: g == TEAM || groups.contains(&TEAM),
            team_required: false,
        }
    } else {
        let (u, g) = (sq(uid), sq(gid));
        assert!(u != 0 && g != 0 && !groups.contains(&0), "{label}: the probes are for callers who are not root");
        let team = g == TEAM || groups.contains(&TEAM);
        Expect { label: label.into(), owners: vec![(u, g)], must_create: true, team_allowed: team, team_required: team }
    }
}

/// The anonymous user (flags 0, no `IDENTITY`): refusals or 65534:65534.
fn anonymous(label: &str) -> Expect {
    Expect {
        label: label.into(),
        owners: vec![(ANON, ANON)],
        must_create: false,
        team_allowed: false,
        team_required: false,
    }
}

/// Tries, as the caller in `slot`, what only root may do (and one thing
/// any caller may: mkdir in `open/`), and returns what went wrong, each
/// line naming `exp.label`. `full` adds the requests beyond reading the
/// secret and making a directory.
fn probe(fx: &Fx, c: &mut Conn, slot: u16, tag: &str, exp: &Expect, full: bool) -> Vec<String> {
    let mut bad = Vec::new();
    let who = &exp.label;
    let no = |what: &str, out: &Out, bad: &mut Vec<String>| {
        if out.is_ok() {
            bad.push(format!("{who}: {what} succeeded"));
        }
    };
    // Reading root's 0600 file.
    let r = c.open(slot, "secret.txt", O_RDONLY);
    if let Out::Ok(b) = &r {
        let (h, _, _) = opened(op::OPEN, b);
        let d = c.call(slot, &Request::Pread { handle: h, offset: 0, count: 4096 });
        let read = d.body() == SECRET;
        bad.push(format!("{who}: OPEN secret.txt (root 0600) for reading succeeded (read the secret: {read})"));
        c.close(h);
    }
    // A group-0 file.
    let r = c.open(slot, "group0.txt", O_RDONLY);
    if let Out::Ok(b) = &r {
        let (h, _, _) = opened(op::OPEN, b);
        bad.push(format!("{who}: OPEN group0.txt (root:root 0640) succeeded"));
        c.close(h);
    }
    // A directory in the 0777 one: its owner is the caller's.
    let name = format!("open/{tag}");
    let r = c.call(slot, &Request::Mkdir { path: name.as_bytes(), mode: 0o755 });
    match owner_of(&fx.ex().join(&name)) {
        Some(o) if !exp.owners.contains(&o) => bad.push(format!(
            "{who}: MKDIR {name} made an entry owned by {}:{} (allowed: {:?}; reply {})",
            o.0,
            o.1,
            exp.owners,
            r.describe()
        )),
        None if exp.must_create => bad.push(format!("{who}: MKDIR {name} failed: {}", r.describe())),
        _ => {}
    }
    if !full {
        return bad;
    }
    let r = c.open(slot, "g23004.txt", O_RDONLY);
    match &r {
        Out::Ok(b) => {
            let (h, _, _) = opened(op::OPEN, b);
            if !exp.team_allowed {
                bad.push(format!("{who}: OPEN g23004.txt (root:{TEAM} 0640) succeeded, the caller claims no {TEAM}"));
            }
            c.close(h);
        }
        _ if exp.team_required => {
            bad.push(format!("{who}: OPEN g23004.txt by a caller of group {TEAM}: {}", r.describe()))
        }
        _ => {}
    }
    let r = c.open(slot, "private/inner.txt", O_RDONLY);
    if let Out::Ok(b) = &r {
        let (h, _, _) = opened(op::OPEN, b);
        bad.push(format!("{who}: OPEN private/inner.txt (inside root's 0700 directory) succeeded"));
        c.close(h);
    }
    let r = c.open(slot, "private", O_RDONLY | O_DIRECTORY);
    if let Out::Ok(b) = &r {
        let (h, _, _) = opened(op::OPEN, b);
        bad.push(format!("{who}: OPEN of root's 0700 directory private/ succeeded"));
        c.close(h);
    }
    let r = c.open(slot, "world.txt", O_WRONLY);
    if let Out::Ok(b) = &r {
        let (h, _, _) = opened(op::OPEN, b);
        bad.push(format!("{who}: OPEN world.txt (root 0644) for writing succeeded"));
        c.close(h);
    }
    for (path, mode, what) in [
        ("secret.txt", R_OK, "ACCESS secret.txt R_OK"),
        ("secret.txt", W_OK, "ACCESS secret.txt W_OK"),
        ("private/inner.txt", R_OK, "ACCESS private/inner.txt R_OK"),
        ("world.txt", W_OK, "ACCESS world.txt W_OK"),
    ] {
        no(what, &c.call(slot, &Request::Access { path: path.as_bytes(), mode }), &mut bad);
    }
    let top = format!("probe-{tag}");
    no(
        "MKDIR in the export's root (root 0755)",
        &c.call(slot, &Request::Mkdir { path: top.as_bytes(), mode: 0o777 }),
        &mut bad,
    );
    no(
        "CHMOD secret.txt 0666",
        &c.call(slot, &Request::Chmod { target: Target::Path(b"secret.txt"), mode: 0o666 }),
        &mut bad,
    );
    no(
        "CHOWN secret.txt to the anonymous user",
        &c.call(slot, &Request::Chown { target: Target::Path(b"secret.txt"), uid: ANON, gid: NEG }),
        &mut bad,
    );
    no(
        "CHMOD suid.bin (root 04755) 0755",
        &c.call(slot, &Request::Chmod { target: Target::Path(b"suid.bin"), mode: 0o755 }),
        &mut bad,
    );
    no(
        "SETXATTR trusted.hostile on world.txt",
        &c.call(
            slot,
            &Request::SetXattr { target: Target::Path(b"world.txt"), name: b"trusted.hostile", value: b"x", flags: 0 },
        ),
        &mut bad,
    );
    // (Gone if an earlier request could rename it: reported there.)
    if let Ok(st) = fs::symlink_metadata(fx.ex().join("secret.txt")) {
        let r = c.call(
            slot,
            &Request::Reopen { flags: O_RDONLY, dev: st.dev(), ino: st.ino(), id: &fx.secret_id, path: b"secret.txt" },
        );
        if let Out::Ok(b) = &r {
            let (h, _, _) = opened(op::REOPEN, b);
            bad.push(format!("{who}: REOPEN of secret.txt (never opened by this session; a forged id) succeeded"));
            c.close(h);
        }
    }
    bad
}

fn assert_clean(what: &str, bad: &[String]) {
    assert!(bad.is_empty(), "{what}: {} violation(s):\n  {}", bad.len(), bad.join("\n  "));
}

// ---------------------------------------------------------------------------
// Item 1: -1 ids

fn minus_one_callers(squash: bool) {
    let mut fx = Fx::new(squash);
    let mut c = fx.conn();
    let mut bad = Vec::new();
    for (i, (uid, gid, groups)) in [
        (NEG, NEG, vec![]),
        (NEG, NEG, vec![NEG]),
        (NEG, USER, vec![]),
        (USER, USER, vec![NEG]),
        (NEG, 0, vec![0]),
        (0, NEG, vec![]),
    ]
    .into_iter()
    .enumerate()
    {
        let slot = 1 + i as u16;
        let label = format!("Caller {{ uid {uid:#x}, gid {gid:#x}, groups {groups:x?} }}");
        let named = c.name(slot, uid, gid, &groups);
        eprintln!("{label}: {}", named.describe());
        bad.extend(probe(&fx, &mut c, slot, &format!("i1-{i}"), &expect(&label, uid, gid, &groups, squash), true));
    }
    assert_clean(&format!("item 1 (-1 ids, squash {squash})"), &bad);
    fx.assert_no_root_entries_in_open();
    fx.assert_unchanged(&[]);
}

/// Item 1: a `Caller` of uid/gid 0xFFFFFFFF ("unchanged" to setresuid)
/// must not leave the thread root: no secret read, no root-owned mkdir.
#[test]
fn item1_minus_one_uid_and_gid_never_act_as_root() {
    minus_one_callers(true);
}

/// Item 1 with `--no-root-squash`: -1 ids are still not root.
#[test]
fn item1_minus_one_uid_and_gid_never_act_as_root_without_root_squash() {
    minus_one_callers(false);
}

// ---------------------------------------------------------------------------
// Item 2: a gid of -1 keeps a leftover gid

fn leftover_gid(squash: bool) {
    let mut fx = Fx::new(squash);
    let mut bad = Vec::new();
    // On a fresh connection the thread's gid is the server's (0).
    let mut c = fx.conn();
    c.name_ok(1, USER, USER, &[]);
    let named = c.name(2, USER, NEG, &[]);
    eprintln!("Caller {{ uid {USER}, gid -1 }}: {}", named.describe());
    bad.extend(probe(&fx, &mut c, 2, "i2-fresh", &expect("uid 23001 gid -1 (fresh)", USER, NEG, &[], squash), true));
    // After a caller of group TEAM, a caller with gid -1 must not keep it.
    let mut c = fx.conn();
    c.name_ok(1, 23005, TEAM, &[]);
    c.name(2, 23006, NEG, &[]);
    c.name(3, 23007, 23007, &[NEG]);
    for i in 0..3 {
        // Right after a request of group TEAM, one with gid -1 (or a
        // group -1) must not keep TEAM.
        for (slot, who) in [(2u16, "23006 gid -1"), (3, "23007 groups [-1]")] {
            as_team(&mut c, &mut bad);
            let r = c.open(slot, "g23004.txt", O_RDONLY);
            if let Out::Ok(b) = &r {
                bad.push(format!(
                    "{who}, right after a request of 23005:TEAM: OPEN g23004.txt (root:TEAM 0640) succeeded"
                ));
                c.close(opened(op::OPEN, b).0);
            }
            as_team(&mut c, &mut bad);
            let name = format!("open/i2-after-team-{i}-{slot}");
            let r = c.call(slot, &Request::Mkdir { path: name.as_bytes(), mode: 0o755 });
            if let Some(o) = owner_of(&fx.ex().join(&name)) {
                if o.1 == TEAM || o.1 == 0 || o.0 == 0 {
                    bad.push(format!(
                        "{who}, right after a request of 23005:TEAM: MKDIR made {name} owned by {}:{} ({})",
                        o.0,
                        o.1,
                        r.describe()
                    ));
                }
            }
        }
        bad.extend(probe(
            &fx,
            &mut c,
            1,
            &format!("i2-team-{i}"),
            &expect("23005:TEAM", 23005, TEAM, &[], squash),
            true,
        ));
        bad.extend(probe(
            &fx,
            &mut c,
            2,
            &format!("i2-neg-{i}"),
            &expect("23006 gid -1", 23006, NEG, &[], squash),
            true,
        ));
        bad.extend(probe(
            &fx,
            &mut c,
            3,
            &format!("i2-negg-{i}"),
            &expect("23007 groups [-1]", 23007, 23007, &[NEG], squash),
            true,
        ));
    }
    assert_clean(&format!("item 2 (gid -1 keeps a leftover gid, squash {squash})"), &bad);
    fx.assert_no_root_entries_in_open();
    fx.assert_unchanged(&[]);
}

/// A request of slot 1 (23005:TEAM) that reads `g23004.txt`.
fn as_team(c: &mut Conn, bad: &mut Vec<String>) {
    match c.open(1, "g23004.txt", O_RDONLY) {
        Out::Ok(b) => c.close(opened(op::OPEN, &b).0),
        r => bad.push(format!("23005:TEAM could not open g23004.txt: {}", r.describe())),
    }
}

/// Item 2: uid 23001 with gid 0xFFFFFFFF must not keep the thread's gid 0
/// (read root:root 0640, make gid-0 entries) nor a gid left by an earlier
/// caller.
#[test]
fn item2_gid_minus_one_keeps_no_leftover_gid() {
    leftover_gid(true);
}

#[test]
fn item2_gid_minus_one_keeps_no_leftover_gid_without_root_squash() {
    leftover_gid(false);
}

// ---------------------------------------------------------------------------
// Each request's own caller

/// The thread's ids come from each request's caller, never from the one
/// before: callers root (squashed), 23001:23001, 23002 with gid TEAM
/// (claimed, so it may read g23004.txt), 23006 with TEAM among its groups,
/// and -1 claims, interleaved in a seeded order; each request's effect
/// (owner of its mkdir, what it may read) must be its own caller's.
#[test]
fn interleaved_callers_each_act_as_themselves() {
    let mut fx = Fx::new(true);
    let mut c = fx.conn();
    let callers: Vec<(u32, u32, Vec<u32>)> = vec![
        (0, 0, vec![0]),
        (USER, USER, vec![]),
        (23002, TEAM, vec![]),
        (23006, 23006, vec![TEAM]),
        (23003, NEG, vec![]),
        (NEG, NEG, vec![]),
        (23008, 23008, vec![NEG, TEAM]),
    ];
    for (i, (u, g, gs)) in callers.iter().enumerate() {
        let r = c.name(1 + i as u16, *u, *g, gs);
        eprintln!("slot {}: Caller {{ {u:#x}, {g:#x}, {gs:x?} }}: {}", 1 + i, r.describe());
    }
    let mut rng = Rng::new(0x1D_5EED);
    let mut bad = Vec::new();
    let mut seq = Vec::new();
    for step in 0..36 {
        let i = rng.index(callers.len());
        seq.push(i + 1);
        let (u, g, gs) = &callers[i];
        let label = format!("step {step}, slot {} ({u:#x}:{g:#x} {gs:x?})", i + 1);
        let e = expect(&label, *u, *g, gs, true);
        // Also a flags-0 request now and then: the anonymous user.
        if step % 5 == 4 {
            bad.extend(probe(
                &fx,
                &mut c,
                0,
                &format!("mix-anon-{step}"),
                &anonymous(&format!("step {step}, flags 0")),
                false,
            ));
        }
        bad.extend(probe(&fx, &mut c, 1 + i as u16, &format!("mix-{step}"), &e, true));
    }
    eprintln!("slot order: {seq:?}");
    assert_clean("interleaved callers", &bad);
    fx.assert_no_root_entries_in_open();
    fx.assert_unchanged(&[]);
}

/// Ids near the top of the range and the anonymous ids are ordinary ids:
/// they act as themselves (and are not root).
#[test]
fn ids_near_the_top_act_as_themselves() {
    let mut fx = Fx::new(true);
    let mut c = fx.conn();
    let mut bad = Vec::new();
    for (i, (u, g, gs)) in
        [(0xFFFF_FFFE, 0xFFFF_FFFE, vec![]), (ANON, ANON, vec![]), (USER, USER, vec![USER, 0xFFFF_FFFE])]
            .into_iter()
            .enumerate()
    {
        let slot = 1 + i as u16;
        c.name_ok(slot, u, g, &gs);
        let label = format!("Caller {{ {u:#x}, {g:#x}, {gs:x?} }}");
        bad.extend(probe(&fx, &mut c, slot, &format!("top-{i}"), &expect(&label, u, g, &gs, true), true));
    }
    assert_clean("ids near the top", &bad);
    fx.assert_no_root_entries_in_open();
    fx.assert_unchanged(&[]);
}

// ---------------------------------------------------------------------------
// Item 3: Reopen

/// Item 3: `Reopen` of root's 0600 file, which this session never opened,
/// as uid 23001 (by path and by a forged kernel file handle; read-write
/// and read-only) or as the anonymous user: refused.
#[test]
fn item3_reopen_of_a_root_file_never_opened_is_refused() {
    let mut fx = Fx::new(true);
    let mut c = fx.conn();
    c.name_ok(1, USER, USER, &[]);
    let st = fx.stat("secret.txt");
    let mut bad = Vec::new();
    for slot in [1u16, 0] {
        for flags in [O_RDWR, O_RDONLY, O_WRONLY] {
            for id in [&[][..], &fx.secret_id[..]] {
                let r = c.call(slot, &Request::Reopen { flags, dev: st.dev(), ino: st.ino(), id, path: b"secret.txt" });
                if let Out::Ok(b) = &r {
                    let (h, attr, _) = opened(op::REOPEN, b);
                    let read = c.call(slot, &Request::Pread { handle: h, offset: 0, count: 100 });
                    bad.push(format!(
                        "slot {slot}: REOPEN {{ flags {flags:#o}, id {} bytes, path secret.txt }} gave handle {h} to \
                         a file of mode {:o} (pread: {}{})",
                        id.len(),
                        attr.mode,
                        read.describe(),
                        if read.body() == SECRET { ", the secret" } else { "" }
                    ));
                    c.close(h);
                }
            }
        }
    }
    assert_clean("item 3 (REOPEN of root's 0600 file)", &bad);
    assert_eq!(fs::read(fx.ex().join("secret.txt")).unwrap(), SECRET);
    fx.assert_unchanged(&[]);
}

/// Item 3: guessed inode numbers near root's 0700 directory, with a path
/// inside it (or a forged id), never open a file there for uid 23001.
#[test]
fn item3_reopen_by_guessed_inode_in_a_private_dir_is_refused() {
    let mut fx = Fx::new(true);
    let mut c = fx.conn();
    c.name_ok(1, USER, USER, &[]);
    let p = fx.stat("private");
    let inner = fx.stat("private/inner.txt");
    let mut inos: Vec<u64> = (p.ino().saturating_sub(4)..=p.ino() + 8).collect();
    inos.push(inner.ino());
    let mut bad = Vec::new();
    let mut tried = 0;
    for ino in inos {
        for path in [&b"private/inner.txt"[..], b"private/../private/inner.txt", b"inner.txt"] {
            for id in [&[][..], &fx.inner_id[..]] {
                tried += 1;
                let r = c.call(1, &Request::Reopen { flags: O_RDONLY, dev: p.dev(), ino, id, path });
                if let Out::Ok(b) = &r {
                    let (h, attr, _) = opened(op::REOPEN, b);
                    bad.push(format!(
                        "REOPEN {{ ino {ino}, id {} bytes, path {} }} opened ino {} (mode {:o})",
                        id.len(),
                        String::from_utf8_lossy(path),
                        attr.ino,
                        attr.mode
                    ));
                    c.close(h);
                }
            }
        }
    }
    eprintln!("{tried} REOPEN guesses");
    assert_clean("item 3 (REOPEN by guessed inode inside a 0700 directory)", &bad);
    fx.assert_unchanged(&[]);
}

/// Item 3: a `Reopen` gives no more than a fresh `Open` by its caller
/// would: 23001 opened root's 0644 `world.txt` read-only, and its `Reopen`
/// read-write (with the id it was given) must be refused.
#[test]
fn item3_reopen_gives_no_more_than_a_fresh_open() {
    let mut fx = Fx::new(true);
    let mut c = fx.conn();
    c.name_ok(1, USER, USER, &[]);
    let r = c.call(1, &Request::OpenId { path: b"world.txt", flags: O_RDONLY, mode: 0 });
    let Out::Ok(b) = &r else { panic!("23001 must be able to open root's 0644 file read-only: {}", r.describe()) };
    let (h, attr, id) = opened(op::OPEN_ID, b);
    let fresh = c.open(1, "world.txt", O_RDWR);
    assert!(!fresh.is_ok(), "a fresh read-write OPEN of root's 0644 file by 23001 succeeded");
    let mut bad = Vec::new();
    for flags in [O_RDWR, O_WRONLY] {
        for rid in [&id[..], &[][..]] {
            let r = c.call(1, &Request::Reopen { flags, dev: attr.dev, ino: attr.ino, id: rid, path: b"world.txt" });
            if let Out::Ok(b) = &r {
                let (h2, _, _) = opened(op::REOPEN, b);
                bad.push(format!(
                    "REOPEN {{ flags {flags:#o}, id {} bytes }} of world.txt (root 0644) by 23001 gave handle {h2}",
                    rid.len()
                ));
                c.close(h2);
            }
        }
    }
    c.close(h);
    assert_clean("item 3 (REOPEN gives more than OPEN)", &bad);
    fx.assert_unchanged(&[]);
}

// ---------------------------------------------------------------------------
// Item 5: no IDENTITY, flags 0

/// Item 5: a session whose `Hello` leaves out `IDENTITY`, and never sends
/// a `Caller`, acts as the anonymous user: no root reads, no root-owned
/// entries, no chmod/chown of root's files, no `trusted.*` xattrs. Header
/// flags are ignored there (0 and a made-up slot).
#[test]
fn item5_a_session_without_identity_acts_as_anonymous() {
    let mut fx = Fx::new(true);
    let mut c = Conn::new(&fx.server, caps::ALL & !caps::IDENTITY);
    assert!(!c.identity(), "IDENTITY was not offered, so it must not be in force");
    let mut bad = Vec::new();
    for slot in [0u16, 1] {
        bad.extend(probe(
            &fx,
            &mut c,
            slot,
            &format!("i5-{slot}"),
            &anonymous(&format!("no IDENTITY, flags {slot}")),
            true,
        ));
        bad.extend(trusted_xattr_and_root_files(&mut c, slot, &format!("no IDENTITY, flags {slot}")));
    }
    assert_clean("item 5 (a session without IDENTITY)", &bad);
    fx.assert_no_root_entries_in_open();
    fx.assert_unchanged(&[]);
}

/// `setxattr trusted.*`, chmod and chown of root's files.
fn trusted_xattr_and_root_files(c: &mut Conn, slot: u16, who: &str) -> Vec<String> {
    let mut bad = Vec::new();
    for (what, req) in [
        (
            "SETXATTR trusted.x on secret.txt",
            Request::SetXattr { target: Target::Path(b"secret.txt"), name: b"trusted.x", value: b"1", flags: 0 },
        ),
        (
            "SETXATTR trusted.x on the export root",
            Request::SetXattr { target: Target::Path(b""), name: b"trusted.x", value: b"1", flags: 0 },
        ),
        (
            "SETXATTR security.x on world.txt",
            Request::SetXattr { target: Target::Path(b"world.txt"), name: b"security.x", value: b"1", flags: 0 },
        ),
        ("CHMOD world.txt 0666", Request::Chmod { target: Target::Path(b"world.txt"), mode: 0o666 }),
        ("CHMOD private 0777", Request::Chmod { target: Target::Path(b"private"), mode: 0o777 }),
        ("CHOWN world.txt to 65534", Request::Chown { target: Target::Path(b"world.txt"), uid: ANON, gid: ANON }),
        ("CHOWN suid.bin to 23001", Request::Chown { target: Target::Path(b"suid.bin"), uid: USER, gid: NEG }),
        ("UNLINK world.txt", Request::Unlink { path: b"world.txt" }),
        ("RENAME secret.txt to open/stolen", Request::Rename { from: b"secret.txt", to: b"open/stolen", flags: 0 }),
        ("LINK private/inner.txt to open/inner", Request::Link { from: b"private/inner.txt", to: b"open/inner" }),
    ] {
        let r = c.call(slot, &req);
        if r.is_ok() {
            bad.push(format!("{who}: {what} succeeded"));
        }
    }
    bad
}

/// Flags 0 in a session with `IDENTITY` is the anonymous user too (with
/// squash on): refusals or 65534's effects, never root's.
#[test]
fn flags_zero_with_identity_acts_as_anonymous() {
    let mut fx = Fx::new(true);
    let mut c = fx.conn();
    let mut bad = probe(&fx, &mut c, 0, "flags0", &anonymous("IDENTITY, flags 0"), true);
    bad.extend(trusted_xattr_and_root_files(&mut c, 0, "IDENTITY, flags 0"));
    assert_clean("flags 0 with IDENTITY", &bad);
    fx.assert_no_root_entries_in_open();
    fx.assert_unchanged(&[]);
}

/// A slot never named is refused with `ENOKEY` for requests that name
/// files, before anything runs.
#[test]
fn a_slot_never_named_is_refused() {
    let mut fx = Fx::new(true);
    let mut c = fx.conn();
    c.name_ok(1, USER, USER, &[]);
    let mut bad = Vec::new();
    for (what, req) in [
        ("OPEN secret.txt", Request::Open { path: b"secret.txt", flags: O_RDONLY, mode: 0 }),
        ("OPEN world.txt", Request::Open { path: b"world.txt", flags: O_RDONLY, mode: 0 }),
        ("OPEN open/new O_CREAT", Request::Open { path: b"open/unnamed", flags: O_RDWR | O_CREAT, mode: 0o644 }),
        ("MKDIR open/unnamed-dir", Request::Mkdir { path: b"open/unnamed-dir", mode: 0o755 }),
        ("STAT world.txt", Request::Stat { target: Target::Path(b"world.txt") }),
        ("ACCESS secret.txt R_OK", Request::Access { path: b"secret.txt", mode: R_OK }),
        ("CHMOD suid.bin 0755", Request::Chmod { target: Target::Path(b"suid.bin"), mode: 0o755 }),
        ("LIST_DIR private", Request::ListDir { path: b"private", max_entries: 100, plus: true }),
        (
            "SETXATTR trusted.x",
            Request::SetXattr { target: Target::Path(b"world.txt"), name: b"trusted.x", value: b"1", flags: 0 },
        ),
        (
            "REOPEN secret.txt",
            Request::Reopen {
                flags: O_RDONLY,
                dev: fx.stat("secret.txt").dev(),
                ino: fx.stat("secret.txt").ino(),
                id: &fx.secret_id,
                path: b"secret.txt",
            },
        ),
    ] {
        for slot in [2u16, 4242, 65535] {
            match c.call(slot, &req) {
                Out::Err(ENOKEY, _) => {}
                // A file this session never held may be refused as such
                // (ESTALE, EACCES) before its slot is looked at.
                Out::Err(..) if req.op() == op::REOPEN => {}
                r => bad.push(format!("slot {slot} (never named): {what}: {} (expected ENOKEY)", r.describe())),
            }
        }
    }
    assert_clean("a slot never named", &bad);
    assert!(!fx.ex().join("open/unnamed").exists() && !fx.ex().join("open/unnamed-dir").exists());
    fx.assert_unchanged(&[]);
}

// ---------------------------------------------------------------------------
// Item 6: chmod falls back to root

/// Item 6: clearing the set-uid bit of root's 04755 file is refused to
/// callers who cannot write it (by path, and through a read-only handle),
/// and the mode stays.
#[test]
fn item6_chmod_clearing_set_id_bits_of_roots_file_is_refused() {
    let mut fx = Fx::new(true);
    let mut c = fx.conn();
    c.name_ok(1, ANON, ANON, &[]);
    c.name_ok(2, USER, USER, &[]);
    c.name_ok(3, 0, 0, &[0]);
    let p = fx.ex().join("suid.bin");
    let mut bad = Vec::new();
    for slot in [0u16, 1, 2, 3] {
        for mode in [0o755, 0o2755, 0o0755 | 0o1000] {
            let r = c.call(slot, &Request::Chmod { target: Target::Path(b"suid.bin"), mode });
            let now = mode_of(&p);
            if r.is_ok() || now != 0o4755 {
                bad.push(format!("slot {slot}: CHMOD suid.bin {mode:o}: {}; mode now {now:o}", r.describe()));
                set_mode(&p, 0o4755);
            }
        }
        // Through a handle it opened read-only (others may read it).
        let r = c.open(slot, "suid.bin", O_RDONLY);
        let Out::Ok(b) = &r else { panic!("slot {slot}: OPEN suid.bin (0755) read-only: {}", r.describe()) };
        let (h, _, _) = opened(op::OPEN, b);
        let r = c.call(slot, &Request::Chmod { target: Target::Handle(h), mode: 0o755 });
        let now = mode_of(&p);
        if r.is_ok() || now != 0o4755 {
            bad.push(format!(
                "slot {slot}: CHMOD of a read-only handle of suid.bin 0755: {}; mode now {now:o}",
                r.describe()
            ));
            set_mode(&p, 0o4755);
        }
        c.close(h);
    }
    assert_clean("item 6 (chmod clearing set-id bits of root's file)", &bad);
    fx.assert_unchanged(&[]);
}

/// Item 6, the race: 23001 chmods its symlink `open/race/link` (to its
/// own 06777 file) while a second connection swaps it (RENAME_EXCHANGE)
/// with `open/race/alt` (to `../../secret.txt`), for 2.5 s. Root's
/// `secret.txt` must keep mode 0600 throughout.
#[test]
fn item6_symlink_swap_race_never_chmods_roots_file() {
    let mut fx = Fx::new(true);
    let ex = fx.ex().to_path_buf();
    let race = ex.join("open/race");
    dir(&race, USER, USER, 0o755);
    file(&race.join("mine"), b"mine\n", USER, USER, 0o6777);
    std::os::unix::fs::symlink("mine", race.join("link")).unwrap();
    chown(&race.join("link"), USER, USER);
    std::os::unix::fs::symlink("../../secret.txt", race.join("alt")).unwrap();
    chown(&race.join("alt"), USER, USER);
    let secret = ex.join("secret.txt");
    let mut attacker = fx.conn();
    attacker.name_ok(1, USER, USER, &[]);
    let mut swapper = fx.conn();
    swapper.name_ok(1, USER, USER, &[]);
    let deadline = Instant::now() + Duration::from_millis(2500);
    let (swaps, outcomes, hit) = std::thread::scope(|s| {
        let sw = s.spawn(move || {
            let mut n = 0u64;
            while Instant::now() < deadline {
                let r = swapper.call(
                    1,
                    &Request::Rename { from: b"open/race/link", to: b"open/race/alt", flags: RENAME_EXCHANGE },
                );
                if r.is_ok() {
                    n += 1;
                }
            }
            n
        });
        let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
        let mut hit = None;
        let mut i = 0u64;
        while Instant::now() < deadline {
            let mode = if i.is_multiple_of(2) { 0o777 } else { 0o4777 };
            i += 1;
            let r = attacker.call(1, &Request::Chmod { target: Target::Path(b"open/race/link"), mode });
            let key = match &r {
                Out::Ok(_) => "ok".to_string(),
                Out::Err(e, _) => format!("errno {e}"),
                Out::Closed => "closed".into(),
            };
            *outcomes.entry(key).or_default() += 1;
            // Its own file back to 06777 (through the link's target name).
            attacker.call(1, &Request::Chmod { target: Target::Path(b"open/race/mine"), mode: 0o6777 });
            let m = fs::metadata(&secret).unwrap();
            if m.mode() & 0o7777 != 0o600 || m.uid() != 0 {
                hit = Some(format!("after {i} attempts secret.txt is {:o} {}:{}", m.mode() & 0o7777, m.uid(), m.gid()));
                break;
            }
        }
        (sw.join().unwrap(), outcomes, hit)
    });
    eprintln!("{swaps} swaps; chmod outcomes {outcomes:?}");
    assert!(swaps > 10, "the swapper made only {swaps} swaps: the race was not run");
    if let Some(h) = hit {
        panic!("item 6: the symlink-swap race made root chmod its own file: {h} (chmod outcomes {outcomes:?})");
    }
    let m = fs::metadata(&secret).unwrap();
    assert_eq!((m.mode() & 0o7777, m.uid(), m.gid()), (0o600, 0, 0), "secret.txt");
    assert_eq!(fs::read(&secret).unwrap(), SECRET);
    fx.assert_unchanged(&[]);
}

// ---------------------------------------------------------------------------
// Item 7: Access

fn access_judges_the_caller(squash: bool) {
    let mut fx = Fx::new(squash);
    let mut c = fx.conn();
    c.name_ok(1, ANON, ANON, &[]);
    c.name_ok(2, USER, USER, &[]);
    c.name_ok(3, 23002, 23002, &[TEAM]);
    let mut slots = vec![(1u16, "65534"), (2, "23001"), (3, "23002 in TEAM")];
    if squash {
        c.name_ok(4, 0, 0, &[0]);
        slots.push((4, "root, squashed"));
        slots.push((0, "flags 0"));
    }
    let mut bad = Vec::new();
    for (slot, who) in slots {
        for (path, mode) in [
            ("secret.txt", R_OK),
            ("secret.txt", W_OK),
            ("secret.txt", R_OK | W_OK),
            ("private/inner.txt", R_OK),
            ("private/inner.txt", 0),
            ("group0.txt", R_OK),
            ("world.txt", W_OK),
            ("suid.bin", W_OK),
        ] {
            let r = c.call(slot, &Request::Access { path: path.as_bytes(), mode });
            if r.is_ok() {
                bad.push(format!("{who}: ACCESS {path} mode {mode} succeeded"));
            }
        }
        // What the caller may do, it is told it may.
        let r = c.call(slot, &Request::Access { path: b"world.txt", mode: R_OK });
        if !r.is_ok() && slot != 0 {
            bad.push(format!("{who}: ACCESS world.txt R_OK (root 0644): {}", r.describe()));
        }
    }
    let r = c.call(3, &Request::Access { path: b"g23004.txt", mode: R_OK });
    if !r.is_ok() {
        bad.push(format!("23002 in TEAM: ACCESS g23004.txt R_OK: {}", r.describe()));
    }
    let r = c.call(2, &Request::Access { path: b"g23004.txt", mode: R_OK });
    if r.is_ok() {
        bad.push("23001: ACCESS g23004.txt R_OK succeeded, it is not in TEAM".into());
    }
    assert_clean(&format!("item 7 (ACCESS, squash {squash})"), &bad);
    fx.assert_unchanged(&[]);
}

/// Item 7: `Access` answers for the caller, not for root.
#[test]
fn item7_access_judges_the_caller() {
    access_judges_the_caller(true);
}

#[test]
fn item7_access_judges_the_caller_without_root_squash() {
    access_judges_the_caller(false);
}

// ---------------------------------------------------------------------------
// Item 8: requests without a slot after a server-identity op

const S_ISUID: u32 = libc::S_ISUID;

/// Item 8: after a `Lock` (which the server ran with its own ids), a
/// `Pwrite`/`Write` with flags 0 (or a slot never named) to root's 04777
/// file is the anonymous user's: the kernel clears the set-uid bit.
#[test]
fn item8_pwrite_without_a_slot_after_lock_clears_set_uid() {
    let mut fx = Fx::new(true);
    let mut c = fx.conn();
    let ex = fx.ex().to_path_buf();
    let mut bad = Vec::new();
    for (name, slot, positional) in
        [("w/lock.bin", 0u16, true), ("w/lock-write.bin", 0, false), ("w/lock-slot.bin", 77, true)]
    {
        let r = c.open(0, name, O_RDWR);
        let Out::Ok(b) = &r else { panic!("OPEN {name} (04777) read-write by the anonymous user: {}", r.describe()) };
        let (h, _, _) = opened(op::OPEN, b);
        let l = c.call(0, &lock_req(h, lock::WRLCK));
        let g = c.call(
            0,
            &Request::GetLock { handle: h, owner: 78, start: 0, len: 0, pid: 78, kind: lock::POSIX, typ: lock::WRLCK },
        );
        let w = if positional {
            c.call(slot, &Request::Pwrite { handle: h, offset: 0, data: b"X" })
        } else {
            c.call(slot, &Request::Write { handle: h, data: b"X" })
        };
        let m = mode_of(&ex.join(name));
        eprintln!("{name}: LOCK {}, GETLOCK {}, write {}, mode {m:o}", l.describe(), g.describe(), w.describe());
        if w.is_ok() && m & S_ISUID != 0 {
            bad.push(format!(
                "{} with slot {slot} after LOCK to root's 04777 {name} kept the set-uid bit (mode {m:o}): it ran as root",
                if positional { "PWRITE" } else { "WRITE" }
            ));
        }
        c.close(h);
    }
    assert_clean("item 8 (a write without a slot after LOCK)", &bad);
    fx.assert_unchanged(&["w/lock.bin", "w/lock-write.bin", "w/lock-slot.bin"]);
}

/// Item 8: the same after `SessionNew` (which the server runs with its own
/// ids to write its journal).
#[test]
fn item8_pwrite_without_a_slot_after_session_new_clears_set_uid() {
    let mut fx = Fx::new(true);
    let mut c = fx.conn();
    let name = "w/session.bin";
    let r = c.open(0, name, O_RDWR);
    let Out::Ok(b) = &r else { panic!("OPEN {name} read-write by the anonymous user: {}", r.describe()) };
    let (h, _, _) = opened(op::OPEN, b);
    let s = c.call(0, &Request::SessionNew);
    assert!(s.is_ok(), "SESSION_NEW: {}", s.describe());
    let w = c.call(0, &Request::Pwrite { handle: h, offset: 0, data: b"X" });
    let m = mode_of(&fx.ex().join(name));
    if w.is_ok() {
        assert!(
            m & S_ISUID == 0,
            "item 8: PWRITE with flags 0 after SESSION_NEW to root's 04777 file kept the set-uid bit (mode {m:o}): it \
             ran as root"
        );
    }
    fx.assert_unchanged(&[name]);
}

fn root_attrs_in(entries: &[DirEntry], who: &str) -> Vec<String> {
    entries
        .iter()
        .filter(|e| e.name == b"a.txt" || e.name == b"sub")
        .filter_map(|e| {
            e.attr.as_ref().map(|a| {
                format!(
                    "{who}: READDIR plus of dir744 (root 0744, not searchable by the caller) gave {}'s attributes \
                     (mode {:o}, {}:{})",
                    String::from_utf8_lossy(&e.name),
                    a.mode,
                    a.uid,
                    a.gid
                )
            })
        })
        .collect()
}

/// Item 8: a `ReadDir` with attributes (plus), flags 0 or an unnamed slot,
/// after a `Lock`, of root's 0744 directory: the anonymous user cannot
/// search it, so no entry may carry attributes.
#[test]
fn item8_readdir_plus_without_a_slot_after_lock_shows_no_attributes() {
    let mut fx = Fx::new(true);
    let mut c = fx.conn();
    let r = c.open(0, "dir744", O_RDONLY | O_DIRECTORY);
    let Out::Ok(b) = &r else { panic!("OPEN dir744 (0744) by the anonymous user: {}", r.describe()) };
    let (d, _, _) = opened(op::OPEN, b);
    let r = c.open(0, "world.txt", O_RDONLY);
    let Out::Ok(b) = &r else { panic!("OPEN world.txt by the anonymous user: {}", r.describe()) };
    let (f, _, _) = opened(op::OPEN, b);
    let mut bad = Vec::new();
    // Before any lock (the thread wears the anonymous ids of the opens).
    let r = c.call(0, &Request::ReadDir { handle: d, cookie: 0, max_entries: 100, plus: true });
    if let Out::Ok(b) = &r {
        bad.extend(root_attrs_in(&dir_entries(op::READDIR, b), "flags 0, before LOCK"));
    }
    for (i, slot) in [0u16, 77].into_iter().enumerate() {
        let l = c.call(0, &lock_req(f, lock::RDLCK));
        eprintln!("LOCK: {}", l.describe());
        let r = c.call(slot, &Request::ReadDir { handle: d, cookie: 0, max_entries: 100, plus: true });
        if let Out::Ok(b) = &r {
            bad.extend(root_attrs_in(&dir_entries(op::READDIR, b), &format!("slot {slot}, after LOCK {i}")));
        }
        let l = c.call(
            0,
            &Request::GetLock { handle: f, owner: 78, start: 0, len: 0, pid: 78, kind: lock::POSIX, typ: lock::WRLCK },
        );
        eprintln!("GETLOCK: {}", l.describe());
        let r = c.call(slot, &Request::ReadDir { handle: d, cookie: 0, max_entries: 100, plus: true });
        if let Out::Ok(b) = &r {
            bad.extend(root_attrs_in(&dir_entries(op::READDIR, b), &format!("slot {slot}, after GETLOCK {i}")));
        }
    }
    let r = c.call(0, &Request::ListDir { path: b"dir744", max_entries: 100, plus: true });
    if let Out::Ok(b) = &r {
        bad.extend(root_attrs_in(&dir_entries(op::LIST_DIR, b), "LIST_DIR flags 0"));
    }
    assert_clean("item 8 (READDIR plus without a slot after LOCK)", &bad);
    fx.assert_unchanged(&[]);
}

/// Item 8 with `--no-root-squash`: after a `Lock`, requests that carry a
/// named slot (23001) act as it: its write clears the set-uid bit of
/// root's 04777 file, its `ReadDir` plus of the 0744 directory shows no
/// attributes.
#[test]
fn item8_after_lock_requests_act_as_their_slot_without_root_squash() {
    let mut fx = Fx::new(false);
    let mut c = fx.conn();
    c.name_ok(1, USER, USER, &[]);
    let name = "w/slot.bin";
    let r = c.open(1, name, O_RDWR);
    let Out::Ok(b) = &r else { panic!("OPEN {name} read-write by 23001: {}", r.describe()) };
    let (h, _, _) = opened(op::OPEN, b);
    let r = c.open(1, "dir744", O_RDONLY | O_DIRECTORY);
    let Out::Ok(b) = &r else { panic!("OPEN dir744 by 23001: {}", r.describe()) };
    let (d, _, _) = opened(op::OPEN, b);
    let mut bad = Vec::new();
    let l = c.call(1, &lock_req(h, lock::WRLCK));
    eprintln!("LOCK: {}", l.describe());
    let r = c.call(1, &Request::ReadDir { handle: d, cookie: 0, max_entries: 100, plus: true });
    if let Out::Ok(b) = &r {
        bad.extend(root_attrs_in(&dir_entries(op::READDIR, b), "23001 after LOCK"));
    }
    let w = c.call(1, &Request::Pwrite { handle: h, offset: 0, data: b"X" });
    let m = mode_of(&fx.ex().join(name));
    if w.is_ok() && m & S_ISUID != 0 {
        bad.push(format!("PWRITE by 23001 after LOCK kept the set-uid bit of root's 04777 file (mode {m:o})"));
    }
    assert_clean("item 8 without root squash", &bad);
    fx.assert_unchanged(&[name]);
}

// ---------------------------------------------------------------------------
// Handles of other sessions

/// A handle number of session A used on session B (fresh, or with a
/// session of its own, having opened nothing) is `EBADF` for every
/// request that takes a handle; A still has it.
#[test]
fn handles_of_another_session_are_ebadf() {
    let mut fx = Fx::new(true);
    let mut a = fx.conn();
    a.name_ok(1, USER, USER, &[]);
    assert!(a.call(0, &Request::SessionNew).is_ok(), "SESSION_NEW");
    let r = a.open(1, "open/a-file", O_RDWR | O_CREAT);
    let Out::Ok(b) = &r else { panic!("OPEN open/a-file: {}", r.describe()) };
    let (h, _, _) = opened(op::OPEN, b);
    let r = a.open(1, "dir744", O_RDONLY | O_DIRECTORY);
    let Out::Ok(b) = &r else { panic!("OPEN dir744: {}", r.describe()) };
    let (d, _, _) = opened(op::OPEN, b);
    let mut bad = Vec::new();
    for own_session in [false, true] {
        let mut b = fx.conn();
        b.name_ok(1, USER, USER, &[]);
        if own_session {
            assert!(b.call(0, &Request::SessionNew).is_ok(), "SESSION_NEW");
        }
        for (what, req) in handle_requests(h, d) {
            for slot in [0u16, 1] {
                match b.call(slot, &req) {
                    Out::Err(EBADF, _) => {}
                    r => bad.push(format!(
                        "session B (own session {own_session}), slot {slot}: {what} on A's handle: {} (expected EBADF)",
                        r.describe()
                    )),
                }
            }
        }
    }
    let r = a.call(1, &Request::Pread { handle: h, offset: 0, count: 10 });
    assert!(r.is_ok(), "A's own handle: {}", r.describe());
    assert_clean("another session's handles", &bad);
    let p = fx.ex().join("open/a-file");
    assert_eq!(fs::read(&p).unwrap(), b"", "open/a-file was written through another session");
    assert_eq!(owner_of(&p), Some((USER, USER)));
    fx.assert_unchanged(&[]);
}

fn handle_requests(h: u64, d: u64) -> Vec<(&'static str, Request<'static>)> {
    vec![
        ("PREAD", Request::Pread { handle: h, offset: 0, count: 10 }),
        ("READ", Request::Read { handle: h, count: 10 }),
        ("PWRITE", Request::Pwrite { handle: h, offset: 0, data: b"stolen" }),
        ("WRITE", Request::Write { handle: h, data: b"stolen" }),
        ("SEEK", Request::Seek { handle: h, offset: 0, whence: 0 }),
        ("FSYNC", Request::Fsync { handle: h, datasync: false }),
        ("STAT", Request::Stat { target: Target::Handle(h) }),
        ("CHMOD", Request::Chmod { target: Target::Handle(h), mode: 0o777 }),
        ("TRUNCATE", Request::Truncate { target: Target::Handle(h), size: 100 }),
        ("LOCK", lock_req(h, lock::WRLCK)),
        ("READDIR", Request::ReadDir { handle: d, cookie: 0, max_entries: 10, plus: true }),
        ("CLOSE", Request::Close { handle: h }),
    ]
}

/// Handles of a connection that made no session die with it: a new
/// connection (with a session of its own, or not) gets `EBADF` for them,
/// and a forged attach to a session that never was is refused.
#[test]
fn handles_die_with_a_connection_that_made_no_session() {
    let mut fx = Fx::new(true);
    let mut a = fx.conn();
    a.name_ok(1, USER, USER, &[]);
    let r = a.open(1, "open/gone", O_RDWR | O_CREAT);
    let Out::Ok(b) = &r else { panic!("OPEN open/gone: {}", r.describe()) };
    let (h, _, _) = opened(op::OPEN, b);
    let r = a.open(1, "dir744", O_RDONLY | O_DIRECTORY);
    let Out::Ok(b) = &r else { panic!("OPEN dir744: {}", r.describe()) };
    let (d, _, _) = opened(op::OPEN, b);
    a.shutdown();
    std::thread::sleep(Duration::from_millis(200));
    let mut bad = Vec::new();
    for with_session in [false, true] {
        let mut b = fx.conn();
        b.name_ok(1, USER, USER, &[]);
        if with_session {
            assert!(b.call(0, &Request::SessionNew).is_ok(), "SESSION_NEW");
        } else {
            // A made-up session id and proof.
            let r = b.call(0, &Request::SessionAttach { id: 1, proof: [7; 32] });
            if r.is_ok() {
                bad.push("SESSION_ATTACH to session 1 with a made-up proof succeeded".into());
            }
        }
        for (what, req) in handle_requests(h, d) {
            match b.call(1, &req) {
                Out::Err(EBADF, _) => {}
                r => bad.push(format!(
                    "new connection (session {with_session}): {what} on a dead connection's handle: {} (expected EBADF)",
                    r.describe()
                )),
            }
        }
        b.ping();
    }
    assert_clean("handles of a closed connection", &bad);
    assert_eq!(fs::read(fx.ex().join("open/gone")).unwrap(), b"");
    fx.assert_unchanged(&[]);
}

// ---------------------------------------------------------------------------
// Property: random ids

/// For 64 seeded random claims, uid, gid and groups each drawn from
/// {0, 1, 65534, 23001, 0xFFFFFFFE, 0xFFFFFFFF, random}: a `Caller` then an
/// `Open` of root's 0600 file never reads the secret, and a mkdir in the
/// 0777 directory never makes an entry of uid 0 or gid 0 (squash on), and
/// is the caller's own (or the anonymous user's, for a -1 claim).
#[test]
fn property_random_ids_never_read_the_secret_or_make_root_entries() {
    let mut fx = Fx::new(true);
    let seed = 0x1DE7_7171_u64;
    let mut rng = Rng::new(seed);
    let draw = |rng: &mut Rng| -> u32 {
        match rng.below(7) {
            0 => 0,
            1 => 1,
            2 => ANON,
            3 => USER,
            4 => 0xFFFF_FFFE,
            5 => NEG,
            _ => rng.next() as u32,
        }
    };
    let mut c = fx.conn();
    let mut bad = Vec::new();
    let mut refused = 0;
    for case in 0..64u16 {
        let uid = draw(&mut rng);
        let gid = draw(&mut rng);
        let n = rng.below(4) as usize;
        let groups: Vec<u32> = (0..n).map(|_| draw(&mut rng)).collect();
        let slot = 1 + case;
        let label = format!("seed {seed:#x} case {case}: Caller {{ uid {uid:#x}, gid {gid:#x}, groups {groups:x?} }}");
        let named = c.name(slot, uid, gid, &groups);
        if !named.is_ok() {
            refused += 1;
        }
        let e = expect(&label, uid, gid, &groups, true);
        bad.extend(probe(&fx, &mut c, slot, &format!("prop-{case}"), &e, false));
        // Every few cases, a request with flags 0 between callers.
        if case % 8 == 7 {
            bad.extend(probe(
                &fx,
                &mut c,
                0,
                &format!("prop-anon-{case}"),
                &anonymous(&format!("case {case}, flags 0")),
                false,
            ));
        }
    }
    eprintln!("{refused} of 64 Callers refused; {} reconnects", c.reconnects);
    assert_clean("random ids", &bad);
    fx.assert_no_root_entries_in_open();
    fx.assert_unchanged(&[]);
}
