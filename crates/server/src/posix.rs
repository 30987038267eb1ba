//! A directory on the server's disk, with every path confined beneath it.
//!
//! Confinement rests on one rule: nothing ever resolves a client path except
//! `openat2(root, path, .., RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`. Calls
//! that act on a final name (`mkdirat`, `unlinkat`, `renameat2`, ...) get a
//! parent directory opened that way plus a single component that cannot
//! contain `/`, and never follow a final symlink. Calls that must follow one
//! act on the `O_PATH` descriptor `openat2` returned, through
//! `/proc/self/fd/N` (our own descriptor, so the magic link is safe). A
//! concurrent rename cannot redirect a resolution outside: the kernel checks
//! `RESOLVE_IN_ROOT` during the walk itself. `RESOLVE_IN_ROOT` treats the
//! export as the root of the name space, exactly as the memory backend does:
//! `..` at the top stays at the top and an absolute symlink resolves from the
//! export root, so both backends give the same answers.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Mutex;

use ferry_proto::{Attr, DirEntry, StatFs, Time};
use rustix::fs::{self as rfs, AtFlags, Dir, Mode, OFlags, ResolveFlags, CWD};

use crate::backend::{Backend, Errno, Node, ReadData, Result};

const RESOLVE: ResolveFlags = ResolveFlags::IN_ROOT.union(ResolveFlags::NO_MAGICLINKS);

/// Open flags a client may ask for; anything else is dropped so `openat2`
/// (which rejects unknown bits) sees only what we understand.
const CLIENT_FLAGS: u32 = (libc::O_ACCMODE
    | libc::O_CREAT
    | libc::O_EXCL
    | libc::O_TRUNC
    | libc::O_APPEND
    | libc::O_DIRECTORY
    | libc::O_NOFOLLOW
    | libc::O_DSYNC
    | libc::O_SYNC
    | libc::O_NOATIME) as u32;

pub struct PosixBackend {
    root: OwnedFd,
    /// The export is one gateway's view of a file system other gateways
    /// export too (`shared_volume`).
    shared: bool,
    /// The export is a whole file system (`volume::is_fs_root`): every file
    /// of its device is inside it.
    whole_fs: bool,
    /// The export is on GlusterFS: file ids carry the file's gfid, which
    /// every gateway of the volume can resolve.
    gfids: bool,
    /// The export is the root of a GlusterFS mount that opens files by
    /// gfid (`-o aux-gfid-mount`): ids are found by their gfid.
    by_gfid: bool,
}

/// Says at start how a client moving here from another gateway of a
/// GlusterFS volume finds its open files again, and what is missing for
/// the best way (by gfid).
fn say_how_files_are_found(root: &Path, whole_fs: bool, by_gfid: bool) {
    let at = root.display();
    if by_gfid {
        tracing::info!(
            "{at} is a GlusterFS mount with aux-gfid-mount: a client moving here from another gateway finds \
             its open files by gfid, also when renamed meanwhile"
        );
    } else if whole_fs {
        tracing::warn!(
            "{at} is a GlusterFS mount without -o aux-gfid-mount: a client moving here from another gateway \
             finds its open files by name and inode number, and a file renamed meanwhile is ESTALE \
             (mount it with -o aux-gfid-mount to find files by gfid)"
        );
    } else {
        tracing::warn!(
            "{at} is a directory inside a GlusterFS mount: a client moving here from another gateway finds \
             its open files by name and inode number, and a file renamed meanwhile is ESTALE (export the \
             mount point itself, mounted with -o aux-gfid-mount, to find files by gfid)"
        );
    }
}

/// An open file; directories carry a lazily created stream for `readdir`.
pub struct PosixFile {
    fd: OwnedFd,
    readable: bool,
    append: bool,
    dir: Mutex<Option<DirStream>>,
}

struct DirStream {
    dir: Dir,
    /// Cookie of the position the stream is at, so sequential batches need no seek.
    at: u64,
}

