//! Changes made on the server's host outside ferry, seen through the
//! kernel's `fanotify` notices and turned into lease breaks (capability
//! `WATCHED`, PROTOCOL.md 8.10): without them a client holding a lease
//! would keep a file's old attributes for as long as the lease stands.
//!
//! The export's file systems are marked whole (`FAN_MARK_FILESYSTEM`,
//! which needs `CAP_SYS_ADMIN`): every change on them is reported by
//! `(fsid, file handle)` of the object and, for a name, of its directory.
//! A handle is turned into the `(dev, ino)` leases are keyed by with
//! `open_by_handle_at` + `fstat`, remembered for the objects seen (a
//! removed file can no longer be opened). Changes the server made itself
//! are skipped: it broke those leases before it answered.
//!
//! The whole file system is more than the export: a server exporting
//! `/srv/x` on `/` sees every file any program writes anywhere on `/`
//! (206,758 notices for a `tar x` of 54,000 entries), and opened each
//! one's handle. So in a directory known
//! to lie outside the export, where only the object's key can matter (a
//! hard link into the export, a read of it in flight), the key is read
//! from the handle itself: `FILEID_INO32_GEN` handles carry the inode
//! number, at a place each file system chooses, learnt per file system
//! from the handles this watcher opened ([`Layout`]) and checked again at
//! each one it opens after.
//!
//! Unlike a client's change, an outside one cannot wait for the holders:
//! the kernel reports it after it happened. The break goes out as soon as
//! the notice is read (tens of microseconds), so a client may answer from
//! its lease for that long after the change; `ferry compare` measures it.
//! A notice queue that overflowed breaks everything.

use std::collections::{HashMap, HashSet};
use std::ffi::c_int;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use rustix::fs::OFlags;

use crate::leases::{Leases, Touched};
use crate::locks::FileKey;

/// What a change on the export's file systems is reported for.
const MASK: u64 = libc::FAN_MODIFY
    | libc::FAN_ATTRIB
    | libc::FAN_CREATE
    | libc::FAN_DELETE
    | libc::FAN_MOVED_FROM
    | libc::FAN_MOVED_TO
    | libc::FAN_DELETE_SELF
    | libc::FAN_MOVE_SELF
    | libc::FAN_ONDIR;

/// Handles resolved, kept for the objects removed later; emptied past this.
const MAX_KNOWN: usize = 1 << 16;

/// One file system watched: its id in the notices, and a descriptor on it
/// to open handles with.
struct Fs {
    fsid: [u8; 8],
    root: OwnedFd,
    /// Its device, as `fstat` gives it for every object on it.
    dev: u64,
    layout: Layout,
}

/// Where a handle of kind `FILEID_INO32_GEN` (1) or
/// `FILEID_INO32_GEN_PARENT` (2) keeps the inode number: most file systems
/// put a 32-bit one first (ext4, XFS's small ones); tmpfs puts its
/// generation first and a 64-bit number after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InoAt {
    U32(usize),
    U64(usize),
}

const CANDIDATES: [InoAt; 2] = [InoAt::U32(0), InoAt::U64(4)];

/// Handles opened that a candidate read right before it is trusted.
const LEARN: u32 = 32;

/// What the handles this watcher opened on one file system showed of
/// where they keep the inode number.
struct Layout {
    /// The kind and length of the handles learnt from; others are opened.
    shape: Option<(c_int, usize)>,
    /// Per candidate: how many handles it read right; `None` once one it
    /// read wrong.
    right: [Option<u32>; CANDIDATES.len()],
    /// Set aside for good: a trusted candidate read one wrong.
    failed: bool,
}

/// What a handle opened said of the layout trusted until then.
#[derive(Debug, PartialEq, Eq)]
enum Learnt {
    Agreed,
    /// A trusted candidate had read it wrong: keys read by it before may
    /// have been wrong too.
    Misled,
}

impl Layout {
    fn new() -> Layout {
        Layout { shape: None, right: [Some(0); CANDIDATES.len()], failed: false }
    }

    /// The candidate trusted now.
    fn trusted(&self) -> Option<InoAt> {
        if self.failed || self.shape.is_none() {
            return None;
        }
        let i = self.right.iter().position(|r| r.is_some_and(|n| n >= LEARN))?;
        Some(CANDIDATES[i])
    }

    /// The inode number in `bytes`, a handle of kind `typ`, if a layout is
    /// trusted for its shape.
    fn ino(&self, typ: c_int, bytes: &[u8]) -> Option<u64> {
        let at = self.trusted()?;
        (self.shape == Some((typ, bytes.len()))).then(|| read(at, bytes))?
    }

