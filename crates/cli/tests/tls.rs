//! TLS between clients and `ferry serve` (docs/security-and-deploying.md, "Deploying on a
//! network"): what passes on the wire is sealed (captured here by a relay
//! in the middle), the first certificate is trusted and kept and a changed
//! one refused, a server that requires TLS gets it from a client that did
//! not ask, and a client that asked never falls back to plaintext.

mod common;

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use common::restart::Serve;
use common::{Server, TempDir, FERRY};

/// A relay on 127.0.0.1 to `to` that keeps a copy of every byte it passes,
/// both ways, for as long as the test lives.
struct Tap {
    port: u16,
    seen: Arc<Mutex<Vec<u8>>>,
}

impl Tap {
    fn to(to: u16) -> Tap {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let keep = Arc::clone(&seen);
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let Ok(s) = TcpStream::connect(("127.0.0.1", to)) else { return };
                for (mut a, mut b) in [(c.try_clone().unwrap(), s.try_clone().unwrap()), (s, c)] {
                    let keep = Arc::clone(&keep);
                    std::thread::spawn(move || {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            match a.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    keep.lock().unwrap().extend_from_slice(&buf[..n]);
                                    if b.write_all(&buf[..n]).is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = b.shutdown(std::net::Shutdown::Write);
                    });
                }
            }
        });
        Tap { port, seen }
    }

    fn saw(&self, needle: &[u8]) -> bool {
        self.seen.lock().unwrap().windows(needle.len()).any(|w| w == needle)
    }

    fn bytes(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

/// `ferry ARGS` with its own configuration directory (`known_servers`),
/// the server's token, over TCP only (the same-host path would skip the
/// network), and `env`.
fn ferry(cfg: &Path, token: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(FERRY)
        .args(args)
        .env("XDG_CONFIG_HOME", cfg)
        .env("FERRY_TOKEN_FILE", token)
        .env("FERRY_SAME_HOST", "0")
        .env_remove("FERRY_TLS")
        .env_remove("FERRY_TLS_FINGERPRINT")
        .envs(env.iter().copied())
        .output()
        .expect("run ferry")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A pattern no encryption would leave whole, long enough to be in every
/// record of a transfer.
fn pattern() -> Vec<u8> {
    b"FERRY-PLAINTEXT-MARKER-".iter().copied().cycle().take(300_000).collect()
}

#[test]
fn with_tls_neither_data_nor_token_is_on_the_wire_and_without_it_the_data_is() {
    let cfg = TempDir::new("tls-cfg");
    let local = TempDir::new("tls-local");
    let data = pattern();
    fs::write(local.path().join("up"), &data).unwrap();
    let up = local.path().join("up");
    for tls in [true, false] {
        let server =
            Server::start_env(if tls { &["--tls"] } else { &[] }, &[("XDG_CONFIG_HOME", cfg.path().to_str().unwrap())]);
        let tap = Tap::to(server.port);
        let url = |p: &str| format!("ferry://127.0.0.1:{}{p}", tap.port);
        let o = ferry(cfg.path(), &server.token_file, &[], &["cp", up.to_str().unwrap(), &url("/f")]);
        assert!(o.status.success(), "{}", text(&o));
        let o = ferry(cfg.path(), &server.token_file, &[], &["cat", &url("/f")]);
        assert!(o.status.success() && o.stdout == data, "{}", String::from_utf8_lossy(&o.stderr));
        assert!(tap.bytes() > 2 * data.len(), "the data went through the tap both ways");
        let marker = b"FERRY-PLAINTEXT-MARKER-FERRY";
        let token = fs::read_to_string(&server.token_file).unwrap();
        assert!(!tap.saw(token.trim().as_bytes()), "the token never travels, TLS or not");
        match tls {
            true => assert!(!tap.saw(marker), "file data visible on the wire under TLS"),
            false => assert!(tap.saw(marker), "the tap must see plaintext without TLS (else it proves nothing)"),
        }
    }
}

#[test]
fn the_first_certificate_is_kept_and_a_changed_one_refused() {
    let cfg = TempDir::new("tls-tofu");
    let dir = TempDir::new("tls-tofu-server");
    let export = dir.path().join("export");
    fs::create_dir(&export).unwrap();
    fs::write(export.join("f"), b"hello").unwrap();
    let token = dir.path().join("token");
    let (c1, k1) = (dir.path().join("c1.pem"), dir.path().join("k1.pem"));
    let (c2, k2) = (dir.path().join("c2.pem"), dir.path().join("k2.pem"));
    let tls = |c: &Path, k: &Path| {
        ["--tls".to_string(), format!("--tls-cert={}", c.display()), format!("--tls-key={}", k.display())]
    };
    let args1 = tls(&c1, &k1);
    let a1: Vec<&str> = args1.iter().map(String::as_str).collect();
    let mut server = Serve::launch_with(export.as_os_str(), 0, &token, &a1);
    let url = format!("ferry://127.0.0.1:{}/f", server.port);
    let o = ferry(cfg.path(), &token, &[], &["cat", &url]);
    assert!(o.status.success() && o.stdout == b"hello", "{}", text(&o));
    assert!(text(&o).contains("first TLS connection"), "said once: {}", text(&o));
    let known = fs::read_to_string(cfg.path().join("ferry/known_servers")).unwrap();
    assert!(known.starts_with(&format!("127.0.0.1:{} sha256:", server.port)), "{known}");
    let o = ferry(cfg.path(), &token, &[], &["cat", &url]);
    assert!(o.status.success() && !text(&o).contains("first TLS connection"), "{}", text(&o));

    // The same address, another certificate: someone in between, as far
    // as the client can tell.
    server.kill();
    let args2 = tls(&c2, &k2);
    let a2: Vec<&str> = args2.iter().map(String::as_str).collect();
    let _server = Serve::launch_with(export.as_os_str(), server.port, &token, &a2);
    let o = ferry(cfg.path(), &token, &[], &["cat", &url]);
    assert!(!o.status.success() && o.stdout.is_empty(), "{}", text(&o));
    assert!(text(&o).contains("CHANGED") && text(&o).contains("known_servers"), "{}", text(&o));
    // A fingerprint pinned by hand wins over the file, right or wrong.
    let fp = known.split_whitespace().nth(1).unwrap();
    let o = ferry(cfg.path(), &token, &[("FERRY_TLS_FINGERPRINT", fp)], &["cat", &url]);
    assert!(!o.status.success() && text(&o).contains("FERRY_TLS_FINGERPRINT"), "{}", text(&o));
}

#[test]
fn a_server_requiring_tls_gets_it_and_a_client_asking_for_it_never_falls_back() {
    let cfg = TempDir::new("tls-mode");
    let tls_server = Server::start_env(&["--tls"], &[("XDG_CONFIG_HOME", cfg.path().to_str().unwrap())]);
    let plain = Server::start(&[]);
    fs::write(tls_server.export.path().join("f"), b"x").unwrap();
    fs::write(plain.export.path().join("f"), b"x").unwrap();
    // On loopback a client starts without TLS; told it is required, it
    // connects again with it.
    let o = ferry(cfg.path(), &tls_server.token_file, &[], &["cat", &tls_server.url("/f")]);
    assert!(o.status.success(), "{}", text(&o));
    // Unless TLS was turned off on purpose: then it says why it cannot.
    let o = ferry(cfg.path(), &tls_server.token_file, &[("FERRY_TLS", "0")], &["cat", &tls_server.url("/f")]);
    assert!(!o.status.success() && text(&o).contains("requires TLS"), "{}", text(&o));
    // A client that asks for TLS, at a server without it: an error, never
    // the plaintext connection.
    let o = ferry(cfg.path(), &plain.token_file, &[("FERRY_TLS", "1")], &["cat", &plain.url("/f")]);
    assert!(!o.status.success() && text(&o).contains("TLS"), "{}", text(&o));
    // A plaintext peer that is not ferry at all is still named as such.
    let o = ferry(cfg.path(), &plain.token_file, &[], &["cat", &plain.url("/f")]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn the_mount_and_ferry_run_work_over_tls() {
    use common::fuse::{mount_url_env, require_fuse, Detach};
    require_fuse();
    let cfg = TempDir::new("tls-mount");
    let server = Server::start_env(&["--tls"], &[("XDG_CONFIG_HOME", cfg.path().to_str().unwrap())]);
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 4096) as u8).collect();
    fs::write(server.export.path().join("big"), &data).unwrap();
    let mp = server.state.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    let env = [("XDG_CONFIG_HOME", cfg.path().to_str().unwrap()), ("FERRY_SAME_HOST", "0")];
    let _m = mount_url_env(&server.url("/"), &mp, &server.token_file, &[], &env);
    let _d = Detach(mp.clone());
    assert_eq!(fs::read(mp.join("big")).unwrap(), data, "a read through the mount, sealed");
    fs::write(mp.join("written"), &data).unwrap();
    assert_eq!(fs::read(server.export.path().join("written")).unwrap(), data);
    let o = Command::new(FERRY)
        .args(["run", "--mount"])
        .arg(format!("/r={}", server.url("/")))
        .args(["--", "sh", "-c", "cmp /r/big /r/written && echo same"])
        .env("FERRY_TOKEN_FILE", &server.token_file)
        .envs(env)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "same\n", "{}", text(&o));
}

/// Runs `openssl ARGS` in `dir` (test.sh installs it).
fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl (test.sh installs it)");
    assert!(o.status.success(), "openssl {args:?}: {}", text(&o));
}

