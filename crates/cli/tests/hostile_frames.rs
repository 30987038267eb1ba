//! Hostile peers: malformed, oversized, truncated and random frames sent over
//! a raw TCP socket to a real `ferry serve`, before, during and after the
//! handshake.
//!
//! What the server must do (conn.rs, PROTOCOL.md):
//! - before authentication, frames over 1 KiB and anything but a correct
//!   `HELLO` then `AUTH` end the connection (an error reply first when the
//!   frame was whole: `EPROTO` for a bad `HELLO`, `EACCES` "authentication
//!   failed" for a bad `AUTH`);
//! - after it, a frame over the announced `max_frame` gets an `EMSGSIZE`
//!   reply naming the limit, then the connection ends, with one log line;
//!   every other frame gets exactly one reply with its id
//!   and op: `ENOSYS` for an unknown op, `EBADMSG` for a body that does not
//!   decode (short, invalid or with trailing bytes), `EINVAL` for a second
//!   handshake, `EBADF` for an unknown handle;
//! - one peer never blocks another, and the server never dies.
//!
//! After every scenario the server must be alive and a fresh, normal client
//! must still write and read a file. Every socket read is bounded by a
//! timeout, so no test can hang.

mod common;

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{random_bytes, Rng, Server};
use ferry_client::{Client, Options};
use ferry_proto::{
    caps, client_proof, op, server_proof, ErrorReply, Header, Reply, Request, Target, Time, Welcome, FLAG_ERROR,
    HEADER_LEN, MAGIC, MIN_MAX_FRAME,
};

const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// The server's limit before authentication (conn.rs `HANDSHAKE_MAX`).
const HANDSHAKE_MAX: u32 = 1024;

const EBADF: u32 = libc::EBADF as u32;
const EACCES: u32 = libc::EACCES as u32;
const ENOTDIR: u32 = libc::ENOTDIR as u32;
const EINVAL: u32 = libc::EINVAL as u32;
const ENOSYS: u32 = libc::ENOSYS as u32;
const EPROTO: u32 = libc::EPROTO as u32;
const EBADMSG: u32 = libc::EBADMSG as u32;

/// Every operation the protocol defines.
const VALID_OPS: [u16; 30] = [
    op::HELLO,
    op::AUTH,
    op::PING,
    op::OPEN,
    op::CLOSE,
    op::READ,
    op::PREAD,
    op::WRITE,
    op::PWRITE,
    op::SEEK,
    op::STAT,
    op::FSYNC,
    op::TRUNCATE,
    op::MKDIR,
    op::RMDIR,
    op::UNLINK,
    op::RENAME,
    op::LINK,
    op::SYMLINK,
    op::READLINK,
    op::CHMOD,
    op::CHOWN,
    op::UTIMENS,
    op::STATFS,
    op::ACCESS,
    op::GETXATTR,
    op::SETXATTR,
    op::LISTXATTR,
    op::REMOVEXATTR,
    op::READDIR,
];

// ---------------------------------------------------------------------------
// Raw frames

fn connect(server: &Server) -> TcpStream {
    let s = TcpStream::connect(server.addr()).expect("connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

fn header(len: u32, op: u16, flags: u16, id: u64) -> [u8; HEADER_LEN] {
    Header { len, op, flags, id }.encode()
}

/// A raw frame: header (with the true body length) and body.
fn frame(op: u16, id: u64, body: &[u8]) -> Vec<u8> {
    let mut v = header(body.len() as u32, op, 0, id).to_vec();
    v.extend_from_slice(body);
    v
}

fn encode(req: &Request<'_>, id: u64) -> Vec<u8> {
    let mut v = Vec::new();
    req.encode(id, &mut v);
    v.extend_from_slice(req.bulk());
    v
}

fn hello(id: u64, nonce: [u8; 32]) -> Vec<u8> {
    encode(&Request::Hello { min_version: 1, max_version: 1, caps: u64::MAX, max_frame: MIN_MAX_FRAME, nonce }, id)
}

/// What came back from the server.
#[derive(Debug)]
enum Got {
    Frame(Header, Vec<u8>),
    /// Orderly close (EOF) or reset: the connection is over.
    Closed,
}

/// Reads one frame, or notices the close. A timeout is a test failure.
fn read_frame(s: &mut TcpStream) -> Got {
    let mut hb = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match s.read(&mut hb[got..]) {
            Ok(0) if got == 0 => return Got::Closed,
            Ok(0) => panic!("connection closed in the middle of a reply header ({got} bytes)"),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset && got == 0 => return Got::Closed,
            Err(e) => panic!("reading a reply header: {e} (a timeout means the server neither replied nor closed)"),
        }
    }
    let h = Header::decode(&hb);
    assert!(h.len <= 64 * 1024 * 1024 + 4096, "absurd reply length {}", h.len);
    let mut body = vec![0u8; h.len as usize];
    s.read_exact(&mut body).unwrap_or_else(|e| panic!("reading a reply body of {} bytes: {e}", h.len));
    Got::Frame(h, body)
}

fn expect_frame(s: &mut TcpStream, what: &str) -> (Header, Vec<u8>) {
    match read_frame(s) {
        Got::Frame(h, b) => (h, b),
        Got::Closed => panic!("{what}: the server closed the connection instead of replying"),
    }
}

/// The next thing must be the end of the connection: no reply, no hang.
fn expect_closed(s: &mut TcpStream, what: &str) {
    match read_frame(s) {
        Got::Closed => {}
        Got::Frame(h, b) => panic!("{what}: expected the connection to close, got a frame {h:?} {b:?}"),
    }
}

/// Reads an error reply for (op, id) and returns its errno and message.
fn expect_error(s: &mut TcpStream, op: u16, id: u64, what: &str) -> (u32, String) {
    let (h, body) = expect_frame(s, what);
    assert!(h.flags & FLAG_ERROR != 0, "{what}: expected an error reply, got {h:?} {body:?}");
    assert_eq!((h.op, h.id), (op, id), "{what}: the error reply must echo the request's op and id");
    let e = ErrorReply::decode(&body).unwrap_or_else(|e| panic!("{what}: undecodable error reply: {e}"));
    (e.errno, e.message.to_string())
}

fn expect_errno(s: &mut TcpStream, op: u16, id: u64, errno: u32, what: &str) -> String {
    let (e, msg) = expect_error(s, op, id, what);
    assert_eq!(e, errno, "{what}: errno ({msg})");
    msg
}

/// A successful reply for (op, id), decoded.
fn expect_ok(s: &mut TcpStream, op: u16, id: u64, what: &str) -> Vec<u8> {
    let (h, body) = expect_frame(s, what);
    if h.flags & FLAG_ERROR != 0 {
        panic!("{what}: error reply {:?}", ErrorReply::decode(&body));
    }
    assert_eq!((h.op, h.id), (op, id), "{what}: reply op/id");
    Reply::decode(op, &body).unwrap_or_else(|e| panic!("{what}: undecodable reply: {e}"));
    body
}

fn send(s: &mut TcpStream, bytes: &[u8]) {
    s.write_all(bytes).expect("send");
}

/// The server may close while we still send (it refuses before reading
/// everything): a failed write is then expected, not an error.
fn send_lossy(s: &mut TcpStream, bytes: &[u8]) {
    let _ = s.write_all(bytes);
}

/// A complete, correct handshake done by hand; returns the authenticated
/// socket and the server's `Welcome`.
fn handshake(server: &Server) -> (TcpStream, Welcome) {
    let mut s = connect(server);
    let nonce: [u8; 32] = random_bytes(32, 0x5eed).try_into().unwrap();
    send(&mut s, &hello(1, nonce));
    let body = expect_ok(&mut s, op::HELLO, 1, "HELLO");
    let w = match Reply::decode(op::HELLO, &body).unwrap() {
        Reply::Welcome(w) => w,
        r => panic!("expected Welcome, got {r:?}"),
    };
    assert!(w.auth_required, "the harness serves with a token");
    let token = server.token();
    send(&mut s, &encode(&Request::Auth { proof: client_proof(&token, &w.nonce, &nonce) }, 2));
    let body = expect_ok(&mut s, op::AUTH, 2, "AUTH");
    match Reply::decode(op::AUTH, &body).unwrap() {
        Reply::AuthOk { proof } => assert_eq!(proof, server_proof(&token, &w.nonce, &nonce), "server proof"),
        r => panic!("expected AuthOk, got {r:?}"),
    }
    (s, w)
}

fn ping(s: &mut TcpStream, id: u64, what: &str) {
    send(s, &frame(op::PING, id, &[]));
    expect_ok(s, op::PING, id, &format!("PING after {what}"));
}

static HEALTH: AtomicU64 = AtomicU64::new(0);

/// The server is alive and a fresh, normal client can write and read a file
/// (in a thread with a deadline, so a wedged server fails instead of hangs).
fn assert_healthy(server: &mut Server, after: &str) {
    assert!(server.alive(), "the server died after {after}; log:\n{}", server.log());
    let n = HEALTH.fetch_add(1, Ordering::Relaxed);
    let (addr, opts) = (server.addr(), server.options());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = (|| -> Result<(), String> {
            let c = Client::connect(&addr, &Options { connect_timeout: IO_TIMEOUT, ..opts })
                .map_err(|e| format!("connect: {e}"))?;
            let name = format!("/health-{n}");
            let data = random_bytes(3000 + n as usize, n);
            c.write(&name, &data).map_err(|e| format!("write: {e}"))?;
            let back = c.read(&name).map_err(|e| format!("read: {e}"))?;
            if back != data {
                return Err("read back different data".into());
            }
            c.remove_file(&name).map_err(|e| format!("unlink: {e}"))
        })();
        let _ = tx.send(r);
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("after {after}, a normal client failed: {e}; log:\n{}", server.log()),
        Err(_) => panic!("after {after}, a normal client did not finish within 30 s; log:\n{}", server.log()),
    }
    assert!(server.alive(), "the server died after {after}");
    assert!(!server.log().contains("panicked"), "a server thread panicked after {after}; log:\n{}", server.log());
}

