//! A mount open to other users (`--allow-other`) enforces their
//! permissions: the server acts with its own rights for every request, so
//! the kernel must check the caller's.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::fuse::{mount_url, require_fuse, Detach, Mounted};
use common::{Server, FERRY};

fn as_nobody(script: &str) -> (bool, String) {
    let o = Command::new("runuser")
        .args(["-u", "nobody", "--", "sh", "-c", script])
        .stdin(Stdio::null())
        .output()
        .expect("runuser (util-linux) is needed for this test");
    (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn mount(server: &Server, mp: &Path, extra: &[&str]) -> Mounted {
    mount_url(&server.url("/"), mp, &server.token_file, extra)
}

/// A server whose export, state directory and a mount point `mnt` in it
/// other users may reach; returns the mount point (not yet mounted).
fn reachable_server() -> (Server, std::path::PathBuf) {
    let server = Server::start(&[]);
    fs::set_permissions(server.export.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(server.state.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let mp = server.state.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    fs::set_permissions(&mp, fs::Permissions::from_mode(0o755)).unwrap();
    (server, mp)
}

#[test]
fn other_users_of_an_allow_other_mount_get_their_own_rights() {
    require_fuse();
    let (server, mp) = reachable_server();
    let secret = server.export.path().join("secret");
    fs::write(&secret, b"root only\n").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    let _m = mount(&server, &mp, &["--allow-other"]);
    let _d = Detach(mp.clone());
    let f = mp.join("secret");
    let f = f.display();
    let (ok, err) = as_nobody(&format!("cat {f}"));
    assert!(!ok && err.contains("Permission denied"), "nobody read a 0600 root file: {err}");
    let (ok, err) = as_nobody(&format!("echo x >> {f}"));
    assert!(!ok && err.contains("Permission denied"), "nobody appended to a 0600 root file: {err}");
    let (ok, err) = as_nobody(&format!("chown nobody {f}"));
    assert!(!ok && err.contains("not permitted"), "nobody took a root file: {err}");
    assert_eq!(fs::read(&secret).unwrap(), b"root only\n");
    // What nobody may do, nobody can do: a world-writable directory.
    let open = server.export.path().join("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    let (ok, err) = as_nobody(&format!("echo hi > {}/open/mine && cat {}/open/mine", mp.display(), mp.display()));
    assert!(ok, "{err}");
}

/// `ferry serve` run by `nobody`, on a directory `nobody` owns.
struct NobodyServer {
    child: Child,
    url: String,
    token: std::path::PathBuf,
}

impl Drop for NobodyServer {
    fn drop(&mut self) {
        // runuser forwards SIGTERM to the server it started and waits for
        // it; a SIGKILL would end runuser alone and leave the server running.
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        for _ in 0..500 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve_as_nobody(export: &Path, state: &Path) -> NobodyServer {
    use std::io::BufRead;
    let token = state.join("token");
    // nobody's HOME is /nonexistent: its state directory is named, or the
    // server would refuse to start without one.
    let mut child = Command::new("runuser")
        .args(["-u", "nobody", "--"])
        .arg(FERRY)
        .arg("serve")
        .arg(export)
        .args(["--listen", "127.0.0.1:0", "--token-file"])
        .arg(&token)
        .arg("--state-dir")
        .arg(state.join("sessions"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("runuser (util-linux) is needed for this test");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("{line:?}")).to_string();
    NobodyServer { child, url: format!("ferry://{addr}/"), token }
}

#[test]
fn creating_through_a_server_that_is_not_root_succeeds_and_leaves_nothing_half_done() {
    use std::os::unix::fs::MetadataExt;
    require_fuse();
    let base = common::TempDir::new("nonroot");
    fs::set_permissions(base.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let (export, state) = (base.path().join("export"), base.path().join("state"));
    for d in [&export, &state] {
        fs::create_dir(d).unwrap();
        rustix::fs::chown(d.as_path(), Some(rustix::fs::Uid::from_raw(65534)), Some(rustix::fs::Gid::from_raw(65534)))
            .unwrap();
    }
    let server = serve_as_nobody(&export, &state);
    let mp = base.path().join("mnt");
    fs::create_dir(&mp).unwrap();
    let _m = mount_url(&server.url, &mp, &server.token, &[]);
    let _d = Detach(mp.clone());
    // root creates through the mount: every kind of node works, and belongs
    // to the server's user (who cannot give it away).
    fs::write(mp.join("f"), b"data").unwrap();
    fs::create_dir(mp.join("d")).unwrap();
    std::os::unix::fs::symlink("f", mp.join("l")).unwrap();
    let st = Command::new("mkfifo").arg(mp.join("p")).status().unwrap();
    assert!(st.success());
    let st = Command::new("touch").arg(mp.join("t")).status().unwrap();
    assert!(st.success());
    for n in ["f", "d", "l", "p", "t"] {
        let m = fs::symlink_metadata(export.join(n)).unwrap_or_else(|e| panic!("{n}: {e}"));
        assert_eq!(m.uid(), 65534, "{n} is the server user's");
    }
    assert_eq!(fs::read(export.join("f")).unwrap(), b"data");
    let mut names: Vec<_> = fs::read_dir(&export).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["d", "f", "l", "p", "t"]);
}

/// A write (and a truncate) by a user without CAP_FSETID clears set-id bits as a local file
/// system does (set-user-ID always, set-group-ID only with group execute),
/// though the server, running as root, would keep them; root's own writes
/// keep them. The expected modes come from the same writes on a local
/// directory, not from memory.
#[test]
fn a_write_by_another_user_clears_set_id_bits_as_locally() {
    require_fuse();
    let (server, mp) = reachable_server();
    let local = server.state.path().join("local");
    fs::create_dir(&local).unwrap();
    let _m = mount(&server, &mp, &["--allow-other"]);
    let _d = Detach(mp.clone());
    let modes = [0o4777, 0o2777, 0o2767, 0o6777, 0o4666];
    let mode_of = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    for (who, by_nobody) in [("nobody", true), ("root", false)] {
        for m in modes {
            let name = format!("{who}-{m:o}");
            for dir in [&local, &server.export.path().to_path_buf()] {
                fs::write(dir.join(&name), b"x").unwrap();
                fs::set_permissions(dir.join(&name), fs::Permissions::from_mode(m)).unwrap();
            }
            let append = |p: &Path| format!("echo more >> {} && truncate -s 6 {}", p.display(), p.display());
            let (on_local, on_mount) = (local.join(&name), mp.join(&name));
            if by_nobody {
                let (ok, err) = as_nobody(&append(&on_local));
                assert!(ok, "{err}");
                let (ok, err) = as_nobody(&append(&on_mount));
                assert!(ok, "{err}");
            } else {
                for p in [&on_local, &on_mount] {
                    assert!(Command::new("sh").args(["-c", &append(p)]).status().unwrap().success());
                }
            }
            let want = mode_of(&on_local);
            assert_eq!(mode_of(&server.export.path().join(&name)), want, "{name}: mode {want:o} expected");
            assert_eq!(fs::read(server.export.path().join(&name)).unwrap(), b"xmore\n");
        }
    }
}

/// Without `--allow-other`, other users reach nothing under the mount: the
/// kernel answers `EACCES` (as for a directory they may not search) before
/// a request reaches ferry, for listing, reading and changing.
#[test]
fn without_allow_other_other_users_get_eacces_for_everything() {
    require_fuse();
    let (server, mp) = reachable_server();
    fs::write(server.export.path().join("f"), b"x").unwrap();
    fs::set_permissions(server.export.path().join("f"), fs::Permissions::from_mode(0o666)).unwrap();
    let _m = mount(&server, &mp, &[]);
    let _d = Detach(mp.clone());
    let m = mp.display();
    for cmd in [
        format!("ls {m}"),
        format!("stat {m}/f"),
        format!("cat {m}/f"),
        format!("chmod 600 {m}/f"),
        format!("touch {m}/g"),
    ] {
        let (ok, err) = as_nobody(&cmd);
        assert!(!ok && err.contains("Permission denied"), "{cmd}: {err}");
    }
    assert_eq!(fs::metadata(server.export.path().join("f")).unwrap().permissions().mode() & 0o777, 0o666);
    assert!(!server.export.path().join("g").exists());
}

/// A directory its user may read but not search (mode 0644) lists its
/// names, and only looking into an entry is refused: as on a local file
/// system (the server listed it through a reopen of ".", a lookup in the
/// directory, and refused the listing; the mount then hid names it had no
/// attributes for, numbering them 0). The same script on a local
/// directory says what to expect.
#[test]
fn a_readable_directory_that_is_not_searchable_lists_as_locally() {
    require_fuse();
    let (server, mp) = reachable_server();
    let local = server.state.path().join("local");
    for d in [&local, &server.export.path().join("open")] {
        fs::create_dir(d).unwrap();
        fs::set_permissions(d, fs::Permissions::from_mode(0o777)).unwrap();
    }
    let _m = mount(&server, &mp, &["--allow-other"]);
    let _d = Detach(mp.clone());
    let script = |dir: &Path| {
        let d = dir.join("d");
        format!(
            "mkdir {d} && touch {d}/x {d}/y && chmod 644 {d} && ls {d} | tr '\\n' ' ' >&2 && \
             python3 -c 'import os,sys; print(sorted(os.listdir(sys.argv[1])), file=sys.stderr)' {d} && \
             ! stat {d}/x 2>/dev/null && echo refused >&2",
            d = d.display()
        )
    };
    let (ok, want) = as_nobody(&script(&local));
    assert!(ok, "on a local directory: {want}");
    assert_eq!(want, "x y ['x', 'y']\nrefused\n");
    let (ok, got) = as_nobody(&script(&mp.join("open")));
    assert!(ok && got == want, "on the mount: {got}");
}
