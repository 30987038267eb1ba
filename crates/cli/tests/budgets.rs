//! Fair shares of what a server holds for its clients, against a real
//! `ferry serve` on loopback: connections still in their handshake have a
//! budget of their own, so no number of stalled ones keeps out a client
//! that proves the token; and open handles are shared, so one client
//! opening files until refused does not make another's open fail.
//!
//! Floods come from other loopback addresses (127.0.0.2, ...: all of
//! 127/8 is local on Linux) bound before connecting, as several hosts
//! would; every socket read is bounded by a timeout.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{random_bytes, stderr, Server, TempDir};
use ferry_client::OpenOptions;
use ferry_proto::{client_proof, op, ErrorReply, Header, Reply, Request, FLAG_ERROR, HEADER_LEN, MIN_MAX_FRAME};

const IO_TIMEOUT: Duration = Duration::from_secs(20);

/// The tests run one at a time: a flood timed against the server's
/// deadlines must not share two cores with another flood.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Descriptors enough for the floods (the hard limit is ours to take).
fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let l = getrlimit(Resource::Nofile);
    let _ = setrlimit(Resource::Nofile, Rlimit { current: l.maximum, maximum: l.maximum });
}

/// A TCP connection to `server` from the loopback address `from`.
fn connect_from(server: &Server, from: &str) -> TcpStream {
    use rustix::net::{AddressFamily, SocketType};
    let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).expect("socket");
    let local: SocketAddr = format!("{from}:0").parse().unwrap();
    rustix::net::bind(&fd, &local).unwrap_or_else(|e| panic!("bind {from}: {e}"));
    let to: SocketAddr = server.addr().parse().unwrap();
    rustix::net::connect(&fd, &to).unwrap_or_else(|e| panic!("connect from {from}: {e}"));
    let s = TcpStream::from(fd);
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s
}

fn encode(req: &Request<'_>, id: u64) -> Vec<u8> {
    let mut v = Vec::new();
    req.encode(id, &mut v);
    v.extend_from_slice(req.bulk());
    v
}

fn hello(nonce: [u8; 32]) -> Vec<u8> {
    encode(&Request::Hello { min_version: 1, max_version: 1, caps: u64::MAX, max_frame: MIN_MAX_FRAME, nonce }, 1)
}

fn read_frame(s: &mut TcpStream) -> (Header, Vec<u8>) {
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb).expect("reply header");
    let h = Header::decode(&hb);
    let mut body = vec![0u8; h.len as usize];
    s.read_exact(&mut body).expect("reply body");
    (h, body)
}

/// An authenticated raw connection from `from`.
fn handshake_from(server: &Server, from: &str) -> TcpStream {
    let mut s = connect_from(server, from);
    let nonce = [9u8; 32];
    s.write_all(&hello(nonce)).unwrap();
    let (h, body) = read_frame(&mut s);
    assert_eq!(h.flags & FLAG_ERROR, 0, "HELLO refused: {:?}", ErrorReply::decode(&body));
    let Reply::Welcome(w) = Reply::decode(op::HELLO, &body).unwrap() else { panic!("no Welcome") };
    let proof = client_proof(&server.token(), &w.nonce, &nonce);
    s.write_all(&encode(&Request::Auth { proof }, 2)).unwrap();
    let (h, body) = read_frame(&mut s);
    assert_eq!(h.flags & FLAG_ERROR, 0, "AUTH refused: {:?}", ErrorReply::decode(&body));
    s
}

