//! `ferry mount`: a real server's export mounted with FUSE, driven with
//! std::fs and ordinary programs. Every mount is unmounted and its daemon
//! killed on drop, and a watchdog kills a daemon that outlives its test's
//! time limit, which turns a hung FUSE request into a failed one.
//! Without /dev/fuse or root every test fails (`require_fuse`); none skips.

mod common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::fuse::{is_live, is_mounted, require_fuse, wait_for, Detach};
use common::{random_bytes, Server, TempDir, FERRY};
use rustix::mount::UnmountFlags;
use rustix::process::{Pid, Signal};

/// Longest any one test may keep a mount.
const TEST_LIMIT: Duration = Duration::from_secs(180);
/// Longest any one program run on the mount may take.
const CMD_LIMIT: Duration = Duration::from_secs(60);

/// A foreground `ferry mount` daemon.
struct Mount {
    child: Child,
    mp: PathBuf,
    log: PathBuf,
    stop_watchdog: Option<mpsc::Sender<()>>,
}

impl Mount {
    fn start(server: &Server, mp: &Path, extra: &[&str]) -> Mount {
        static N: AtomicUsize = AtomicUsize::new(0);
        let log = server.state.path().join(format!("mount-{}.log", N.fetch_add(1, Ordering::Relaxed)));
        let mut cmd = Command::new(FERRY);
        cmd.arg("mount").arg(server.url("/")).arg(mp).args(extra);
        cmd.env("FERRY_TOKEN_FILE", &server.token_file).env_remove("FERRY_TOKEN");
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(fs::File::create(&log).expect("log"));
        let child = cmd.spawn().expect("spawn ferry mount");
        let pid = child.id();
        let (tx, rx) = mpsc::channel::<()>();
        let wmp = mp.to_path_buf();
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(TEST_LIMIT) {
                eprintln!("watchdog: killing mount daemon {pid} after {TEST_LIMIT:?}");
                let _ = rustix::process::kill_process(Pid::from_raw(pid as i32).expect("pid"), Signal::KILL);
                let _ = rustix::mount::unmount(&wmp, UnmountFlags::DETACH);
            }
        });
        let mut m = Mount { child, mp: mp.to_path_buf(), log, stop_watchdog: Some(tx) };
        let ready = wait_for(Duration::from_secs(20), || is_live(mp) || m.exited());
        assert!(ready && is_live(mp), "mount did not come up: {}", m.log());
        m
    }

    fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.mp.join(rel)
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(tx) = self.stop_watchdog.take() {
            let _ = tx.send(());
        }
        if !self.exited() {
            let _ = rustix::process::kill_process(Pid::from_raw(self.child.id() as i32).expect("pid"), Signal::TERM);
            wait_for(Duration::from_secs(5), || self.exited());
        }
        self.kill();
        if is_mounted(&self.mp) {
            let _ = rustix::mount::unmount(&self.mp, UnmountFlags::DETACH);
        }
    }
}

/// Runs a program with a time limit; output goes through files so a full
/// pipe can never block it.
fn run(cmd: &mut Command) -> (ExitStatus, String, String) {
    let dir = TempDir::new("cmd");
    let (o, e) = (dir.path().join("out"), dir.path().join("err"));
    cmd.stdin(Stdio::null()).stdout(fs::File::create(&o).unwrap()).stderr(fs::File::create(&e).unwrap());
    let mut child = cmd.spawn().unwrap_or_else(|err| panic!("spawn {cmd:?}: {err}"));
    let end = Instant::now() + CMD_LIMIT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} took longer than {CMD_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (status, fs::read_to_string(o).unwrap_or_default(), fs::read_to_string(e).unwrap_or_default())
}

fn sh(script: &str, dir: &Path) -> String {
    let (st, out, err) = run(Command::new("sh").arg("-c").arg(script).current_dir(dir));
    assert!(st.success(), "`{script}` failed: {st}\nstdout: {out}\nstderr: {err}");
    out
}

fn ferry(server: &Server, args: &[&str]) -> (ExitStatus, String, String) {
    run(Command::new(FERRY).args(args).env("FERRY_TOKEN_FILE", &server.token_file).env_remove("FERRY_TOKEN"))
}

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

