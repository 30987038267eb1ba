//! The same-host path: a client on the server's host moves file data over
//! the server's Unix socket and through the server's own descriptors of
//! regular files, found by itself from a TCP connection or named with a
//! `unix:` address / `ferry+unix://` URL; every pairing of peers that do
//! and do not offer it; the mount reading through the descriptors; another
//! user, the memory backend and a read-only
//! export; a client killed mid-transfer and one sending descriptors and
//! garbage at the server.

mod common;

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::process::{Command, Stdio};

use common::{random_bytes, Server, TempDir, FERRY};
use ferry_client::{Client, OpenOptions, Options};

const LEN: usize = 24 << 20;

fn setup(extra: &[&str]) -> (Server, Vec<u8>) {
    let srv = Server::start(extra);
    let data = random_bytes(LEN, 5);
    if !extra.contains(&"--memory") {
        std::fs::write(srv.export.path().join("big"), &data).unwrap();
    }
    (srv, data)
}

/// Reads `/big` sequentially and positionally, writes `/out` with one
/// positional write and `/seq` through `Write`; returns whether each file
/// went through a passed descriptor.
fn round_trip(c: &Client, data: &[u8], read_back: impl Fn(&str) -> Vec<u8>) -> [bool; 3] {
    let f = common::read_both_ways(c, "/big", data);
    let read_local = f.is_local();
    f.close().unwrap();
    let out = c.open("/out", OpenOptions::new().write(true).create(true).truncate(true)).unwrap();
    out.write_at(data, 0).unwrap();
    let out_local = out.is_local();
    out.close().unwrap();
    assert!(read_back("out") == data, "positional write differs");
    let mut seq = c.open("/seq", OpenOptions::new().write(true).create(true).truncate(true)).unwrap();
    for part in data.chunks(1 << 20) {
        seq.write_all(part).unwrap();
    }
    let seq_local = seq.is_local();
    seq.sync_all().unwrap();
    seq.close().unwrap();
    assert!(read_back("seq") == data, "sequential write differs");
    [read_local, out_local, seq_local]
}

fn on_disk(srv: &Server) -> impl Fn(&str) -> Vec<u8> + '_ {
    move |name| std::fs::read(srv.export.path().join(name)).unwrap()
}

#[test]
fn a_client_on_the_servers_host_finds_its_socket_and_uses_its_descriptors() {
    let (srv, data) = setup(&[]);
    let c = srv.client();
    assert_eq!(round_trip(&c, &data, on_disk(&srv)), [true; 3]);
    assert_eq!(c.data_channels(), 1, "the Unix socket is the one channel");
    assert_eq!(c.bytes_fetched(), 0, "no file data came by request");
    // What goes past the server is seen at once by a client over TCP.
    let tcp = Client::connect(&srv.addr(), &Options { same_host: false, ..srv.options() }).unwrap();
    let w = c.open("/out", OpenOptions::new().write(true)).unwrap();
    w.write_at(b"changed", 100).unwrap();
    assert!(w.is_local());
    let mut b = [0u8; 7];
    let r = tcp.open("/out", OpenOptions::new().read(true)).unwrap();
    assert_eq!(r.read_at(&mut b, 100).unwrap(), 7);
    assert!(!r.is_local());
    assert_eq!(&b, b"changed");
}

/// Everything right, no descriptor passed.
fn without_descriptors(server_args: &[&str], opts: Options) {
    let (srv, data) = setup(server_args);
    let c = Client::connect(&srv.addr(), &Options { token: Some(srv.token()), ..opts }).unwrap();
    assert_eq!(round_trip(&c, &data, on_disk(&srv)), [false; 3]);
}

#[test]
fn a_server_that_does_not_offer_it_serves_over_tcp() {
    without_descriptors(&["--disable-caps", "same-host"], Options::default());
}

#[test]
fn a_client_that_does_not_ask_for_it_stays_on_tcp() {
    without_descriptors(&[], Options { same_host: false, ..Options::default() });
    without_descriptors(&[], Options { same_host: false, data_channels: 0, ..Options::default() });
    // An older client: it does not offer the capability at all.
    let old = ferry_proto::caps::ALL & !ferry_proto::caps::SAME_HOST;
    without_descriptors(&[], Options { caps: old, ..Options::default() });
}

/// The server's Unix socket answers but will not serve (over its
/// connection limit): the copy goes on the main connection, right, said
/// once on stderr.
#[test]
fn a_same_host_socket_that_refuses_falls_back_and_says_so_once() {
    let (srv, data) = setup(&["--max-connections", "1"]);
    let dst = TempDir::new("same-host-refused");
    let copy = dst.path().join("copy");
    let out = srv.ferry(&["cp", &srv.url("/big"), copy.to_str().unwrap()]);
    let err = common::stderr(&out);
    assert!(out.status.success(), "ferry cp failed: {err}");
    assert!(std::fs::read(&copy).unwrap() == data, "the copy differs");
    assert_eq!(err.matches("bulk data goes on the main connection").count(), 1, "stderr: {err}");
    assert!(err.contains("same-host socket"), "stderr: {err}");
}