/// A CA, and a server certificate for 127.0.0.1 it signed, in `dir`.
fn ca_and_server(dir: &Path, tag: &str) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let ca = format!("/CN=ferry test CA {tag}");
    openssl(
        dir,
        &[&["req", "-x509"][..], &ec, &["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", &ca]].concat(),
    );
    openssl(dir, &[&["req"][..], &ec, &["-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=127.0.0.1"]].concat());
    fs::write(
        dir.join("ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "srv.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "srv.pem",
            "-days",
            "2",
            "-extfile",
            "ext",
        ],
    );
}

#[test]
fn with_a_ca_the_server_is_verified_by_it_and_nothing_is_pinned() {
    let cfg = TempDir::new("tls-ca-cfg");
    let (ours, theirs) = (TempDir::new("tls-ca-ours"), TempDir::new("tls-ca-theirs"));
    ca_and_server(ours.path(), "ours");
    ca_and_server(theirs.path(), "theirs");
    let cert = format!("--tls-cert={}", ours.path().join("srv.pem").display());
    let key = format!("--tls-key={}", ours.path().join("srv.key").display());
    let server = Server::start(&["--tls", &cert, &key]);
    fs::write(server.export.path().join("f"), b"verified").unwrap();
    let ca = |d: &TempDir| format!("--tls-ca={}", d.path().join("ca.pem").display());
    let o = ferry(cfg.path(), &server.token_file, &[], &[&ca(&ours), "cat", &server.url("/f")]);
    assert!(o.status.success() && o.stdout == b"verified", "{}", text(&o));
    assert!(!cfg.path().join("ferry/known_servers").exists(), "a CA-verified server is not pinned");
    // Another CA did not sign it: refused, whatever was seen before.
    let o = ferry(cfg.path(), &server.token_file, &[], &[&ca(&theirs), "cat", &server.url("/f")]);
    assert!(!o.status.success() && o.stdout.is_empty(), "{}", text(&o));
    assert!(text(&o).to_lowercase().contains("issuer") || text(&o).contains("certificate"), "{}", text(&o));
}
