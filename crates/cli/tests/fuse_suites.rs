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

/// The C pjdfstest (vendored from its source in `tests/pjdfstest-c`, built
/// here with gcc, run by `prove`) on a mount open to all users and checked
/// by the server alone (`--allow-other` against a root server acting as
/// each caller), beside the Rust port above. Failures must be exactly
/// those of `tests/pjdfstest-c-expected.txt`, each with its reason.
#[test]
fn c_pjdfstest_passes_on_a_mount_open_to_all_checked_by_the_server_alone() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/pjdfstest-c");
    let build = TempDir::new("pjdc");
    let cp =
        Command::new("cp").arg("-r").arg(src.join("tests")).arg(src.join("pjdfstest.c")).arg(build.path()).status();
    assert!(cp.expect("cp").success(), "copying the pjdfstest source");
    std::fs::write(build.path().join("config.h"), PJDFSTEST_CONFIG).unwrap();
    let cc = Command::new("gcc")
        .args(["-O2", "-Wall", "-include", "config.h", "-o", "pjdfstest", "pjdfstest.c"])
        .current_dir(build.path())
        .output()
        .expect("gcc (test.sh installs it)");
    assert!(cc.status.success(), "building pjdfstest: {}", String::from_utf8_lossy(&cc.stderr));
    let server = Server::start(&["--allow-devices"]);
    let mount = Mount::start(&server, &["--attr-timeout", "0", "--entry-timeout", "0", "--allow-other"]);
    let work = mount.path().join("pjdc");
    std::fs::create_dir(&work).expect("mkdir on the mount");
    std::fs::set_permissions(&work, std::os::unix::fs::PermissionsExt::from_mode(0o777)).expect("chmod");
    let mut cmd = Command::new(tool("prove"));
    cmd.args(["-r", "-j", "4"]).arg(build.path().join("tests")).current_dir(&work);
    let (_, out) = run_bounded(cmd, Duration::from_secs(2400));
    let got = prove_failures(&out, &build.path().join("tests"));
    let expected = expected_c_failures();
    let summary = out.lines().rev().find(|l| l.starts_with("Files=")).unwrap_or("no summary");
    println!("C pjdfstest on ferry mount: {summary}; {} expected failures", expected.len());
    let unexpected: Vec<_> = got.iter().filter(|f| !expected.contains(f)).collect();
    let fixed: Vec<_> = expected.iter().filter(|f| !got.contains(f)).collect();
    assert!(
        unexpected.is_empty() && fixed.is_empty(),
        "unexpected failures: {unexpected:?}\nexpected but passed (take them off the list): {fixed:?}\n\n{out}"
    );
    assert!(summary.contains("Tests="), "prove ran no test:\n{out}");
}

/// What configure would find on Linux with glibc.
const PJDFSTEST_CONFIG: &str = "#define _GNU_SOURCE 1
#define HAVE_SYS_SYSMACROS_H 1
#define HAVE_OPENAT 1
#define HAVE_UNLINKAT 1
#define HAVE_MKDIRAT 1
#define HAVE_LINKAT 1
#define HAVE_SYMLINKAT 1
#define HAVE_RENAMEAT 1
#define HAVE_MKFIFOAT 1
#define HAVE_MKNODAT 1
#define HAVE_FCHMODAT 1
#define HAVE_FCHOWNAT 1
#define HAVE_FSTATAT 1
#define HAVE_FACCESSAT 1
#define HAVE_READLINKAT 1
#define HAVE_POSIX_FALLOCATE 1
#define HAVE_UTIMENSAT 1
#define HAVE_STRUCT_STAT_ST_ATIM 1
#define HAVE_STRUCT_STAT_ST_MTIM 1
#define HAVE_STRUCT_STAT_ST_CTIM 1
";

/// `(file, test number)` of every failed assertion in `prove`'s summary
/// ("path/open/06.t (Wstat: 0 Tests: 144 Failed: 2)" then "Failed tests:
/// 3, 7-9", continued on lines of numbers), a file that died without a
/// failed assertion as `(file, 0)`. "TODO passed" lists are not failures.
fn prove_failures(out: &str, tests: &Path) -> Vec<(String, u32)> {
    let prefix = format!("{}/", tests.display());
    let summary = out.split("Test Summary Report").nth(1).unwrap_or("");
    let mut got = Vec::new();
    let mut file: Option<String> = None;
    let mut in_failed = false;
    for line in summary.lines() {
        let t = line.trim();
        if let Some((f, stat)) = t.strip_prefix(&prefix).and_then(|r| r.split_once(" (Wstat: ")) {
            file = Some(f.trim().to_string());
            in_failed = false;
            if !stat.starts_with("0 ") && stat.contains("Failed: 0)") {
                got.push((f.trim().to_string(), 0));
            }
            continue;
        }
        let nums = if let Some(n) = t.strip_prefix("Failed tests:") {
            in_failed = true;
            n
        } else if in_failed && t.chars().next().is_some_and(|c| c.is_ascii_digit()) {
            t
        } else {
            in_failed = false;
            continue;
        };
        let Some(f) = &file else { continue };
        for part in nums.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                got.extend((a..=b).map(|n| (f.clone(), n)));
            }
        }
    }
    got
}

/// `tests/pjdfstest-c-expected.txt`: `FILE NUMBERS... # reason` per line.
fn expected_c_failures() -> Vec<(String, u32)> {
    let list = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/pjdfstest-c-expected.txt");
    let text = std::fs::read_to_string(&list).expect("the expected-failures list");
    let mut out = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (what, why) = line.split_once('#').unwrap_or((line, ""));
        assert!(!why.trim().is_empty(), "{line}: every expected failure needs its reason");
        let mut words = what.split_whitespace();
        let file = words.next().expect("a file").to_string();
        for part in words {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            let (a, b): (u32, u32) = (a.parse().expect("a number"), b.parse().expect("a number"));
            out.extend((a..=b).map(|n| (file.clone(), n)));
        }
    }
    out
}
