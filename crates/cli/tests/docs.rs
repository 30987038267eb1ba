//! The docs, checked against the program: README.md and docs/*.md.
//!
//! Fenced blocks by their info string:
//! - `sh test` runs as written, in order, as the ordinary user `tests` in a
//!   network name space of its own (so 127.0.0.1:7070 is free) with HOME in
//!   a fresh directory; `sh test-root` the same as root, from the
//!   repository root (the install). The README's getting started is one.
//! - `sh test-python` is run by python/test.sh (it makes the venv the
//!   Python tests use), `python` blocks by python/tests/test_readme.py.
//! - `rust` is crates/client/examples/quickstart.rs, built and run here.
//! - every other `sh` block: each `ferry` command in it must exist and take
//!   every `--option` it is shown with (examples spanning several machines
//!   cannot run on one).

mod common;

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{stderr, stdout, Server, TempDir, FERRY};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Every fenced block of README.md and docs/*.md: (file, info string, text).
fn blocks() -> Vec<(PathBuf, String, String)> {
    let mut files = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let mut lines = text.lines();
        while let Some(l) = lines.next() {
            if let Some(info) = l.trim_start().strip_prefix("```") {
                let indent = l.len() - l.trim_start().len();
                let body: Vec<&str> = lines.by_ref().take_while(|l| !l.trim_start().starts_with("```")).collect();
                let body: String =
                    body.iter().map(|l| format!("{}\n", l.get(indent..).unwrap_or(l.trim_start()))).collect();
                out.push((f.clone(), info.trim().to_string(), body));
            }
        }
    }
    out
}

/// The Rust library example of the docs is crates/client/examples/quickstart.rs,
/// word for word, and it builds and runs against a real server.
#[test]
fn the_library_example_is_the_example_that_builds_and_runs() {
    let example = std::fs::read_to_string(repo().join("crates/client/examples/quickstart.rs")).unwrap();
    let rust: Vec<_> = blocks().into_iter().filter(|(_, info, _)| info == "rust").collect();
    assert!(!rust.is_empty(), "no ```rust block in the docs");
    for (file, _, body) in &rust {
        assert_eq!(
            body,
            &example,
            "{}: the rust block differs from crates/client/examples/quickstart.rs",
            file.display()
        );
    }
    let srv = Server::start(&[]);
    // Built as the workspace is (same features: nothing else rebuilds).
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let o = Command::new(cargo)
        .current_dir(repo())
        .args(["build", "--release", "--quiet", "--workspace", "--examples"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let o = Command::new(repo().join("target/release/examples/quickstart"))
        .arg(srv.addr())
        .env("FERRY_TOKEN_FILE", &srv.token_file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(srv.export.path().join("notes.txt")).unwrap(), b"hello\n");
    assert!(stdout(&o).lines().any(|l| l == "notes.txt 6"), "{}", stdout(&o));
}

/// The markdown files of the docs.
fn doc_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = blocks().into_iter().map(|(f, _, _)| f).collect();
    v.dedup();
    v
}

#[test]
fn the_readme_is_short_and_links_every_page() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 250, "README.md has {lines} lines: move detail into docs/");
    let mut pages: Vec<String> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    pages.sort();
    for p in &pages {
        assert!(readme.contains(&format!("(docs/{p})")), "README.md does not link docs/{p}");
    }
    // Every link of the README and the pages leads somewhere.
    for f in doc_files() {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, _) in text.match_indices("](") {
            let target = &text[i + 2..];
            let target = &target[..target.find(')').unwrap_or(0)];
            if target.starts_with("http") || target.starts_with('#') || target.is_empty() {
                continue;
            }
            let path = f.parent().unwrap().join(target.split('#').next().unwrap());
            assert!(path.exists(), "{}: link to {target}: nothing there", f.display());
        }
    }
}

/// `ferry SUB --help` of each subcommand: its own options and the connection options it takes.
fn options_of(sub: &str, cache: &mut HashMap<String, Option<String>>) -> Option<String> {
    cache
        .entry(sub.to_string())
        .or_insert_with(|| {
            let o = Command::new(FERRY).args([sub, "--help"]).output().unwrap();
            o.status.success().then(|| stdout(&o))
        })
        .clone()
}

/// The `ferry` commands of a shell block: (subcommand, long options), one
/// per command, a line starting with `--` continuing the one before (the
/// reference's layout), `\` joining lines, comments and what follows a
/// bare `--` (the program `ferry run` starts) left out.
fn ferry_commands(block: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let joined = block.replace("\\\n", " ");
    for line in joined.lines() {
        let code = match line.find(" #") {
            Some(i) => &line[..i],
            None if line.trim_start().starts_with('#') => "",
            None => line,
        };
        let words: Vec<&str> = code.split_whitespace().collect();
        let options = |ws: &[&str]| -> Vec<String> {
            ws.iter()
                .take_while(|w| **w != "--")
                .map(|w| w.trim_start_matches('[').trim_end_matches([']', ',']))
                .filter(|w| w.starts_with("--") && w.len() > 2)
                .map(|w| w.split('=').next().unwrap().to_string())
                .collect()
        };
        if words.first().is_some_and(|w| w.starts_with("--")) {
            if let Some(last) = out.last_mut() {
                last.1.extend(options(&words));
            }
            continue;
        }
        let Some(at) = words.iter().position(|w| *w == "ferry" || w.ends_with("/ferry")) else { continue };
        let mut rest = &words[at + 1..];
        let mut opts = Vec::new();
        // Global options before the subcommand.
        while let Some(w) = rest.first().filter(|w| w.starts_with("--")) {
            opts.push(w.split('=').next().unwrap().to_string());
            rest = &rest[if w.contains('=') { 1 } else { 2.min(rest.len()) }..];
        }
        let Some(sub) = rest.first() else { continue };
        if sub.starts_with("ferry://") || sub.starts_with('-') || sub.starts_with('$') {
            continue;
        }
        opts.extend(options(&rest[1..]));
        out.push((sub.to_string(), opts));
    }
    out
}

#[test]
fn every_ferry_command_in_the_docs_exists_with_its_options() {
    let mut cache = HashMap::new();
    // Each command's help lists the connection options it takes (given
    // before the command or after it): no option is taken by all.
    let global = ["--help"];
    let mut wrong = Vec::new();
    let mut seen = 0;
    for (file, info, body) in blocks() {
        if info.split_whitespace().next() != Some("sh") {
            continue;
        }
        for (sub, opts) in ferry_commands(&body) {
            seen += 1;
            let Some(help) = options_of(&sub, &mut cache) else {
                wrong.push(format!("{}: `ferry {sub}`: no such command", file.display()));
                continue;
            };
            for o in opts {
                if !global.contains(&o.as_str())
                    && !help.contains(&format!("{o} "))
                    && !help.contains(&format!("{o}\n"))
                {
                    wrong.push(format!("{}: `ferry {sub} {o}`: no such option", file.display()));
                }
            }
        }
    }
    assert!(seen > 30, "only {seen} ferry commands found in the docs' sh blocks");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The `tests` user's ids.
fn test_user() -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let o = Command::new("id").args([flag, "tests"]).output().unwrap();
        assert!(o.status.success(), "the user `tests` is missing: ./test.sh creates it");
        stdout(&o).trim().parse().unwrap()
    };
    (id("-u"), id("-g"))
}

/// Kills the blocks' processes (their process groups) and detaches what
/// they left mounted under the sandbox, even when a block fails.
struct Sandbox {
    dir: TempDir,
    groups: Vec<i32>,
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        for g in &self.groups {
            if let Some(pid) = rustix::process::Pid::from_raw(*g) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
        }
        let prefix = self.dir.path().to_string_lossy().into_owned();
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut mps: Vec<&str> =
            info.lines().filter_map(|l| l.split(' ').nth(4)).filter(|m| m.starts_with(&prefix)).collect();
        mps.reverse();
        for m in mps {
            let _ = rustix::mount::unmount(m, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

/// Runs the `sh test` and `sh test-root` blocks of `file` in order.
fn run_test_blocks(file: &Path) {
    assert!(rustix::process::geteuid().is_root(), "the docs test switches users: run it as root (./test.sh)");
    let (uid, gid) = test_user();
    let dir = TempDir::new("docs");
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut sb = Sandbox { dir, groups: Vec::new() };
    let home = sb.dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let chown_home = || {
        let st = Command::new("chown").arg("-R").arg(format!("{uid}:{gid}")).arg(&home).status().unwrap();
        assert!(st.success());
    };
    chown_home();
    let real_home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let cargo_home = std::env::var("CARGO_HOME").unwrap_or_else(|_| format!("{real_home}/.cargo"));
    let rustup_home = std::env::var("RUSTUP_HOME").unwrap_or_else(|_| format!("{real_home}/.rustup"));
    let path = format!(
        "{}/.local/bin:{cargo_home}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        home.display()
    );
    let mut ran = 0;
    for (f, info, body) in blocks() {
        if f != file || !(info == "sh test" || info == "sh test-root") {
            continue;
        }
        ran += 1;
        let root = info == "sh test-root";
        let script = sb.dir.path().join(format!("block-{ran}.sh"));
        std::fs::write(&script, &body).unwrap();
        // A network name space of its own, loopback up; then the user.
        // Bounded: an install may build (minutes); the rest takes seconds.
        let mut inner = vec!["timeout".to_string(), if root { "1200" } else { "120" }.into()];
        if !root {
            inner.extend(["runuser".into(), "-p".into(), "-u".into(), "tests".into(), "--".into()]);
        }
        inner.extend(["bash".into(), "-euo".into(), "pipefail".into(), script.display().to_string()]);
        let mut cmd = Command::new("unshare");
        cmd.args(["-n", "--", "sh", "-c", "ip link set lo up && exec \"$@\"", "sh"]).args(&inner);
        cmd.env_clear()
            .env("HOME", &home)
            .env("PATH", &path)
            .env("CARGO_HOME", &cargo_home)
            .env("RUSTUP_HOME", &rustup_home)
            .env("LANG", "C.UTF-8")
            .current_dir(if root { repo() } else { home.clone() })
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let child = cmd.spawn().expect("unshare (util-linux) and ip (iproute2) are needed");
        sb.groups.push(child.id() as i32);
        let o = child.wait_with_output().unwrap();
        assert!(
            o.status.success(),
            "{} block {ran} ({info}) failed ({}):\n{body}\n--- stdout\n{}--- stderr\n{}",
            file.display(),
            o.status,
            stdout(&o),
            stderr(&o)
        );
        if root {
            // What a user's own `make install PREFIX=~/.local` leaves: theirs.
            chown_home();
        }
    }
    assert!(ran > 0, "no `sh test` block in {}", file.display());
}

/// The README's install and getting started, as a newcomer runs them.
#[test]
fn the_readme_runs_as_written() {
    run_test_blocks(&repo().join("README.md"));
}
