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