impl PosixBackend {
    /// Exports `root`, which must be a directory.
    pub fn new(root: &Path) -> std::io::Result<PosixBackend> {
        let fd = rfs::open(root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        let whole_fs = crate::volume::is_fs_root(root);
        let gfids = crate::volume::fs_type(root).as_deref() == Some(crate::volume::GLUSTERFS);
        let by_gfid = gfids && whole_fs && crate::gfid::opens_by_gfid(fd.as_fd());
        if gfids {
            say_how_files_are_found(root, whole_fs, by_gfid);
        }
        Ok(PosixBackend { root: fd, shared: false, whole_fs, gfids, by_gfid })
    }

    /// Declares the export one of several gateways' views of one shared
    /// file system (see `shared_volume`): a client moving from another
    /// gateway finds its open files again by inode number alone, as the
    /// device number differs between machines (and between two mounts of
    /// one volume on one machine).
    pub fn set_shared(&mut self, shared: bool) {
        self.shared = shared;
    }

    /// Whether `fd` (opened by a file id, which a client could forge) is a
    /// file of the export: the export is its whole file system, or the path
    /// the kernel knows for it, walked again from the export root with the
    /// usual confinement, gives this file.
    fn inside(&self, fd: &OwnedFd) -> Result<bool> {
        // A file of the exported file system, when all of it is exported:
        // the path is not needed (and a FUSE file system gives a file
        // opened by a handle of another mount of it no path: "/").
        if self.whole_fs && rfs::fstat(fd)?.st_dev == rfs::fstat(&self.root)?.st_dev {
            return Ok(true);
        }
        let link = |fd: &OwnedFd| rfs::readlinkat(CWD, format!("/proc/self/fd/{}", fd.as_raw_fd()), Vec::new());
        let (root, p) = (link(&self.root)?, link(fd)?);
        let (root, p) = (root.as_bytes(), p.as_bytes());
        let rest = if root == b"/" {
            p
        } else {
            match p.strip_prefix(root) {
                Some(r) if r.is_empty() || r[0] == b'/' => r,
                _ => return Ok(false),
            }
        };
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let Ok(again) = resolve(&self.root, rel(rest)?, flags, Mode::empty()) else { return Ok(false) };
        let (a, b) = (rfs::fstat(fd)?, rfs::fstat(&again)?);
        Ok((a.st_dev, a.st_ino) == (b.st_dev, b.st_ino))
    }

    /// Whether a file at `(dev, ino)` is the one a client knows as `key`.
    /// On a shared volume the client may come from another gateway, whose
    /// device number for the volume is its own: inode numbers are the
    /// volume's, and name the file on every gateway.
    fn same_inode(&self, dev: u64, ino: u64, key: (u64, u64)) -> bool {
        ino == key.1 && (self.shared || dev == key.0)
    }

    fn same_file(&self, st: &rfs::Stat, key: (u64, u64)) -> bool {
        self.same_inode(st.st_dev, st.st_ino, key)
    }

    fn open_path(&self, path: &[u8], follow: bool) -> Result<OwnedFd> {
        let mut flags = OFlags::PATH | OFlags::CLOEXEC;
        if !follow {
            flags |= OFlags::NOFOLLOW;
        }
        resolve(&self.root, self.rel(path)?, flags, Mode::empty())
    }

    /// `rel`, and on a mount that opens files by gfid, no way through its
    /// `.gfid` directory: a gfid reaches a file past the directories above
    /// it, which the server allows only for an id it sealed (`locate`).
    /// Lexical: a symlink on the volume to `/.gfid/…` is followed as the
    /// mount follows it for anyone.
    fn rel<'p>(&self, path: &'p [u8]) -> Result<&'p [u8]> {
        let p = rel(path)?;
        if self.by_gfid && p.split(|&b| b == b'/').any(|c| c == crate::gfid::DIR) {
            return Err(Errno::NOENT);
        }
        Ok(p)
    }

    fn is_root(&self, fd: &OwnedFd) -> bool {
        match (rfs::fstat(fd), rfs::fstat(&self.root)) {
            (Ok(a), Ok(b)) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
            _ => false,
        }
    }

    /// Parent directory (confined) and final component of `path`.
    fn split<'p>(&self, path: &'p [u8]) -> Result<(OwnedFd, Final<'p>)> {
        let p = self.rel(path)?;
        let p = &p[..p.iter().rposition(|&b| b != b'/').map_or(0, |i| i + 1)];
        let (parent, name) = match p.iter().rposition(|&b| b == b'/') {
            Some(i) => (&p[..i], &p[i + 1..]),
            None => (&b"."[..], p),
        };
        let parent = if parent.is_empty() { b"." } else { parent };
        let fin = match name {
            b"" | b"." if p == b"." || p.is_empty() => Final::Root,
            b"." => Final::Dot,
            b".." => Final::DotDot,
            n => {
                if n.len() > 255 {
                    return Err(Errno::NAMETOOLONG);
                }
                Final::Name(n)
            }
        };
        let fd = resolve(&self.root, parent, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        Ok((fd, fin))
    }

    /// A descriptor for the node, and whether it is an `O_PATH` one (which
    /// needs the `/proc/self/fd` route for some calls).
    fn node_fd<'a>(&self, node: &Node<'a, PosixFile>) -> Result<NodeFd<'a>> {
        Ok(match node {
            Node::File(f) => NodeFd::Open(f.fd.as_fd()),
            Node::Path(p) => NodeFd::Path(self.open_path(p, true)?),
            Node::PathNoFollow(p) => NodeFd::Path(self.open_path(p, false)?),
        })
    }
}