#[test]
fn files_dirs_and_renames() {
    require_fuse();
    let s = Server::start(&[]);
    let mpd = TempDir::new("mnt");
    let m = Mount::start(&s, mpd.path(), &[]);
    let exp = s.export.path();

    // Create, write, read back, append.
    fs::write(m.p("a.txt"), b"hello\n").unwrap();
    assert_eq!(fs::read(m.p("a.txt")).unwrap(), b"hello\n");
    let mut f = fs::OpenOptions::new().append(true).open(m.p("a.txt")).unwrap();
    f.write_all(b"world\n").unwrap();
    drop(f);
    assert_eq!(fs::read(m.p("a.txt")).unwrap(), b"hello\nworld\n");
    assert_eq!(fs::read(exp.join("a.txt")).unwrap(), b"hello\nworld\n");
    // Positional writes and reads through one descriptor.
    let mut f = fs::OpenOptions::new().read(true).write(true).open(m.p("a.txt")).unwrap();
    f.seek(SeekFrom::Start(6)).unwrap();
    f.write_all(b"WORLD").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut s1 = String::new();
    f.read_to_string(&mut s1).unwrap();
    assert_eq!(s1, "hello\nWORLD\n");
    drop(f);

    // O_EXCL.
    let e = fs::OpenOptions::new().write(true).create_new(true).open(m.p("a.txt")).unwrap_err();
    assert_eq!(errno_of(&e), libc::EEXIST);
    fs::OpenOptions::new().write(true).create_new(true).mode(0o640).open(m.p("new.txt")).unwrap();
    assert_eq!(fs::metadata(exp.join("new.txt")).unwrap().permissions().mode() & 0o777, 0o640);

    // Truncate: by descriptor, by path, and O_TRUNC.
    let f = fs::OpenOptions::new().write(true).open(m.p("a.txt")).unwrap();
    f.set_len(3).unwrap();
    assert_eq!(fs::read(m.p("a.txt")).unwrap(), b"hel");
    f.set_len(10).unwrap();
    assert_eq!(fs::read(m.p("a.txt")).unwrap(), b"hel\0\0\0\0\0\0\0");
    drop(f);
    fs::write(m.p("a.txt"), b"xy").unwrap();
    assert_eq!(fs::read(exp.join("a.txt")).unwrap(), b"xy");

    // Directories, and renaming a directory with files inside.
    fs::create_dir_all(m.p("d1/d2/d3")).unwrap();
    fs::write(m.p("d1/d2/d3/f"), b"deep").unwrap();
    fs::write(m.p("d1/top"), b"top").unwrap();
    assert_eq!(fs::read(m.p("d1/d2/d3/f")).unwrap(), b"deep");
    fs::rename(m.p("d1"), m.p("moved")).unwrap();
    assert!(!m.p("d1").exists());
    assert_eq!(fs::read(m.p("moved/d2/d3/f")).unwrap(), b"deep");
    assert_eq!(fs::read(m.p("moved/top")).unwrap(), b"top");
    fs::write(m.p("moved/d2/d3/g"), b"new").unwrap();
    assert_eq!(fs::read(exp.join("moved/d2/d3/g")).unwrap(), b"new");
    let e = fs::remove_dir(m.p("moved")).unwrap_err();
    assert_eq!(errno_of(&e), libc::ENOTEMPTY);
    fs::remove_file(m.p("moved/d2/d3/f")).unwrap();
    fs::remove_file(m.p("moved/d2/d3/g")).unwrap();
    fs::remove_dir(m.p("moved/d2/d3")).unwrap();
    assert!(!exp.join("moved/d2/d3").exists());

    // Rename over an existing file; the old name's node is not reused.
    fs::write(m.p("src"), b"source").unwrap();
    fs::write(m.p("dst"), b"dest").unwrap();
    fs::rename(m.p("src"), m.p("dst")).unwrap();
    assert_eq!(fs::read(m.p("dst")).unwrap(), b"source");
    assert!(!m.p("src").exists());
    fs::write(m.p("src"), b"again").unwrap();
    assert_eq!(fs::read(m.p("src")).unwrap(), b"again");

    // renameat2 flags pass through.
    let cwd = rustix::fs::CWD;
    let e =
        rustix::fs::renameat_with(cwd, m.p("src"), cwd, m.p("dst"), rustix::fs::RenameFlags::NOREPLACE).unwrap_err();
    assert_eq!(e, rustix::io::Errno::EXIST);
    rustix::fs::renameat_with(cwd, m.p("src"), cwd, m.p("dst"), rustix::fs::RenameFlags::EXCHANGE).unwrap();
    assert_eq!(fs::read(m.p("src")).unwrap(), b"source");
    assert_eq!(fs::read(m.p("dst")).unwrap(), b"again");

    // A file removed while open stays readable through its descriptor.
    fs::write(m.p("gone"), b"still here").unwrap();
    let mut f = fs::File::open(m.p("gone")).unwrap();
    fs::remove_file(m.p("gone")).unwrap();
    let mut buf = String::new();
    f.read_to_string(&mut buf).unwrap();
    assert_eq!(buf, "still here");
    assert!(f.metadata().is_ok());
    let e = fs::metadata(m.p("gone")).unwrap_err();
    assert_eq!(errno_of(&e), libc::ENOENT);

    // Listing.
    let mut names: Vec<String> =
        fs::read_dir(m.p("")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["a.txt", "dst", "moved", "new.txt", "src"]);
}

