//! What a user sees when the other end is not what it should be: a listener
//! that never answers, a peer that is not a ferry server, a connection cut
//! in the middle of a copy. Every case ends quickly with a sentence.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::{random_bytes, stderr, Server, TempDir};
use ferry_client::{Client, Options};

/// A listener on 127.0.0.1:0 whose accepted connections get `on_accept`,
/// in a thread that ends when the test process does.
fn listener(on_accept: fn(TcpStream)) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    thread::spawn(move || {
        for s in l.incoming().flatten() {
            thread::spawn(move || on_accept(s));
        }
    });
    port
}

fn ferry_ls(port: u16) -> (std::process::Output, Duration) {
    let t = Instant::now();
    let out = std::process::Command::new(common::FERRY)
        .args(["ls", &format!("ferry://127.0.0.1:{port}/")])
        .env("FERRY_TOKEN", "x")
        .output()
        .unwrap();
    (out, t.elapsed())
}

#[test]
fn a_listener_that_never_answers_times_out_with_a_message() {
    let port = listener(|s| {
        thread::sleep(Duration::from_secs(30));
        drop(s);
    });
    let opts = Options { handshake_timeout: Duration::from_millis(500), ..Options::default() };
    let t = Instant::now();
    let e = Client::connect(&format!("127.0.0.1:{port}"), &opts).err().expect("connect must fail");
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
    assert_eq!(e.errno(), libc::ETIMEDOUT, "{e}");
    assert!(e.to_string().contains("did not answer the handshake"), "{e}");
}

