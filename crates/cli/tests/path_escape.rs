//! Confinement: nothing a client sends may reach outside the export.
//!
//! Every test plants a "secret" tree OUTSIDE the export (its own temp dir,
//! not `server.state`, whose log changes under our feet), snapshots it
//! (content, mode, owner, link count, nanosecond mtime/ctime, the files'
//! atimes, xattrs, the list of entries), then attacks it through the
//! `ferry_client` library with `..`, absolute and relative symlinks,
//! symlinked directories, `/proc` magic links, loops and a rename race, with
//! every operation the protocol has. Afterwards the snapshot must be
//! identical: an error that still had a side effect is as bad as a success.
//!
//! Documented behaviour these tests pin down (verified against the code, not
//! assumed; PROTOCOL.md "Paths", ARCHITECTURE.md "posix.rs"): the directory
//! backend resolves every client path with
//! `openat2(root, path, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` (an earlier
//! version used `RESOLVE_BENEATH`, which refused the same paths with
//! `EXDEV`). The export is the root of the client's name space, as in a
//! chroot:
//! - `..` at the export root stays at the root (`/../x` is `/x`);
//! - an absolute symlink resolves from the export root (`l -> /etc/passwd`
//!   names `EXPORT/etc/passwd`), and so does `/proc/self/root` (there is no
//!   `/proc` inside an export, so the magic links are never even met);
//! - `readlink` returns a symlink's text, whatever it points to.
//!
//! So an escape attempt either fails (the re-rooted name does not exist:
//! `ENOENT`), or — once a decoy tree is planted inside the export at the
//! re-rooted spot — reaches the decoy. Both are checked: phase 1 asserts
//! every attempt is refused, phase 2 asserts every attempt that succeeds
//! acted on the decoy, never on the real outside tree.
//!
//! The memory backend must behave the same way with its in-memory tree.
//!
//! As root (how this suite usually runs), permission checks cannot hide an
//! escape: every attempt would succeed if resolution let it out.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use common::{Server, TempDir};
use ferry_client::{Client, Error, OpenOptions, Target, Time};

/// What the outside secret holds; no reply may ever contain it.
const SECRET: &[u8] = b"TOP SECRET: this file lives outside the export and must never be served\n";
const SECRET_MODE: u32 = 0o600;
/// What the decoys planted inside the export hold.
const DECOY: &[u8] = b"decoy inside the export\n";
/// 2001-09-09: old enough that relatime updates the atime on any read, so a
/// read that reached the outside secret shows in its atime.
const OLD: i64 = 1_000_000_000;

/// Errnos a refused attempt may carry. `ENOENT`/`ENOTDIR`: the re-rooted
/// name does not exist; `ELOOP`: loops and magic links; `EXDEV`: the
/// `RESOLVE_BENEATH` flavour of refusal; `EACCES`/`EPERM`: other grounds;
/// `EAGAIN`: `openat2` gives up on a path with `..` when anything on the
/// machine renamed during the walk (see
/// `dotdot_paths_survive_concurrent_renames`) — still a refusal.
const REFUSED: &[i32] =
    &[libc::ENOENT, libc::ENOTDIR, libc::ELOOP, libc::EXDEV, libc::EACCES, libc::EPERM, libc::EAGAIN];

/// Tests that rename furiously take this exclusively, the others share it:
/// renames anywhere on the machine make `openat2` fail `..` walks with
/// `EAGAIN` (a bug, tested on its own), which must not make the other tests
/// of this binary flaky.
static RENAMES: RwLock<()> = RwLock::new(());

fn shared() -> RwLockReadGuard<'static, ()> {
    RENAMES.read().unwrap_or_else(|e| e.into_inner())
}

fn exclusive() -> RwLockWriteGuard<'static, ()> {
    RENAMES.write().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------
// The outside tree and its snapshot

/// One node of the outside tree, with everything an escape could change.
#[derive(Debug, PartialEq, Eq)]
struct NodeState {
    kind: &'static str,
    ino: u64,
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    /// Regular files only: the snapshot reads directories and links, which
    /// moves their atimes.
    atime: Option<(i64, i64)>,
    /// File content or link target.
    data: Vec<u8>,
    xattrs: BTreeMap<String, Vec<u8>>,
}

type Snapshot = BTreeMap<PathBuf, NodeState>;

fn lxattrs(p: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut names = vec![0u8; 64 * 1024];
    let Ok(n) = rustix::fs::llistxattr(p, &mut names[..]) else {
        return out;
    };
    for name in names[..n].split(|b| *b == 0).filter(|s| !s.is_empty()) {
        let name = String::from_utf8_lossy(name).into_owned();
        let mut v = vec![0u8; 64 * 1024];
        if let Ok(k) = rustix::fs::lgetxattr(p, name.as_str(), &mut v[..]) {
            v.truncate(k);
            out.insert(name, v);
        }
    }
    out
}

fn node_state(p: &Path) -> NodeState {
    let m = fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let ft = m.file_type();
    let (kind, data, atime) = if ft.is_file() {
        // O_NOATIME: the snapshot must not move the atime it checks.
        let mut f = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOATIME)
            .open(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut v).expect("read outside file");
        ("file", v, Some((m.atime(), m.atime_nsec())))
    } else if ft.is_symlink() {
        ("symlink", fs::read_link(p).expect("readlink").into_os_string().into_encoded_bytes(), None)
    } else if ft.is_dir() {
        ("dir", Vec::new(), None)
    } else {
        ("other", Vec::new(), None)
    };
    NodeState {
        kind,
        ino: m.ino(),
        mode: m.mode(),
        uid: m.uid(),
        gid: m.gid(),
        nlink: m.nlink(),
        size: if ft.is_dir() { 0 } else { m.size() },
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
        atime,
        data,
        xattrs: lxattrs(p),
    }
}

fn snapshot_into(root: &Path, rel: &Path, out: &mut Snapshot) {
    let p = root.join(rel);
    let st = node_state(&p);
    let is_dir = st.kind == "dir";
    out.insert(rel.to_path_buf(), st);
    if is_dir {
        let mut names: Vec<_> =
            fs::read_dir(&p).expect("read outside dir").map(|e| e.expect("entry").file_name()).collect();
        names.sort();
        for n in names {
            snapshot_into(root, &rel.join(n), out);
        }
    }
}

fn set_times(p: &Path, sec: i64) {
    let t = rustix::fs::Timespec { tv_sec: sec, tv_nsec: 0 };
    let ts = rustix::fs::Timestamps { last_access: t, last_modification: t };
    rustix::fs::utimensat(rustix::fs::CWD, p, &ts, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).expect("utimensat");
}

/// Builds the tree every attack aims at, at `p`:
/// `secret` (`content`, 0600, old times, xattr `user.tag`), `sub/` (empty,
/// so an `rmdir` through an escape would succeed), `full/inner`, and
/// `lnk -> {link_text}`.
fn plant_tree(p: &Path, content: &[u8], link_text: &str) {
    fs::create_dir_all(p).expect("mkdir tree");
    fs::write(p.join("secret"), content).expect("write secret");
    fs::set_permissions(p.join("secret"), fs::Permissions::from_mode(SECRET_MODE)).expect("chmod secret");
    // Best effort: a file system without user xattrs just checks fewer things.
    let _ = rustix::fs::setxattr(p.join("secret").as_path(), "user.tag", b"original", rustix::fs::XattrFlags::empty());
    fs::create_dir(p.join("sub")).expect("mkdir sub");
    fs::create_dir(p.join("full")).expect("mkdir full");
    fs::write(p.join("full/inner"), [content, b" (inner)"].concat()).expect("write inner");
    symlink(link_text, p.join("lnk")).expect("symlink lnk");
    for f in ["secret", "full/inner"] {
        set_times(&p.join(f), OLD);
    }
}

struct Outside {
    dir: TempDir,
}

