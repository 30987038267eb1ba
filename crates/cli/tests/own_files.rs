//! What `ferry serve` writes for itself — its token, TLS certificate and
//! key, the state directory with its sessions' files — is its user's
//! alone, although the server clears its umask (clients' modes are
//! applied as they send them): nothing others may write, and nothing
//! holding a secret others may read.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{TempDir, FERRY};
use ferry_client::{Client, Options};

/// Every file and directory under `root`, itself included.
fn walk(root: &Path, out: &mut Vec<PathBuf>) {
    out.push(root.to_path_buf());
    if root.symlink_metadata().unwrap().is_dir() {
        for e in std::fs::read_dir(root).unwrap() {
            walk(&e.unwrap().path(), out);
        }
    }
}

#[test]
fn what_the_server_makes_for_itself_is_its_users_alone() {
    let base = TempDir::new("own-files");
    let (export, config, state, sock) =
        (base.path().join("export"), base.path().join("config"), base.path().join("state"), base.path().join("sock"));
    std::fs::create_dir(&export).unwrap();
    // The default places of everything: token, TLS pair, state directory.
    let mut child = Command::new(FERRY)
        .arg("serve")
        .arg(&export)
        .args(["--listen", "127.0.0.1:0", "--tls", "--no-root-squash", "--unix"])
        .arg(&sock)
        .env("XDG_CONFIG_HOME", &config)
        .env("XDG_STATE_HOME", &state)
        .env_remove("FERRY_TOKEN_FILE")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("listening on"), "{line:?}");
    let token = std::fs::read_to_string(config.join("ferry/token")).unwrap().trim().as_bytes().to_vec();

    // A session the server journals (its secret goes to the state directory).
    let c = Client::connect(&format!("unix:{}", sock.display()), &Options { token: Some(token), ..Options::default() })
        .unwrap();
    c.new_session().unwrap();
    c.write("/f", b"x").unwrap();
    let mut all = Vec::new();
    let journaled = common::fuse::wait_for(Duration::from_secs(10), || {
        all.clear();
        walk(&state, &mut all);
        all.iter().any(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("s-")))
    });
    assert!(journaled, "no session file under {}", state.display());
    walk(&config, &mut all);
    for name in ["ferry/token", "ferry/tls/key.pem", "ferry/tls/cert.pem"] {
        assert!(all.contains(&config.join(name)), "{name} was not made");
    }
    assert!(all.iter().any(|p| p.ends_with("export")), "the state directory's export file was not made");

    let mut wrong = Vec::new();
    for p in &all {
        let m = p.symlink_metadata().unwrap();
        let mode = m.permissions().mode() & 0o7777;
        let name = p.file_name().unwrap().to_string_lossy();
        let secret = name.starts_with("s-") || name == "token" || name == "key.pem" || name == "export";
        if m.uid() != rustix::process::geteuid().as_raw() {
            wrong.push(format!("{} is owned by {}", p.display(), m.uid()));
        }
        if mode & 0o022 != 0 {
            wrong.push(format!("{} is {mode:o}: others may write it", p.display()));
        }
        if (secret || m.is_dir()) && mode & 0o077 != 0 {
            wrong.push(format!("{} is {mode:o}: others may read it", p.display()));
        }
    }
    // The Unix socket is the clients' door, as the TCP port: the token is
    // what keeps others out. Not in the walk.
    assert!(sock.symlink_metadata().unwrap().file_type().is_socket());
    let _ = child.kill();
    let _ = child.wait();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_state_directory_others_may_write_to_is_refused() {
    let base = TempDir::new("open-state");
    let state = base.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut child = Command::new(FERRY)
        .arg("serve")
        .arg(base.path())
        .args(["--listen", "127.0.0.1:0", "--no-auth", "--state-dir"])
        .arg(&state)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A server that serves says so on its first line: then it is ended.
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    if !line.is_empty() {
        let _ = child.kill();
    }
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(line.is_empty() && !o.status.success(), "served with a state directory anyone may write: {line}{err}");
    assert!(err.contains("may write to it"), "{err}");
}