#[test]
fn a_web_server_is_not_a_ferry_server() {
    let port = listener(|mut s| {
        let mut b = [0u8; 64];
        let _ = s.read(&mut b);
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        thread::sleep(Duration::from_secs(2));
    });
    let (out, took) = ferry_ls(port);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("not a ferry server") && err.contains("HTTP/1.1 400"), "{err}");
    assert!(!err.contains("frame body"), "{err}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn an_ssh_server_is_not_a_ferry_server() {
    // An ssh server speaks first, then waits for the client's banner.
    let port = listener(|mut s| {
        let _ = s.write_all(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n");
        thread::sleep(Duration::from_secs(2));
    });
    let (out, took) = ferry_ls(port);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("not a ferry server") && err.contains("SSH-2.0"), "{err}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn a_peer_sending_binary_garbage_is_not_a_ferry_server() {
    let port = listener(|mut s| {
        let _ = s.write_all(&[0xff; 16]);
        thread::sleep(Duration::from_secs(2));
    });
    let (out, _) = ferry_ls(port);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not a ferry server"), "{}", stderr(&out));
}

fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn an_interrupted_download_leaves_no_partial_file_and_says_why() {
    let server = Server::start(&[]);
    let data = random_bytes(64 << 20, 7);
    std::fs::write(server.export.path().join("big"), &data).unwrap();
    let port = Proxy::cutting(server.addr(), usize::MAX, 8 << 20).port;
    let local = TempDir::new("dl");
    // An older copy is there: an interrupted download must leave it alone.
    std::fs::write(local.path().join("big"), b"old contents").unwrap();
    // No reconnecting: the first cut ends the copy.
    let out = std::process::Command::new(common::FERRY)
        .args(["cp", &format!("ferry://127.0.0.1:{port}/big"), local.path().to_str().unwrap()])
        .env("FERRY_TOKEN_FILE", &server.token_file)
        .env("FERRY_RECONNECT", "0")
        .env("FERRY_SAME_HOST", "0")
        .output()
        .unwrap();
    assert!(!out.status.success(), "the copy cannot have succeeded through the cut");
    let err = stderr(&out);
    assert!(err.contains("closed the connection"), "{err}");
    assert!(!err.contains("fill whole buffer"), "{err}");
    assert_eq!(names_in(local.path()), ["big"], "no temporary file left behind");
    assert_eq!(std::fs::read(local.path().join("big")).unwrap(), b"old contents");
}

/// With reconnecting (the CLI's default), a download through connections
/// cut every 20 MiB completes, byte for byte: a read lost with its
/// connection is done again on the next. (`ferry cp` reads 8 MiB at a
/// time; a read is redone whole, so a connection must carry one.)
#[test]
fn a_download_through_connections_cut_every_20_mib_completes_intact() {
    let server = Server::start(&[]);
    let data = random_bytes(64 << 20, 12);
    std::fs::write(server.export.path().join("big"), &data).unwrap();
    let port = Proxy::cutting(server.addr(), usize::MAX, 20 << 20).port;
    let local = TempDir::new("dl");
    let out = server.ferry(&["cp", &format!("ferry://127.0.0.1:{port}/big"), local.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read(local.path().join("big")).unwrap() == data, "the copy differs from the source");
    assert_eq!(names_in(local.path()), ["big"]);
}

#[test]
fn an_interrupted_upload_leaves_no_partial_file_at_the_destination() {
    let server = Server::start(&[]);
    let local = TempDir::new("ul");
    let src = local.path().join("big");
    std::fs::write(&src, random_bytes(64 << 20, 8)).unwrap();
    std::fs::write(server.export.path().join("big"), b"old contents").unwrap();
    let port = Proxy::cutting(server.addr(), 8 << 20, usize::MAX).port;
    // No reconnecting: the first cut ends the copy.
    let out = std::process::Command::new(common::FERRY)
        .args(["cp", src.to_str().unwrap(), &format!("ferry://127.0.0.1:{port}/big")])
        .env("FERRY_TOKEN_FILE", &server.token_file)
        .env("FERRY_RECONNECT", "0")
        .env("FERRY_SAME_HOST", "0")
        .output()
        .unwrap();
    assert!(!out.status.success(), "the copy cannot have succeeded through the cut");
    assert!(!stderr(&out).contains("fill whole buffer"), "{}", stderr(&out));
    assert_eq!(std::fs::read(server.export.path().join("big")).unwrap(), b"old contents");
}

/// With reconnecting (the CLI's default), a connection cut every 8 MiB
/// costs a delay, not the copy: writes lost with a connection are sent
/// again on the next, in order, and the result is the source, byte for byte.
#[test]
fn an_upload_through_connections_cut_every_8_mib_completes_intact() {
    let server = Server::start(&[]);
    let local = TempDir::new("ul");
    let src = local.path().join("big");
    let data = random_bytes(64 << 20, 11);
    std::fs::write(&src, &data).unwrap();
    std::fs::write(server.export.path().join("big"), b"old contents").unwrap();
    let port = Proxy::cutting(server.addr(), 8 << 20, usize::MAX).port;
    let out = server.ferry(&["cp", src.to_str().unwrap(), &format!("ferry://127.0.0.1:{port}/big")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read(server.export.path().join("big")).unwrap() == data, "the copy differs from the source");
    assert_eq!(names_in(server.export.path()), ["big"]);
}

#[test]
fn a_completed_copy_replaces_the_destination_and_leaves_nothing_else() {
    let server = Server::start(&[]);
    let local = TempDir::new("cp");
    let data = random_bytes(3 << 20, 9);
    std::fs::write(server.export.path().join("f"), &data).unwrap();
    std::fs::write(local.path().join("f"), b"old").unwrap();
    let out = server.ferry(&["cp", &server.url("/f"), local.path().join("f").to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(local.path().join("f")).unwrap(), data);
    assert_eq!(names_in(local.path()), ["f"]);
    std::fs::write(local.path().join("g"), &data[..1000]).unwrap();
    let out = server.ferry(&["cp", local.path().join("g").to_str().unwrap(), &server.url("/f")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(server.export.path().join("f")).unwrap(), &data[..1000]);
    assert_eq!(names_in(server.export.path()), ["f"]);
}

#[test]
fn a_server_at_its_connection_limit_says_so() {
    let server = Server::start(&["--max-connections", "2"]);
    let a = server.client();
    let b = server.client();
    let t = Instant::now();
    let e = Client::connect(&server.addr(), &server.options()).err().expect("a third connection must be refused");
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
    assert!(e.to_string().contains("server busy"), "{e}");
    assert_eq!(e.errno(), libc::EBUSY, "{e}");
    let out = server.ferry(&["ls", &server.url("/")]);
    assert!(stderr(&out).contains("server busy"), "{}", stderr(&out));
    // The two served connections go on, and a slot freed is a slot usable.
    a.ping().unwrap();
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Client::connect(&server.addr(), &server.options()) {
            Ok(c) => {
                c.ping().unwrap();
                break;
            }
            Err(e) => assert!(Instant::now() < deadline, "the freed slot never came back: {e}"),
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Many clients writing frames far above 1 MiB at once: the server lends
/// them its bounded frame pool in turns, and every byte arrives.
#[test]
fn many_large_writes_at_once_all_arrive() {
    let server = Server::start(&[]);
    let data = std::sync::Arc::new(random_bytes(48 << 20, 11));
    let threads: Vec<_> = (0..12)
        .map(|i| {
            let (addr, opts, data) = (server.addr(), server.options(), std::sync::Arc::clone(&data));
            thread::spawn(move || {
                let c = Client::connect(&addr, &opts).unwrap();
                let f = c.open(format!("/w{i}"), ferry_client::OpenOptions::new().write(true).create(true)).unwrap();
                for k in 0..2u64 {
                    f.write_at(&data, k * data.len() as u64).unwrap();
                }
                f.close().unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for i in 0..12 {
        let got = std::fs::read(server.export.path().join(format!("w{i}"))).unwrap();
        assert_eq!(got.len(), 2 * data.len());
        assert!(got[..data.len()] == data[..] && got[data.len()..] == data[..], "file w{i} differs");
    }
}

fn serve_first_line(args: &[&str]) -> (String, std::process::Output) {
    let state = TempDir::new("serve-args");
    let out = std::process::Command::new(common::FERRY)
        .arg("serve")
        .args(args)
        .arg("--token-file")
        .arg(state.path().join("token"))
        .output()
        .unwrap();
    (String::from_utf8_lossy(&out.stdout).into_owned(), out)
}

#[test]
fn serve_of_a_missing_directory_fails_before_saying_it_listens() {
    let (stdout, out) = serve_first_line(&["/nonexistent/ferry-export", "--listen", "127.0.0.1:0"]);
    assert!(!out.status.success());
    assert_eq!(stdout, "", "nothing on stdout: scripts wait for the listening line");
    assert!(stderr(&out).contains("/nonexistent/ferry-export"), "{}", stderr(&out));
    let file = TempDir::new("not-a-dir");
    let f = file.path().join("f");
    std::fs::write(&f, b"x").unwrap();
    let (stdout, out) = serve_first_line(&[f.to_str().unwrap(), "--listen", "127.0.0.1:0"]);
    assert!(!out.status.success() && stdout.is_empty(), "{}", stderr(&out));
}

#[test]
fn listen_takes_a_bare_port_and_explains_a_bad_address() {
    // A bare port is that port on loopback.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let export = TempDir::new("bare-port");
    let state = TempDir::new("bare-port-state");
    let mut child = std::process::Command::new(common::FERRY)
        .arg("serve")
        .arg(export.path())
        .args(["--listen", &port.to_string(), "--token-file"])
        .arg(state.path().join("token"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(line.trim(), format!("listening on 127.0.0.1:{port}"));
    let (_, out) = serve_first_line(&[export.path().to_str().unwrap(), "--listen", "nowhere"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("expected HOST:PORT"), "{}", stderr(&out));
}

/// A connection the far side shuts down without reading what was sent
/// (here: a proxy that stops after 8 MiB) must end a large write with an
/// error, not leave the sender blocked for ever on a full send buffer.
#[test]
fn a_peer_that_hangs_up_without_reading_ends_a_write_with_an_error() {
    let server = Server::start(&[]);
    let proxy = Proxy::cutting(server.addr(), 8 << 20, usize::MAX);
    let c = Client::connect(&format!("127.0.0.1:{}", proxy.port), &server.tcp_options()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let data = random_bytes(64 << 20, 4);
        let r = c.write("/big", &data);
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    let r = rx.recv_timeout(Duration::from_secs(60)).expect("the write hung on a half-closed connection");
    let e = r.expect_err("the write cannot have gone through the cut");
    let l = e.to_lowercase();
    assert!(l.contains("closed") || l.contains("reset") || l.contains("broken pipe"), "{e}");
}

/// A server that stops answering (here: SIGSTOP) is reported while the
/// client waits, and the client goes on when it answers again: a delay and
/// a message, never a silent hang and never a lost request.
#[test]
fn a_stopped_server_is_reported_while_the_client_waits() {
    let server = Server::start(&[]);
    std::fs::write(server.export.path().join("f"), b"still here").unwrap();
    let local = TempDir::new("stop");
    let (ready, go) = (local.path().join("ready"), local.path().join("go"));
    // Connected (the handshake done) before the server stops.
    let script = format!(
        "import os, time\nos.stat('/remote/f')\nopen({ready:?}, 'w').close()\nwhile not os.path.exists({go:?}): time.sleep(0.01)\nprint(open('/remote/f').read())\n",
        ready = ready.to_str().unwrap(),
        go = go.to_str().unwrap()
    );
    let prog = std::process::Command::new(common::FERRY)
        .args(["run", "--mount", &format!("/remote={}", server.url("/")), "--", "python3", "-c", &script])
        .env("FERRY_TOKEN_FILE", &server.token_file)
        .env_remove("FERRY_TOKEN")
        .env_remove("FERRY_MOUNTS")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !ready.exists() {
        assert!(t.elapsed() < Duration::from_secs(30), "the program did not start");
        thread::sleep(Duration::from_millis(10));
    }
    let pid = rustix::process::Pid::from_raw(server.pid() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
    std::fs::write(&go, b"").unwrap();
    // Past the 15 s notice, with room for a program slow to send its
    // request on a busy machine (CI once saw no notice at 17 s).
    thread::sleep(Duration::from_secs(21));
    rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
    let out = prog.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(out.stdout, b"still here\n");
    assert!(err.contains("no reply for 15 s") && err.contains("answering again"), "{err}");
}

/// A server that cannot start makes no token: a typo in the export's name
/// or a bad address left a fresh secret in ~/.config/ferry/token (or the
/// file named), which the next, right, command then served with.
#[test]
fn a_serve_that_cannot_start_leaves_no_token_behind() {
    let home = TempDir::new("serve-no-token");
    let export = TempDir::new("serve-no-token-export");
    let default = home.path().join(".config/ferry/token");
    let named = home.path().join("named-token");
    let typo = export.path().join("dtaa");
    let typo = typo.to_str().unwrap();
    let exp = export.path().to_str().unwrap();
    let state = home.path().join("state");
    let state = state.to_str().unwrap();
    for (args, token) in [
        (vec![typo, "--listen", "127.0.0.1:0"], &default),
        (vec![typo, "--listen", "127.0.0.1:0", "--token-file", named.to_str().unwrap()], &named),
        (vec![exp, "--listen", "127.0.0.1:99999"], &default),
        (vec![exp, "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:99999"], &default),
    ] {
        let out = std::process::Command::new(common::FERRY)
            .arg("serve")
            .args(&args)
            .args(["--state-dir", state])
            .env("HOME", home.path())
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("FERRY_TOKEN_FILE")
            .output()
            .unwrap();
        assert!(!out.status.success(), "ferry serve {args:?} started");
        assert!(out.stdout.is_empty(), "ferry serve {args:?}: {}", String::from_utf8_lossy(&out.stdout));
        assert!(!token.exists(), "ferry serve {args:?} failed ({}) but made {}", stderr(&out), token.display());
    }
    // The same, right, makes it and serves.
    let mut child = std::process::Command::new(common::FERRY)
        .args(["serve", exp, "--listen", "127.0.0.1:0", "--state-dir", state])
        .env("HOME", home.path())
        .env_remove("XDG_CONFIG_HOME")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.starts_with("listening on 127.0.0.1:"), "{line:?}");
    assert!(default.exists(), "no token made by a server that started");
}