impl Outside {
    fn new() -> Outside {
        let dir = TempDir::new("outside");
        plant_tree(dir.path(), SECRET, "outside-link-target");
        Outside { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Absolute path of the secret, as a string for symlink targets.
    fn secret(&self) -> String {
        self.path().join("secret").to_str().expect("utf-8 temp path").to_string()
    }

    /// Absolute path of the tree.
    fn abs(&self) -> String {
        self.path().to_str().expect("utf-8 temp path").to_string()
    }

    /// The directory's own name: export and outside share the temp dir, so
    /// `../NAME` from the export root would be the outside tree.
    fn name(&self) -> String {
        self.path().file_name().expect("name").to_str().expect("utf-8").to_string()
    }

    fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot::new();
        snapshot_into(self.path(), Path::new(""), &mut s);
        s
    }

    /// Panics with the differing nodes if the tree changed.
    fn assert_unchanged(&self, before: &Snapshot, after_what: &str) {
        let now = self.snapshot();
        if &now != before {
            let mut diff = String::new();
            for (k, v) in before {
                match now.get(k) {
                    None => diff += &format!("  removed {}\n", k.display()),
                    Some(n) if n != v => {
                        diff += &format!("  changed {}:\n    before {v:?}\n    after  {n:?}\n", k.display())
                    }
                    _ => {}
                }
            }
            for k in now.keys().filter(|k| !before.contains_key(*k)) {
                diff += &format!("  NEW {}\n", k.display());
            }
            panic!("the OUTSIDE tree changed after {after_what}:\n{diff}");
        }
    }
}

// ---------------------------------------------------------------------------
// Attacks

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// Runs attacks with one client. In `strict` mode each must be refused by
/// the server; otherwise each may succeed (it is expected to act on a decoy
/// inside the export) but a read must never return the outside secret.
/// Either way a connection-level failure is a test failure: a dead
/// connection would make every "refusal" meaningless.
struct Attack<'a> {
    c: &'a Client,
    label: String,
    strict: bool,
    /// (operation, errno or 0 for success), for the summary and for checks.
    seen: Vec<(String, i32)>,
}

