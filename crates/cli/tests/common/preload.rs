//! Helpers for the `ferry run` tests: the preload library, running a
//! command under `ferry run` against a test server, compiling a small C
//! program.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::{stderr, stdout, Server, FERRY};

/// The preload library, built beside the `ferry` binary.
pub fn library() -> PathBuf {
    let lib = Path::new(FERRY).with_file_name("libferry_preload.so");
    assert!(lib.is_file(), "{} missing: build the workspace first (test.sh does)", lib.display());
    lib
}

/// `ferry run --mount /remote=URL -- ARGS...`, bounded by `secs`.
pub fn run_cmd(srv: &Server, cwd: &Path, secs: u32, args: &[&str]) -> Output {
    run_cmd_with(srv, cwd, secs, &[], args)
}

/// `run_cmd` with further `ferry run` options.
pub fn run_cmd_with(srv: &Server, cwd: &Path, secs: u32, opts: &[&str], args: &[&str]) -> Output {
    library();
    Command::new("timeout")
        .arg(secs.to_string())
        .args([FERRY, "run"])
        .args(opts)
        .arg("--mount")
        .arg(format!("/remote={}", srv.url("/")))
        .arg("--")
        .args(args)
        .current_dir(cwd)
        .env("FERRY_TOKEN_FILE", &srv.token_file)
        .env_remove("FERRY_TOKEN")
        .env_remove("FERRY_MOUNTS")
        .output()
        .expect("run ferry run")
}

/// `ferry run --mount /remote=URL -- bash -c SCRIPT`, bounded in time.
pub fn bash(srv: &Server, cwd: &Path, script: &str) -> Output {
    run_cmd(srv, cwd, 120, &["bash", "-c", script])
}

/// The output of a command that must have succeeded.
pub fn ok(o: &Output) -> String {
    assert!(o.status.success(), "failed: {:?}\nstdout:\n{}\nstderr:\n{}", o.status, stdout(o), stderr(o));
    stdout(o)
}

/// Compiles `src` with gcc into `dir/name`.
pub fn compile(dir: &Path, name: &str, src: &str) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, src).unwrap();
    let exe = dir.join(name);
    let o = Command::new("gcc").args(["-O1", "-pthread", "-o"]).arg(&exe).arg(&c).output().expect("gcc");
    assert!(o.status.success(), "gcc: {}", stderr(&o));
    exe
}