#[test]
fn the_memory_backend_moves_data_over_the_unix_socket() {
    let srv = Server::start(&["--memory"]);
    let data = random_bytes(LEN, 6);
    let c = srv.client();
    c.write("/big", &data).unwrap();
    let read_back = |name: &str| c.read(format!("/{name}")).unwrap();
    assert_eq!(round_trip(&c, &data, read_back), [false; 3], "files in memory have no descriptor");
    assert_eq!(c.data_channels(), 1, "but the data went on the Unix socket");
}

#[test]
fn a_read_only_export_passes_read_only_descriptors() {
    let (srv, data) = setup(&["--read-only"]);
    let c = srv.client();
    let f = c.open("/big", OpenOptions::new().read(true)).unwrap();
    let mut got = vec![0u8; LEN];
    assert_eq!(f.read_at(&mut got, 0).unwrap(), LEN);
    assert!(f.is_local() && got == data);
    let e = c.open("/big", OpenOptions::new().write(true)).err().expect("a write open on a read-only export");
    assert_eq!(e.errno(), libc::EROFS);
}

#[test]
fn a_unix_address_and_url_reach_the_server_directly() {
    let sock_dir = TempDir::new("sock");
    let sock = sock_dir.path().join("ferry.sock");
    let (srv, data) = setup(&["--unix", sock.to_str().unwrap()]);
    let addr = format!("unix:{}", sock.display());
    let c = Client::connect(&addr, &srv.options()).unwrap();
    assert!(c.engine().is_unix());
    assert_eq!(round_trip(&c, &data, on_disk(&srv)), [true; 3]);
    // The CLI with the URL form.
    let enc: String = sock.to_str().unwrap().replace('/', "%2F");
    let dst = TempDir::new("same-host-dst");
    let copy = dst.path().join("copy");
    let out = srv.ferry(&["cp", &format!("ferry+unix://{enc}/big"), copy.to_str().unwrap()]);
    assert!(out.status.success(), "ferry cp: {}", common::stderr(&out));
    assert!(std::fs::read(&copy).unwrap() == data);
    let out = srv.ferry(&["ls", &format!("ferry+unix://{enc}/")]);
    assert!(common::stdout(&out).contains("big"), "ls: {}", common::stderr(&out));
    // A stale socket file left by a killed server is replaced.
    drop(srv);
    assert!(sock.exists());
    let again = Server::start(&["--unix", sock.to_str().unwrap()]);
    std::fs::write(again.export.path().join("big"), b"again").unwrap();
    let c = Client::connect(&addr, &again.options()).unwrap();
    assert_eq!(c.read("/big").unwrap(), b"again");
}