#[test]
fn links_attributes_and_xattrs() {
    require_fuse();
    let s = Server::start(&[]);
    let mpd = TempDir::new("mnt");
    let m = Mount::start(&s, mpd.path(), &[]);
    let exp = s.export.path();

    fs::write(m.p("file"), b"content").unwrap();
    std::os::unix::fs::symlink("file", m.p("sl")).unwrap();
    assert_eq!(fs::read_link(m.p("sl")).unwrap(), Path::new("file"));
    assert_eq!(fs::read(m.p("sl")).unwrap(), b"content");
    assert!(fs::symlink_metadata(m.p("sl")).unwrap().file_type().is_symlink());
    assert_eq!(fs::read_link(exp.join("sl")).unwrap(), Path::new("file"));

    fs::hard_link(m.p("file"), m.p("hard")).unwrap();
    assert_eq!(fs::metadata(m.p("hard")).unwrap().nlink(), 2);
    fs::write(m.p("hard"), b"changed").unwrap();
    assert_eq!(fs::read(m.p("file")).unwrap(), b"changed");
    assert_eq!(fs::metadata(exp.join("file")).unwrap().ino(), fs::metadata(exp.join("hard")).unwrap().ino());

    fs::set_permissions(m.p("file"), fs::Permissions::from_mode(0o604)).unwrap();
    assert_eq!(fs::metadata(m.p("file")).unwrap().permissions().mode() & 0o7777, 0o604);
    assert_eq!(fs::metadata(exp.join("file")).unwrap().permissions().mode() & 0o7777, 0o604);
    std::os::unix::fs::chown(m.p("file"), Some(1234), Some(5678)).unwrap();
    let md = fs::metadata(exp.join("file")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    assert_eq!(fs::metadata(m.p("file")).unwrap().uid(), 1234);
    std::os::unix::fs::lchown(m.p("sl"), Some(42), None).unwrap();
    assert_eq!(fs::symlink_metadata(exp.join("sl")).unwrap().uid(), 42);

    let when = UNIX_EPOCH + Duration::new(1_000_000_000, 123_456_789);
    let f = fs::File::options().write(true).open(m.p("file")).unwrap();
    f.set_times(fs::FileTimes::new().set_accessed(when).set_modified(when)).unwrap();
    drop(f);
    assert_eq!(fs::metadata(exp.join("file")).unwrap().modified().unwrap(), when);
    assert_eq!(fs::metadata(m.p("file")).unwrap().modified().unwrap(), when);
    sh("touch -m -d 2001-02-03T04:05:06Z file", m.p("").as_path());
    let mt = fs::metadata(exp.join("file")).unwrap().modified().unwrap();
    assert_eq!(mt.duration_since(UNIX_EPOCH).unwrap().as_secs(), 981_173_106);
    let before = SystemTime::now() - Duration::from_secs(5);
    sh("touch file", m.p("").as_path());
    assert!(fs::metadata(exp.join("file")).unwrap().modified().unwrap() > before);

    let out = sh("ls -l", m.p("").as_path());
    assert!(out.contains("sl -> file") && out.contains("hard"), "{out}");

    // xattrs: the export (under the temp dir) must take user xattrs.
    let probe = rustix::fs::setxattr(exp.join("file"), "user.probe", b"1", rustix::fs::XattrFlags::empty());
    assert!(probe.is_ok(), "the export's file system refuses user xattrs ({probe:?}): the xattr checks cannot run");
    let p = m.p("file");
    rustix::fs::setxattr(&p, "user.color", b"blue", rustix::fs::XattrFlags::empty()).unwrap();
    let mut buf = [0u8; 64];
    let n = rustix::fs::getxattr(&p, "user.color", &mut buf[..]).unwrap();
    assert_eq!(&buf[..n], b"blue");
    assert_eq!(rustix::fs::getxattr_query(&p, "user.color").unwrap(), 4);
    assert_eq!(rustix::fs::getxattr(&p, "user.color", &mut [0u8; 2][..]).unwrap_err(), rustix::io::Errno::RANGE);
    assert_eq!(rustix::fs::getxattr(&p, "user.none", &mut buf[..]).unwrap_err(), rustix::io::Errno::NODATA);
    let e = rustix::fs::setxattr(&p, "user.color", b"red", rustix::fs::XattrFlags::CREATE).unwrap_err();
    assert_eq!(e, rustix::io::Errno::EXIST);
    let n = rustix::fs::listxattr(&p, &mut buf[..]).unwrap();
    let names: Vec<&[u8]> = buf[..n].split(|b| *b == 0).filter(|s| !s.is_empty()).collect();
    assert!(names.contains(&&b"user.color"[..]) && names.contains(&&b"user.probe"[..]), "{names:?}");
    let n = rustix::fs::getxattr(exp.join("file"), "user.color", &mut buf[..]).unwrap();
    assert_eq!(&buf[..n], b"blue");
    rustix::fs::removexattr(&p, "user.color").unwrap();
    assert_eq!(rustix::fs::getxattr(&p, "user.color", &mut buf[..]).unwrap_err(), rustix::io::Errno::NODATA);
}

#[test]
fn programs_on_the_mount() {
    require_fuse();
    let s = Server::start(&[]);
    let mpd = TempDir::new("mnt");
    let m = Mount::start(&s, mpd.path(), &[]);
    let exp = s.export.path();
    let root = m.p("");

    let out = sh("df -P .", &root);
    assert!(out.contains(&format!("ferry://127.0.0.1:{}/", s.port)), "{out}");

    // A tree in with cp -r, out again, compared byte for byte.
    let src = TempDir::new("tree");
    for (i, size) in [0usize, 1, 4095, 4096, 100_000, 1 << 20, 3 << 20].iter().enumerate() {
        let dir = src.path().join(format!("sub{}", i % 3)).join("inner");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(format!("f{i}")), random_bytes(*size, i as u64 + 1)).unwrap();
    }
    std::os::unix::fs::symlink("sub0/inner", src.path().join("link")).unwrap();
    let (st, _, err) = run(Command::new("cp").arg("-a").arg(src.path()).arg(root.join("tree")));
    assert!(st.success(), "cp in: {err}");
    let back = TempDir::new("back");
    let (st, _, err) = run(Command::new("cp").arg("-a").arg(root.join("tree")).arg(back.path().join("tree")));
    assert!(st.success(), "cp out: {err}");
    let (st, out, err) =
        run(Command::new("diff").arg("-r").arg("--no-dereference").arg(src.path()).arg(back.path().join("tree")));
    assert!(st.success(), "trees differ: {out}{err}");
    let (st, out, _) =
        run(Command::new("diff").arg("-r").arg("--no-dereference").arg(src.path()).arg(exp.join("tree")));
    assert!(st.success(), "export differs: {out}");

    // tar writes an archive onto the mount and unpacks it there.
    sh("tar cf t.tar tree && mkdir x && tar xf t.tar -C x && diff -r --no-dereference tree x/tree", &root);
    assert!(exp.join("x/tree/sub1/inner/f1").exists());

    // dd with 1 MiB blocks, checksummed against the export.
    sh("dd if=/dev/urandom of=big bs=1M count=64 status=none", &root);
    let sums = sh(&format!("sha256sum < big; sha256sum < {}", exp.join("big").display()), &root);
    let lines: Vec<&str> = sums.lines().collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0], lines[1], "written data differs from the export's");
    let reread = sh("dd if=big bs=1M status=none | sha256sum", &root);
    assert_eq!(reread.lines().next(), Some(lines[0]));

    // A large file put in the export directly reads back the same.
    let data = random_bytes(48 << 20 | 12345, 99);
    fs::write(exp.join("direct.bin"), &data).unwrap();
    assert!(fs::read(m.p("direct.bin")).unwrap() == data, "large read differs");
}