enum Final<'p> {
    Root,
    Dot,
    DotDot,
    Name(&'p [u8]),
}

impl<'p> Final<'p> {
    /// The name, or `special` for `.`, `..` and the root, which no call may
    /// create or remove.
    fn name(&self, special: Errno) -> Result<&'p [u8]> {
        match self {
            Final::Name(n) => Ok(n),
            _ => Err(special),
        }
    }
}

enum NodeFd<'a> {
    Open(BorrowedFd<'a>),
    Path(OwnedFd),
}

impl NodeFd<'_> {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            NodeFd::Open(fd) => *fd,
            NodeFd::Path(fd) => fd.as_fd(),
        }
    }
    /// `/proc/self/fd/N`: lets path-only calls act on exactly this inode.
    fn proc_path(&self) -> CString {
        use std::os::fd::AsRawFd;
        CString::new(format!("/proc/self/fd/{}", self.fd().as_raw_fd())).expect("no NUL in a number")
    }
    fn is_symlink(&self) -> Result<bool> {
        Ok(rfs::FileType::from_raw_mode(rfs::fstat(self.fd())?.st_mode) == rfs::FileType::Symlink)
    }
}

/// `openat2` confined to the export. The kernel answers `EAGAIN` when a
/// rename anywhere raced a walk through `..`; the walk is then simply
/// repeated, as openat2(2) advises.
///
/// A path of `PATH_MAX` bytes or more (a tree deeper than that from the
/// export root; the kernel takes no such path in one call) is walked in
/// steps: the directory named by a leading part of under `PATH_MAX` bytes,
/// then the rest from there. A later step is confined *beneath* its
/// directory: a `..` or an absolute symlink that would leave it fails with
/// `EXDEV` rather than resolve from the wrong root (one walk would have
/// gone on from the export root).
fn resolve(root: &OwnedFd, path: &[u8], flags: OFlags, mode: Mode) -> Result<OwnedFd> {
    resolve_in(root, path, flags, mode, RESOLVE)
}

fn resolve_in(root: &OwnedFd, path: &[u8], flags: OFlags, mode: Mode, how: ResolveFlags) -> Result<OwnedFd> {
    if path.len() >= ferry_proto::PATH_MAX {
        let cut = path[..ferry_proto::PATH_MAX - 1].iter().rposition(|&b| b == b'/').ok_or(Errno::NAMETOOLONG)?;
        let step = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let dir = resolve_once(root, &path[..cut.max(1)], step, Mode::empty(), how)?;
        let rest = &path[cut + 1..];
        let rest = &rest[rest.iter().position(|&b| b != b'/').unwrap_or(rest.len())..];
        let beneath = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
        return resolve_in(&dir, if rest.is_empty() { b"." } else { rest }, flags, mode, beneath);
    }
    resolve_once(root, path, flags, mode, how)
}