/// A process of another user gets no descriptor (it could not open the
/// server's files itself): it asks, is refused, and its data moves by
/// requests, on the Unix socket. The server's counters say so; the same
/// copy by the server's own user is lent one, so the count can tell.
#[test]
fn another_user_gets_no_descriptors_and_the_right_data() {
    let (srv, data) = setup(&["--no-auth", "--metrics", "127.0.0.1:0"]);
    let metrics = common::scrape::metrics_addr(&srv);
    let counts = || {
        let (status, body) = common::scrape::get(&metrics, "/metrics");
        assert!(status.contains("200"), "{status}");
        let n = |name| common::scrape::sample(&body, name) as u64;
        (n("ferry_descriptors_lent_total"), n("ferry_descriptors_refused_total"))
    };
    let dst = TempDir::new("same-host-nobody");
    std::fs::set_permissions(dst.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let copy = dst.path().join("copy");
    let out = Command::new("runuser")
        .args(["-u", "nobody", "--", FERRY, "cp", &srv.url("/big"), copy.to_str().unwrap()])
        .env_remove("FERRY_TOKEN")
        .env_remove("FERRY_TOKEN_FILE")
        .env("HOME", dst.path())
        .output()
        .expect("runuser");
    assert!(out.status.success(), "ferry cp as nobody: {}", common::stderr(&out));
    assert!(std::fs::read(&copy).unwrap() == data, "copy differs");
    let (lent, refused) = counts();
    assert_eq!(lent, 0, "the server lent another user {lent} descriptors");
    assert!(refused >= 1, "another user's copy never asked for a descriptor: nothing was refused");
    let own = dst.path().join("own");
    let out = Command::new(FERRY)
        .args(["cp", &srv.url("/big"), own.to_str().unwrap()])
        .env_remove("FERRY_TOKEN")
        .env_remove("FERRY_TOKEN_FILE")
        .output()
        .expect("ferry cp");
    assert!(out.status.success(), "ferry cp as root: {}", common::stderr(&out));
    assert!(std::fs::read(&own).unwrap() == data, "root's copy differs");
    let (lent, again) = counts();
    assert!(lent >= 1, "the server's own user was lent no descriptor");
    assert_eq!(again, refused, "the server's own user was refused");
    assert!(!srv.log().contains("panicked"), "server log: {}", srv.log());
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// A client killed in the middle of copying a large file through the
/// server's descriptors: the server goes on serving, and gives the
/// handles back when the session's lease ends.
#[test]
fn a_client_killed_mid_transfer_leaves_the_server_serving() {
    let srv = Server::start(&["--session-lease", "0.2"]);
    let data = random_bytes(256 << 20, 8);
    std::fs::write(srv.export.path().join("big"), &data).unwrap();
    let before = open_fds(srv.pid());
    let dst = TempDir::new("same-host-kill");
    for i in 0..3 {
        let mut child = Command::new(FERRY)
            .args(["cp", &srv.url("/big"), dst.path().join(format!("c{i}")).to_str().unwrap()])
            .env("FERRY_TOKEN_FILE", &srv.token_file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(60 + 40 * i));
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let c = srv.client();
    let mut got = vec![0u8; data.len()];
    let f = c.open("/big", OpenOptions::new().read(true)).unwrap();
    assert_eq!(f.read_at(&mut got, 0).unwrap(), data.len());
    assert!(got == data);
    drop(f);
    drop(c);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while open_fds(srv.pid()) > before && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(open_fds(srv.pid()) <= before, "server descriptors: {} before, {} after", before, open_fds(srv.pid()));
}

/// Descriptors sent *to* the server with garbage, then a frame that
/// claims to be a `FileFd` reply: the server keeps none of them, answers
/// the garbage with a close, and goes on serving.
#[test]
fn descriptors_and_garbage_sent_to_the_server_are_dropped() {
    let sock_dir = TempDir::new("sock-hostile");
    let sock = sock_dir.path().join("ferry.sock");
    let (srv, data) = setup(&["--unix", sock.to_str().unwrap()]);
    let before = open_fds(srv.pid());
    let f = std::fs::File::open("/proc/self/exe").unwrap();
    for round in 0..20u8 {
        let s = ferry_sock::Socket::from(std::os::unix::net::UnixStream::connect(&sock).unwrap());
        // A header of op FILE_FD (51) with a reply flag, then junk.
        let mut junk = vec![round; 64];
        junk[..4].copy_from_slice(&60u32.to_le_bytes());
        junk[4..6].copy_from_slice(&51u16.to_le_bytes());
        for _ in 0..4 {
            if s.send_with_fd(&junk, f.as_fd()).is_err() {
                break;
            }
        }
        let mut sink = [0u8; 256];
        s.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        while matches!((&s).read(&mut sink), Ok(n) if n > 0) {}
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(open_fds(srv.pid()) <= before, "server kept descriptors: {} before, {} after", before, open_fds(srv.pid()));
    let c = Client::connect(&format!("unix:{}", sock.display()), &srv.options()).unwrap();
    let mut got = vec![0u8; LEN];
    let file = c.open("/big", OpenOptions::new().read(true)).unwrap();
    assert_eq!(file.read_at(&mut got, 0).unwrap(), LEN);
    assert!(got == data && file.is_local());
}

/// Bytes the server wrote (`/proc/PID/io` wchar: its sockets) while a
/// program read `/big` through a mount after dropping its pages, checking
/// the data; and a write through the mount lands in the file.
fn server_sends_for_a_mount_read(env: &[(&str, &str)]) -> u64 {
    common::fuse::require_fuse();
    let (srv, data) = setup(&[]);
    let tmp = TempDir::new("same-host-mount");
    let mp = tmp.path().join("mp");
    std::fs::create_dir(&mp).unwrap();
    let _detach = common::fuse::Detach(mp.clone());
    let _m = common::fuse::mount_url_env(&srv.url("/"), &mp, &srv.token_file, &[], env);
    let (got, sent) = common::fuse::read_counting(&mp.join("big"), srv.pid(), "wchar", true);
    assert!(got == data, "read through the mount differs");
    std::fs::write(mp.join("written"), &data[..1 << 20]).unwrap();
    assert!(std::fs::read(srv.export.path().join("written")).unwrap() == data[..1 << 20]);
    sent
}

/// The mount on the server's host reads through the server's descriptor:
/// the server sends none of the file; over TCP it sends all of it.
#[test]
fn the_mount_on_the_servers_host_reads_through_the_servers_descriptor() {
    let local = server_sends_for_a_mount_read(&[]);
    assert!(local < 1 << 20, "on the same host the server sent {local} bytes");
    let tcp = server_sends_for_a_mount_read(&[("FERRY_SAME_HOST", "0")]);
    assert!(tcp >= LEN as u64, "over TCP the server sent {tcp} bytes");
}