#[test]
fn umount_command_and_background_mode() {
    require_fuse();
    let s = Server::start(&[]);
    let mpd = TempDir::new("mnt");
    let mp = mpd.path().to_str().unwrap().to_string();
    let (st, out, err) = ferry(&s, &["mount", &s.url("/"), &mp, "--background"]);
    assert!(st.success(), "background mount failed: {out}{err}");
    // From here the mount must go away even if the test fails.
    let _guard = Detach(mpd.path().to_path_buf());
    assert!(is_mounted(mpd.path()));
    fs::write(mpd.path().join("f"), b"bg").unwrap();
    assert_eq!(fs::read(s.export.path().join("f")).unwrap(), b"bg");

    // A busy mount is refused with a clear reason.
    let busy = fs::File::open(mpd.path().join("f")).unwrap();
    let (st, _, err) = ferry(&s, &["umount", &mp]);
    if !st.success() {
        assert!(err.contains("busy"), "{err}");
    }
    drop(busy);
    if is_mounted(mpd.path()) {
        let (st, _, err) = ferry(&s, &["umount", &mp]);
        assert!(st.success(), "umount: {err}");
    }
    assert!(wait_for(Duration::from_secs(5), || !is_mounted(mpd.path())));
    let (st, _, err) = ferry(&s, &["umount", &mp]);
    assert!(!st.success() && err.contains("not a mount point"), "{err}");

    // A mount that cannot work fails in the foreground with the reason.
    let (st, _, err) = ferry(&s, &["mount", &s.url("/nope"), &mp, "--background"]);
    assert!(!st.success() && err.contains("No such file or directory"), "{err}");
    assert!(!is_mounted(mpd.path()));
}

