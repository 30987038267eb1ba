//! Installing ferry as the README says, and the pieces a system install
//! uses: `make install` (ferry and the preload library where `ferry run`
//! finds them), the mount(8) helper (`mount -t fuse.ferry`, an fstab line)
//! and the systemd unit for `ferry serve`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::fuse::wait_for;
use common::{stderr, stdout, Server, TempDir, FERRY};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn make(args: &[&str]) -> Output {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let o = Command::new("make")
        .arg("-C")
        .arg(repo())
        .args(args)
        .arg(format!("CARGO={cargo}"))
        .output()
        .expect("make is needed (test.sh installs it)");
    assert!(o.status.success(), "make {args:?}: {}{}", stdout(&o), stderr(&o));
    o
}

#[test]
fn make_install_puts_ferry_and_its_library_where_ferry_run_finds_them() {
    let tmp = TempDir::new("install");
    let prefix = tmp.path().join("prefix");
    make(&["install", &format!("PREFIX={}", prefix.display())]);
    let ferry = prefix.join("bin/ferry");
    assert!(ferry.is_file() && prefix.join("lib/ferry/libferry_preload.so").is_file());
    // The man pages and completions, made by the installed ferry.
    let page = prefix.join("share/man/man1/ferry-cp.1");
    let bash = prefix.join("share/bash-completion/completions/ferry");
    let zsh = prefix.join("share/zsh/site-functions/_ferry");
    let fish = prefix.join("share/fish/vendor_completions.d/ferry.fish");
    assert!(std::fs::read_to_string(&page).unwrap().contains(".TH ferry-cp 1"));
    assert!(prefix.join("share/man/man1/ferry.1").is_file());
    assert!(std::fs::read_to_string(&bash).unwrap().contains("complete -F _ferry"));
    assert!(zsh.is_file() && fish.is_file());
    let o = Command::new("man")
        .arg("-w")
        .arg("ferry-cp")
        .env("PATH", format!("{}:/usr/bin:/bin", prefix.join("bin").display()))
        .output()
        .unwrap();
    assert_eq!(stdout(&o).trim(), page.to_str().unwrap(), "man does not find the page from PATH: {}", stderr(&o));
    let srv = Server::start(&[]);
    std::fs::write(srv.export.path().join("f"), b"through the installed ferry\n").unwrap();
    let o = Command::new(&ferry)
        .args(["run", "--mount", &format!("/remote={}", srv.url("/")), "--", "cat", "/remote/f"])
        .env("FERRY_TOKEN_FILE", &srv.token_file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "through the installed ferry\n");
    // Everything under the prefix: the default SBINDIR and UNITDIR are the
    // system's, where another test needs the mount helper.
    let (sbin, units) = (prefix.join("sbin"), prefix.join("units"));
    make(&[
        "uninstall",
        &format!("PREFIX={}", prefix.display()),
        &format!("SBINDIR={}", sbin.display()),
        &format!("UNITDIR={}", units.display()),
    ]);
    assert!(!ferry.exists());
    assert!(!page.exists() && !bash.exists() && !zsh.exists() && !fish.exists());
}

/// The line of /proc/self/mountinfo for `mp`.
fn mount_entry(mp: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().find(|l| l.split(' ').nth(4) == mp.to_str()).map(str::to_string)
}

/// Unmounts (lazily) on drop, so a failing test leaves no mount.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if mount_entry(&self.0).is_some() {
            let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

fn mount_cmd(args: &[&str]) -> Output {
    // The helper runs `ferry` from FERRY when set: this build's.
    Command::new("mount").args(args).env("FERRY", FERRY).stdin(Stdio::null()).output().unwrap()
}