/// 2,000 connections that never finish their handshake — half a header,
/// a whole header and part of a `Hello`, or nothing — from 127.0.0.1 (the
/// client's own address) and forty others, held open while more keep
/// coming: a client that proves the token at once still connects and
/// copies 100 MB, in bounded time.
#[test]
fn stalled_handshakes_do_not_keep_a_client_out() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    raise_fd_limit();
    let server = Server::start(&["--metrics", "127.0.0.1:0"]);
    let partial = hello([1; 32]);
    let stall = |from: &str, k: usize| {
        let mut s = connect_from(&server, from);
        // The server may have shut an older one already: a failed send is
        // the flood's problem, not the test's.
        let _ = match k % 3 {
            0 => s.write_all(&partial[..8]),
            1 => s.write_all(&partial[..HEADER_LEN + 5]),
            _ => Ok(()),
        };
        s
    };
    // Opened from several threads, so all are in place well within the
    // server's handshake deadline.
    let start = Instant::now();
    let mut stalled: Vec<TcpStream> = std::thread::scope(|scope| {
        let openers: Vec<_> = (0..8)
            .map(|t| {
                let stall = &stall;
                scope.spawn(move || {
                    (0..250)
                        .map(|i| {
                            let k = t * 250 + i;
                            let from =
                                if k % 2 == 0 { "127.0.0.1".to_string() } else { format!("127.0.0.{}", 2 + k % 40) };
                            stall(&from, k)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        openers.into_iter().flat_map(|o| o.join().unwrap()).collect()
    });
    eprintln!("2000 stalled connections opened in {:?}", start.elapsed());

    // More keep arriving, from yet other addresses, while the client works.
    let stop = Arc::new(AtomicBool::new(false));
    let dripper = {
        let (stop, addr) = (Arc::clone(&stop), server.addr());
        std::thread::spawn(move || {
            let to: SocketAddr = addr.parse().unwrap();
            let mut held = Vec::new();
            let mut k = 0usize;
            while !stop.load(Ordering::Relaxed) && k < 3000 {
                let s = TcpStream::connect_timeout(&to, Duration::from_secs(5));
                if let Ok(mut s) = s {
                    let _ = s.write_all(&[0x46]);
                    held.push(s);
                }
                k += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            held.len()
        })
    };

    let src = TempDir::new("budgets-src");
    let data = random_bytes(100 << 20, 4);
    let local = src.path().join("big");
    std::fs::write(&local, &data).unwrap();
    let t = Instant::now();
    let out = server.ferry(&["cp", local.to_str().unwrap(), &server.url("/big")]);
    let took = t.elapsed();
    assert!(
        out.status.success(),
        "ferry cp while 2000 handshakes stall failed after {took:?}: {}\nserver log (tail):\n{}",
        stderr(&out),
        tail(&server.log())
    );
    let c = server.client();
    assert!(c.read("/big").unwrap() == data, "the copy differs");
    let total = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let dripped = dripper.join().unwrap();
    eprintln!("ferry cp of 100 MB: {took:?}; read back after {total:?}; {dripped} more stalls arrived meanwhile");
    assert!(total < Duration::from_secs(60), "the copy took {total:?}");
    // What is still held changes nothing for a client.
    stalled.truncate(10);
    c.write("/after", b"ok").unwrap();
    let evicted = metric(&server, "ferry_handshakes_evicted_total");
    let waiting = metric(&server, "ferry_handshakes");
    eprintln!("handshakes evicted: {evicted}, waiting now: {waiting}");
    assert!(evicted >= 1000.0, "{evicted} evicted");
    assert!(waiting <= 64.0, "{waiting} waiting");
}

/// One sample of `name` from the server's `/metrics`.
fn metric(server: &Server, name: &str) -> f64 {
    let found = common::fuse::wait_for(Duration::from_secs(10), || server.log().contains("metrics at http://"));
    assert!(found, "no metrics address in the log");
    let log = server.log();
    let addr = log.split("metrics at http://").nth(1).unwrap().split("/metrics").next().unwrap().to_string();
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let line = text.lines().find(|l| l.split(' ').next() == Some(name));
    line.and_then(|l| l.split(' ').nth(1)).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {name}"))
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// One client from 127.0.0.2, on 18 connections (18 sessions), opens
/// files until the server refuses: it must be refused before another
/// client, from 127.0.0.1, is — which still opens, writes and reads.
#[test]
fn one_client_opening_everything_leaves_room_for_others() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    raise_fd_limit();
    let server = Server::start(&["--metrics", "127.0.0.1:0"]);
    std::fs::write(server.export.path().join("file"), b"content").unwrap();
    const CONNS: usize = 18;
    const PER_CONN: u64 = 4096;
    let hogs: Vec<_> = (0..CONNS)
        .map(|_| {
            let mut s = handshake_from(&server, "127.0.0.2");
            std::thread::spawn(move || {
                let mut burst = Vec::new();
                for i in 0..PER_CONN {
                    let open = Request::Open { path: b"/file", flags: libc::O_RDONLY as u32, mode: 0 };
                    burst.extend(encode(&open, 10 + i));
                }
                let mut w = s.try_clone().unwrap();
                let sender = std::thread::spawn(move || w.write_all(&burst).unwrap());
                let mut errs = std::collections::BTreeMap::<u32, u64>::new();
                for _ in 0..PER_CONN {
                    let (h, body) = read_frame(&mut s);
                    assert_eq!(h.op, op::OPEN);
                    if h.flags & FLAG_ERROR != 0 {
                        *errs.entry(ErrorReply::decode(&body).unwrap().errno).or_default() += 1;
                    }
                }
                sender.join().unwrap();
                // Kept open, holding its handles.
                (s, errs)
            })
        })
        .collect();
    let mut held = Vec::new();
    let mut errs = std::collections::BTreeMap::<u32, u64>::new();
    for h in hogs {
        let (s, e) = h.join().expect("a flooding connection failed");
        held.push(s);
        for (k, v) in e {
            *errs.entry(k).or_default() += v;
        }
    }
    let refused: u64 = errs.values().sum();
    eprintln!(
        "{} opens from 127.0.0.2 on {CONNS} connections: {} granted, refused by errno {errs:?}",
        CONNS as u64 * PER_CONN,
        CONNS as u64 * PER_CONN - refused
    );
    assert!(refused > 0, "the flood was never refused: it is too small for this server's budget");

    // Another client: many files open at once, written and read.
    let c = server.client();
    let mut files = Vec::new();
    for i in 0..200 {
        let name = format!("/other-{i}");
        let f = c
            .open(&name, OpenOptions::new().read(true).write(true).create(true))
            .unwrap_or_else(|e| panic!("open {i} of another client while one holds all it may: {e}"));
        f.write_at(name.as_bytes(), 0).unwrap();
        files.push((name, f));
    }
    for (name, f) in &files {
        let mut got = vec![0u8; name.len()];
        assert_eq!(f.read_at(&mut got, 0).unwrap(), name.len());
        assert_eq!(got, name.as_bytes());
    }
    drop(files);
    let budget = metric(&server, "ferry_handle_budget");
    let handles = metric(&server, "ferry_handles");
    eprintln!("handle budget {budget}, open {handles}, refused {}", metric(&server, "ferry_handles_refused_total"));
    assert!(metric(&server, "ferry_handles_refused_total") >= refused as f64);
    assert!(handles <= budget);
    // And the CLI, in a process of its own.
    let src = TempDir::new("budgets-cli");
    std::fs::write(src.path().join("small"), b"small").unwrap();
    let out = server.ferry(&["cp", src.path().join("small").to_str().unwrap(), &server.url("/small")]);
    assert!(out.status.success(), "ferry cp: {}", stderr(&out));
    assert_eq!(std::fs::read(server.export.path().join("small")).unwrap(), b"small");
    drop(held);
}

/// Eight connections of one peer announce big writes (together nearly the
/// whole frame pool, 512 MiB) and send their bodies no further: the
/// buffers they borrow stay lent for as long as they stall. Another
/// client's big write (a 4 MiB frame, which borrows from the same pool)
/// still goes through at once: one peer holds at most half the pool.
#[test]
fn stalled_big_frames_of_one_peer_leave_the_frame_pool_to_others() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let server = Server::start(&[]);
    // Just under an eighth of the pool each: the first must not wait.
    let len: u32 = (511 << 20) / 8;
    let hogs: Vec<TcpStream> = (0..8)
        .map(|i| {
            let mut s = handshake_from(&server, "127.0.0.2");
            let head = Request::Pwrite { handle: 1, offset: 0, data: &[] };
            let mut frame = encode(&head, 100 + i);
            let announced = frame.len() as u32 - HEADER_LEN as u32 + len;
            frame[..4].copy_from_slice(&announced.to_le_bytes());
            frame.extend_from_slice(&[7u8; 4096]);
            s.write_all(&frame).unwrap();
            s
        })
        .collect();
    // Each announced body is being waited for, its buffer lent.
    std::thread::sleep(Duration::from_millis(500));
    // Another peer: one 4 MiB frame (the library cuts its writes in
    // pieces the connection's own buffer takes, so a raw client here).
    let mut s = handshake_from(&server, "127.0.0.3");
    let open = Request::Open { path: b"/big", flags: (libc::O_WRONLY | libc::O_CREAT) as u32, mode: 0o644 };
    s.write_all(&encode(&open, 10)).unwrap();
    let (h, body) = read_frame(&mut s);
    assert_eq!(h.flags & FLAG_ERROR, 0, "open refused: {:?}", ErrorReply::decode(&body));
    let Reply::Opened { handle, .. } = Reply::decode(op::OPEN, &body).unwrap() else { panic!("no handle") };
    let data = random_bytes(4 << 20, 3);
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(&encode(&Request::Pwrite { handle, offset: 0, data: &data }, 11)).unwrap();
    let mut hb = [0u8; HEADER_LEN];
    if let Err(e) = s.read_exact(&mut hb) {
        panic!("no answer in 30 s to another peer's big write while one peer holds the frame pool: {e}");
    }
    let h = Header::decode(&hb);
    let mut body = vec![0u8; h.len as usize];
    s.read_exact(&mut body).unwrap();
    assert_eq!(h.flags & FLAG_ERROR, 0, "the big write failed: {:?}", ErrorReply::decode(&body));
    assert!(std::fs::read(server.export.path().join("big")).unwrap() == data, "the big write's bytes");
    drop(hogs);
}