#[test]
fn killed_daemon_does_not_block_the_next_mount() {
    require_fuse();
    let s = Server::start(&[]);
    let mpd = TempDir::new("mnt");
    let mut m = Mount::start(&s, mpd.path(), &[]);
    fs::write(m.p("f"), b"one").unwrap();
    m.kill();
    // Either fusermount3 unmounted it (auto_unmount), or a dead mount
    // (ENOTCONN) is left for the next mount to clean up.
    let m2 = Mount::start(&s, mpd.path(), &[]);
    assert_eq!(fs::read(m2.p("f")).unwrap(), b"one");
    if !Path::new("/usr/bin/fusermount3").exists() && !Path::new("/bin/fusermount3").exists() {
        assert!(m2.log().contains("removed a dead mount"), "{}", m2.log());
    }
    drop(m2);
    drop(m);

    // SIGTERM to a foreground daemon unmounts cleanly and exits 0.
    let mut m = Mount::start(&s, mpd.path(), &[]);
    rustix::process::kill_process(Pid::from_raw(m.child.id() as i32).unwrap(), Signal::TERM).unwrap();
    assert!(wait_for(Duration::from_secs(10), || m.exited()), "daemon ignored SIGTERM");
    assert!(m.child.wait().unwrap().success(), "{}", m.log());
    assert!(!is_mounted(mpd.path()));
    let m2 = Mount::start(&s, mpd.path(), &[]);
    drop(m2);
    drop(m);
    assert!(wait_for(Duration::from_secs(5), || !is_mounted(mpd.path())));
}