/// Waits until the server's log has a line containing all of `needles`.
fn wait_for_log(server: &Server, needles: &[&str]) -> String {
    let deadline = Instant::now() + IO_TIMEOUT;
    loop {
        let log = server.log();
        if log.lines().any(|l| needles.iter().all(|n| l.contains(n))) {
            return log;
        }
        assert!(Instant::now() < deadline, "no log line with {needles:?}; log:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------
// Before the handshake

#[test]
fn garbage_before_hello_closes() {
    let mut server = Server::start(&[]);
    // An HTTP request: "GET " read as a length is 0x20544547, far over the
    // handshake limit: closed without a reply.
    let mut s = connect(&server);
    send_lossy(&mut s, b"GET / HTTP/1.1\r\nHost: ferry\r\n\r\n");
    expect_closed(&mut s, "HTTP request");
    wait_for_log(&server, &[&s.local_addr().unwrap().to_string(), "exceeds the limit"]);
    assert_healthy(&mut server, "an HTTP request");

    // Random bytes, several seeds: whatever the header says, the server
    // answers at most one error reply (EPROTO) and closes.
    for seed in 1..=20u64 {
        let mut s = connect(&server);
        let junk = random_bytes(16 + (seed as usize * 37) % 200, seed * 7919);
        send_lossy(&mut s, &junk);
        let _ = s.shutdown(Shutdown::Write);
        match read_frame(&mut s) {
            Got::Closed => {}
            Got::Frame(h, body) => {
                assert!(h.flags & FLAG_ERROR != 0, "seed {seed}: a non-error reply to garbage: {h:?}");
                let e = ErrorReply::decode(&body).expect("error body");
                assert_eq!(e.errno, EPROTO, "seed {seed}: {}", e.message);
                expect_closed(&mut s, "after the refusal of garbage");
            }
        }
    }
    assert_healthy(&mut server, "random garbage");
}

#[test]
fn huge_length_before_hello_closes() {
    let mut server = Server::start(&[]);
    for (len, op) in [
        (u32::MAX, op::HELLO),
        (0x7FFF_FFFF, op::HELLO),
        (1_000_000, op::HELLO),
        (HANDSHAKE_MAX + 1, op::HELLO),
        (u32::MAX, op::PING),
    ] {
        let mut s = connect(&server);
        send_lossy(&mut s, &header(len, op, 0, 7));
        // Some body bytes too: the server must not wait for (or allocate) them.
        send_lossy(&mut s, &[0u8; 4096]);
        expect_closed(&mut s, &format!("len {len:#x} before HELLO"));
        wait_for_log(&server, &[&s.local_addr().unwrap().to_string(), &format!("frame body of {len} bytes exceeds")]);
        assert_healthy(&mut server, &format!("a header with len {len:#x}"));
    }
    // An oversized HELLO sent whole (1 MB of it).
    let mut s = connect(&server);
    let mut big = header(1_000_000, op::HELLO, 0, 1).to_vec();
    big.extend_from_slice(&MAGIC.to_le_bytes());
    big.resize(HEADER_LEN + 1_000_000, 0xAB);
    send_lossy(&mut s, &big);
    expect_closed(&mut s, "a 1 MB HELLO");
    assert_healthy(&mut server, "a 1 MB HELLO");
}

#[test]
fn hello_with_wrong_magic_is_refused() {
    let mut server = Server::start(&[]);
    let mut f = hello(42, [7; 32]);
    f[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(b"HTTP");
    let mut s = connect(&server);
    send(&mut s, &f);
    let msg = expect_errno(&mut s, op::HELLO, 42, EPROTO, "HELLO with a wrong magic");
    assert!(msg.contains("magic"), "message names the field: {msg}");
    expect_closed(&mut s, "after a refused HELLO");
    assert_healthy(&mut server, "a HELLO with a wrong magic");

    // Other bad HELLOs: short body, trailing byte, no common version, a frame
    // limit below the minimum.
    let good = hello(43, [7; 32]);
    let mut trailing = good.clone();
    trailing.push(0);
    trailing[0..4].copy_from_slice(&((good.len() - HEADER_LEN + 1) as u32).to_le_bytes());
    let short = frame(op::HELLO, 43, &good[HEADER_LEN..HEADER_LEN + 20]);
    let v9 = encode(
        &Request::Hello { min_version: 9, max_version: 9, caps: 0, max_frame: MIN_MAX_FRAME, nonce: [0; 32] },
        43,
    );
    let small =
        encode(&Request::Hello { min_version: 1, max_version: 1, caps: 0, max_frame: 4096, nonce: [0; 32] }, 43);
    for (what, f, errno) in [
        ("short HELLO", short, EPROTO),
        ("HELLO with a trailing byte", trailing, EPROTO),
        ("HELLO for version 9", v9, libc::EPROTONOSUPPORT as u32),
        ("HELLO with max_frame 4096", small, EPROTO),
    ] {
        let mut s = connect(&server);
        send(&mut s, &f);
        expect_errno(&mut s, op::HELLO, 43, errno, what);
        expect_closed(&mut s, what);
        assert_healthy(&mut server, what);
    }
}

#[test]
fn non_hello_first_is_refused() {
    let mut server = Server::start(&[]);
    let auth = encode(&Request::Auth { proof: [0; 32] }, 5);
    let stat = encode(&Request::Stat { target: Target::Path(b"/") }, 5);
    let read = encode(&Request::Read { handle: 1, count: 100 }, 5);
    for (what, f, op) in [
        ("PING first", frame(op::PING, 5, &[]), op::PING),
        ("AUTH first", auth, op::AUTH),
        ("STAT first", stat, op::STAT),
        ("READ first", read, op::READ),
        ("unknown op first", frame(999, 5, &[1, 2, 3]), 999),
    ] {
        let mut s = connect(&server);
        send(&mut s, &f);
        let msg = expect_errno(&mut s, op, 5, EPROTO, what);
        assert!(msg.contains("expected HELLO"), "{what}: {msg}");
        expect_closed(&mut s, what);
        assert_healthy(&mut server, what);
    }
}

#[test]
fn truncated_frame_then_close() {
    let mut server = Server::start(&[]);
    for cut in [1usize, 8, 15, 16, 20, 67] {
        let f = hello(9, [1; 32]);
        assert_eq!(f.len(), 68);
        let mut s = connect(&server);
        send(&mut s, &f[..cut]);
        s.shutdown(Shutdown::Write).unwrap();
        expect_closed(&mut s, &format!("a HELLO cut after {cut} bytes"));
        if cut > HEADER_LEN {
            wait_for_log(&server, &[&s.local_addr().unwrap().to_string(), "truncated frame"]);
        }
        assert_healthy(&mut server, &format!("a HELLO cut after {cut} bytes"));
    }
    // The same after authentication.
    let (mut s, _) = handshake(&server);
    let f = encode(&Request::Stat { target: Target::Path(b"/some/path") }, 3);
    send(&mut s, &f[..f.len() - 4]);
    s.shutdown(Shutdown::Write).unwrap();
    expect_closed(&mut s, "a STAT cut short after the handshake");
    wait_for_log(&server, &[&s.local_addr().unwrap().to_string(), "truncated frame"]);
    assert_healthy(&mut server, "a truncated frame after the handshake");
}

#[test]
fn connect_and_close_immediately() {
    let mut server = Server::start(&[]);
    for _ in 0..100 {
        drop(TcpStream::connect(server.addr()).expect("connect"));
    }
    // And a few that reset instead of closing.
    for _ in 0..20 {
        let s = TcpStream::connect(server.addr()).expect("connect");
        socket_linger_zero(&s);
        drop(s);
    }
    assert_healthy(&mut server, "200 connections closed at once");
}

/// SO_LINGER 0: close sends RST.
fn socket_linger_zero(s: &TcpStream) {
    rustix::net::sockopt::set_socket_linger(s, Some(Duration::ZERO)).expect("SO_LINGER");
}

#[test]
fn stalled_peers_do_not_block_others() {
    let mut server = Server::start(&[]);
    let mut stalled = Vec::new();
    // Half a header.
    for _ in 0..10 {
        let mut s = connect(&server);
        send(&mut s, &hello(1, [0; 32])[..8]);
        stalled.push(s);
    }
    // A whole header, part of the body.
    let mut s = connect(&server);
    send(&mut s, &hello(1, [0; 32])[..30]);
    stalled.push(s);
    // Nothing at all.
    stalled.push(connect(&server));
    // HELLO done, AUTH never sent.
    let mut s = connect(&server);
    send(&mut s, &hello(1, [0; 32]));
    expect_ok(&mut s, op::HELLO, 1, "HELLO");
    stalled.push(s);
    // Authenticated, then half a request.
    let (mut s, _) = handshake(&server);
    send(&mut s, &encode(&Request::Stat { target: Target::Path(b"/") }, 3)[..10]);
    stalled.push(s);

    // Meanwhile normal clients work, promptly, several at once.
    let start = Instant::now();
    let workers: Vec<_> = (0..4)
        .map(|i| {
            let (addr, opts) = (server.addr(), server.options());
            std::thread::spawn(move || {
                let c = Client::connect(&addr, &opts).expect("connect while others stall");
                for k in 0..20 {
                    let name = format!("/concurrent-{i}-{k}");
                    c.write(&name, name.as_bytes()).unwrap();
                    assert_eq!(c.read(&name).unwrap(), name.as_bytes());
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a normal client failed while others stalled");
    }
    assert!(start.elapsed() < Duration::from_secs(10), "normal clients were slowed down: {:?}", start.elapsed());
    assert_healthy(&mut server, "14 stalled connections (still open)");
    // The stalled ones are still waiting, not dropped (no idle timeout yet)...
    let mut s = stalled.pop().unwrap();
    send(&mut s, &encode(&Request::Stat { target: Target::Path(b"/") }, 3)[10..]);
    expect_ok(&mut s, op::STAT, 3, "the completed STAT of a stalled, authenticated connection");
    // ...and their going away changes nothing.
    drop(stalled);
    assert_healthy(&mut server, "the stalled connections closing");
}

/// Unauthenticated peers that connect and say nothing must not hold the
/// connection slots for the whole idle timeout (an hour by default): anyone
/// who can reach the port could lock every user out. With 4 slots and 4
/// silent peers, a real client must get in within a handshake-sized delay.
#[test]
fn silent_unauthenticated_peers_do_not_hold_all_slots() {
    let mut server = Server::start(&["--max-connections", "4"]);
    let mut silent: Vec<TcpStream> = (0..4).map(|_| connect(&server)).collect();
    send(&mut silent[0], &hello(1, [0; 32])[..8]);
    // Let the server accept them all.
    std::thread::sleep(Duration::from_millis(300));
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut last;
    let mut attempts = 0;
    loop {
        attempts += 1;
        match Client::connect(&server.addr(), &server.options()) {
            Ok(c) => {
                c.write("/got-in", b"yes").unwrap();
                break;
            }
            Err(e) => last = e.to_string(),
        }
        assert!(
            Instant::now() < deadline,
            "4 silent, unauthenticated connections locked a real client out for 15 s ({attempts} attempts, last error: \
             {last}); log:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    drop(silent);
    assert_healthy(&mut server, "silent unauthenticated peers");
}

#[test]
fn idle_timeout_closes_a_stalled_handshake() {
    let mut server = Server::start(&["--idle-timeout", "1"]);
    let mut s = connect(&server);
    send(&mut s, &hello(1, [0; 32])[..8]);
    let start = Instant::now();
    expect_closed(&mut s, "half a header with --idle-timeout 1");
    assert!(start.elapsed() < Duration::from_secs(5), "closed only after {:?}", start.elapsed());
    assert_healthy(&mut server, "an idle timeout");
}

// ---------------------------------------------------------------------------
// Authentication

/// Builds the second frame of a handshake from the server's `Welcome`.
type MakeAuth = Box<dyn Fn(&Welcome) -> Vec<u8>>;

#[test]
fn wrong_proof_is_refused_and_closed() {
    let mut server = Server::start(&[]);
    let token = server.token();
    let nonce = [3u8; 32];
    let attempts: Vec<(&str, MakeAuth)> = vec![
        ("zero proof", Box::new(|_| encode(&Request::Auth { proof: [0; 32] }, 2))),
        (
            "proof with the wrong token",
            Box::new(move |w| encode(&Request::Auth { proof: client_proof(b"not the token", &w.nonce, &nonce) }, 2)),
        ),
        (
            "the server's proof instead of the client's",
            Box::new({
                let token = token.clone();
                move |w| encode(&Request::Auth { proof: server_proof(&token, &w.nonce, &nonce) }, 2)
            }),
        ),
        (
            "nonces swapped",
            Box::new({
                let token = token.clone();
                move |w| encode(&Request::Auth { proof: client_proof(&token, &nonce, &w.nonce) }, 2)
            }),
        ),
        ("short AUTH body", Box::new(|_| frame(op::AUTH, 2, &[1; 31]))),
        ("AUTH with a trailing byte", Box::new(|_| frame(op::AUTH, 2, &[1; 33]))),
        ("PING instead of AUTH", Box::new(|_| frame(op::PING, 2, &[]))),
        ("second HELLO instead of AUTH", Box::new(move |_| hello(2, nonce))),
    ];
    for (what, make) in &attempts {
        let mut s = connect(&server);
        send(&mut s, &hello(1, nonce));
        let body = expect_ok(&mut s, op::HELLO, 1, "HELLO");
        let Reply::Welcome(w) = Reply::decode(op::HELLO, &body).unwrap() else { panic!("no Welcome") };
        let f = make(&w);
        let op = Header::decode(&f[..HEADER_LEN].try_into().unwrap()).op;
        send(&mut s, &f);
        let msg = expect_errno(&mut s, op, 2, EACCES, what);
        assert_eq!(msg, "authentication failed", "{what}");
        expect_closed(&mut s, what);
        wait_for_log(&server, &[&s.local_addr().unwrap().to_string(), "authentication failed"]);
        assert_healthy(&mut server, what);
    }

    // A proof recorded from a successful session does not open another:
    // the server's nonce changes every time.
    let mut s1 = connect(&server);
    send(&mut s1, &hello(1, nonce));
    let body = expect_ok(&mut s1, op::HELLO, 1, "HELLO");
    let Reply::Welcome(w1) = Reply::decode(op::HELLO, &body).unwrap() else { panic!() };
    let recorded = client_proof(&token, &w1.nonce, &nonce);
    send(&mut s1, &encode(&Request::Auth { proof: recorded }, 2));
    expect_ok(&mut s1, op::AUTH, 2, "the genuine AUTH");
    let mut s2 = connect(&server);
    send(&mut s2, &hello(1, nonce));
    let body = expect_ok(&mut s2, op::HELLO, 1, "HELLO");
    let Reply::Welcome(w2) = Reply::decode(op::HELLO, &body).unwrap() else { panic!() };
    assert_ne!(w1.nonce, w2.nonce, "the server reused its nonce");
    send(&mut s2, &encode(&Request::Auth { proof: recorded }, 2));
    expect_errno(&mut s2, op::AUTH, 2, EACCES, "a replayed proof");
    expect_closed(&mut s2, "a replayed proof");
    ping(&mut s1, 3, "another connection's failed replay");
    assert_healthy(&mut server, "a replayed proof");
}

// ---------------------------------------------------------------------------
// After the handshake

#[test]
fn unknown_op_gets_enosys_and_the_connection_stays() {
    let mut server = Server::start(&[]);
    let (mut s, _) = handshake(&server);
    for (i, op) in [0u16, 4, 9, 90, 100, 999, 0x7FFF, 0xFFFF].into_iter().enumerate() {
        let id = 0xDEAD_0000_0000 + i as u64;
        send(&mut s, &frame(op, id, &[1, 2, 3, 4]));
        let msg = expect_errno(&mut s, op, id, ENOSYS, &format!("unknown op {op}"));
        assert!(msg.contains(&op.to_string()), "{msg}");
        ping(&mut s, id + 1000, &format!("unknown op {op}"));
    }
    // A burst of them pipelined: one reply each (matched by id: replies
    // may come in any order, PROTOCOL.md section 2).
    let mut burst = Vec::new();
    for i in 0..200u64 {
        burst.extend(frame(500 + i as u16, 10_000 + i, &random_bytes(i as usize % 50, i)));
    }
    send(&mut s, &burst);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..200u64 {
        let (h, body) = expect_frame(&mut s, "pipelined unknown op");
        let i = h.id.wrapping_sub(10_000);
        assert!(i < 200 && seen.insert(i), "reply id {} unasked or repeated", h.id);
        assert_eq!(h.op, 500 + i as u16, "the reply echoes its request's op");
        assert!(h.flags & FLAG_ERROR != 0, "an error reply");
        assert_eq!(ErrorReply::decode(&body).unwrap().errno, ENOSYS);
    }
    ping(&mut s, 99, "a burst of unknown ops");
    assert!(server.alive());
    wait_for_log(&server, &["bad request (op 999)"]);
    assert_healthy(&mut server, "unknown ops");
}

#[test]
fn undecodable_bodies_get_ebadmsg() {
    let mut server = Server::start(&[]);
    let (mut s, _) = handshake(&server);
    let stat_x = encode(&Request::Stat { target: Target::Path(b"x") }, 0)[HEADER_LEN..].to_vec();
    let cases: Vec<(&str, u16, Vec<u8>)> = vec![
        ("STAT with body [9,9,9]", op::STAT, vec![9, 9, 9]),
        ("STAT with an empty body", op::STAT, vec![]),
        ("STAT with an unknown target kind", op::STAT, vec![7, 0, 0, 0, 0, 0, 0, 0, 0]),
        ("STAT with a string longer than the body", op::STAT, vec![1, 0xFF, 0xFF, b'a']),
        ("STAT with a trailing byte", op::STAT, [stat_x.clone(), vec![0]].concat()),
        ("PING with a body", op::PING, vec![0]),
        ("CLOSE with 7 bytes", op::CLOSE, vec![1; 7]),
        ("CLOSE with 9 bytes", op::CLOSE, vec![1; 9]),
        ("FSYNC with datasync 2", op::FSYNC, [1u64.to_le_bytes().to_vec(), vec![2]].concat()),
        ("OPEN with no path", op::OPEN, vec![0; 8]),
        ("READDIR with plus 7", op::READDIR, [vec![0; 20], vec![7]].concat()),
        ("SETXATTR with a value length past the end", op::SETXATTR, {
            let mut b = vec![0, 0, 0, 0, 1, 1, 0, b'x', 1, 0, b'n'];
            b.extend_from_slice(&u32::MAX.to_le_bytes());
            b
        }),
        ("RENAME with one path", op::RENAME, vec![0, 0, 0, 0, 1, 0, b'a']),
        ("UTIMENS cut in a time", op::UTIMENS, vec![0; 10]),
    ];
    for (i, (what, op, body)) in cases.iter().enumerate() {
        let id = 1000 + i as u64;
        send(&mut s, &frame(*op, id, body));
        expect_errno(&mut s, *op, id, EBADMSG, what);
        ping(&mut s, id + 500, what);
    }
    // Names are bytes: one that is not UTF-8 decodes (and is not there);
    // a NUL, which no Linux name holds, is refused as the kernel would.
    send(&mut s, &frame(op::STAT, 3000, &[1, 2, 0, 0xFF, 0xFE]));
    expect_errno(&mut s, op::STAT, 3000, libc::ENOENT as u32, "STAT of a name that is not UTF-8");
    send(&mut s, &frame(op::STAT, 3001, &[1, 3, 0, b'a', 0, b'b']));
    expect_errno(&mut s, op::STAT, 3001, libc::EINVAL as u32, "STAT of a name with a NUL");
    assert_healthy(&mut server, "undecodable bodies");
}

#[test]
fn frame_over_max_frame_gets_an_error_reply_then_a_close_and_one_log_line() {
    let mut server = Server::start(&[]);
    for len in [0x7FFF_FFFFu32, u32::MAX, 0] {
        let (mut s, welcome) = handshake(&server);
        let len = if len == 0 { welcome.max_frame + 1 } else { len };
        let peer = s.local_addr().unwrap().to_string();
        ping(&mut s, 3, "the handshake");
        send_lossy(&mut s, &header(len, op::WRITE, 0, 4));
        send_lossy(&mut s, &[0u8; 1024]);
        // Told why, then closed.
        let msg = expect_errno(&mut s, op::WRITE, 4, libc::EMSGSIZE as u32, &format!("a frame of {len:#x} bytes"));
        assert!(msg.contains("exceeds the limit"), "{msg}");
        expect_closed(&mut s, &format!("a frame of {len:#x} bytes"));
        wait_for_log(&server, &[&peer, "exceeds the limit"]);
        // Let any further line land before counting.
        std::thread::sleep(Duration::from_millis(200));
        let log = server.log();
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(&peer)).collect();
        assert_eq!(lines.len(), 1, "expected exactly one log line for {peer}, got {lines:#?}");
        assert!(lines[0].contains(&format!("frame body of {len} bytes exceeds the limit of {}", welcome.max_frame)));
        assert_healthy(&mut server, &format!("a frame of {len:#x} bytes"));
    }
    // Exactly max_frame is allowed (and must be sent whole).
    let (mut s, welcome) = handshake(&server);
    let data = vec![0x5Au8; welcome.max_frame as usize - 16];
    let f = encode(&Request::Open { path: b"/big", flags: (libc::O_CREAT | libc::O_WRONLY) as u32, mode: 0o644 }, 5);
    send(&mut s, &f);
    let body = expect_ok(&mut s, op::OPEN, 5, "OPEN /big");
    let Reply::Opened { handle, .. } = Reply::decode(op::OPEN, &body).unwrap() else { panic!() };
    let w = encode(&Request::Pwrite { handle, offset: 0, data: &data }, 6);
    assert_eq!(w.len() - HEADER_LEN, welcome.max_frame as usize, "a frame of exactly max_frame");
    send(&mut s, &w);
    expect_ok(&mut s, op::PWRITE, 6, "a PWRITE of exactly max_frame");
    assert_eq!(std::fs::metadata(server.export.path().join("big")).unwrap().len(), data.len() as u64);
    assert_healthy(&mut server, "a frame of exactly max_frame");
}

/// Commits run beside the other requests, so their replies may come out of
/// order; a client that sends far more than its window of them, without
/// reading, gets every one answered once and leaves the server healthy.
#[test]
fn a_flood_of_fsyncs_is_answered_once_each() {
    let mut server = Server::start(&[]);
    let (mut s, welcome) = handshake(&server);
    let f = encode(&Request::Open { path: b"/c", flags: (libc::O_CREAT | libc::O_WRONLY) as u32, mode: 0o644 }, 5);
    send(&mut s, &f);
    let body = expect_ok(&mut s, op::OPEN, 5, "OPEN /c");
    let Reply::Opened { handle, .. } = Reply::decode(op::OPEN, &body).unwrap() else { panic!() };
    let n = 20 * welcome.window_requests as u64;
    let mut burst = Vec::new();
    for id in 0..n {
        burst.extend(encode(&Request::Pwrite { handle, offset: id, data: b"x" }, 1_000_000 + id));
        burst.extend(encode(&Request::Fsync { handle, datasync: id % 2 == 0 }, 2_000_000 + id));
    }
    let mut w = s.try_clone().unwrap();
    let sender = std::thread::spawn(move || w.write_all(&burst).unwrap());
    let mut seen = std::collections::HashSet::new();
    for _ in 0..2 * n {
        let (h, _) = expect_frame(&mut s, "a reply in the flood");
        assert_eq!(h.flags, 0, "request {} failed", h.id);
        assert!(seen.insert(h.id), "request {} answered twice", h.id);
    }
    sender.join().unwrap();
    assert_eq!(std::fs::metadata(server.export.path().join("c")).unwrap().len(), n);
    assert_healthy(&mut server, "a flood of fsyncs");
}

#[test]
fn second_handshake_after_auth_is_refused() {
    let mut server = Server::start(&[]);
    let (mut s, w) = handshake(&server);
    send(&mut s, &hello(10, [9; 32]));
    expect_errno(&mut s, op::HELLO, 10, EINVAL, "a second HELLO");
    ping(&mut s, 11, "a second HELLO");
    let token = server.token();
    send(&mut s, &encode(&Request::Auth { proof: client_proof(&token, &w.nonce, &[9; 32]) }, 12));
    expect_errno(&mut s, op::AUTH, 12, EINVAL, "a second AUTH");
    ping(&mut s, 13, "a second AUTH");
    // A bad HELLO body after the handshake: a decoding error, not a close.
    let mut bad = hello(14, [9; 32]);
    bad[HEADER_LEN] ^= 0xFF;
    send(&mut s, &bad);
    expect_errno(&mut s, op::HELLO, 14, EBADMSG, "a second HELLO with a bad magic");
    ping(&mut s, 15, "a bad second HELLO");
    assert_healthy(&mut server, "a second handshake");
}

#[test]
fn unknown_handles_get_ebadf() {
    let mut server = Server::start(&[]);
    let (mut s, _) = handshake(&server);
    let h = 12345u64;
    let t = Time { sec: 1, nsec: 0 };
    let reqs: Vec<(&str, Request<'_>)> = vec![
        ("READ", Request::Read { handle: h, count: 100 }),
        ("PREAD", Request::Pread { handle: h, offset: 0, count: 100 }),
        ("WRITE", Request::Write { handle: h, data: b"data" }),
        ("PWRITE", Request::Pwrite { handle: h, offset: 0, data: b"data" }),
        ("SEEK", Request::Seek { handle: h, offset: 0, whence: 0 }),
        ("FSYNC", Request::Fsync { handle: h, datasync: false }),
        ("CLOSE", Request::Close { handle: h }),
        ("STAT", Request::Stat { target: Target::Handle(h) }),
        ("TRUNCATE", Request::Truncate { target: Target::Handle(h), size: 0 }),
        ("CHMOD", Request::Chmod { target: Target::Handle(h), mode: 0o777 }),
        ("CHOWN", Request::Chown { target: Target::Handle(h), uid: 0, gid: 0 }),
        ("UTIMENS", Request::Utimens { target: Target::Handle(h), atime: t, mtime: t }),
        ("GETXATTR", Request::GetXattr { target: Target::Handle(h), name: b"user.x", size: 0 }),
        ("SETXATTR", Request::SetXattr { target: Target::Handle(h), name: b"user.x", value: b"v", flags: 0 }),
        ("LISTXATTR", Request::ListXattr { target: Target::Handle(h), size: 0 }),
        ("REMOVEXATTR", Request::RemoveXattr { target: Target::Handle(h), name: b"user.x" }),
        ("READDIR", Request::ReadDir { handle: h, cookie: 0, max_entries: 10, plus: false }),
    ];
    for (i, (what, req)) in reqs.iter().enumerate() {
        let id = 100 + i as u64;
        send(&mut s, &encode(req, id));
        expect_errno(&mut s, req.op(), id, EBADF, &format!("{what} on a handle never opened"));
    }
    ping(&mut s, 1, "EBADF");

    // Handles belong to their connection, and die with CLOSE.
    std::fs::write(server.export.path().join("file"), b"content").unwrap();
    send(&mut s, &encode(&Request::Open { path: b"/file", flags: libc::O_RDONLY as u32, mode: 0 }, 200));
    let body = expect_ok(&mut s, op::OPEN, 200, "OPEN");
    let Reply::Opened { handle, .. } = Reply::decode(op::OPEN, &body).unwrap() else { panic!() };
    let (mut other, _) = handshake(&server);
    send(&mut other, &encode(&Request::Pread { handle, offset: 0, count: 7 }, 201));
    expect_errno(&mut other, op::PREAD, 201, EBADF, "another connection's handle");
    send(&mut s, &encode(&Request::Pread { handle, offset: 0, count: 7 }, 202));
    let body = expect_ok(&mut s, op::PREAD, 202, "PREAD on its own connection");
    assert_eq!(body, b"content");
    send(&mut s, &encode(&Request::Close { handle }, 203));
    expect_ok(&mut s, op::CLOSE, 203, "CLOSE");
    send(&mut s, &encode(&Request::Pread { handle, offset: 0, count: 7 }, 204));
    expect_errno(&mut s, op::PREAD, 204, EBADF, "PREAD after CLOSE");
    send(&mut s, &encode(&Request::Close { handle }, 205));
    expect_errno(&mut s, op::CLOSE, 205, EBADF, "a second CLOSE");
    ping(&mut s, 206, "handle misuse");
    assert_healthy(&mut server, "unknown handles");
}

#[test]
fn readdir_on_a_file_handle_is_enotdir() {
    let mut server = Server::start(&[]);
    std::fs::write(server.export.path().join("file"), b"content").unwrap();
    let (mut s, _) = handshake(&server);
    send(&mut s, &encode(&Request::Open { path: b"/file", flags: libc::O_RDWR as u32, mode: 0 }, 1));
    let body = expect_ok(&mut s, op::OPEN, 1, "OPEN");
    let Reply::Opened { handle, .. } = Reply::decode(op::OPEN, &body).unwrap() else { panic!() };
    for plus in [false, true] {
        send(&mut s, &encode(&Request::ReadDir { handle, cookie: 0, max_entries: 100, plus }, 2));
        expect_errno(&mut s, op::READDIR, 2, ENOTDIR, "READDIR on a file handle");
    }
    // And the handle still reads.
    send(&mut s, &encode(&Request::Pread { handle, offset: 0, count: 100 }, 3));
    assert_eq!(expect_ok(&mut s, op::PREAD, 3, "PREAD"), b"content");
    // Hostile values on a real handle: answered, not fatal.
    for (i, req) in [
        Request::Seek { handle, offset: i64::MIN, whence: 0 },
        Request::Seek { handle, offset: i64::MAX, whence: 1 },
        Request::Seek { handle, offset: 0, whence: 99 },
        Request::Pread { handle, offset: u64::MAX, count: u32::MAX },
        Request::Pread { handle, offset: i64::MAX as u64, count: 10 },
        Request::Read { handle, count: u32::MAX },
        Request::ReadDir { handle, cookie: u64::MAX, max_entries: u32::MAX, plus: true },
        Request::Truncate { target: Target::Handle(handle), size: u64::MAX },
        Request::Pwrite { handle, offset: u64::MAX - 1, data: b"xx" },
        Request::Pwrite { handle, offset: i64::MAX as u64 - 1, data: b"xx" },
        Request::Write { handle, data: b"xx" },
    ]
    .iter()
    .enumerate()
    {
        let id = 10 + i as u64;
        send(&mut s, &encode(req, id));
        let (h, body) = expect_frame(&mut s, &format!("{req:?}"));
        assert_eq!((h.op, h.id), (req.op(), id), "{req:?}");
        if h.flags & FLAG_ERROR != 0 {
            ErrorReply::decode(&body).unwrap();
        } else {
            Reply::decode(h.op, &body).unwrap_or_else(|e| panic!("{req:?}: {e}"));
        }
    }
    ping(&mut s, 99, "hostile values on a real handle");
    assert_healthy(&mut server, "READDIR on a file handle");
}

// ---------------------------------------------------------------------------
// Random frames

/// Sends `frames` one at a time; each must get exactly one reply with its
/// id and op (an error or a decodable success), or the connection may close
/// cleanly, after which a new one is made. Returns (replies, closes).
fn run_random(
    server: &Server,
    s: &mut TcpStream,
    frames: impl Iterator<Item = (u16, u64, Vec<u8>)>,
    seed: u64,
) -> (u64, u64) {
    let (mut replies, mut closes) = (0u64, 0u64);
    // errno (0 = success) -> count, to show what the frames reached.
    let mut outcomes: std::collections::BTreeMap<u32, u64> = Default::default();
    for (n, (op, id, body)) in frames.enumerate() {
        let mut f = header(body.len() as u32, op, (id >> 48) as u16, id).to_vec();
        f.extend_from_slice(&body);
        if s.write_all(&f).is_err() {
            closes += 1;
            *s = handshake(server).0;
            continue;
        }
        match read_frame(s) {
            Got::Closed => {
                closes += 1;
                *s = handshake(server).0;
            }
            Got::Frame(h, rb) => {
                assert_eq!(
                    (h.id, h.op),
                    (id, op),
                    "seed {seed:#x}, frame {n} (op {op}, body {body:?}): reply for another request"
                );
                if h.flags & FLAG_ERROR != 0 {
                    let e = ErrorReply::decode(&rb)
                        .unwrap_or_else(|e| panic!("seed {seed:#x}, frame {n}: undecodable error reply: {e}"));
                    assert!(e.errno > 0 && e.errno < 4096, "seed {seed:#x}, frame {n}: errno {}", e.errno);
                    *outcomes.entry(e.errno).or_default() += 1;
                } else {
                    *outcomes.entry(0).or_default() += 1;
                    Reply::decode(op, &rb)
                        .unwrap_or_else(|e| panic!("seed {seed:#x}, frame {n} (op {op}, body {body:?}): {e}"));
                }
                replies += 1;
            }
        }
    }
    // Nothing extra is queued: the next reply is the PING's.
    ping(s, 0xABCD_EF01, "the random frames");
    eprintln!("seed {seed:#x}: outcomes by errno (0 = success): {outcomes:?}");
    assert!(outcomes.len() > 3, "the random frames all ended the same way: {outcomes:?}");
    (replies, closes)
}

#[test]
fn ten_thousand_random_frames() {
    let mut server = Server::start(&[]);
    let ex = server.export.path();
    std::fs::write(ex.join("f"), b"a file for random requests").unwrap();
    std::fs::create_dir(ex.join("d")).unwrap();
    let (mut s, _) = handshake(&server);
    // Some real handles, so random handle numbers sometimes hit one.
    for (i, (p, fl)) in [("/f", libc::O_RDWR), ("/d", libc::O_RDONLY | libc::O_DIRECTORY), ("/f", libc::O_RDONLY)]
        .into_iter()
        .enumerate()
    {
        send(&mut s, &encode(&Request::Open { path: p.as_bytes(), flags: fl as u32, mode: 0 }, 1 + i as u64));
        expect_ok(&mut s, op::OPEN, 1 + i as u64, "OPEN");
    }

    // Phase 1: random op among the valid ones, random body of 0-64 bytes.
    let seed = 0x0F0E_BAD5_EED5_u64;
    let mut rng = Rng::new(seed);
    let frames: Vec<(u16, u64, Vec<u8>)> = (0..10_000u64)
        .map(|i| {
            let op = VALID_OPS[rng.below(VALID_OPS.len() as u64) as usize];
            let len = rng.below(65) as usize;
            let mut body = rng.bytes(len);
            // Bias some bodies toward real handles and short strings, so the
            // decoder passes and the backend runs.
            if len >= 8 && rng.below(3) == 0 {
                body[..8].copy_from_slice(&(1 + rng.below(4)).to_le_bytes());
            }
            (op, (rng.next() & 0xFFFF_0000_0000_0000) | (1000 + i), body)
        })
        .collect();
    let start = Instant::now();
    let (replies, closes) = run_random(&server, &mut s, frames.into_iter(), seed);
    eprintln!("random frames: {replies} replies, {closes} closes in {:?}", start.elapsed());
    assert_eq!(replies + closes, 10_000);
    // No frame here exceeds max_frame, so none may end the connection.
    assert_eq!(closes, 0, "the server closed the connection on a frame under its limit");
    assert_healthy(&mut server, "10,000 random frames");

    // Phase 2: well-formed requests with random fields on a few paths
    // (deeper: they reach the backend).
    let seed = 0x5EED_0002_u64;
    let mut rng = Rng::new(seed);
    let paths = ["/f", "/d", "/d/x", "/g", "/", "..", "/d/../f", "/l", "/nope/x", ""];
    let mut frames = Vec::new();
    for i in 0..3000u64 {
        let p = paths[rng.below(paths.len() as u64) as usize];
        let q = paths[rng.below(paths.len() as u64) as usize];
        let handle = 1 + rng.below(6);
        let target = match rng.below(3) {
            0 => Target::Handle(handle),
            1 => Target::Path(p.as_bytes()),
            _ => Target::PathNoFollow(p.as_bytes()),
        };
        let n = rng.below(65) as usize;
        let data = rng.bytes(n);
        let t = Time { sec: rng.next() as i64 >> 20, nsec: rng.next() as u32 };
        let req = match rng.below(27) {
            0 => Request::Ping,
            1 => Request::Open {
                path: p.as_bytes(),
                flags: rng.next() as u32 & !(libc::O_TRUNC as u32),
                mode: rng.next() as u32,
            },
            2 => Request::Close { handle },
            3 => Request::Read { handle, count: rng.below(1 << 16) as u32 },
            4 => Request::Pread { handle, offset: rng.below(1 << 20), count: rng.below(1 << 16) as u32 },
            5 => Request::Write { handle, data: &data },
            6 => Request::Pwrite { handle, offset: rng.below(1 << 20), data: &data },
            7 => Request::Seek { handle, offset: rng.next() as i64, whence: rng.below(6) as u32 },
            8 => Request::Stat { target },
            9 => Request::Fsync { handle, datasync: rng.below(2) == 0 },
            10 => Request::Truncate { target, size: rng.below(1 << 20) },
            11 => Request::Mkdir { path: p.as_bytes(), mode: rng.next() as u32 },
            12 => Request::Rmdir { path: p.as_bytes() },
            13 => Request::Unlink { path: p.as_bytes() },
            14 => Request::Rename { from: p.as_bytes(), to: q.as_bytes(), flags: rng.below(4) as u32 },
            15 => Request::Link { from: p.as_bytes(), to: q.as_bytes() },
            16 => Request::Symlink { target: q.as_bytes(), path: p.as_bytes() },
            17 => Request::Readlink { path: p.as_bytes() },
            // Keep the owner's access, so a non-root run can still use the export.
            18 => Request::Chmod { target, mode: rng.next() as u32 | 0o700 },
            19 => Request::Chown { target, uid: rng.next() as u32, gid: rng.next() as u32 },
            20 => Request::Utimens { target, atime: t, mtime: t },
            21 => Request::Statfs { path: p.as_bytes() },
            22 => Request::Access { path: p.as_bytes(), mode: rng.below(16) as u32 },
            23 => Request::GetXattr { target, name: b"user.k", size: rng.below(100) as u32 },
            24 => Request::SetXattr { target, name: b"user.k", value: &data, flags: rng.below(4) as u32 },
            25 => Request::ListXattr { target, size: rng.below(100) as u32 },
            _ => Request::ReadDir { handle, cookie: rng.below(5), max_entries: rng.below(10) as u32, plus: true },
        };
        let f = encode(&req, 0);
        frames.push((req.op(), 50_000 + i, f[HEADER_LEN..].to_vec()));
    }
    let (replies, closes) = run_random(&server, &mut s, frames.into_iter(), seed);
    eprintln!("structured random requests: {replies} replies, {closes} closes");
    assert_eq!(closes, 0, "the server closed the connection on a well-formed request");
    assert_healthy(&mut server, "3,000 random well-formed requests");
}

/// One authenticated connection opening handles until the server refuses
/// must not lock everyone else out. The per-connection limit (`max_handles`,
/// 65536 by default) exceeds the process's descriptor limit, so the flood is
/// sized from the limit the server inherits from this process.
#[test]
fn handle_flood_does_not_lock_out_other_clients() {
    let mut server = Server::start(&[]);
    std::fs::write(server.export.path().join("file"), b"content").unwrap();
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(u64::MAX);
    let n = limit.saturating_add(1000).min(70_000);
    let (mut s, _) = handshake(&server);
    let mut burst = Vec::new();
    for i in 0..n {
        burst.extend(encode(&Request::Open { path: b"/file", flags: libc::O_RDONLY as u32, mode: 0 }, 10 + i));
    }
    let mut w = s.try_clone().unwrap();
    let sender = std::thread::spawn(move || w.write_all(&burst).unwrap());
    let mut errs = std::collections::BTreeMap::<u32, u64>::new();
    // Replies are matched by id: a slow open lets the ones behind it
    // answer first (PROTOCOL.md section 10).
    let mut seen = std::collections::HashSet::new();
    for _ in 0..n {
        let (h, body) = expect_frame(&mut s, "OPEN in a flood");
        assert_eq!(h.op, op::OPEN);
        assert!((10..10 + n).contains(&h.id) && seen.insert(h.id), "reply id {} unasked or repeated", h.id);
        if h.flags & FLAG_ERROR != 0 {
            *errs.entry(ErrorReply::decode(&body).unwrap().errno).or_default() += 1;
        }
    }
    sender.join().unwrap();
    eprintln!("{n} OPENs with RLIMIT_NOFILE {limit}: errors by errno {errs:?}");
    // The flooding connection is still open, holding its handles.
    assert_healthy(&mut server, &format!("one connection opening {n} handles"));
    ping(&mut s, 1, "the flood");
}

/// Lease frames no ferry client sends: a `LeaseReturn` for a break never
/// sent (answered by nothing, changes nothing), a `LeaseBreak` sent as a
/// request (unknown: `ENOSYS`), `LeaseOn` twice; then a raw holder that
/// never returns its break delays another client's change by at most the
/// lease time, and the server goes on serving.
#[test]
fn lease_frames_from_a_raw_client_change_nothing_and_a_silent_holder_is_bounded() {
    let mut server = Server::start(&["--lease-time", "1"]);
    std::fs::write(server.export.path().join("f"), "1").unwrap();
    let (mut s, w) = handshake(&server);
    assert!(w.caps & caps::LEASES != 0, "leases offered");
    send(&mut s, &encode(&Request::LeaseReturn { seq: u64::MAX }, 0));
    ping(&mut s, 10, "a LeaseReturn nobody asked for");
    send(&mut s, &frame(op::LEASE_BREAK, 11, &[0; 12]));
    expect_errno(&mut s, op::LEASE_BREAK, 11, ENOSYS, "a LeaseBreak from a client");
    for id in [12, 13] {
        send(&mut s, &encode(&Request::LeaseOn, id));
        let body = expect_ok(&mut s, op::LEASE_ON, id, "LeaseOn");
        assert_eq!(Reply::decode(op::LEASE_ON, &body).unwrap(), Reply::LeaseTime { ms: 1000 });
    }
    // Granted a lease on /f, then silent: another client's change waits for
    // the lease time, no longer, and this raw client gets the break.
    send(&mut s, &encode(&Request::Stat { target: Target::Path(b"/f") }, 14));
    expect_ok(&mut s, op::STAT, 14, "Stat");
    let c = server.client();
    let t = std::time::Instant::now();
    c.truncate(Target::Path(b"/f"), 3).unwrap();
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(3), "{waited:?}");
    let (h, body) = expect_frame(&mut s, "the break");
    assert!(h.is_notice() && h.op == op::LEASE_BREAK && h.id == 0, "{h:?}");
    let b = ferry_proto::LeaseBreak::decode(&body).unwrap();
    assert!(!b.objects.is_empty());
    // Unanswered, it took all this holder held (a second notice, of all).
    send(&mut s, &frame(op::PING, 15, &[]));
    loop {
        let (h, _) = expect_frame(&mut s, "a ping after the break");
        if !h.is_notice() {
            assert_eq!((h.op, h.id, h.flags), (op::PING, 15, 0));
            break;
        }
    }
    assert_healthy(&mut server, "lease frames");
}