fn resolve_once(root: &OwnedFd, path: &[u8], flags: OFlags, mode: Mode, how: ResolveFlags) -> Result<OwnedFd> {
    const ATTEMPTS: usize = 128;
    let mut last = rustix::io::Errno::AGAIN;
    for _ in 0..ATTEMPTS {
        match rfs::openat2(root, path, flags, mode, how) {
            Ok(fd) => return Ok(fd),
            Err(rustix::io::Errno::AGAIN) => last = rustix::io::Errno::AGAIN,
            Err(e) => return Err(e.into()),
        }
    }
    Err(last.into())
}

/// Strips the leading `/`; the root is `.`. No Linux path holds a NUL.
fn rel(path: &[u8]) -> Result<&[u8]> {
    if path.len() > ferry_proto::MAX_PATH {
        return Err(Errno::NAMETOOLONG);
    }
    if path.contains(&0) {
        return Err(Errno::INVAL);
    }
    let p = &path[path.iter().position(|&b| b != b'/').unwrap_or(path.len())..];
    Ok(if p.is_empty() { b"." } else { p })
}

fn attr_of(st: &rfs::Stat) -> Attr {
    Attr {
        dev: st.st_dev,
        ino: st.st_ino,
        mode: st.st_mode,
        nlink: st.st_nlink,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev,
        size: st.st_size as u64,
        blksize: st.st_blksize as u32,
        blocks: st.st_blocks as u64,
        atime: Time { sec: st.st_atime, nsec: st.st_atime_nsec as u32 },
        mtime: Time { sec: st.st_mtime, nsec: st.st_mtime_nsec as u32 },
        ctime: Time { sec: st.st_ctime, nsec: st.st_ctime_nsec as u32 },
    }
}

/// The open file `fd`, opened with `flags`.
fn file_from(fd: OwnedFd, flags: u32) -> Result<(PosixFile, Attr)> {
    let attr = fstat_attr(fd.as_fd())?;
    // As on a `nodev` mount: a device node in the export is never a way
    // into the server's devices.
    if matches!(attr.kind(), 0o020000 | 0o060000) {
        return Err(Errno::ACCES);
    }
    let acc = flags & libc::O_ACCMODE as u32;
    let file = PosixFile {
        fd,
        readable: acc == libc::O_RDONLY as u32 || acc == libc::O_RDWR as u32,
        append: flags & libc::O_APPEND as u32 != 0,
        dir: Mutex::new(None),
    };
    Ok((file, attr))
}

fn fstat_attr(fd: BorrowedFd<'_>) -> Result<Attr> {
    Ok(attr_of(&rfs::fstat(fd)?))
}

fn stat_at(dir: &OwnedFd, name: &[u8]) -> Result<Attr> {
    Ok(attr_of(&rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?))
}

fn timestamp(t: Time) -> rustix::fs::Timespec {
    rustix::fs::Timespec { tv_sec: t.sec, tv_nsec: t.nsec as _ }
}

fn dt_of(t: rfs::FileType) -> u8 {
    match t {
        rfs::FileType::Fifo => libc::DT_FIFO,
        rfs::FileType::CharacterDevice => libc::DT_CHR,
        rfs::FileType::Directory => libc::DT_DIR,
        rfs::FileType::BlockDevice => libc::DT_BLK,
        rfs::FileType::RegularFile => libc::DT_REG,
        rfs::FileType::Symlink => libc::DT_LNK,
        rfs::FileType::Socket => libc::DT_SOCK,
        _ => libc::DT_UNKNOWN,
    }
}

impl Backend for PosixBackend {
    type File = PosixFile;

    fn open(&self, path: &[u8], flags: u32, mode: u32) -> Result<(PosixFile, Attr)> {
        let flags = flags & CLIENT_FLAGS;
        // O_NONBLOCK keeps a FIFO in the export from stalling the connection.
        let oflags = OFlags::from_bits_retain(flags) | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let mode = if flags & libc::O_CREAT as u32 != 0 { mode & 0o7777 } else { 0 };
        let fd = resolve(&self.root, self.rel(path)?, oflags, Mode::from_bits_retain(mode))?;
        file_from(fd, flags)
    }