    /// An opened handle's `(typ, bytes)` turned out to be inode `ino` on
    /// this file system's own device (`same_dev`).
    fn learn(&mut self, typ: c_int, bytes: &[u8], ino: u64, same_dev: bool) -> Learnt {
        if self.failed || !matches!(typ, 1 | 2) {
            return Learnt::Agreed;
        }
        match self.shape {
            None => self.shape = Some((typ, bytes.len())),
            Some(s) if s != (typ, bytes.len()) => return Learnt::Agreed,
            Some(_) => {}
        }
        let trusted = self.trusted();
        for (i, at) in CANDIDATES.iter().enumerate() {
            let right = same_dev && read(*at, bytes) == Some(ino);
            self.right[i] = match (self.right[i], right) {
                (Some(n), true) => Some(n.saturating_add(1)),
                _ => None,
            };
        }
        match trusted {
            Some(at) if self.trusted() != Some(at) => {
                self.failed = true;
                Learnt::Misled
            }
            _ => Learnt::Agreed,
        }
    }
}

fn read(at: InoAt, bytes: &[u8]) -> Option<u64> {
    match at {
        InoAt::U32(o) => Some(u32::from_ne_bytes(bytes.get(o..o + 4)?.try_into().ok()?).into()),
        InoAt::U64(o) => {
            let lo = u32::from_ne_bytes(bytes.get(o..o + 4)?.try_into().ok()?);
            let hi = u32::from_ne_bytes(bytes.get(o + 4..o + 8)?.try_into().ok()?);
            Some(u64::from(lo) | u64::from(hi) << 32)
        }
    }
}

