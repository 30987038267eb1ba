//! Sessions that outlive connections: a second connection joins a session
//! and shares its open files and locks; a session whose connection was cut
//! stays for the lease (its files open, its locks held), then ends.

mod common;

use std::io::Write;
use std::thread;
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::{random_bytes, Server};
use ferry_client::wire::Frame;
use ferry_client::{Client, LockKind, LockSpec, LockType, OpenOptions};
use ferry_proto::{Reply, Request};

fn pread(c: &Client, handle: u64, offset: u64, count: u32) -> ferry_client::Result<Vec<u8>> {
    let mut buf = vec![0u8; count as usize];
    let id = c.engine().start(&Request::Pread { handle, offset, count }, count as u64)?;
    let f: Frame = c.engine().finish(id, Some(&mut buf))?;
    buf.truncate(f.data_len);
    Ok(buf)
}

fn whole_write_lock() -> LockSpec {
    LockSpec { kind: LockKind::Ofd, typ: LockType::Write, start: 0, len: 0, pid: 1 }
}

#[test]
fn a_second_connection_shares_the_sessions_open_files() {
    let server = Server::start(&[]);
    let a = server.client();
    let ticket = a.new_session().unwrap();
    assert_eq!(ticket.lease, Duration::from_secs(60), "the default lease");
    let mut f = a.open("/f", OpenOptions::new().read(true).write(true).create(true)).unwrap();
    f.write_all(b"hello from a").unwrap();
    f.flush_writes().unwrap();
    let b = server.client();
    b.attach(&ticket).unwrap();
    assert_eq!(pread(&b, f.handle(), 0, 64).unwrap(), b"hello from a");
    // And the other way: a write through b's connection, read through a's.
    let r = b.engine().call(&Request::Pwrite { handle: f.handle(), offset: 0, data: b"HELLO" }).unwrap();
    assert!(matches!(r.reply().unwrap(), Reply::Written { count: 5 }));
    let mut got = vec![0u8; 12];
    f.read_at(&mut got, 0).unwrap();
    assert_eq!(got, b"HELLO from a");
}

#[test]
fn attach_needs_the_right_secret_and_a_live_session() {
    let server = Server::start(&[]);
    let a = server.client();
    let ticket = a.new_session().unwrap();
    // Another connection's session has another secret; its own ticket
    // works from any connection.
    let other = server.client().new_session().unwrap();
    assert!(server.client().attach(&other).is_ok());
    // A ticket whose id was changed no longer matches its secret.
    let mut wrong = ticket.clone();
    wrong.id = other.id;
    let e = server.client().attach(&wrong).unwrap_err();
    assert_eq!(e.errno(), libc::EACCES, "{e}");
    let mut gone = ticket.clone();
    gone.id ^= 0x5555;
    let e = server.client().attach(&gone).unwrap_err();
    assert_eq!(e.errno(), libc::ESTALE, "{e}");
    // Without the capability: a clear ENOSYS.
    let old = Server::start(&["--disable-caps", "sessions"]);
    let e = old.client().new_session().unwrap_err();
    assert_eq!(e.errno(), libc::ENOSYS, "{e}");
}

#[test]
fn a_cut_connection_leaves_its_session_for_the_lease_then_it_ends() {
    let server = Server::start(&["--session-lease", "2"]);
    let proxy = Proxy::to(server.addr());
    // On TCP: a same-host channel would keep the session attached.
    let a = Client::connect(&format!("127.0.0.1:{}", proxy.port), &server.tcp_options()).unwrap();
    let ticket = a.new_session().unwrap();
    assert_eq!(ticket.lease, Duration::from_secs(2));
    let data = random_bytes(3 << 20, 5);
    let mut f = a.open("/f", OpenOptions::new().read(true).write(true).create(true)).unwrap();
    f.write_all(&data).unwrap();
    f.flush_writes().unwrap();
    f.try_lock(&whole_write_lock()).unwrap();
    let handle = f.handle();
    proxy.cut();
    assert!(a.ping().is_err(), "the connection is cut");
    let cut_at = Instant::now();

    // Another client meets the lock the session still holds...
    let other = server.client();
    let g = other.open("/f", OpenOptions::new().read(true).write(true)).unwrap();
    let e = g.try_lock(&whole_write_lock()).unwrap_err();
    assert_eq!(e.errno(), libc::EAGAIN, "{e}");
    // ...and the session's owner, back on a new connection, finds its open
    // file where it left it.
    let back = server.client();
    back.attach(&ticket).unwrap();
    assert_eq!(pread(&back, handle, 0, 3 << 20).unwrap(), data);
    drop(back);
    assert!(cut_at.elapsed() < Duration::from_secs(2), "the checks above took the whole lease");

    // Once the lease has run out with no connection, the session is gone:
    // its lock is released and its ticket is stale.
    let deadline = Instant::now() + Duration::from_secs(15);
    while g.try_lock(&whole_write_lock()).is_err() {
        assert!(Instant::now() < deadline, "the expired session's lock was never released");
        thread::sleep(Duration::from_millis(100));
    }
    let e = server.client().attach(&ticket).unwrap_err();
    assert_eq!(e.errno(), libc::ESTALE, "{e}");
    drop(f);
}

#[test]
fn without_a_session_a_connection_takes_its_state_with_it() {
    // Clients that never ask for a session keep today's behaviour: a lock
    // dies with the connection, at once.
    let server = Server::start(&[]);
    let proxy = Proxy::to(server.addr());
    let a = Client::connect(&format!("127.0.0.1:{}", proxy.port), &server.options()).unwrap();
    let f = a.open("/f", OpenOptions::new().read(true).write(true).create(true)).unwrap();
    f.try_lock(&whole_write_lock()).unwrap();
    proxy.cut();
    let g = server.client().open("/f", OpenOptions::new().read(true).write(true)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while g.try_lock(&whole_write_lock()).is_err() {
        assert!(Instant::now() < deadline, "the lock outlived its connection");
        thread::sleep(Duration::from_millis(20));
    }
    drop(f);
}

/// A session is journaled with the server's own ids even when the thread
/// that makes it last acted for a caller who may not write the state
/// directory: here a squashed root, whose client asks for its session
/// (for a data channel) only after opening a file as that caller.
#[test]
fn a_squashed_callers_session_is_journaled_all_the_same() {
    let journal = common::TempDir::new("journal");
    let server = Server::start(&["--root-squash", "--state-dir", journal.path().to_str().unwrap()]);
    let data = random_bytes(4 << 20, 7);
    std::fs::write(server.export.path().join("pub"), &data).unwrap();
    let c = server.tcp_client();
    let f = c.open("/pub", OpenOptions::new().read(true)).unwrap();
    let mut back = vec![0u8; data.len()];
    let mut at = 0;
    while at < back.len() {
        at += f.read_at(&mut back[at..], at as u64).unwrap();
    }
    assert!(back == data);
    let sessions: Vec<_> = std::fs::read_dir(journal.path())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("s-"))
        .collect();
    let log = std::fs::read_to_string(server.state.path().join("server.log")).unwrap();
    assert!(!sessions.is_empty(), "no session file in the state directory; server log:\n{log}");
    assert!(!log.contains("not kept"), "{log}");
}