impl<'a> Attack<'a> {
    fn strict(c: &'a Client, label: impl Into<String>) -> Attack<'a> {
        Attack { c, label: label.into(), strict: true, seen: Vec::new() }
    }

    fn lenient(c: &'a Client, label: impl Into<String>) -> Attack<'a> {
        Attack { c, label: label.into(), strict: false, seen: Vec::new() }
    }

    /// Checks one outcome; returns the errno (0 for success).
    fn deny_with<T>(&mut self, op: &str, r: ferry_client::Result<T>, extra: &[i32]) -> i32 {
        let e = match r {
            Ok(_) if self.strict => panic!("[{}] {op}: SUCCEEDED, but it names no file inside the export", self.label),
            Ok(_) => 0,
            Err(Error::Remote { errno, message }) => {
                assert!(
                    !self.strict || REFUSED.contains(&errno) || extra.contains(&errno),
                    "[{}] {op}: refused with unexpected errno {errno} ({message})",
                    self.label
                );
                errno
            }
            Err(e) => panic!("[{}] {op}: not an answer from the server but {e:?}", self.label),
        };
        self.seen.push((op.to_string(), e));
        e
    }

    fn deny<T>(&mut self, op: &str, r: ferry_client::Result<T>) -> i32 {
        self.deny_with(op, r, &[])
    }

    /// A read: must never return `secret`; in strict mode must fail.
    fn deny_read(&mut self, op: &str, r: ferry_client::Result<Vec<u8>>, secret: &[u8]) -> i32 {
        if let Ok(data) = &r {
            assert!(!contains(data, secret), "[{}] {op}: read returned the OUTSIDE secret", self.label);
            assert!(!contains(data, SECRET), "[{}] {op}: read returned the OUTSIDE secret", self.label);
        }
        self.deny(op, r)
    }

    /// Every refusal so far had one of `errnos` (successes excluded).
    fn assert_errnos(&self, errnos: &[i32]) {
        for (op, e) in &self.seen {
            assert!(
                *e == 0 || errnos.contains(e) || (*e == libc::EEXIST && op.contains("O_EXCL")),
                "[{}] {op}: errno {e}, expected one of {errnos:?}",
                self.label
            );
        }
    }

    fn summary(&self) {
        let mut by_errno: BTreeMap<i32, usize> = BTreeMap::new();
        for (_, e) in &self.seen {
            *by_errno.entry(*e).or_default() += 1;
        }
        eprintln!("[{}] {} attempts, by errno (0 = success): {by_errno:?}", self.label, self.seen.len());
    }

    /// Operations that only look at what `p` resolves to (following a
    /// final symlink). Safe to aim at files that are not ours.
    fn look_at(&mut self, p: &str, secret: &[u8]) {
        let c = self.c;
        self.deny_read(&format!("read({p})"), c.read(p), secret);
        self.deny(&format!("open({p}, O_RDONLY)"), c.open(p, OpenOptions::new().read(true)));
        self.deny(
            &format!("open({p}, O_RDONLY|O_NOATIME)"),
            c.open(p, OpenOptions::new().read(true).custom_flags(libc::O_NOATIME as u32)),
        );
        self.deny(&format!("open({p}, O_DIRECTORY)"), c.open(p, OpenOptions::new().read(true).directory(true)));
        self.deny(&format!("read_dir({p})"), c.read_dir(p));
        self.deny(&format!("stat({p})"), c.metadata(p));
        self.deny(&format!("statfs({p})"), c.statfs(p));
        self.deny(&format!("access({p}, F_OK)"), c.access(p, libc::F_OK as u32));
        self.deny(&format!("access({p}, R_OK|W_OK)"), c.access(p, (libc::R_OK | libc::W_OK) as u32));
        self.deny(&format!("getxattr({p})"), c.get_xattr(Target::Path(p.as_bytes()), "user.tag"));
        self.deny(&format!("listxattr({p})"), c.list_xattr(Target::Path(p.as_bytes())));
    }

    /// Operations that would change what `p` resolves to (following a
    /// final symlink). Only ever aimed at our own outside tree.
    fn change(&mut self, p: &str) {
        let c = self.c;
        self.deny(&format!("open({p}, O_WRONLY)"), c.open(p, OpenOptions::new().write(true)));
        self.deny(&format!("open({p}, O_RDWR)"), c.open(p, OpenOptions::new().read(true).write(true)));
        self.deny(&format!("open({p}, O_WRONLY|O_CREAT)"), c.open(p, OpenOptions::new().write(true).create(true)));
        self.deny(&format!("open({p}, O_WRONLY|O_TRUNC)"), c.open(p, OpenOptions::new().write(true).truncate(true)));
        self.deny(&format!("open({p}, O_APPEND|O_CREAT)"), c.open(p, OpenOptions::new().append(true).create(true)));
        // O_EXCL on an existing final symlink refuses with EEXIST without
        // following it, which is no escape either.
        self.deny_with(
            &format!("open({p}, O_CREAT|O_EXCL)"),
            c.open(p, OpenOptions::new().write(true).create_new(true)),
            &[libc::EEXIST],
        );
        self.deny(&format!("write({p})"), c.write(p, b"PWNED"));
        self.deny(&format!("truncate({p}, 0)"), c.truncate(Target::Path(p.as_bytes()), 0));
        self.deny(&format!("truncate({p}, 1M)"), c.truncate(Target::Path(p.as_bytes()), 1 << 20));
        self.deny(&format!("chmod({p}, 0777)"), c.set_permissions(Target::Path(p.as_bytes()), 0o777));
        self.deny(&format!("chmod({p}, 04755)"), c.set_permissions(Target::Path(p.as_bytes()), 0o4755));
        self.deny(&format!("chown({p}, 4242, 4242)"), c.chown(Target::Path(p.as_bytes()), 4242, 4242));
        // Even a chown that changes nothing moves the ctime.
        self.deny(&format!("chown({p}, -1, -1)"), c.chown(Target::Path(p.as_bytes()), u32::MAX, u32::MAX));
        let t = Time { sec: 1234, nsec: 0 };
        self.deny(&format!("utimens({p}, 1234)"), c.set_times(Target::Path(p.as_bytes()), t, t));
        self.deny(&format!("utimens({p}, NOW)"), c.set_times(Target::Path(p.as_bytes()), Time::NOW, Time::NOW));
        self.deny(&format!("setxattr({p})"), c.set_xattr(Target::Path(p.as_bytes()), "user.evil", b"1", 0));
        self.deny(&format!("removexattr({p})"), c.remove_xattr(Target::Path(p.as_bytes()), "user.tag"));
    }

    /// The same without following a final symlink: for a path whose PARENT
    /// leads out, these must not reach the outside either.
    fn change_nofollow(&mut self, p: &str) {
        let c = self.c;
        self.deny(&format!("lstat({p})"), c.symlink_metadata(p));
        self.deny(&format!("open({p}, O_NOFOLLOW)"), c.open(p, OpenOptions::new().read(true).nofollow(true)));
        self.deny(&format!("chmod(nofollow {p})"), c.set_permissions(Target::PathNoFollow(p.as_bytes()), 0o777));
        self.deny(&format!("chown(nofollow {p})"), c.chown(Target::PathNoFollow(p.as_bytes()), 4242, 4242));
        let t = Time { sec: 1234, nsec: 0 };
        self.deny(&format!("utimens(nofollow {p})"), c.set_times(Target::PathNoFollow(p.as_bytes()), t, t));
        self.deny(&format!("truncate(nofollow {p})"), c.truncate(Target::PathNoFollow(p.as_bytes()), 0));
        self.deny(&format!("getxattr(nofollow {p})"), c.get_xattr(Target::PathNoFollow(p.as_bytes()), "user.tag"));
        self.deny(&format!("listxattr(nofollow {p})"), c.list_xattr(Target::PathNoFollow(p.as_bytes())));
        self.deny(
            &format!("setxattr(nofollow {p})"),
            c.set_xattr(Target::PathNoFollow(p.as_bytes()), "user.evil", b"1", 0),
        );
        self.deny(
            &format!("removexattr(nofollow {p})"),
            c.remove_xattr(Target::PathNoFollow(p.as_bytes()), "user.tag"),
        );
    }

    /// Every operation, aimed at a directory path `d` that would lead to the
    /// outside tree (`d/secret` the outside secret). `inside` is an existing
    /// file inside the export, the other end of renames and links (it is
    /// moved away if a rename succeeds, so phase 2 does not use this).
    fn whole_dir(&mut self, d: &str, inside: &str) {
        let c = self.c;
        let j = |n: &str| format!("{}/{n}", d.trim_end_matches('/'));
        self.look_at(d, SECRET);
        self.deny(&format!("lstat({d}/.)"), c.symlink_metadata(j(".")));
        self.deny(&format!("chmod({d})"), c.set_permissions(Target::Path(d.as_bytes()), 0o777));
        self.deny(&format!("chown({d})"), c.chown(Target::Path(d.as_bytes()), 4242, 4242));
        let t = Time { sec: 1234, nsec: 0 };
        self.deny(&format!("utimens({d})"), c.set_times(Target::Path(d.as_bytes()), t, t));
        self.deny(&format!("setxattr({d})"), c.set_xattr(Target::Path(d.as_bytes()), "user.evil", b"1", 0));

        let secret = j("secret");
        self.look_at(&secret, SECRET);
        self.change(&secret);
        self.change_nofollow(&secret);
        self.deny_read(&format!("read({})", j("full/inner")), c.read(j("full/inner")), SECRET);
        self.deny(&format!("read_dir({})", j("full")), c.read_dir(j("full")));
        self.deny(&format!("readlink({})", j("lnk")), c.read_link(j("lnk")));

        // Name-level operations through the directory.
        self.deny(&format!("mkdir({})", j("newdir")), c.create_dir(j("newdir"), 0o755));
        self.deny(&format!("rmdir({})", j("sub")), c.remove_dir(j("sub")));
        self.deny(&format!("unlink({})", j("secret")), c.remove_file(j("secret")));
        self.deny(&format!("unlink({})", j("lnk")), c.remove_file(j("lnk")));
        self.deny(&format!("remove_dir_all({})", j("full")), c.remove_dir_all(j("full")));
        self.deny(&format!("rename({} -> /stolen)", j("secret")), c.rename(j("secret"), "/stolen"));
        self.deny(&format!("rename({} -> /stolen_dir)", j("sub")), c.rename(j("sub"), "/stolen_dir"));
        self.deny(&format!("rename({inside} -> {})", j("planted")), c.rename(inside, j("planted")));
        self.deny(&format!("rename({inside} -> {}) overwrite", j("secret")), c.rename(inside, j("secret")));
        self.deny(&format!("rename({} -> {})", j("secret"), j("moved")), c.rename(j("secret"), j("moved")));
        self.deny(
            &format!("rename_exchange({inside} <-> {})", j("secret")),
            c.rename_with_flags(inside, j("secret"), 2),
        );
        self.deny(&format!("link({} -> /hardlink)", j("secret")), c.hard_link(j("secret"), "/hardlink"));
        self.deny(&format!("link({inside} -> {})", j("planted_link")), c.hard_link(inside, j("planted_link")));
        self.deny(&format!("symlink(x -> {})", j("newlink")), c.symlink("x", j("newlink")));
        self.deny(
            &format!("open({}, O_CREAT|O_EXCL)", j("created")),
            c.open(j("created"), OpenOptions::new().write(true).create_new(true)),
        );
        self.deny(&format!("write({})", j("created2")), c.write(j("created2"), b"PWNED"));
        self.deny(&format!("statfs({})", j("secret")), c.statfs(j("secret")));
    }
}

// ---------------------------------------------------------------------------
// Fixtures inside the export

/// `inside.txt`, `sub/f`, `a/` (for `a/../..`); returns a client.
fn prepare_export(server: &Server) -> Client {
    let ex = server.export.path();
    fs::write(ex.join("inside.txt"), b"inside\n").unwrap();
    fs::create_dir(ex.join("sub")).unwrap();
    fs::write(ex.join("sub/f"), b"inside f\n").unwrap();
    fs::create_dir(ex.join("a")).unwrap();
    server.client()
}

/// After a batch of attacks: the connection still works, and nothing inside
/// was moved away.
fn assert_inside_intact(server: &Server, c: &Client) {
    assert_eq!(c.read("/inside.txt").expect("inside.txt still readable"), b"inside\n");
    assert_eq!(c.read("/sub/f").expect("sub/f still readable"), b"inside f\n");
    for n in ["stolen", "stolen_dir", "hardlink"] {
        assert!(!server.export.path().join(n).exists(), "{n} appeared inside the export");
    }
}

/// Where re-rooting sends absolute path `abs` in the export.
fn rerooted(export: &Path, abs: &str) -> PathBuf {
    export.join(abs.trim_start_matches('/'))
}

/// Phase 2: plants a fresh decoy tree at `mirror` (inside the export, where
/// the server's re-rooting sends the escape path `d`), then checks that every
/// operation through `d` acts on the decoy, and fires every other attack too.
/// The caller checks the outside afterwards.
fn confined_pass(c: &Client, d: &str, mirror: &Path, label: &str) {
    let _ = fs::remove_dir_all(mirror);
    plant_tree(mirror, DECOY, "decoy-link-target");
    let j = |n: &str| format!("{}/{n}", d.trim_end_matches('/'));
    let ino = |p: &str| fs::symlink_metadata(mirror.join(p)).unwrap().ino();
    let ctx = |what: &str| format!("[{label}] {what} through {d} (decoy {})", mirror.display());

    assert_eq!(c.read(j("secret")).unwrap_or_else(|e| panic!("{}: {e:?}", ctx("read"))), DECOY, "{}", ctx("read"));
    assert_eq!(c.metadata(j("secret")).unwrap().ino, ino("secret"), "{}", ctx("stat"));
    assert_eq!(c.metadata(d).unwrap().ino, ino(""), "{}", ctx("stat of the dir"));
    assert_eq!(c.read_link(j("lnk")).unwrap().to_str().unwrap(), "decoy-link-target", "{}", ctx("readlink"));
    let names: BTreeSet<String> =
        c.read_dir(d).unwrap().into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect();
    let want: BTreeSet<String> = ["full", "lnk", "secret", "sub"].iter().map(|s| s.to_string()).collect();
    assert_eq!(names, want, "{}", ctx("read_dir"));
    c.set_permissions(Target::Path((j("secret")).as_bytes()), 0o640).unwrap();
    assert_eq!(fs::metadata(mirror.join("secret")).unwrap().mode() & 0o7777, 0o640, "{}", ctx("chmod"));
    let t = Time { sec: 1234, nsec: 0 };
    c.set_times(Target::Path((j("secret")).as_bytes()), t, t).unwrap();
    assert_eq!(fs::metadata(mirror.join("secret")).unwrap().mtime(), 1234, "{}", ctx("utimens"));
    c.truncate(Target::Path((j("secret")).as_bytes()), 3).unwrap();
    assert_eq!(fs::metadata(mirror.join("secret")).unwrap().len(), 3, "{}", ctx("truncate"));
    c.write(j("created"), b"made inside").unwrap();
    assert_eq!(fs::read(mirror.join("created")).unwrap(), b"made inside", "{}", ctx("create"));
    c.create_dir(j("newdir"), 0o755).unwrap();
    assert!(mirror.join("newdir").is_dir(), "{}", ctx("mkdir"));
    c.rename(j("created"), j("renamed")).unwrap();
    assert!(mirror.join("renamed").is_file(), "{}", ctx("rename"));
    c.hard_link(j("renamed"), j("hl")).unwrap();
    assert_eq!(fs::metadata(mirror.join("hl")).unwrap().nlink(), 2, "{}", ctx("link"));
    c.symlink("t", j("newlink")).unwrap();
    assert_eq!(fs::read_link(mirror.join("newlink")).unwrap(), Path::new("t"), "{}", ctx("symlink"));
    c.remove_file(j("hl")).unwrap();
    c.remove_dir(j("newdir")).unwrap();
    c.remove_dir(j("sub")).unwrap();
    assert!(!mirror.join("sub").exists(), "{}", ctx("rmdir"));
    c.statfs(d).unwrap();

    // And every attack, now allowed to succeed (on the decoy).
    let mut a = Attack::lenient(c, format!("{label}: phase 2 through {d}"));
    let secret = j("secret");
    a.look_at(&secret, SECRET);
    a.change(&secret);
    a.change_nofollow(&secret);
    a.look_at(d, SECRET);
}

/// A file some attack might have created in a directory that is not ours;
/// removed on drop if it did appear, so a failing test cleans up after itself.
struct Probe(PathBuf);

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
        let _ = fs::remove_dir(&self.0);
    }
}

