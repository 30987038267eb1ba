//! External POSIX suites against a real `ferry mount`: pjdfstest (Rust
//! port) and fsx. `test.sh` installs both; without them these tests fail
//! rather than pass silently. Expected pjdfstest failures, each with a
//! reason, live in `tests/pjdfstest.toml`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Server, TempDir, FERRY};

/// A `ferry mount` daemon; unmounted and killed (by PID) on drop, even when
/// the test fails.
struct Mount {
    child: Child,
    dir: TempDir,
}

impl Mount {
    fn start(server: &Server, extra: &[&str]) -> Mount {
        let dir = TempDir::new("mnt");
        let before = dev_of(dir.path());
        let child = Command::new(FERRY)
            .arg("mount")
            .arg(server.url("/"))
            .arg(dir.path())
            .args(extra)
            .env("FERRY_TOKEN_FILE", &server.token_file)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn ferry mount");
        let mut m = Mount { child, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while dev_of(m.path()) == before {
            if let Ok(Some(st)) = m.child.try_wait() {
                panic!("ferry mount exited early: {st}");
            }
            assert!(Instant::now() < deadline, "mount not ready after 20 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        m
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new(FERRY).arg("umount").arg(self.dir.path()).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Whatever happened, leave no mount behind.
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).stderr(Stdio::null()).status();
    }
}

fn dev_of(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).map(|m| m.dev()).unwrap_or(0)
}

/// A tool `test.sh` installs with `cargo install`.
fn tool(name: &str) -> PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    if let Some(p) = home.map(|h| h.join("bin").join(name)).filter(|p| p.exists()) {
        return p;
    }
    if let Ok(out) = Command::new("sh").arg("-c").arg(format!("command -v {name}")).output() {
        let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !s.is_empty() {
            return PathBuf::from(s);
        }
    }
    panic!("{name} is not installed: run ./test.sh, which installs it with cargo install");
}

/// Runs a command with a time bound; kills it (by PID) if it overruns.
fn run_bounded(mut cmd: Command, limit: Duration) -> (bool, String) {
    let out_file = TempDir::new("out");
    let log = out_file.path().join("log");
    let f = std::fs::File::create(&log).expect("log");
    let mut child = cmd.stdout(f.try_clone().expect("dup")).stderr(f).spawn().expect("spawn");
    let deadline = Instant::now() + limit;
    let ok = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st.success();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("command overran {limit:?}: {}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    (ok, std::fs::read_to_string(&log).unwrap_or_default())
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c2 in chars.by_ref() {
                if c2.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Runs pjdfstest on a fresh mount made with `mount_args`, against the
/// configuration `conf` (in `tests/`), whose expected failures each carry
/// a reason.
fn pjdfstest_on_a_mount(mount_args: &[&str], conf: &str) {
    // Device nodes: pjdfstest makes them (they are never opened).
    let server = Server::start(&["--allow-devices"]);
    let mount = Mount::start(&server, mount_args);
    let conf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests").join(conf);
    let work = mount.path().join("pjd");
    std::fs::create_dir(&work).expect("mkdir on the mount");
    std::fs::set_permissions(&work, std::os::unix::fs::PermissionsExt::from_mode(0o777)).expect("chmod");
    let mut cmd = Command::new(tool("pjdfstest"));
    cmd.arg("-c").arg(&conf).arg("-p").arg(&work).env("NO_COLOR", "1").current_dir(&work);
    let (_, out) = run_bounded(cmd, Duration::from_secs(900));
    let out = strip_ansi(&out);
    let failed: Vec<&str> = out.lines().filter(|l| l.trim_end().ends_with("FAILED")).collect();
    let summary = out.lines().find(|l| l.starts_with("Summary:")).unwrap_or("no summary");
    println!("pjdfstest on ferry mount {mount_args:?}: {summary}");
    assert!(failed.is_empty(), "pjdfstest failures ({}):\n{}\n\n{out}", failed.len(), failed.join("\n"));
    assert!(summary.contains(" 0 failed"), "unexpected summary: {summary}\n{out}");
}

#[test]
fn pjdfstest_passes_on_the_mount() {
    pjdfstest_on_a_mount(
        &["--attr-timeout", "0", "--entry-timeout", "0", "--allow-other", "-o", "default_permissions"],
        "pjdfstest.toml",
    );
}

#[test]
fn pjdfstest_passes_on_a_mount_open_to_all_checked_by_the_server_alone() {
    // `--allow-other` without `default_permissions`: the kernel checks
    // nothing; the server (root here) acts as each request's caller, so its
    // kernel applies every rule to the right user (PROTOCOL.md 8.8).
    pjdfstest_on_a_mount(&["--attr-timeout", "0", "--entry-timeout", "0", "--allow-other"], "pjdfstest.toml");
}

#[test]
fn pjdfstest_passes_on_a_mount_with_default_options() {
    // No `--allow-other`, no `default_permissions`: the kernel checks
    // nothing, the mount and the server answer every rule themselves.
    // Timeouts 0 as above: with the default 1 s, a second user's `stat`
    // answered from the kernel's attribute cache never meets the mount's
    // refusal, and two expected failures would pass or fail by timing.
    pjdfstest_on_a_mount(&["--attr-timeout", "0", "--entry-timeout", "0"], "pjdfstest-private.toml");
}

#[test]
fn fsx_finds_no_data_mismatch_on_the_mount() {
    let server = Server::start(&[]);
    let mount = Mount::start(&server, &["--attr-timeout", "0", "--entry-timeout", "0"]);
    for seed in [1u32, 2, 3] {
        let file = mount.path().join(format!("fsx-{seed}"));
        let mut cmd = Command::new(tool("fsx"));
        cmd.arg("-N").arg("3000").arg("-S").arg(seed.to_string()).arg("-P").arg(mount.path()).arg(&file);
        let (ok, out) = run_bounded(cmd, Duration::from_secs(300));
        assert!(ok && out.contains("All operations completed A-OK!"), "fsx seed {seed} failed:\n{out}");
    }
}