#[test]
fn cache_read_only_and_zero_timeouts() {
    require_fuse();
    let s = Server::start(&[]);
    let exp = s.export.path();

    // Kernel page cache: same results, and a reopen sees server changes.
    let mpd = TempDir::new("mnt");
    let m = Mount::start(&s, mpd.path(), &["--cache", "--attr-timeout", "0", "--entry-timeout", "0"]);
    let data = random_bytes(5 << 20, 7);
    fs::write(m.p("c"), &data).unwrap();
    assert!(fs::read(m.p("c")).unwrap() == data);
    fs::write(exp.join("c"), b"server side").unwrap();
    assert_eq!(fs::read(m.p("c")).unwrap(), b"server side");
    drop(m);

    // Zero timeouts without cache: a change on the server shows at once.
    let m = Mount::start(&s, mpd.path(), &["--attr-timeout", "0", "--entry-timeout", "0"]);
    assert!(!m.p("later").exists());
    fs::write(exp.join("later"), b"abc").unwrap();
    assert_eq!(fs::metadata(m.p("later")).unwrap().len(), 3);
    fs::write(exp.join("later"), b"abcdef").unwrap();
    assert_eq!(fs::metadata(m.p("later")).unwrap().len(), 6);
    drop(m);

    // Read-only: reads work, every change fails with EROFS.
    let m = Mount::start(&s, mpd.path(), &["--read-only"]);
    assert_eq!(fs::read(m.p("later")).unwrap(), b"abcdef");
    assert_eq!(errno_of(&fs::write(m.p("new"), b"x").unwrap_err()), libc::EROFS);
    assert_eq!(errno_of(&fs::remove_file(m.p("later")).unwrap_err()), libc::EROFS);
    assert_eq!(errno_of(&fs::create_dir(m.p("d")).unwrap_err()), libc::EROFS);
}