fn remote_errno<T: std::fmt::Debug>(r: ferry_client::Result<T>, what: &str) -> i32 {
    match r {
        Err(Error::Remote { errno, .. }) => errno,
        other => panic!("{what}: expected an error from the server, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// Directory backend

#[test]
fn dotdot_is_clamped_at_the_export_root() {
    let _g = shared();
    let server = Server::start(&[]);
    let outside = Outside::new();
    let before = outside.snapshot();
    let c = prepare_export(&server);
    let ex = server.export.path();
    let name = outside.name();
    let abs = outside.abs();

    // `..` at the root is the root.
    let root = c.metadata("/").unwrap();
    for p in ["..", "/..", "/../", "a/../..", "../..", "/../../../../../../..", "sub/../../a/../.."] {
        assert_eq!(c.metadata(p).unwrap_or_else(|e| panic!("stat({p}): {e:?}")).ino, root.ino, "{p} is the root");
    }
    for p in ["/../inside.txt", "../../../inside.txt", "a/../../../inside.txt", "//..//sub/../inside.txt"] {
        assert_eq!(c.read(p).unwrap_or_else(|e| panic!("read({p}): {e:?}")), b"inside\n", "{p}");
    }

    // The outside tree in several spellings of "above the root".
    let spell = |rel_to_parent: bool| -> Vec<String> {
        if rel_to_parent {
            vec![
                format!("/../{name}"),
                format!("../{name}"),
                format!("a/../../{name}"),
                format!("/a/../../{name}/"),
                format!("sub/../a/../../{name}"),
                format!("//..//{name}"),
                format!("./../{name}"),
            ]
        } else {
            vec![format!("../../../../../../../..{abs}"), format!("/../../../../../../../../../..{abs}/.")]
        }
    };
    // Phase 1: nothing there yet, so every attempt is refused.
    let mut a = Attack::strict(&c, "dotdot phase 1");
    for d in spell(true).iter().chain(spell(false).iter()) {
        a.whole_dir(d, "/inside.txt");
        outside.assert_unchanged(&before, &format!("attacks through {d}"));
        assert_inside_intact(&server, &c);
    }
    for p in ["../../../../etc/passwd", "/../../../../../../../../etc/passwd", "a/../../../../../../etc/shadow"] {
        a.look_at(p, b"root:");
    }
    let probe = Probe(outside.path().join("created_by_dotdot"));
    a.deny("create via ..", c.write(format!("/../{name}/created_by_dotdot"), b"PWNED"));
    assert!(!probe.0.exists());
    // The re-rooted names do not exist: it is ENOENT, not some other refusal.
    a.assert_errnos(&[libc::ENOENT, libc::EAGAIN]);
    a.summary();

    // Phase 2: decoys where the server says those paths are.
    for d in spell(true) {
        confined_pass(&c, &d, &ex.join(&name), "dotdot");
        outside.assert_unchanged(&before, &format!("phase 2 through {d}"));
    }
    for d in spell(false) {
        confined_pass(&c, &d, &rerooted(ex, &abs), "dotdot");
        outside.assert_unchanged(&before, &format!("phase 2 through {d}"));
    }
    fs::create_dir_all(ex.join("etc")).unwrap();
    fs::write(ex.join("etc/passwd"), DECOY).unwrap();
    for p in ["../../../../etc/passwd", "/../../../../../../../../etc/passwd", "a/../../etc/passwd"] {
        assert_eq!(c.read(p).unwrap(), DECOY, "{p} is the export's etc/passwd");
    }
    outside.assert_unchanged(&before, "all .. attacks");
    assert_inside_intact(&server, &c);
}

#[test]
fn absolute_symlinks_pointing_outside_resolve_inside() {
    let _g = shared();
    let server = Server::start(&[]);
    let outside = Outside::new();
    let before = outside.snapshot();
    let c = prepare_export(&server);
    let ex = server.export.path();
    let abs = outside.abs();
    // Planted on the server side, as a local user of the export could.
    symlink(outside.secret(), ex.join("abs_secret")).unwrap();
    symlink(outside.path(), ex.join("abs_dir")).unwrap();
    symlink("/etc/passwd", ex.join("passwd")).unwrap();
    symlink("/etc", ex.join("etc_link")).unwrap();
    symlink("/", ex.join("slash")).unwrap();
    // A dangling absolute symlink: O_CREAT through it would create outside.
    let dangling = outside.path().join("created_through_dangling");
    symlink(&dangling, ex.join("abs_dangling")).unwrap();
    let _probe = Probe(dangling.clone());
    // Planted by the client itself, through the protocol.
    c.symlink(outside.secret(), "/client_abs_secret").expect("creating a symlink is allowed");
    c.symlink(&abs, "/client_abs_dir").expect("symlink");

    // "/" is the export root.
    assert_eq!(c.read("slash/inside.txt").unwrap(), b"inside\n");
    assert_eq!(c.metadata("slash").unwrap().ino, c.metadata("/").unwrap().ino);

    let mut a = Attack::strict(&c, "absolute symlinks phase 1");
    for p in ["abs_secret", "/client_abs_secret", "/sub/../abs_secret"] {
        a.look_at(p, SECRET);
        a.change(p);
        outside.assert_unchanged(&before, &format!("attacks on {p}"));
        // The link itself is inside: lstat and readlink work, and only
        // reveal what the server's owner (or the client) wrote there.
        assert!(c.symlink_metadata(p).expect("lstat of the link itself").is_symlink());
        assert_eq!(c.read_link(p).expect("readlink"), outside.secret());
    }
    for d in ["abs_dir".to_string(), "/client_abs_dir".to_string(), format!("slash{abs}")] {
        a.whole_dir(&d, "/inside.txt");
        outside.assert_unchanged(&before, &format!("attacks through {d}"));
        assert_inside_intact(&server, &c);
    }
    for p in ["passwd", "etc_link/passwd", "etc_link/shadow", "slash/etc/passwd"] {
        a.look_at(p, b"root:");
    }
    let etc_probe = Probe(PathBuf::from(format!("/etc/ferry-escape-probe-{}", std::process::id())));
    let pname = etc_probe.0.file_name().unwrap().to_str().unwrap().to_string();
    a.deny("create in /etc", c.write(format!("etc_link/{pname}"), b"PWNED"));
    a.deny("mkdir in /etc", c.create_dir(format!("etc_link/{pname}"), 0o755));
    a.deny("symlink in /etc", c.symlink("x", format!("etc_link/{pname}")));
    assert!(fs::symlink_metadata(&etc_probe.0).is_err(), "a file was created in the real /etc");
    // O_CREAT through a dangling link must not create its target.
    for opts in [
        OpenOptions::new().write(true).create(true).clone(),
        OpenOptions::new().read(true).write(true).create(true).truncate(true).clone(),
        OpenOptions::new().append(true).create(true).clone(),
    ] {
        a.deny("open(abs_dangling, O_CREAT)", c.open("abs_dangling", &opts));
    }
    a.deny("write(abs_dangling)", c.write("abs_dangling", b"PWNED"));
    assert!(fs::symlink_metadata(&dangling).is_err(), "O_CREAT through a dangling symlink created {dangling:?}");
    a.assert_errnos(&[libc::ENOENT, libc::EAGAIN]);
    a.summary();
    outside.assert_unchanged(&before, "phase 1");

    // Phase 2: the decoy sits where the export root puts the absolute path.
    let mirror = rerooted(ex, &abs);
    for d in ["abs_dir".to_string(), "/client_abs_dir".to_string(), format!("slash{abs}")] {
        confined_pass(&c, &d, &mirror, "absolute");
        outside.assert_unchanged(&before, &format!("phase 2 through {d}"));
    }
    let _ = fs::remove_dir_all(&mirror);
    plant_tree(&mirror, DECOY, "decoy-link-target");
    for p in ["abs_secret", "/client_abs_secret"] {
        assert_eq!(c.read(p).unwrap(), DECOY, "{p} leads to the decoy");
        assert_eq!(c.metadata(p).unwrap().ino, fs::metadata(mirror.join("secret")).unwrap().ino());
    }
    let mut a = Attack::lenient(&c, "absolute symlinks phase 2");
    for p in ["abs_secret", "/client_abs_secret"] {
        a.look_at(p, SECRET);
        a.change(p);
    }
    c.write("abs_dangling", b"created through the link").expect("re-rooted dangling link: parent exists now");
    assert_eq!(fs::read(mirror.join("created_through_dangling")).unwrap(), b"created through the link");
    assert!(fs::symlink_metadata(&dangling).is_err(), "created outside through a dangling symlink");
    fs::create_dir(ex.join("etc")).unwrap();
    fs::write(ex.join("etc/passwd"), DECOY).unwrap();
    for p in ["passwd", "etc_link/passwd", "slash/etc/passwd"] {
        assert_eq!(c.read(p).unwrap(), DECOY, "{p} is the export's etc/passwd");
    }
    c.write(format!("etc_link/{pname}"), b"inside").unwrap();
    assert!(ex.join("etc").join(&pname).is_file());
    assert!(fs::symlink_metadata(&etc_probe.0).is_err(), "a file was created in the real /etc");
    outside.assert_unchanged(&before, "all absolute symlink attacks");
    assert_inside_intact(&server, &c);
}

#[test]
fn relative_symlinks_escaping_are_clamped() {
    let _g = shared();
    let server = Server::start(&[]);
    let outside = Outside::new();
    let before = outside.snapshot();
    let c = prepare_export(&server);
    let ex = server.export.path();
    let name = outside.name();
    let abs = outside.abs();
    symlink(format!("../{name}/secret"), ex.join("rel_secret")).unwrap();
    symlink(format!("../../{name}/secret"), ex.join("sub/rel_secret_deep")).unwrap();
    symlink(format!("../{name}"), ex.join("rel_dir")).unwrap();
    symlink(format!("../../../../../../../..{abs}"), ex.join("sub/far_dir")).unwrap();
    symlink("..", ex.join("up")).unwrap();
    symlink("../..", ex.join("sub/upup")).unwrap();
    // A chain: each hop stays inside, the last one climbs.
    symlink("hop2", ex.join("hop1")).unwrap();
    symlink("sub/hop3", ex.join("hop2")).unwrap();
    symlink("../rel_dir", ex.join("sub/hop3")).unwrap();
    symlink("../../../../../../etc/passwd", ex.join("sub/rel_passwd")).unwrap();
    let dangling = outside.path().join("created_through_rel_dangling");
    symlink(format!("../{name}/created_through_rel_dangling"), ex.join("rel_dangling")).unwrap();
    let _probe = Probe(dangling.clone());
    c.symlink(format!("../{name}/secret"), "/client_rel_secret").unwrap();
    c.symlink(format!("../../{name}"), "/sub/client_rel_dir").unwrap();

    // Climbing links stop at the root.
    assert_eq!(c.read("up/inside.txt").unwrap(), b"inside\n");
    assert_eq!(c.read("sub/upup/inside.txt").unwrap(), b"inside\n");
    assert_eq!(c.metadata("up").unwrap().ino, c.metadata("/").unwrap().ino);

    let files = [
        "rel_secret".to_string(),
        "sub/rel_secret_deep".into(),
        "/client_rel_secret".into(),
        format!("up/{name}/secret"),
    ];
    let dirs = [
        "rel_dir".to_string(),
        "/sub/client_rel_dir".into(),
        "hop1".into(),
        format!("up/{name}"),
        format!("sub/upup/{name}"),
    ];
    let mut a = Attack::strict(&c, "relative symlinks phase 1");
    for p in &files {
        a.look_at(p, SECRET);
        a.change(p);
        outside.assert_unchanged(&before, &format!("attacks on {p}"));
    }
    for d in dirs.iter().chain(["sub/far_dir".to_string()].iter()) {
        a.whole_dir(d, "/inside.txt");
        outside.assert_unchanged(&before, &format!("attacks through {d}"));
        assert_inside_intact(&server, &c);
    }
    a.look_at("sub/rel_passwd", b"root:");
    a.deny("write(rel_dangling)", c.write("rel_dangling", b"PWNED"));
    a.deny("open(rel_dangling, O_CREAT)", c.open("rel_dangling", OpenOptions::new().write(true).create(true)));
    assert!(fs::symlink_metadata(&dangling).is_err(), "O_CREAT through a relative dangling link created {dangling:?}");
    a.assert_errnos(&[libc::ENOENT, libc::EAGAIN]);
    a.summary();

    // Phase 2.
    let mirror = ex.join(&name);
    for d in &dirs {
        confined_pass(&c, d, &mirror, "relative");
        outside.assert_unchanged(&before, &format!("phase 2 through {d}"));
    }
    confined_pass(&c, "sub/far_dir", &rerooted(ex, &abs), "relative");
    let _ = fs::remove_dir_all(&mirror);
    plant_tree(&mirror, DECOY, "decoy-link-target");
    for p in &files {
        assert_eq!(c.read(p).unwrap(), DECOY, "{p}");
    }
    c.write("rel_dangling", b"made inside").unwrap();
    assert_eq!(fs::read(mirror.join("created_through_rel_dangling")).unwrap(), b"made inside");
    assert!(fs::symlink_metadata(&dangling).is_err());
    outside.assert_unchanged(&before, "all relative symlink attacks");
    assert_inside_intact(&server, &c);
}

#[test]
fn proc_magic_links_lead_nowhere() {
    let _g = shared();
    let server = Server::start(&[]);
    let outside = Outside::new();
    let before = outside.snapshot();
    let c = prepare_export(&server);
    let ex = server.export.path();
    let abs = outside.abs();
    for (link, target) in [
        ("procroot", "/proc/self/root"),
        ("proccwd", "/proc/self/cwd"),
        ("fd0", "/proc/self/fd/0"),
        ("fds", "/proc/self/fd"),
        ("exe", "/proc/self/exe"),
        ("self", "/proc/self"),
        ("threadroot", "/proc/thread-self/root"),
        ("rel_procroot", "../../../../../../../../proc/self/root"),
    ] {
        symlink(target, ex.join(link)).unwrap();
    }
    c.symlink("/proc/self/root", "/client_procroot").unwrap();

    let roots = ["procroot", "threadroot", "rel_procroot", "/client_procroot", "self/root", "fds/../root"];
    let mut a = Attack::strict(&c, "magic links phase 1");
    // Through the server's root magic link to OUR outside tree: every
    // operation, since what it would change is ours.
    for root in roots {
        let d = format!("{root}{abs}");
        a.whole_dir(&d, "/inside.txt");
        outside.assert_unchanged(&before, &format!("attacks through {d}"));
        assert_inside_intact(&server, &c);
        a.look_at(&format!("{root}/etc/passwd"), b"root:");
    }
    // The server's own descriptors, cwd and binary: look, never touch.
    for p in
        ["fd0", "fds/0", "fds/1", "fds/2", "fds/3", "exe", "self/environ", "self/maps", "proccwd", "proccwd/Cargo.toml"]
    {
        a.look_at(p, b"");
    }
    // The server's cwd is ours (the package directory cargo runs tests in):
    // a create through it must not appear there.
    let cwd = std::env::current_dir().unwrap();
    let probe = Probe(cwd.join(format!("ferry-escape-probe-{}", std::process::id())));
    let pname = probe.0.file_name().unwrap().to_str().unwrap().to_string();
    a.deny("create via proccwd", c.write(format!("proccwd/{pname}"), b"PWNED"));
    a.deny("mkdir via proccwd", c.create_dir(format!("proccwd/{pname}"), 0o755));
    assert!(fs::symlink_metadata(&probe.0).is_err(), "a file was created in the server's cwd");
    // There is no /proc inside the export: ENOENT. (Were one bind-mounted
    // there, RESOLVE_NO_MAGICLINKS would make it ELOOP.)
    a.assert_errnos(&[libc::ENOENT, libc::ELOOP, libc::EAGAIN]);
    a.summary();
    outside.assert_unchanged(&before, "phase 1");

    // Phase 2: a fake /proc inside the export is just a directory.
    fs::create_dir_all(ex.join("proc/self/fd")).unwrap();
    fs::write(ex.join("proc/self/fd/0"), DECOY).unwrap();
    assert_eq!(c.read("fd0").unwrap(), DECOY);
    assert_eq!(c.read("fds/0").unwrap(), DECOY);
    let mirror = rerooted(&ex.join("proc/self/root"), &abs);
    for d in [format!("procroot{abs}"), format!("/client_procroot{abs}"), format!("self/root{abs}")] {
        confined_pass(&c, &d, &mirror, "magic links");
        outside.assert_unchanged(&before, &format!("phase 2 through {d}"));
    }
    outside.assert_unchanged(&before, "all magic link attacks");
    assert_inside_intact(&server, &c);
}

#[test]
fn symlink_loops_give_eloop() {
    let _g = shared();
    let server = Server::start(&[]);
    let outside = Outside::new();
    let before = outside.snapshot();
    let c = prepare_export(&server);
    let ex = server.export.path();
    symlink("self_loop", ex.join("self_loop")).unwrap();
    symlink("loop_b", ex.join("loop_a")).unwrap();
    symlink("loop_a", ex.join("loop_b")).unwrap();
    symlink("dirloop2/x", ex.join("dirloop")).unwrap();
    symlink("dirloop/x", ex.join("dirloop2")).unwrap();
    symlink("/abs_loop", ex.join("abs_loop")).unwrap();
    c.symlink("client_loop", "/client_loop").unwrap();

    let mut a = Attack::strict(&c, "loops");
    for p in ["self_loop", "loop_a", "loop_b", "dirloop", "loop_a/x", "/client_loop", "dirloop2", "abs_loop"] {
        assert_eq!(a.deny(&format!("stat({p})"), c.metadata(p)), libc::ELOOP, "stat({p})");
        assert_eq!(a.deny(&format!("read({p})"), c.read(p)), libc::ELOOP, "read({p})");
        assert_eq!(
            a.deny(&format!("write({p})"), c.write(p, b"x")),
            libc::ELOOP,
            "write({p}) (O_CREAT through a loop)"
        );
        a.look_at(p, b"");
        a.change(p);
    }
    // Only ELOOP is right for a loop, except O_EXCL on the final link
    // (EEXIST: it does not follow).
    a.assert_errnos(&[libc::ELOOP]);
    a.summary();
    // The loops themselves are inside and can be inspected and removed.
    assert!(c.symlink_metadata("loop_a").unwrap().is_symlink());
    assert_eq!(c.read_link("loop_a").unwrap().to_str().unwrap(), "loop_b");
    c.remove_file("self_loop").expect("unlink does not follow");
    outside.assert_unchanged(&before, "loop attacks");
    assert_inside_intact(&server, &c);
}

#[test]
fn symlinks_inside_the_export_still_work() {
    let _g = shared();
    let server = Server::start(&[]);
    let c = prepare_export(&server);
    let ex = server.export.path();
    fs::write(ex.join("top.txt"), b"top\n").unwrap();
    symlink("sub/f", ex.join("l")).unwrap();
    symlink("../top.txt", ex.join("sub/up")).unwrap();
    symlink("sub", ex.join("dirlink")).unwrap();
    symlink("./sub/../sub/./f", ex.join("winding")).unwrap();
    symlink("/sub/f", ex.join("abs_inside")).unwrap();
    symlink("/sub", ex.join("abs_dirlink")).unwrap();
    c.symlink("sub/f", "/client_l").unwrap();
    c.symlink("/sub/f", "/client_abs").unwrap();

    for p in [
        "l",
        "/l",
        "winding",
        "/client_l",
        "dirlink/f",
        "sub/../sub/f",
        "/./sub/./f",
        "a/../sub/f",
        "dirlink/../dirlink/f",
        // Absolute targets resolve from the export root (documented).
        "abs_inside",
        "/client_abs",
        "abs_dirlink/f",
        "abs_dirlink/../sub/f",
    ] {
        assert_eq!(c.read(p).unwrap_or_else(|e| panic!("read({p}): {e:?}")), b"inside f\n", "{p}");
        let m = c.metadata(p).unwrap_or_else(|e| panic!("stat({p}): {e:?}"));
        assert!(m.is_file() && m.size == 9, "stat({p}) follows to sub/f: {m:?}");
        c.statfs(p).unwrap_or_else(|e| panic!("statfs({p}): {e:?}"));
    }
    assert_eq!(c.read("sub/up").unwrap(), b"top\n");
    assert_eq!(c.read("dirlink/up").unwrap(), b"top\n");
    let names: Vec<String> =
        c.read_dir("dirlink").unwrap().into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect();
    assert!(names.contains(&"f".to_string()), "{names:?}");
    // Writes through an inside link land inside.
    c.write("dirlink/new", b"via link").unwrap();
    assert_eq!(fs::read(ex.join("sub/new")).unwrap(), b"via link");
    c.write("abs_dirlink/new2", b"via abs link").unwrap();
    assert_eq!(fs::read(ex.join("sub/new2")).unwrap(), b"via abs link");
    c.set_permissions(Target::Path(b"l"), 0o640).unwrap();
    assert_eq!(fs::metadata(ex.join("sub/f")).unwrap().mode() & 0o7777, 0o640);
    c.set_permissions(Target::Path(b"abs_inside"), 0o604).unwrap();
    assert_eq!(fs::metadata(ex.join("sub/f")).unwrap().mode() & 0o7777, 0o604);
    assert_eq!(c.read_link("abs_inside").unwrap().to_str().unwrap(), "/sub/f");
}

/// `access` on plain files and through inside links. A positive control for
/// the `access` refusals above, which would mean little if `access` always
/// failed (as it did, with EINVAL, before commit c5ed61b: rustix's `accessat`
/// rejects `AT_EMPTY_PATH`).
#[test]
fn access_works_inside_the_export() {
    let _g = shared();
    let server = Server::start(&[]);
    let c = prepare_export(&server);
    symlink("sub/f", server.export.path().join("l")).unwrap();
    for p in ["/inside.txt", "sub/f", "l", "/", "sub"] {
        for mode in [libc::F_OK, libc::R_OK, libc::R_OK | libc::W_OK] {
            c.access(p, mode as u32).unwrap_or_else(|e| panic!("access({p}, {mode}) on an existing file: {e:?}"));
        }
    }
    assert_eq!(remote_errno(c.access("/missing", libc::F_OK as u32), "access(/missing)"), libc::ENOENT);
}

#[test]
fn readdir_dotdot_of_the_root_reveals_nothing_outside() {
    use ferry_proto::{Reply, Request};
    let _g = shared();
    let server = Server::start(&[]);
    let c = prepare_export(&server);
    let parent = server.export.path().parent().unwrap();
    let parent_ino = fs::metadata(parent).unwrap().ino();
    let root = c.metadata("/").unwrap();
    let dir = c.open("/", OpenOptions::new().read(true).directory(true)).unwrap();
    let f =
        c.engine().call(&Request::ReadDir { handle: dir.handle(), cookie: 0, max_entries: 4096, plus: true }).unwrap();
    let entries = match f.reply().unwrap() {
        Reply::Dir { entries, .. } => entries,
        r => panic!("unexpected {r:?}"),
    };
    let dotdot = entries.iter().find(|e| e.name == b"..").expect("a `..` entry");
    if let Some(a) = &dotdot.attr {
        assert_ne!(a.ino, parent_ino, "readdirplus attributes of `..` are those of the export's parent");
        assert_eq!(a.ino, root.ino, "`..` of the root should describe the root itself");
    }
    // The export is the root of the client's name space, whose `..` is itself.
    assert_ne!(
        dotdot.ino,
        parent_ino,
        "the `..` entry of the export root carries the inode number of the directory ABOVE the export ({})",
        parent.display()
    );
}

/// `openat2` with `RESOLVE_IN_ROOT`/`RESOLVE_BENEATH` fails with `EAGAIN`
/// when a path has `..` and anything on the machine renamed during the walk
/// ("the caller may choose to retry", openat2(2)). Clients must not see
/// that: a legitimate path inside the export must resolve however busy the
/// rest of the machine is.
#[test]
fn dotdot_paths_survive_concurrent_renames() {
    let _g = exclusive();
    let server = Server::start(&[]);
    let c = prepare_export(&server);
    let ex = server.export.path();
    fs::write(ex.join("top.txt"), b"top\n").unwrap();
    symlink("../top.txt", ex.join("sub/up")).unwrap();
    // Renames somewhere unrelated, not even in the export.
    let elsewhere = TempDir::new("renamer");
    fs::write(elsewhere.path().join("a"), b"x").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let renamer = {
        let stop = Arc::clone(&stop);
        let (a, b) = (elsewhere.path().join("a"), elsewhere.path().join("b"));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                fs::rename(&a, &b).unwrap();
                fs::rename(&b, &a).unwrap();
            }
        })
    };
    let mut failures: BTreeMap<String, BTreeMap<i32, u32>> = BTreeMap::new();
    let mut tries = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        tries += 1;
        for (p, want) in
            [("sub/../inside.txt", &b"inside\n"[..]), ("sub/up", &b"top\n"[..]), ("a/../sub/f", &b"inside f\n"[..])]
        {
            match c.read(p) {
                Ok(v) => assert_eq!(v, want, "{p}"),
                Err(e) => *failures.entry(p.to_string()).or_default().entry(e.errno()).or_default() += 1,
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    renamer.join().unwrap();
    assert!(
        failures.is_empty(),
        "legitimate `..` paths failed while another directory was being renamed ({tries} rounds); \
         by path and errno: {failures:?}"
    );
}

/// Stops a helper thread even when the test panics, before the temp dirs go.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// `d` flips between a real directory inside and a symlink to the outside
/// tree (RENAME_EXCHANGE, atomic), and `d/secret` between a file and an
/// absolute symlink to the outside secret, as fast as the server's side can,
/// while two clients hammer `d/secret` with reads, stats, creates and
/// changes. With re-rooting, the escaping states reach decoys inside the
/// export (or nothing); never once may the outside tree be touched.
#[test]
fn rename_race_never_escapes() {
    const INSIDE: &[u8] = b"inside race\n";
    let _g = exclusive();
    let server = Server::start(&[]);
    let outside = Outside::new();
    let before = outside.snapshot();
    let ex = server.export.path().to_path_buf();
    let name = outside.name();
    fs::create_dir(ex.join("d")).unwrap();
    fs::write(ex.join("d/secret"), INSIDE).unwrap();
    symlink(outside.secret(), ex.join("d/secret_alt")).unwrap();
    // Relative: `..` above the root, clamped to EXPORT/NAME.
    symlink(format!("../{name}"), ex.join("d_alt")).unwrap();
    // Decoys where re-rooting sends the two links.
    let decoy_dir = ex.join(&name);
    fs::create_dir(&decoy_dir).unwrap();
    fs::write(decoy_dir.join("secret"), DECOY).unwrap();
    let decoy_abs = rerooted(&ex, &outside.secret());
    fs::create_dir_all(decoy_abs.parent().unwrap()).unwrap();
    fs::write(&decoy_abs, DECOY).unwrap();
    let inside_ino = fs::metadata(ex.join("d/secret")).unwrap().ino();
    let decoy_inos = [fs::metadata(decoy_dir.join("secret")).unwrap().ino(), fs::metadata(&decoy_abs).unwrap().ino()];
    let outside_ino = fs::metadata(outside.path().join("secret")).unwrap().ino();

    let stop = Arc::new(AtomicBool::new(false));
    let _stop_on_panic = StopOnDrop(Arc::clone(&stop));
    let swapper = {
        let stop = Arc::clone(&stop);
        let ex = ex.clone();
        std::thread::spawn(move || {
            use rustix::fs::{renameat_with, RenameFlags, CWD};
            let (d, d_alt) = (ex.join("d"), ex.join("d_alt"));
            let mut swaps = 0u64;
            // Which name the real directory has now.
            let mut real_is_d = true;
            while !stop.load(Ordering::Relaxed) {
                renameat_with(CWD, &d, CWD, &d_alt, RenameFlags::EXCHANGE).expect("exchange d <-> d_alt");
                real_is_d = !real_is_d;
                let real = if real_is_d { &d } else { &d_alt };
                renameat_with(CWD, real.join("secret"), CWD, real.join("secret_alt"), RenameFlags::EXCHANGE)
                    .expect("exchange secret <-> secret_alt");
                swaps += 1;
            }
            swaps
        })
    };

    #[derive(Default, Debug)]
    struct Counts {
        reads_inside: u64,
        reads_decoy: u64,
        stats_inside: u64,
        stats_decoy: u64,
        creates_ok: u64,
        changes_ok: u64,
        errors: BTreeMap<i32, u64>,
    }
    let workers: Vec<_> = (0..2)
        .map(|t| {
            let c = server.client();
            std::thread::spawn(move || {
                let mut n = Counts::default();
                let count_err = |n: &mut Counts, what: &str, e: Error| match e {
                    Error::Remote { errno, .. } => {
                        assert!(
                            [libc::EXDEV, libc::ENOENT, libc::ENOTDIR, libc::ELOOP, libc::EAGAIN].contains(&errno),
                            "{what}: unexpected errno {errno}"
                        );
                        *n.errors.entry(errno).or_default() += 1;
                    }
                    e => panic!("{what}: connection-level failure {e:?}"),
                };
                let check_ino = |what: &str, ino: u64| {
                    assert_ne!(ino, outside_ino, "{what} through the race reached the OUTSIDE secret");
                    assert!(ino == inside_ino || decoy_inos.contains(&ino), "{what} reached an unknown file");
                    ino == inside_ino
                };
                let start = Instant::now();
                let mut i = 0u64;
                while start.elapsed() < Duration::from_secs(2) {
                    i += 1;
                    match c.read("d/secret") {
                        Ok(b) => {
                            assert!(!contains(&b, SECRET), "read through the race returned the OUTSIDE secret");
                            // The other worker rewrites the files, so any
                            // prefix; and a read racing its O_TRUNC may see
                            // zeros where the data was cut (ARCHITECTURE.md,
                            // "the truncate race").
                            let fits = |want: &[u8]| {
                                b.len() <= want.len() && b.iter().zip(want).all(|(x, y)| x == y || *x == 0)
                            };
                            if b.iter().any(|x| *x != 0) && fits(DECOY) && !fits(INSIDE) {
                                n.reads_decoy += 1;
                            } else {
                                assert!(fits(INSIDE) || fits(DECOY), "read returned something else: {b:?}");
                                n.reads_inside += 1;
                            }
                        }
                        Err(e) => count_err(&mut n, "read", e),
                    }
                    match c.metadata("d/secret") {
                        Ok(a) => {
                            if check_ino("stat", a.ino) {
                                n.stats_inside += 1;
                            } else {
                                n.stats_decoy += 1;
                            }
                        }
                        Err(e) => count_err(&mut n, "stat", e),
                    }
                    let name = format!("d/new-{t}-{i}");
                    match c.open(&name, OpenOptions::new().write(true).create_new(true)) {
                        Ok(f) => {
                            f.write_at(b"created", 0).unwrap();
                            f.close().unwrap();
                            n.creates_ok += 1;
                        }
                        Err(e) => count_err(&mut n, "create", e),
                    }
                    match c.write("d/secret", INSIDE) {
                        Ok(()) => n.changes_ok += 1,
                        Err(e) => count_err(&mut n, "write", e),
                    }
                    for r in [
                        c.truncate(Target::Path(b"d/secret"), INSIDE.len() as u64),
                        c.set_permissions(Target::Path(b"d/secret"), 0o644),
                        c.chown(Target::Path(b"d/secret"), 4242, 4242),
                        c.set_times(Target::Path(b"d/secret"), Time::NOW, Time::NOW),
                    ] {
                        match r {
                            Ok(a) => {
                                check_ino("change", a.ino);
                                n.changes_ok += 1;
                            }
                            Err(e) => count_err(&mut n, "change", e),
                        }
                    }
                    match c.set_xattr(Target::Path(b"d/secret"), "user.race", b"1", 0) {
                        Ok(()) => n.changes_ok += 1,
                        Err(e) => count_err(&mut n, "setxattr", e),
                    }
                }
                n
            })
        })
        .collect();
    let counts: Vec<Counts> = workers.into_iter().map(|w| w.join().expect("worker panicked")).collect();
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().expect("swapper");
    eprintln!("rename race: {swaps} swaps, {counts:?}");

    outside.assert_unchanged(&before, "the rename race");
    let sum = |f: fn(&Counts) -> u64| counts.iter().map(f).sum::<u64>();
    assert!(swaps > 100, "the swapper barely ran ({swaps} swaps)");
    assert!(sum(|c| c.stats_inside) > 0, "no stat ever saw the inside state");
    assert!(
        sum(|c| c.stats_decoy) + sum(|c| c.errors.values().sum()) > 0,
        "no attempt ever met an escaping state: the race did not exercise both states"
    );
    // Every successful create is in the real directory (whatever its name
    // now) or in the decoy directory, and nowhere else.
    let real = if fs::symlink_metadata(ex.join("d")).unwrap().is_dir() { ex.join("d") } else { ex.join("d_alt") };
    let count_new = |dir: &Path| {
        fs::read_dir(dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("new-"))
            .count() as u64
    };
    assert_eq!(count_new(&real) + count_new(&decoy_dir), sum(|c| c.creates_ok), "creates vs. files found");
}

// ---------------------------------------------------------------------------
// Memory backend: the same attacks, with links created through the client.

/// The memory backend has no way out (its tree is all it has): `..` at the
/// root is the root, and absolute symlinks start at the tree's root. So
/// escape attempts either fail (the name does not exist in the tree) or
/// reach a node of the tree, never the disk.
#[test]
fn memory_backend_never_leaves_its_tree() {
    let _g = shared();
    let mut server = Server::start(&["--memory"]);
    let outside = Outside::new();
    let before = outside.snapshot();
    let c = server.client();
    let name = outside.name();
    let abs = outside.abs();
    let real_passwd = fs::read("/etc/passwd").unwrap_or_default();

    c.write("/x", b"memory x\n").unwrap();
    c.write("/inside.txt", b"inside\n").unwrap();
    c.create_dir("/a", 0o755).unwrap();
    c.create_dir("/sub", 0o755).unwrap();
    c.write("/sub/f", b"inside f\n").unwrap();

    // `..` at the root stays at the root.
    for p in ["/../x", "../x", "/../../../../x", "a/../../x", "//..//x", "./../x", "sub/../../../x"] {
        assert_eq!(c.read(p).unwrap_or_else(|e| panic!("read({p}): {e:?}")), b"memory x\n", "{p}");
    }
    let root = c.metadata("/").unwrap();
    for p in ["/..", "..", "a/../..", "/../../.."] {
        assert_eq!(c.metadata(p).unwrap().ino, root.ino, "{p} is the root");
    }
    // Absolute symlinks resolve inside the tree.
    c.symlink("/x", "/abs_x").unwrap();
    c.symlink("/sub/f", "/sub/abs_f").unwrap();
    assert_eq!(c.read("/abs_x").unwrap(), b"memory x\n");
    assert_eq!(c.read("/sub/abs_f").unwrap(), b"inside f\n");
    c.symlink("sub/f", "/l").unwrap();
    assert_eq!(c.read("/l").unwrap(), b"inside f\n", "positive control: relative link");

    // Links aimed at the real outside tree, /etc and /proc: none of those
    // names exist in the tree yet, so everything fails with ENOENT.
    c.symlink(outside.secret(), "/abs_secret").unwrap();
    c.symlink(&abs, "/abs_dir").unwrap();
    c.symlink(format!("../{name}/secret"), "/rel_secret").unwrap();
    c.symlink(format!("../../../../../../..{abs}"), "/sub/rel_dir").unwrap();
    c.symlink("/etc/passwd", "/passwd").unwrap();
    c.symlink("/proc/self/root", "/procroot").unwrap();
    c.symlink("/proc/self/fd/0", "/fd0").unwrap();
    c.symlink("/proc/self/cwd", "/proccwd").unwrap();
    c.symlink("loop_b", "/loop_a").unwrap();
    c.symlink("loop_a", "/loop_b").unwrap();
    c.symlink("self_loop", "/self_loop").unwrap();

    let mut a = Attack::strict(&c, "memory phase 1");
    for p in ["/abs_secret", "/rel_secret"] {
        a.look_at(p, SECRET);
        a.change(p);
    }
    for d in ["/abs_dir".to_string(), "/sub/rel_dir".into(), format!("/../{name}"), format!("procroot{abs}")] {
        a.whole_dir(&d, "/inside.txt");
        outside.assert_unchanged(&before, &format!("attacks through {d}"));
    }
    for p in ["/passwd", "procroot/etc/passwd", "/fd0", "proccwd/Cargo.toml", "../../../../etc/passwd"] {
        a.look_at(p, b"root:");
    }
    a.assert_errnos(&[libc::ENOENT]);
    for p in ["/loop_a", "/self_loop", "/loop_b/x"] {
        assert_eq!(a.deny(&format!("stat({p})"), c.metadata(p)), libc::ELOOP, "stat({p})");
        assert_eq!(a.deny(&format!("read({p})"), c.read(p)), libc::ELOOP);
        assert_eq!(a.deny(&format!("write({p})"), c.write(p, b"x")), libc::ELOOP);
    }
    a.summary();
    outside.assert_unchanged(&before, "memory backend attacks");
    assert_eq!(c.read("/inside.txt").unwrap(), b"inside\n");

    // Phase 2: once the tree has those paths, the links resolve INSIDE the
    // tree and the real files are untouched.
    c.create_dir_all(&abs, 0o755).expect("mirror the outside path inside the tree");
    c.write("/abs_secret", b"memory secret\n").expect("create through the re-rooted link");
    assert_eq!(c.read(format!("{abs}/secret")).unwrap(), b"memory secret\n");
    assert_eq!(c.read(format!("/../../{abs}/secret")).unwrap(), b"memory secret\n");
    assert_eq!(c.read("/sub/rel_dir/secret").unwrap(), b"memory secret\n");
    let mut a = Attack::lenient(&c, "memory phase 2");
    for p in ["/abs_secret", "/abs_dir/secret", "/sub/rel_dir/secret"] {
        a.look_at(p, SECRET);
        a.change(p);
        a.change_nofollow(p);
    }
    c.create_dir(format!("/{name}"), 0o755).unwrap();
    c.write(format!("/{name}/secret"), b"memory rel\n").unwrap();
    assert_eq!(c.read("/rel_secret").unwrap(), b"memory rel\n");
    outside.assert_unchanged(&before, "writes through re-rooted links in the memory tree");

    c.create_dir_all("/etc", 0o755).unwrap();
    c.write("/etc/passwd", b"memory passwd\n").unwrap();
    for p in ["/passwd", "../../../../etc/passwd", "/../etc/passwd"] {
        let got = c.read(p).unwrap();
        assert_eq!(got, b"memory passwd\n", "{p} resolves in the tree");
        assert_ne!(got, real_passwd);
    }
    // Nothing in the tree is /proc: magic links stay dangling.
    for p in ["procroot/etc/passwd", "/fd0", "proccwd/Cargo.toml"] {
        assert_eq!(remote_errno(c.read(p), p), libc::ENOENT, "{p}");
    }
    assert!(server.alive());
    outside.assert_unchanged(&before, "the memory backend test");
}

/// File ids come back from clients: one naming a file outside the export
/// (here: in another server's export on the same file system, so the
/// kernel can open it by handle) must open nothing.
#[test]
fn a_file_id_from_outside_the_export_opens_nothing() {
    use ferry_proto::{caps, Reply, Request};
    let a = Server::start(&[]);
    let b = Server::start(&[]);
    std::fs::write(a.export.path().join("secret"), b"not for b's clients").unwrap();
    let ca = a.client();
    assert!(ca.engine().has_cap(caps::FILE_IDS));
    let f = ca.engine().call(&Request::OpenId { path: b"/secret", flags: libc::O_RDONLY as u32, mode: 0 }).unwrap();
    let Reply::OpenedId { attr, id, .. } = f.reply().unwrap() else { panic!("not an OpenedId reply") };
    assert!(!id.is_empty(), "a root server on ext4 gives file ids");
    let (id, dev, ino) = (id.to_vec(), attr.dev, attr.ino);
    let cb = b.client();
    for path in [&b"/secret"[..], b"/../secret", b"/"] {
        let req = Request::Reopen { flags: libc::O_RDONLY as u32, dev, ino, id: &id, path };
        let Err(e) = cb.engine().call(&req) else { panic!("{path:?}: opened a file outside the export") };
        assert_eq!(e.errno(), libc::ESTALE, "{path:?}: {e}");
    }
    // The same id works on the server it came from.
    let req = Request::Reopen { flags: libc::O_RDONLY as u32, dev, ino, id: &id, path: b"/elsewhere" };
    assert!(matches!(ca.engine().call(&req).unwrap().reply().unwrap(), Reply::OpenedId { .. }));
}
