//! Two `ferry serve` of one directory (how one tries gateways on one
//! machine): each keeps its own state, and a state directory that cannot
//! be used stops the server before its `listening on` line, saying how to
//! choose (`--state-dir`, `--no-state`).

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{TempDir, FERRY};

struct Serve {
    child: Child,
    first_line: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(export: &Path, state_home: &Path, extra: &[&str]) -> Serve {
    let mut child = Command::new(FERRY)
        .arg("serve")
        .arg(export)
        .args(["--listen", "127.0.0.1:0", "--no-auth"])
        .args(extra)
        .env("XDG_STATE_HOME", state_home)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first_line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first_line).unwrap();
    Serve { child, first_line }
}

#[test]
fn two_servers_of_one_directory_each_keep_their_own_state() {
    let base = TempDir::new("twice");
    let (export, state) = (base.path().join("export"), base.path().join("state"));
    std::fs::create_dir(&export).unwrap();
    let mut a = serve(&export, &state, &[]);
    let mut b = serve(&export, &state, &[]);
    for s in [&a, &b] {
        assert!(s.first_line.starts_with("listening on 127.0.0.1:"), "{:?}", s.first_line);
    }
    std::thread::sleep(Duration::from_millis(500));
    for s in [&mut a, &mut b] {
        if let Ok(Some(st)) = s.child.try_wait() {
            let mut err = String::new();
            let _ = std::io::Read::read_to_string(s.child.stderr.as_mut().unwrap(), &mut err);
            panic!("a server of the same directory exited ({st}) after `{}`: {err}", s.first_line.trim());
        }
    }
    let dirs = std::fs::read_dir(state.join("ferry/serve")).unwrap().count();
    assert_eq!(dirs, 2, "two servers, two state directories");
}

/// Both ways a state directory is unusable: one asked for that another
/// server holds, and a default one that cannot be made.
#[test]
fn an_unusable_state_directory_stops_the_server_before_listening() {
    let base = TempDir::new("state-busy");
    let (export, state, held) = (base.path().join("export"), base.path().join("state"), base.path().join("held"));
    std::fs::create_dir(&export).unwrap();
    let a = serve(&export, &state, &["--state-dir", held.to_str().unwrap()]);
    assert!(a.first_line.starts_with("listening on"), "{:?}", a.first_line);
    let not_a_dir = base.path().join("file");
    std::fs::write(&not_a_dir, b"").unwrap();
    for (home, extra) in [(&state, vec!["--state-dir", held.to_str().unwrap()]), (&not_a_dir, vec![])] {
        // Bounded: a server that starts anyway is ended after 10 s.
        let o = Command::new("timeout")
            .args(["10", FERRY, "serve"])
            .arg(&export)
            .args(["--listen", "127.0.0.1:0", "--no-auth"])
            .args(&extra)
            .env("XDG_STATE_HOME", home)
            .output()
            .unwrap();
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert_eq!(out, "", "a server without its state said it listens: {err}");
        assert!(!o.status.success(), "{err}");
        assert!(err.contains("--state-dir") && err.contains("--no-state"), "{err}");
    }
}