/// Hard links are one node: one `st_ino`, a shared link count and shared
/// data, whichever name is used; removing one name leaves the other.
fn check_hard_links(m: &Mount) {
    fs::create_dir(m.p("hl")).unwrap();
    fs::write(m.p("hl/a"), b"first").unwrap();
    fs::write(m.p("hl/other"), b"x").unwrap();
    fs::hard_link(m.p("hl/a"), m.p("hl/b")).unwrap();
    fs::create_dir(m.p("hl/sub")).unwrap();
    fs::hard_link(m.p("hl/b"), m.p("hl/sub/c")).unwrap();
    let (a, b, c) = (fs::metadata(m.p("hl/a")).unwrap(), fs::metadata(m.p("hl/b")).unwrap(), m.p("hl/sub/c"));
    let c = fs::metadata(c).unwrap();
    assert_eq!(a.ino(), b.ino());
    assert_eq!(a.ino(), c.ino());
    assert_ne!(a.ino(), fs::metadata(m.p("hl/other")).unwrap().ino());
    assert_eq!((a.nlink(), b.nlink(), c.nlink()), (3, 3, 3));
    let ino = a.ino();

    // Data written through one name is read through the others, also
    // through descriptors open on different names at once.
    fs::write(m.p("hl/b"), b"through b").unwrap();
    assert_eq!(fs::read(m.p("hl/a")).unwrap(), b"through b");
    let mut fa = fs::OpenOptions::new().read(true).write(true).open(m.p("hl/a")).unwrap();
    let mut fc = fs::File::open(m.p("hl/sub/c")).unwrap();
    fa.write_all(b"THROUGH").unwrap();
    let mut got = String::new();
    fc.read_to_string(&mut got).unwrap();
    assert_eq!(got, "THROUGH b");
    assert_eq!(fa.metadata().unwrap().ino(), fc.metadata().unwrap().ino());
    drop((fa, fc));
    // Metadata is shared too.
    fs::set_permissions(m.p("hl/a"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(m.p("hl/sub/c")).unwrap().permissions().mode() & 0o777, 0o600);

    // Renaming a link (and the directory holding one) keeps the node.
    fs::rename(m.p("hl/b"), m.p("hl/b2")).unwrap();
    fs::rename(m.p("hl/sub"), m.p("hl/sub2")).unwrap();
    assert_eq!(fs::metadata(m.p("hl/b2")).unwrap().ino(), ino);
    assert_eq!(fs::metadata(m.p("hl/sub2/c")).unwrap().ino(), ino);
    assert_eq!(fs::metadata(m.p("hl/a")).unwrap().ino(), ino);

    // Unlinking names one by one leaves the rest, data and inode number.
    fs::remove_file(m.p("hl/a")).unwrap();
    assert_eq!(errno_of(&fs::metadata(m.p("hl/a")).unwrap_err()), libc::ENOENT);
    let b = fs::metadata(m.p("hl/b2")).unwrap();
    assert_eq!((b.ino(), b.nlink()), (ino, 2));
    assert_eq!(fs::read(m.p("hl/sub2/c")).unwrap(), b"THROUGH b");
    let f = fs::File::open(m.p("hl/b2")).unwrap();
    fs::remove_file(m.p("hl/b2")).unwrap();
    let c = fs::metadata(m.p("hl/sub2/c")).unwrap();
    assert_eq!((c.ino(), c.nlink()), (ino, 1));
    assert_eq!(f.metadata().unwrap().ino(), ino);
    drop(f);
    assert_eq!(fs::read(m.p("hl/sub2/c")).unwrap(), b"THROUGH b");
    // A link made again from the last name joins the same node.
    fs::hard_link(m.p("hl/sub2/c"), m.p("hl/again")).unwrap();
    assert_eq!(fs::metadata(m.p("hl/again")).unwrap().ino(), ino);
    assert_eq!(fs::metadata(m.p("hl/sub2/c")).unwrap().nlink(), 2);
}

#[test]
fn hard_links_are_one_inode() {
    require_fuse();
    let s = Server::start(&[]);
    let mpd = TempDir::new("mnt");
    let m = Mount::start(&s, mpd.path(), &[]);
    check_hard_links(&m);
    // A link made on the server directly is found as the same node too —
    // once the server's watcher told the mount (`hl` is a directory the
    // mount made, whose names it answers from its lease until a break:
    // a change outside ferry is seen after the notice, not before).
    fs::hard_link(s.export.path().join("hl/again"), s.export.path().join("hl/server")).unwrap();
    assert!(common::fuse::wait_for(Duration::from_secs(5), || fs::metadata(m.p("hl/server")).is_ok()));
    assert_eq!(fs::metadata(m.p("hl/server")).unwrap().ino(), fs::metadata(m.p("hl/again")).unwrap().ino());
    drop(m);

    // Caching nothing, every call asks the server: the same must hold.
    fs::remove_dir_all(s.export.path().join("hl")).unwrap();
    let m = Mount::start(&s, mpd.path(), &["--attr-timeout", "0", "--entry-timeout", "0"]);
    check_hard_links(&m);
}

/// Writes are answered before the server acknowledges them (write-behind):
/// every later call through the mount must still see them, and `close`
/// must leave them on the server.
#[test]
fn write_behind_is_seen_by_later_calls() {
    require_fuse();
    let s = Server::start(&[]);
    let mpd = TempDir::new("mnt");
    let m = Mount::start(&s, mpd.path(), &["--attr-timeout", "0", "--entry-timeout", "0"]);
    let block = random_bytes(1 << 20, 5);
    let mut w = fs::File::create(m.p("wb")).unwrap();
    let mut r = fs::File::open(m.p("wb")).unwrap();
    for i in 0..24u64 {
        w.write_all(&block).unwrap();
        // Another descriptor, a stat by name and by descriptor: all after.
        assert_eq!(fs::metadata(m.p("wb")).unwrap().len(), (i + 1) << 20);
        assert_eq!(w.metadata().unwrap().len(), (i + 1) << 20);
        let mut back = vec![0u8; 1 << 20];
        r.seek(SeekFrom::Start(i << 20)).unwrap();
        r.read_exact(&mut back).unwrap();
        assert!(back == block, "block {i} read back differs");
    }
    // Overwrites in flight land in order.
    w.seek(SeekFrom::Start(0)).unwrap();
    w.write_all(b"first").unwrap();
    w.seek(SeekFrom::Start(0)).unwrap();
    w.write_all(b"SECOND").unwrap();
    w.set_len(30 << 20).unwrap();
    drop(w);
    let exp = fs::read(s.export.path().join("wb")).unwrap();
    assert_eq!(exp.len(), 30 << 20);
    assert_eq!(&exp[..6], b"SECOND");
    assert!(exp[6..1 << 20] == block[6..]);
    assert!(exp[24 << 20..].iter().all(|b| *b == 0));

    // A small file comes whole with a read-only open: a write through
    // another descriptor after that open must still be seen.
    fs::write(m.p("small"), "hello").unwrap();
    let mut r = fs::File::open(m.p("small")).unwrap();
    let w = fs::OpenOptions::new().write(true).open(m.p("small")).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&w, b"HE", 0).unwrap();
    let mut got = String::new();
    r.read_to_string(&mut got).unwrap();
    assert_eq!(got, "HEllo");
    w.set_len(2).unwrap();
    let mut again = fs::File::open(m.p("small")).unwrap();
    got.clear();
    again.read_to_string(&mut got).unwrap();
    assert_eq!(got, "HE");
}