/// Starts watching the file systems under `export` (the export's own and
/// every one mounted inside it), breaking `leases` for what changes there.
/// Fails where the kernel will not report them all (not root, no
/// `fanotify`, a file system without handles): the caller then does not
/// offer `WATCHED`.
pub fn start(export: &Path, leases: Arc<Leases>) -> io::Result<()> {
    // SAFETY: plain flags; the result is a new descriptor or -1.
    let fd = unsafe {
        libc::fanotify_init(
            libc::FAN_CLASS_NOTIF | libc::FAN_CLOEXEC | libc::FAN_REPORT_DFID_NAME_TARGET,
            (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_LARGEFILE) as u32,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let export = std::fs::canonicalize(export)?;
    let mut watched = Vec::new();
    for dir in std::iter::once(export.clone()).chain(mounts_inside(&export)) {
        mark(fd.as_fd(), &dir).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
        let root =
            rustix::fs::open(&dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, rustix::fs::Mode::empty())?;
        let fsid = fsid_of(root.as_fd())?;
        if !watched.iter().any(|f: &Fs| f.fsid == fsid) {
            let dev = rustix::fs::fstat(&root)?.st_dev;
            watched.push(Fs { fsid, root, dev, layout: Layout::new() });
        }
    }
    let mut w = Watcher {
        fd,
        watched,
        leases,
        known: HashMap::new(),
        gone: HashSet::new(),
        me: std::process::id() as i32,
        export,
        misled: false,
    };
    std::thread::Builder::new().name("ferry-watch".into()).spawn(move || w.run())?;
    Ok(())
}

fn mark(fd: BorrowedFd<'_>, dir: &Path) -> io::Result<()> {
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    let r = unsafe {
        libc::fanotify_mark(
            fd.as_raw_fd(),
            libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM,
            MASK,
            libc::AT_FDCWD,
            c.as_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The file system id notices name `fd`'s file system by.
fn fsid_of(fd: BorrowedFd<'_>) -> io::Result<[u8; 8]> {
    // `f_fsid` is the kernel's two 32-bit halves, the first low: in memory
    // order, what the notices carry.
    let id = rustix::fs::fstatvfs(fd)?.f_fsid;
    let (lo, hi) = (id as u32, (id >> 32) as u32);
    Ok([lo.to_ne_bytes(), hi.to_ne_bytes()].concat().try_into().expect("8 bytes"))
}

/// Mount points strictly inside `export` (`/proc/self/mountinfo`'s fifth
/// field, with its octal escapes undone).
fn mounts_inside(export: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read("/proc/self/mountinfo") else { return Vec::new() };
    let top = export.as_os_str().as_bytes();
    info.split(|&b| b == b'\n')
        .filter_map(|line| line.split(|&b| b == b' ').nth(4))
        .map(unescape)
        .filter(|p| p.len() > top.len() && p.starts_with(top) && (top == b"/" || p[top.len()] == b'/'))
        .map(|p| PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(p)))
        .collect()
}

fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let oct = field.get(i + 1..i + 4).filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match oct {
            Some(d) => {
                out.push(d.iter().fold(0u8, |v, c| v.wrapping_mul(8).wrapping_add(c - b'0')));
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

struct Watcher {
    fd: OwnedFd,
    watched: Vec<Fs>,
    leases: Arc<Leases>,
    /// `(fsid, handle)` → the object, as first resolved.
    known: HashMap<Vec<u8>, Known>,
    /// Handles of objects removed before they were looked at.
    gone: HashSet<Vec<u8>>,
    me: i32,
    export: PathBuf,
    /// A key read from a handle may have been wrong (`Learnt::Misled`).
    misled: bool,
}

/// What a handle resolved to.
#[derive(Clone, Copy)]
struct Known {
    key: FileKey,
    /// A directory or symlink: a name of it going away breaks everything.
    by_path: bool,
    /// A directory or symlink inside the export (others are not looked at).
    in_export: bool,
}

/// One notice's parts: its mask, the object's handle, and for a name its
/// directory's handle and the name.
struct Notice<'a> {
    mask: u64,
    object: Option<&'a [u8]>,
    entry: Option<(&'a [u8], &'a [u8])>,
}

impl Watcher {
    fn run(&mut self) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match rustix::io::read(&self.fd, &mut buf) {
                Ok(n) => n,
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => continue,
                Err(e) => {
                    tracing::error!("file system notices stopped ({e}): leases break everything");
                    self.leases.changed_outside(&[Touched::All]);
                    return;
                }
            };
            // Read even while nobody holds a lease, so the queue never
            // overflows; looked at only when someone does.
            if !self.leases.active() {
                continue;
            }
            let mut touched = Vec::new();
            for notice in parse(&buf[..n], self.me) {
                self.touched(&notice, &mut touched);
            }
            if std::mem::take(&mut self.misled) {
                tracing::warn!(
                    "a file handle's inode number was misread: every lease breaks, handles are opened from now"
                );
                touched.push(Touched::All);
            }
            if !touched.is_empty() {
                tracing::debug!("changed outside ferry: {touched:?}");
                self.leases.changed_outside(&touched);
            }
        }
    }

    fn touched(&mut self, n: &Notice<'_>, out: &mut Vec<Touched>) {
        if n.mask & libc::FAN_Q_OVERFLOW != 0 {
            out.push(Touched::All);
            return;
        }
        self.leases.counts.outside_notices.fetch_add(1, Relaxed);
        if n.mask & libc::FAN_ONDIR != 0 && n.mask & (libc::FAN_MOVED_FROM | libc::FAN_MOVED_TO) != 0 {
            // Directories moved: whether each lies in the export is to be
            // looked at again.
            self.known.retain(|_, k| !k.by_path);
        }
        let dir = n.entry.map(|(dir, _)| self.resolve(dir));
        // Only the object's key counts for a notice in a directory outside
        // the export, in one gone since (its own removal broke what it had
        // to), or of the object alone (its removal or move: it is gone).
        let by_key = match dir {
            Some(Some(d)) => d.by_path && !d.in_export,
            Some(None) | None => true,
        };
        let dir = dir.flatten();
        let object = match n.object {
            Some(h) if by_key => self.known.get(h).copied().or_else(|| self.key_of(h)).or_else(|| self.resolve(h)),
            Some(h) => self.resolve(h),
            None => None,
        };
        if let Some(o) = &object {
            out.push(Touched::Object(o.key));
        }
        let Some((_, name)) = n.entry else { return };
        // A write or an attribute change names its directory and name
        // too, but changes no entry: the object's own break is the one
        // (the directory's holders would drop their listing for nothing).
        let entries = libc::FAN_CREATE | libc::FAN_DELETE | libc::FAN_MOVED_FROM | libc::FAN_MOVED_TO;
        if n.mask & entries == 0 && object.is_some() {
            return;
        }
        let Some(d) = dir else { return };
        if name != b"." {
            out.push(Touched::Entry(d.key, name.to_vec()));
        }
        // A directory or symlink of the export renamed or removed: paths
        // through it lead elsewhere now. (The whole file system is
        // watched: one elsewhere on it changes nothing of ours.)
        let leaving = n.mask & (libc::FAN_MOVED_FROM | libc::FAN_DELETE) != 0;
        if leaving && (n.mask & libc::FAN_ONDIR != 0 || object.is_some_and(|o| o.by_path)) && d.in_export {
            out.push(Touched::All);
        }
    }

    /// The key of the object a `(fsid, handle)` names, read from the
    /// handle where its file system's layout is known (not a directory or
    /// symlink: it is not opened to tell).
    fn key_of(&self, fid: &[u8]) -> Option<Known> {
        let (fsid, typ, bytes) = parts(fid)?;
        let fs = self.watched.iter().find(|f| f.fsid == fsid)?;
        let ino = fs.layout.ino(typ, bytes)?;
        Some(Known { key: (fs.dev, ino), by_path: false, in_export: false })
    }

    /// The object a `(fsid, handle)` names, opened or remembered.
    fn resolve(&mut self, fid: &[u8]) -> Option<Known> {
        if let Some(k) = self.known.get(fid) {
            return Some(*k);
        }
        let (fsid, id) = split_key(fid)?;
        let fs = self.watched.iter_mut().find(|f| f.fsid == fsid)?;
        if self.gone.contains(fid) {
            return None;
        }
        self.leases.counts.outside_opened.fetch_add(1, Relaxed);
        // Removed since (`ESTALE`): nothing to break by it, ever (a handle
        // names one life of an inode).
        let fd = match crate::fileid::open(fs.root.as_fd(), &id, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC) {
            Ok(fd) => fd,
            Err(e) => {
                if e == crate::backend::Errno::STALE {
                    if self.gone.len() >= MAX_KNOWN {
                        self.gone.clear();
                    }
                    self.gone.insert(fid.to_vec());
                }
                return None;
            }
        };
        let st = rustix::fs::fstat(&fd).ok()?;
        if let Some((_, typ, bytes)) = parts(fid) {
            if fs.layout.learn(typ, bytes, st.st_ino, st.st_dev == fs.dev) == Learnt::Misled {
                self.misled = true;
            }
        }
        let fmt = st.st_mode & libc::S_IFMT;
        let by_path = fmt == libc::S_IFDIR || fmt == libc::S_IFLNK;
        let k = Known { key: (st.st_dev, st.st_ino), by_path, in_export: by_path && self.inside(&fd) };
        if self.known.len() >= MAX_KNOWN {
            self.known.clear();
        }
        self.known.insert(fid.to_vec(), k);
        Some(k)
    }

    /// Whether the open `fd` lies in the export (by the path the kernel
    /// gives it now).
    fn inside(&self, fd: &OwnedFd) -> bool {
        let Ok(p) = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())) else { return true };
        let (p, top) = (p.as_os_str().as_bytes(), self.export.as_os_str().as_bytes());
        top == b"/" || p == top || (p.starts_with(top) && p.get(top.len()) == Some(&b'/'))
    }
}

/// The notices in `buf`, except those of process `me` (the server's own
/// changes). A handle comes out as the record's bytes up to its end
/// (`split_key` takes it apart).
fn parse(buf: &[u8], me: i32) -> Vec<Notice<'_>> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(meta) = buf.get(at..at + 24) {
        let len = u32::from_ne_bytes(meta[0..4].try_into().unwrap()) as usize;
        let meta_len = u16::from_ne_bytes(meta[6..8].try_into().unwrap()) as usize;
        let mask = u64::from_ne_bytes(meta[8..16].try_into().unwrap());
        let fd = i32::from_ne_bytes(meta[16..20].try_into().unwrap());
        let pid = i32::from_ne_bytes(meta[20..24].try_into().unwrap());
        if len < 24 || at + len > buf.len() || meta[4] != libc::FANOTIFY_METADATA_VERSION {
            break;
        }
        if fd >= 0 {
            // Not asked for with FID reports; closed if ever given.
            // SAFETY: the kernel gave this descriptor to us alone.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let mut n = Notice { mask, object: None, entry: None };
        let mut i = at + meta_len.max(24);
        while let Some(h) = buf.get(i..i + 4) {
            let (kind, rlen) = (h[0], u16::from_ne_bytes([h[2], h[3]]) as usize);
            if rlen < 4 || i + rlen > at + len {
                break;
            }
            let rec = &buf[i + 4..i + rlen];
            if let Some((fid, rest)) = handle(rec) {
                match kind {
                    libc::FAN_EVENT_INFO_TYPE_FID => n.object = Some(fid),
                    libc::FAN_EVENT_INFO_TYPE_DFID_NAME
                    | libc::FAN_EVENT_INFO_TYPE_OLD_DFID_NAME
                    | libc::FAN_EVENT_INFO_TYPE_NEW_DFID_NAME => {
                        let name = &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())];
                        n.entry = Some((fid, name));
                    }
                    _ => {}
                }
            }
            i += rlen;
        }
        if pid != me || mask & libc::FAN_Q_OVERFLOW != 0 {
            out.push(n);
        }
        at += len;
    }
    out
}