    fn file_id(&self, file: &PosixFile) -> Vec<u8> {
        let handle = crate::fileid::of(file.fd.as_fd()).unwrap_or_default();
        match self.gfids.then(|| crate::gfid::of(file.fd.as_fd())).flatten() {
            Some(g) => crate::gfid::id(&g, &handle),
            None => handle,
        }
    }

    fn locate(&self, id: &[u8], _path: &[u8], key: (u64, u64)) -> Result<PosixFile> {
        // `O_PATH`: found, not opened; the caller's open comes after.
        let fd = match crate::gfid::split(id) {
            (Some(g), _) if self.by_gfid => crate::gfid::find(self.root.as_fd(), &g)?,
            (_, handle) => {
                // The kernel wants a real descriptor of the file system,
                // not the `O_PATH` one the export is held by.
                let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
                let mount = rfs::openat(&self.root, ".", flags, Mode::empty())?;
                crate::fileid::open(mount.as_fd(), handle, OFlags::PATH | OFlags::CLOEXEC)?
            }
        };
        let st = rfs::fstat(&fd)?;
        let symlink = rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::Symlink;
        if !self.same_file(&st, key) || symlink || !self.inside(&fd)? {
            return Err(Errno::STALE);
        }
        Ok(PosixFile { fd, readable: false, append: false, dir: Mutex::new(None) })
    }

    fn reopen(
        &self,
        found: Option<PosixFile>,
        id: &[u8],
        path: &[u8],
        flags: u32,
        key: (u64, u64),
    ) -> Result<(PosixFile, Attr)> {
        let flags = flags & CLIENT_FLAGS & !((libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC) as u32);
        if let Some(f) = found {
            // Through the descriptor's own link: the file itself, opened
            // with the thread's (the caller's) ids, so the kernel checks the
            // file's permissions as an open would; the walk to it was made
            // when the session first opened it.
            // Not `O_NOFOLLOW`: the link followed is the descriptor's own
            // (`locate` never finds a symlink).
            let oflags = (OFlags::from_bits_retain(flags) - OFlags::NOFOLLOW) | OFlags::CLOEXEC | OFlags::NONBLOCK;
            let fd = rfs::open(NodeFd::Open(f.fd.as_fd()).proc_path().as_c_str(), oflags, Mode::empty())?;
            if !self.same_file(&rfs::fstat(&fd)?, key) {
                return Err(Errno::STALE);
            }
            return file_from(fd, flags);
        }
        let (f, a) = crate::backend::reopen_by_path(self, path, flags, |a| self.same_inode(a.dev, a.ino, key))?;
        // Where the id names the file by its gfid, the file at the path
        // must have that gfid too (it has the inode number already).
        if let (Some(want), true) = (crate::gfid::split(id).0, self.gfids) {
            if crate::gfid::of(f.fd.as_fd()).is_some_and(|g| g != want) {
                return Err(Errno::STALE);
            }
        }
        Ok((f, a))
    }

