//! `ferry run`: paths as the program means them. A path relative to a
//! local working directory or directory fd that leads into a mount, a
//! `..` after a local symlink, and symlinks in the export whose targets
//! are paths of the program's own name space (absolute targets outside
//! every mount are local).

mod common;

use std::path::Path;

use common::preload::{ok, run_cmd_with};
use common::{stderr, Server, TempDir};

/// A mount at `prefix` (beside `/remote`, both the server's root).
fn mount_at(srv: &Server, prefix: &Path) -> Vec<String> {
    vec!["--mount".into(), format!("{}={}", prefix.display(), srv.url("/"))]
}

fn run_with_mount(srv: &Server, prefix: &Path, cwd: &Path, script: &str) -> std::process::Output {
    let opts = mount_at(srv, prefix);
    let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
    run_cmd_with(srv, cwd, 180, &opts, &["bash", "-c", script])
}

/// Coreutils `mkdir -p` walks by `chdir` and relative `mkdir`; a program
/// in a mount point's parent names it relatively (`stat rmt`, `mkdir
/// rmt/q`); rsync makes its target's directories relative to its cwd.
/// Every one of these reaches the server, and nothing is made locally
/// where the mount point is.
#[test]
fn relative_paths_from_a_mounts_parent_reach_the_server() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    let x = local.path().join("x");
    let rmt = x.join("rmt");
    std::fs::create_dir_all(x.join("sub")).unwrap();
    std::fs::create_dir_all(local.path().join("src/deep")).unwrap();
    std::fs::write(local.path().join("src/deep/f"), "deep\n").unwrap();
    std::fs::write(local.path().join("src/top"), "top\n").unwrap();
    // A local symlink whose `..` is its target's parent: link/.. is x.
    std::os::unix::fs::symlink(x.join("sub"), local.path().join("link")).unwrap();
    let script = format!(
        r#"set -e
cd {x}
mkdir rmt/q
stat -c '%F' rmt
mkdir -p {rmt}/a/b/c
mkdir -p rmt/n1/n2
cd rmt/a && mkdir m && cd ../.. && pwd
rsync -a ../src/ rmt/r/
cd {local}
rsync -a src/ x/rmt/r2/
cat link/../rmt/r/deep/f
mkdir x/rmt/../made-locally
ls x
"#,
        x = x.display(),
        rmt = rmt.display(),
        local = local.path().display()
    );
    let o = run_with_mount(&srv, &rmt, local.path(), &script);
    assert_eq!(ok(&o), format!("directory\n{}\ndeep\nmade-locally\nsub\n", x.display()));
    let e = srv.export.path();
    for d in ["q", "a/b/c", "a/m", "n1/n2", "r/deep", "r2/deep"] {
        assert!(e.join(d).is_dir(), "{d} not made on the server\n{}", stderr(&o));
    }
    assert_eq!(std::fs::read_to_string(e.join("r2/top")).unwrap(), "top\n");
    assert!(!rmt.exists(), "a local directory was made at the mount point");
    assert!(x.join("made-locally").is_dir());
}

/// With the mount at `/remote`: `cd / && rsync -a src/ remote/d/` (the
/// issue's report), and `find` / `tar -C /` naming it relatively.
#[test]
fn relative_paths_from_the_root_reach_a_mount() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    std::fs::create_dir_all(local.path().join("src/sub")).unwrap();
    std::fs::write(local.path().join("src/sub/f"), "f\n").unwrap();
    let rel = local.path().strip_prefix("/").unwrap().join("src");
    let script = format!(
        "set -e; cd / && rsync -a {}/ remote/d/ && mkdir -p remote/d/x/y && find remote/d | sort",
        rel.display()
    );
    let o = common::preload::bash(&srv, local.path(), &script);
    assert_eq!(ok(&o), "remote/d\nremote/d/sub\nremote/d/sub/f\nremote/d/x\nremote/d/x/y\n");
    assert_eq!(std::fs::read_to_string(srv.export.path().join("d/sub/f")).unwrap(), "f\n");
}

/// A venv made on the server: `bin/python3 -> /usr/bin/python3` (an
/// absolute target outside every mount: local), `bin/pip` a script whose
/// `#!` interpreter is that link. The server resolves links inside its
/// export, where `/usr/bin/python3` is not: the client follows the link
/// out (`stat -L`, `readlink -f`, libc's `realpath`, `exec` through it).
#[test]
fn a_venv_on_the_server_runs_through_its_absolute_symlinks() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    let script = r#"set -e
python3 -m venv /remote/v
/remote/v/bin/pip --version | cut -d' ' -f1,4
stat -L -c %F /remote/v/bin/python3
real=$(python3 -c 'import os, sys; print(os.path.realpath(sys.executable))')
test "$(readlink -f /remote/v/bin/python3)" = "$real" && echo same-binary
/remote/v/bin/python3 -c 'import sys; print(sys.prefix, sys.prefix != sys.base_prefix)'
python3 -c '
import ctypes, os
libc = ctypes.CDLL(None)
libc.realpath.restype = ctypes.c_char_p
print(libc.realpath(b"/remote/v/bin/python3", None) == os.path.realpath(os.readlink("/remote/v/bin/python3")).encode())
'
"#;
    let o = common::preload::bash(&srv, local.path(), script);
    assert_eq!(
        ok(&o),
        "pip /remote/v/lib/python3\nregular file\nsame-binary\n/remote/v True\nTrue\n"
            .replace("/lib/python3\n", &format!("/lib/{}/site-packages/pip\n", python_dir()))
    );
    let link = std::fs::read_link(srv.export.path().join("v/bin/python3")).unwrap();
    assert!(link.is_absolute(), "{link:?}");
}

/// `python3.X`, the venv's `lib/` directory name.
fn python_dir() -> String {
    let o = std::process::Command::new("python3")
        .args(["-c", "import sys; print(f'python{sys.version_info[0]}.{sys.version_info[1]}')"])
        .output()
        .expect("python3");
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

/// Targets are paths of the program's name space: absolute under a
/// prefix is remote, absolute elsewhere local, relative from the link's
/// directory (climbing out of the mount with `..` into the local part).
#[test]
fn symlink_targets_are_read_in_the_programs_name_space() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    std::fs::write(local.path().join("here"), "local file\n").unwrap();
    let e = srv.export.path();
    std::fs::create_dir(e.join("d")).unwrap();
    std::fs::write(e.join("d/f"), "remote file\n").unwrap();
    std::os::unix::fs::symlink("/remote/d", e.join("abs-remote")).unwrap();
    std::os::unix::fs::symlink(local.path().join("here"), e.join("abs-local")).unwrap();
    std::os::unix::fs::symlink(local.path(), e.join("abs-local-dir")).unwrap();
    let up = format!("../..{}", local.path().join("here").display());
    std::os::unix::fs::symlink(&up, e.join("d/up")).unwrap();
    let script = r#"set -e
cat /remote/abs-remote/f
cat /remote/abs-local
cat /remote/abs-local-dir/here
cat /remote/d/up
stat -L -c %s /remote/abs-local
ls /remote/abs-local-dir
cd /remote/abs-remote && cat f
test -e /remote/abs-remote/nothing || echo absent
"#;
    let o = common::preload::bash(&srv, local.path(), script);
    assert_eq!(ok(&o), "remote file\nlocal file\nlocal file\nlocal file\n11\nhere\nremote file\nabsent\n");
}