#[test]
fn mount_t_fuse_ferry_and_an_fstab_line_mount_through_the_helper() {
    common::fuse::require_fuse();
    let helper = Path::new("/sbin/mount.fuse.ferry");
    assert!(helper.is_file(), "{} is missing: `make install-mount-helper` (test.sh does it)", helper.display());
    let srv = Server::start(&[]);
    std::fs::write(srv.export.path().join("f"), b"hello\n").unwrap();
    let tmp = TempDir::new("helper");
    let mp = tmp.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let _u = Unmount(mp.clone());
    let url = srv.url("/");
    let opts = format!("ro,noatime,_netdev,token_file={}", srv.token_file.display());

    // mount -t fuse.ferry URL DIR -o ...: returns once the mount is ready.
    let o = mount_cmd(&["-t", "fuse.ferry", &url, mp.to_str().unwrap(), "-o", &opts]);
    assert!(o.status.success(), "mount -t fuse.ferry: {}", stderr(&o));
    let entry = mount_entry(&mp).expect("mounted");
    assert!(entry.contains("fuse.ferry") && entry.contains(" ro,"), "{entry}");
    assert_eq!(std::fs::read(mp.join("f")).unwrap(), b"hello\n");
    let e = std::fs::write(mp.join("g"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    assert!(Command::new("umount").arg(&mp).status().unwrap().success());
    assert!(mount_entry(&mp).is_none());

    // An /etc/fstab line (here a file of its own: mount -T).
    let fstab = tmp.path().join("fstab");
    let line = format!("{url} {} fuse.ferry noauto,token_file={} 0 0\n", mp.display(), srv.token_file.display());
    std::fs::write(&fstab, line).unwrap();
    let o = mount_cmd(&["-T", fstab.to_str().unwrap(), mp.to_str().unwrap()]);
    assert!(o.status.success(), "mount from fstab: {}", stderr(&o));
    std::fs::write(mp.join("via-fstab"), b"rw\n").unwrap();
    assert_eq!(std::fs::read(srv.export.path().join("via-fstab")).unwrap(), b"rw\n");
    assert!(Command::new("umount").arg(&mp).status().unwrap().success());
    assert!(mount_entry(&mp).is_none());
}

/// The unit's own command line, as systemd would run it (its paths moved
/// under a temporary directory), serves; `systemd-analyze verify` finds
/// nothing wrong with the unit.
#[test]
fn the_systemd_unit_serves() {
    let tmp = TempDir::new("unit");
    let bindir = Path::new(FERRY).parent().unwrap();
    make(&["install-systemd", &format!("UNITDIR={}", tmp.path().display()), &format!("BINDIR={}", bindir.display())]);
    let unit = std::fs::read_to_string(tmp.path().join("ferry-serve@.service")).unwrap();
    let instance = tmp.path().join("ferry-serve@srv-data.service");
    std::fs::write(&instance, &unit).unwrap();
    let o = Command::new("systemd-analyze").arg("verify").arg(&instance).output().expect("systemd-analyze (systemd)");
    let complaints = stderr(&o);
    assert!(o.status.success() && !complaints.contains("ferry-serve"), "systemd-analyze verify: {complaints}");

    let export = tmp.path().join("srv/data");
    std::fs::create_dir_all(&export).unwrap();
    std::fs::write(export.join("f"), b"served by the unit\n").unwrap();
    let exec = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("ExecStart");
    let (etc, var) = (tmp.path().join("etc/ferry"), tmp.path().join("var/lib/ferry"));
    let argv: Vec<String> = exec
        .split_whitespace()
        .map(|w| {
            w.replace("%f", export.to_str().unwrap())
                .replace("%i", "srv-data")
                .replace("${FERRY_LISTEN}", "127.0.0.1:0")
                .replace("/etc/ferry", etc.to_str().unwrap())
                .replace("/var/lib/ferry", var.to_str().unwrap())
        })
        .collect();
    let mut child =
        Command::new(&argv[0]).args(&argv[1..]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    let addr = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("{line:?}")).to_string();
    let o = Command::new(FERRY)
        .args(["cat", &format!("ferry://{addr}/f")])
        .env("FERRY_TOKEN_FILE", etc.join("token"))
        .output()
        .unwrap();
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    );
    let stopped = wait_for(Duration::from_secs(10), || matches!(child.try_wait(), Ok(Some(_))));
    if !stopped {
        let _ = child.kill();
    }
    let _ = child.wait();
    assert_eq!(stdout(&o), "served by the unit\n", "{}", stderr(&o));
    assert!(stopped, "SIGTERM (the unit's KillSignal) did not stop the server");
    assert!(var.join("srv-data").is_dir(), "no state directory");
}

/// The licence files are those Cargo.toml and the Python package name.
#[test]
fn the_licence_files_match_the_manifests() {
    let manifest = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    assert!(manifest.contains("license = \"MIT OR Apache-2.0\""), "the workspace licence changed: update LICENSE-*");
    for f in ["python/Cargo.toml", "python/pyproject.toml"] {
        let text = std::fs::read_to_string(repo().join(f)).unwrap();
        assert!(text.contains("MIT OR Apache-2.0"), "{f} names another licence");
    }
    let apache = std::fs::read_to_string(repo().join("LICENSE-APACHE")).unwrap();
    assert!(apache.contains("Apache License") && apache.contains("Version 2.0, January 2004"));
    assert!(apache.contains("END OF TERMS AND CONDITIONS"));
    let mit = std::fs::read_to_string(repo().join("LICENSE-MIT")).unwrap();
    assert!(mit.contains("Permission is hereby granted, free of charge") && mit.contains("WITHOUT WARRANTY OF"));
}
