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
//! Unlike a client's change, an outside one cannot wait for the holders:
//! the kernel reports it after it happened. The break goes out as soon as
//! the notice is read (tens of microseconds), so a client may answer from
//! its lease for that long after the change; `ferry compare` measures it.
//! A notice queue that overflowed breaks everything.

use std::collections::HashMap;
use std::ffi::c_int;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
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
            watched.push(Fs { fsid, root });
        }
    }
    let mut w = Watcher { fd, watched, leases, known: HashMap::new(), me: std::process::id() as i32, export };
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
    me: i32,
    export: PathBuf,
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
        let object = n.object.and_then(|h| self.resolve(h));
        if let Some(o) = &object {
            out.push(Touched::Object(o.key));
        }
        let Some((dir, name)) = n.entry else { return };
        // A write or an attribute change names its directory and name
        // too, but changes no entry: the object's own break is the one
        // (the directory's holders would drop their listing for nothing).
        let entries = libc::FAN_CREATE | libc::FAN_DELETE | libc::FAN_MOVED_FROM | libc::FAN_MOVED_TO;
        if n.mask & entries == 0 && object.is_some() {
            return;
        }
        let Some(d) = self.resolve(dir) else { return };
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

    /// The object a `(fsid, handle)` names, opened or remembered.
    fn resolve(&mut self, fid: &[u8]) -> Option<Known> {
        if let Some(k) = self.known.get(fid) {
            return Some(*k);
        }
        let (fsid, id) = split_key(fid)?;
        let fs = self.watched.iter().find(|f| f.fsid == fsid)?;
        // Removed since (`ESTALE`): nothing to break by it.
        let fd = crate::fileid::open(fs.root.as_fd(), &id, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC).ok()?;
        let st = rustix::fs::fstat(&fd).ok()?;
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

/// `fsid ++ handle_bytes ++ type ++ bytes` → the id `fileid::open` takes
/// (`type ++ bytes`), with the fsid apart.
fn split_key(key: &[u8]) -> Option<([u8; 8], Vec<u8>)> {
    let fsid: [u8; 8] = key.get(..8)?.try_into().ok()?;
    let typ: [u8; 4] = key.get(12..16)?.try_into().ok()?;
    let typ = c_int::from_ne_bytes(typ);
    Some((fsid, [&typ.to_le_bytes()[..], &key[16..]].concat()))
}