/// A record's `fsid` and `struct file_handle` (`handle_bytes`, type, the
/// bytes), as one key, and what follows it (a name, for some).
fn handle(rec: &[u8]) -> Option<(&[u8], &[u8])> {
    let bytes = u32::from_ne_bytes(rec.get(8..12)?.try_into().ok()?) as usize;
    let end = 16usize.checked_add(bytes)?;
    rec.get(..end)?;
    Some((&rec[..end], &rec[end..]))
}

/// `fsid ++ handle_bytes ++ type ++ bytes` → its fsid, type and bytes.
fn parts(key: &[u8]) -> Option<([u8; 8], c_int, &[u8])> {
    let fsid: [u8; 8] = key.get(..8)?.try_into().ok()?;
    let typ = c_int::from_ne_bytes(key.get(12..16)?.try_into().ok()?);
    Some((fsid, typ, &key[16..]))
}

/// `fsid ++ handle_bytes ++ type ++ bytes` → the id `fileid::open` takes
/// (`type ++ bytes`), with the fsid apart.
fn split_key(key: &[u8]) -> Option<([u8; 8], Vec<u8>)> {
    let (fsid, typ, bytes) = parts(key)?;
    Some((fsid, [&typ.to_le_bytes()[..], bytes].concat()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext4(ino: u64, gen: u32) -> Vec<u8> {
        [(ino as u32).to_ne_bytes(), gen.to_ne_bytes()].concat()
    }

    fn tmpfs(ino: u64, gen: u32) -> Vec<u8> {
        [gen.to_ne_bytes(), (ino as u32).to_ne_bytes(), ((ino >> 32) as u32).to_ne_bytes()].concat()
    }

    /// Trusted only after `LEARN` handles, each read right.
    #[test]
    fn a_layout_is_trusted_once_learnt_and_set_aside_once_wrong() {
        for (handle, at) in [(ext4 as fn(u64, u32) -> Vec<u8>, InoAt::U32(0)), (tmpfs, InoAt::U64(4))] {
            let mut l = Layout::new();
            for i in 0..LEARN {
                assert_eq!(l.ino(1, &handle(1000, 7)), None, "trusted after {i}");
                let ino = 12 + u64::from(i) * 977;
                assert_eq!(l.learn(1, &handle(ino, 0x9e37_79b9 ^ i), ino, true), Learnt::Agreed);
            }
            assert_eq!(l.trusted(), Some(at));
            assert_eq!(l.ino(1, &handle(1000, 7)), Some(1000));
            assert_eq!(l.ino(2, &handle(1000, 7)), None, "another kind of handle");
            assert_eq!(l.ino(1, &handle(1000, 7)[..4]), None, "another length");
            // One read wrong: it is never used again.
            assert_eq!(l.learn(1, &handle(5, 1), 6, true), Learnt::Misled);
            assert_eq!(l.ino(1, &handle(1000, 7)), None);
            assert_eq!(l.learn(1, &handle(6, 1), 6, true), Learnt::Agreed);
            assert_eq!(l.trusted(), None);
        }
    }

    /// Handles whose numbers no candidate reads (another kind, another
    /// device, generation 0 with a wide number) never make one trusted.
    #[test]
    fn no_layout_is_trusted_from_handles_it_cannot_read() {
        let mut l = Layout::new();
        for i in 0..2 * LEARN {
            l.learn(0x4d, &[0; 16], u64::from(i), true);
        }
        assert_eq!(l.trusted(), None, "btrfs's kind");
        let mut l = Layout::new();
        for i in 0..2 * LEARN {
            l.learn(1, &ext4(u64::from(i + 10), 3), u64::from(i + 10), false);
        }
        assert_eq!(l.trusted(), None, "objects on another device");
        let mut l = Layout::new();
        for i in 0..2 * LEARN {
            let ino = u64::from(i + 10) << 32 | 5;
            l.learn(1, &ext4(5, i + 10), ino, true);
        }
        assert_eq!(l.trusted(), None, "a 64-bit number");
    }
}