    fn fd_of<'f>(&self, file: &'f PosixFile) -> Option<std::os::fd::BorrowedFd<'f>> {
        let st = rfs::fstat(&file.fd).ok()?;
        let regular = rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::RegularFile;
        regular.then(|| file.fd.as_fd())
    }

    fn read<'f>(&self, file: &'f PosixFile, offset: u64, len: usize) -> Result<ReadData<'f>> {
        let st = rfs::fstat(&file.fd)?;
        if rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::RegularFile {
            // The size clamps the reply length announced before `sendfile`;
            // see ARCHITECTURE.md for the truncate race.
            let avail = (st.st_size as u64).saturating_sub(offset);
            let len = len.min(usize::try_from(avail).unwrap_or(usize::MAX));
            if !file.readable {
                return Err(Errno::BADF);
            }
            return Ok(ReadData::Fd { fd: file.fd.as_fd(), offset, len });
        }
        let mut buf = vec![0u8; len];
        let n = rustix::io::pread(&file.fd, &mut buf, offset)?;
        buf.truncate(n);
        Ok(ReadData::Bytes(buf))
    }

    fn write(&self, file: &PosixFile, offset: u64, data: &[u8]) -> Result<u64> {
        let append = file.append;
        let mut done = 0;
        while done < data.len() {
            let n = if append {
                rustix::io::write(&file.fd, &data[done..])?
            } else {
                rustix::io::pwrite(&file.fd, &data[done..], offset + done as u64)?
            };
            if n == 0 {
                return Err(Errno::NOSPC);
            }
            done += n;
        }
        if append {
            return Ok(rfs::seek(&file.fd, rfs::SeekFrom::Current(0))?);
        }
        Ok(offset + done as u64)
    }

    fn fsync(&self, file: &PosixFile, datasync: bool) -> Result<()> {
        if datasync {
            rfs::fdatasync(&file.fd)?;
        } else {
            rfs::fsync(&file.fd)?;
        }
        Ok(())
    }

    fn readdir(&self, dir: &PosixFile, cookie: u64, max: usize, plus: bool) -> Result<(Vec<DirEntry>, bool)> {
        let mut guard = dir.dir.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            // A duplicate of the handle's own descriptor, not `read_from`'s
            // reopen of ".": that is a lookup in the directory, which
            // needs search permission, and a directory readable but not
            // searchable lists as on a local file system.
            let stream = if rfs::fcntl_getfl(&dir.fd)?.contains(OFlags::PATH) {
                Dir::read_from(&dir.fd)?
            } else {
                Dir::new(rustix::io::fcntl_dupfd_cloexec(&dir.fd, 0)?)?
            };
            *guard = Some(DirStream { dir: stream, at: 0 });
        }
        let stream = guard.as_mut().expect("just set");
        if stream.at != cookie {
            if cookie == 0 {
                stream.dir.rewind();
            } else {
                stream.dir.seek(cookie as i64)?;
            }
            stream.at = cookie;
        }
        let mut out = Vec::new();
        let mut eof = false;
        while out.len() < max {
            let Some(ent) = stream.dir.read() else {
                eof = true;
                break;
            };
            let ent = ent?;
            let name = ent.file_name().to_bytes().to_vec();
            // `..` of the export root is the root itself, as the export is
            // the root of the client's name space; nothing outside shows.
            let target = if name == b".." && self.is_root(&dir.fd) { c"." } else { ent.file_name() };
            let st = if plus || target != ent.file_name() {
                rfs::statat(&dir.fd, target, AtFlags::SYMLINK_NOFOLLOW).ok()
            } else {
                None
            };
            let ino = if target == ent.file_name() { ent.ino() } else { st.as_ref().map_or(0, |s| s.st_ino) };
            let attr = if plus { st.as_ref().map(attr_of) } else { None };
            stream.at = ent.offset() as u64;
            out.push(DirEntry { name, ino, kind: dt_of(ent.file_type()), cookie: stream.at, attr });
        }
        Ok((out, eof))
    }

    fn getattr(&self, node: Node<'_, PosixFile>) -> Result<Attr> {
        fstat_attr(self.node_fd(&node)?.fd())
    }

    fn truncate(&self, node: Node<'_, PosixFile>, size: u64) -> Result<Attr> {
        let size = i64::try_from(size).map_err(|_| Errno::FBIG)?;
        match node {
            Node::File(f) => {
                rfs::ftruncate(&f.fd, size as u64).map_err(|e| {
                    // ftruncate on a descriptor not open for writing.
                    if e == rustix::io::Errno::BADF {
                        Errno::INVAL
                    } else {
                        e.into()
                    }
                })?;
                fstat_attr(f.fd.as_fd())
            }
            Node::Path(_) | Node::PathNoFollow(_) => {
                let n = self.node_fd(&node)?;
                let fd = rfs::open(
                    n.proc_path().as_c_str(),
                    OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NONBLOCK,
                    Mode::empty(),
                )?;
                rfs::ftruncate(&fd, size as u64)?;
                fstat_attr(fd.as_fd())
            }
        }
    }

    fn chmod(&self, node: Node<'_, PosixFile>, mode: u32) -> Result<Attr> {
        let n = self.node_fd(&node)?;
        if matches!(node, Node::PathNoFollow(_)) && n.is_symlink()? {
            return Err(Errno::OPNOTSUPP);
        }
        rfs::chmodat(CWD, n.proc_path().as_c_str(), Mode::from_bits_retain(mode & 0o7777), AtFlags::empty())?;
        fstat_attr(n.fd())
    }

    fn chown(&self, node: Node<'_, PosixFile>, uid: u32, gid: u32) -> Result<Attr> {
        let n = self.node_fd(&node)?;
        let uid = (uid != u32::MAX).then(|| rustix::fs::Uid::from_raw(uid));
        let gid = (gid != u32::MAX).then(|| rustix::fs::Gid::from_raw(gid));
        rfs::chownat(n.fd(), "", uid, gid, AtFlags::EMPTY_PATH)?;
        fstat_attr(n.fd())
    }

    fn utimens(&self, node: Node<'_, PosixFile>, atime: Time, mtime: Time) -> Result<Attr> {
        let ts = rfs::Timestamps { last_access: timestamp(atime), last_modification: timestamp(mtime) };
        match node {
            Node::PathNoFollow(p) => {
                let (dir, fin) = self.split(p)?;
                match fin {
                    Final::Name(name) => {
                        rfs::utimensat(&dir, name, &ts, AtFlags::SYMLINK_NOFOLLOW)?;
                        stat_at(&dir, name)
                    }
                    // `.`/`..`/root are directories: no symlink to avoid following.
                    _ => self.utimens(Node::Path(p), atime, mtime),
                }
            }
            _ => {
                let n = self.node_fd(&node)?;
                rfs::utimensat(CWD, n.proc_path().as_c_str(), &ts, AtFlags::empty())?;
                fstat_attr(n.fd())
            }
        }
    }

    fn mkdir(&self, path: &[u8], mode: u32) -> Result<Attr> {
        let (dir, fin) = self.split(path)?;
        let name = fin.name(Errno::EXIST)?;
        rfs::mkdirat(&dir, name, Mode::from_bits_retain(mode & 0o7777))?;
        stat_at(&dir, name)
    }

    fn mknod(&self, path: &[u8], mode: u32, rdev: u64) -> Result<Attr> {
        let (dir, fin) = self.split(path)?;
        let name = fin.name(Errno::EXIST)?;
        let ftype = rfs::FileType::from_raw_mode(mode);
        let ftype = if mode & libc::S_IFMT == 0 { rfs::FileType::RegularFile } else { ftype };
        rfs::mknodat(&dir, name, ftype, Mode::from_bits_retain(mode & 0o7777), rdev)?;
        stat_at(&dir, name)
    }

    fn rmdir(&self, path: &[u8]) -> Result<()> {
        let (dir, fin) = self.split(path)?;
        let name = match fin {
            Final::Root => return Err(Errno(libc::EBUSY)),
            Final::Dot => return Err(Errno::INVAL),
            Final::DotDot => return Err(Errno::NOTEMPTY),
            Final::Name(n) => n,
        };
        Ok(rfs::unlinkat(&dir, name, AtFlags::REMOVEDIR)?)
    }

    fn unlink(&self, path: &[u8]) -> Result<()> {
        let (dir, fin) = self.split(path)?;
        Ok(rfs::unlinkat(&dir, fin.name(Errno::ISDIR)?, AtFlags::empty())?)
    }

    fn rename(&self, from: &[u8], to: &[u8], flags: u32) -> Result<()> {
        let (fdir, ffin) = self.split(from)?;
        let (tdir, tfin) = self.split(to)?;
        let busy = Errno(libc::EBUSY);
        let flags = rfs::RenameFlags::from_bits(flags).ok_or(Errno::INVAL)?;
        Ok(rfs::renameat_with(&fdir, ffin.name(busy)?, &tdir, tfin.name(busy)?, flags)?)
    }

    fn link(&self, from: &[u8], to: &[u8]) -> Result<Attr> {
        let (fdir, ffin) = self.split(from)?;
        let (tdir, tfin) = self.split(to)?;
        let fname = ffin.name(Errno::PERM)?;
        let tname = tfin.name(Errno::EXIST)?;
        rfs::linkat(&fdir, fname, &tdir, tname, AtFlags::empty())?;
        stat_at(&tdir, tname)
    }

    fn symlink(&self, target: &[u8], path: &[u8]) -> Result<Attr> {
        if target.contains(&0) {
            return Err(Errno::INVAL);
        }
        if target.len() >= ferry_proto::PATH_MAX {
            return Err(Errno::NAMETOOLONG);
        }
        let (dir, fin) = self.split(path)?;
        let name = fin.name(Errno::EXIST)?;
        rfs::symlinkat(target, &dir, name)?;
        stat_at(&dir, name)
    }

    fn readlink(&self, path: &[u8]) -> Result<Vec<u8>> {
        let (dir, fin) = self.split(path)?;
        let target = rfs::readlinkat(&dir, fin.name(Errno::INVAL)?, Vec::new())?;
        Ok(target.into_bytes())
    }

    fn statfs(&self, path: &[u8]) -> Result<StatFs> {
        let fd = self.open_path(path, true)?;
        let s = rfs::fstatvfs(&fd)?;
        Ok(StatFs {
            bsize: s.f_bsize,
            frsize: s.f_frsize,
            blocks: s.f_blocks,
            bfree: s.f_bfree,
            bavail: s.f_bavail,
            files: s.f_files,
            ffree: s.f_ffree,
            favail: s.f_favail,
            fsid: s.f_fsid,
            flags: s.f_flag.bits(),
            namemax: s.f_namemax,
        })
    }

    fn access(&self, path: &[u8], mode: u32) -> Result<()> {
        let n = NodeFd::Path(self.open_path(path, true)?);
        let access = rfs::Access::from_bits(mode).ok_or(Errno::INVAL)?;
        // AT_EACCESS: judged by the ids the thread acts with (its caller's),
        // not by its real uid, which stays the server's.
        Ok(rfs::accessat(CWD, n.proc_path().as_c_str(), access, AtFlags::EACCESS)?)
    }

    fn getxattr(&self, node: Node<'_, PosixFile>, name: &[u8]) -> Result<Vec<u8>> {
        let n = self.node_fd(&node)?;
        if n.is_symlink()? {
            return Err(Errno::NODATA);
        }
        let path = n.proc_path();
        let size = rfs::getxattr_query(path.as_c_str(), name)?;
        let mut buf = vec![0u8; size];
        let got = rfs::getxattr(path.as_c_str(), name, &mut buf[..])?;
        buf.truncate(got);
        Ok(buf)
    }

    fn setxattr(&self, node: Node<'_, PosixFile>, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        let n = self.node_fd(&node)?;
        if n.is_symlink()? {
            return Err(Errno::PERM);
        }
        let flags = rfs::XattrFlags::from_bits(flags).ok_or(Errno::INVAL)?;
        Ok(rfs::setxattr(n.proc_path().as_c_str(), name, value, flags)?)
    }

    fn listxattr(&self, node: Node<'_, PosixFile>) -> Result<Vec<u8>> {
        let n = self.node_fd(&node)?;
        if n.is_symlink()? {
            return Ok(Vec::new());
        }
        let path = n.proc_path();
        let size = rfs::listxattr_query(path.as_c_str())?;
        let mut buf = vec![0u8; size];
        let got = rfs::listxattr(path.as_c_str(), &mut buf[..])?;
        buf.truncate(got);
        Ok(buf)
    }

    fn removexattr(&self, node: Node<'_, PosixFile>, name: &[u8]) -> Result<()> {
        let n = self.node_fd(&node)?;
        if n.is_symlink()? {
            return Err(Errno::PERM);
        }
        Ok(rfs::removexattr(n.proc_path().as_c_str(), name)?)
    }
}