/// `ferry umount` must not need the server: with it gone, a `stat` through
/// the mount fails, but the unmount itself works.
#[test]
fn umount_works_after_the_server_is_gone() {
    require_fuse();
    let s = Server::start(&[]);
    let mpd = TempDir::new("mnt");
    let mp = mpd.path().to_str().unwrap().to_string();
    // No attribute cache, so a `stat` of the mount point reaches the daemon.
    let args = ["mount", &s.url("/"), &mp, "--background", "--attr-timeout", "0", "--entry-timeout", "0"];
    let (st, out, err) = ferry(&s, &args);
    assert!(st.success(), "background mount failed: {out}{err}");
    let _guard = Detach(mpd.path().to_path_buf());
    assert!(is_mounted(mpd.path()));
    drop(s);
    let o = std::process::Command::new(common::FERRY).args(["umount", &mp]).output().unwrap();
    assert!(o.status.success(), "umount: {}", String::from_utf8_lossy(&o.stderr));
    assert!(wait_for(Duration::from_secs(5), || !is_mounted(mpd.path())));
}

/// While one process renames new versions over a file (as editors, git and
/// package managers save), another that opens, reads and stats it by name
/// always finds a file, old or new, as on a local file system. The kernel
/// may have looked the name up just before a rename: that node has no
/// name on the server any more.
#[test]
fn readers_always_find_a_file_renamed_over() {
    require_fuse();
    let s = Server::start(&[]);
    for opts in [&[][..], &["--cache"][..], &["--attr-timeout", "0", "--entry-timeout", "0"][..]] {
        let mpd = TempDir::new("mnt");
        let m = Mount::start(&s, mpd.path(), opts);
        let target = m.p("target");
        fs::write(&target, "v0").unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let renamer = {
            let (dir, stop) = (m.mp.clone(), std::sync::Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let tmp = dir.join(format!("tmp{}", i % 5));
                    fs::write(&tmp, format!("v{i}")).unwrap();
                    fs::rename(&tmp, dir.join("target")).unwrap();
                    i += 1;
                }
                i
            })
        };
        let (mut opens, mut failures) = (0, Vec::new());
        let end = Instant::now() + Duration::from_millis(1500);
        while Instant::now() < end {
            opens += 1;
            match fs::read_to_string(&target) {
                Ok(v) => assert!(v.starts_with('v'), "{opts:?}: read {v:?}"),
                Err(e) => failures.push(format!("open: {e}")),
            }
            if let Err(e) = fs::metadata(&target) {
                failures.push(format!("stat: {e}"));
            }
        }
        stop.store(true, Ordering::Relaxed);
        let renames = renamer.join().unwrap();
        assert!(renames > 50 && opens > 50, "{opts:?}: only {renames} renames and {opens} opens");
        assert!(
            failures.is_empty(),
            "{opts:?}: {} of {opens} reads failed, e.g. {:?}",
            failures.len(),
            &failures[..3.min(failures.len())]
        );
    }
}
