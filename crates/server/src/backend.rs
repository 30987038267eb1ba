//! The storage seen by a session: a set of file-system calls on paths
//! relative to the export root and on open files. Two implementations:
//! [`crate::posix::PosixBackend`] (a directory, every path confined beneath
//! it) and [`crate::memory::MemoryBackend`] (ORFA's in-memory file system).

use std::fmt;
use std::os::fd::BorrowedFd;

use ferry_proto::{Attr, DirEntry, StatFs, Time};

/// A Linux errno value. Backends return exactly what the system call would.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    pub const PERM: Errno = Errno(libc::EPERM);
    pub const NOENT: Errno = Errno(libc::ENOENT);
    pub const IO: Errno = Errno(libc::EIO);
    pub const BADF: Errno = Errno(libc::EBADF);
    pub const ACCES: Errno = Errno(libc::EACCES);
    pub const EXIST: Errno = Errno(libc::EEXIST);
    pub const XDEV: Errno = Errno(libc::EXDEV);
    pub const NOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const ISDIR: Errno = Errno(libc::EISDIR);
    pub const INVAL: Errno = Errno(libc::EINVAL);
    pub const NOSPC: Errno = Errno(libc::ENOSPC);
    pub const ROFS: Errno = Errno(libc::EROFS);
    pub const NAMETOOLONG: Errno = Errno(libc::ENAMETOOLONG);
    pub const NOTEMPTY: Errno = Errno(libc::ENOTEMPTY);
    pub const LOOP: Errno = Errno(libc::ELOOP);
    pub const NODATA: Errno = Errno(libc::ENODATA);
    pub const RANGE: Errno = Errno(libc::ERANGE);
    pub const NOSYS: Errno = Errno(libc::ENOSYS);
    pub const NXIO: Errno = Errno(libc::ENXIO);
    pub const MFILE: Errno = Errno(libc::EMFILE);
    pub const OPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    pub const FBIG: Errno = Errno(libc::EFBIG);
    pub const BADMSG: Errno = Errno(libc::EBADMSG);
    pub const BUSY: Errno = Errno(libc::EBUSY);
    pub const TOOBIG: Errno = Errno(libc::E2BIG);
    pub const MLINK: Errno = Errno(libc::EMLINK);
    pub const STALE: Errno = Errno(libc::ESTALE);

    /// The errno of the last failed libc call on this thread.
    pub fn last() -> Errno {
        Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Errno({}: {})", self.0, std::io::Error::from_raw_os_error(self.0))
    }
}

impl From<std::io::Error> for Errno {
    fn from(e: std::io::Error) -> Errno {
        Errno(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl From<rustix::io::Errno> for Errno {
    fn from(e: rustix::io::Errno) -> Errno {
        Errno(e.raw_os_error())
    }
}

pub type Result<T> = std::result::Result<T, Errno>;

/// What an attribute call acts on; the session has already turned a handle
/// id into the backend's open file.
#[derive(Clone, Copy)]
pub enum Node<'a, F> {
    File(&'a F),
    Path(&'a [u8]),
    PathNoFollow(&'a [u8]),
}

/// Where the bytes of a read come from, so the connection can move them to the
/// socket the cheapest way: `sendfile` from a descriptor, or a plain write.
pub enum ReadData<'a> {
    /// `len` bytes of `fd` at `offset` (already clamped to the file's size).
    Fd {
        fd: BorrowedFd<'a>,
        offset: u64,
        len: usize,
    },
    Bytes(Vec<u8>),
}

impl ReadData<'_> {
    pub fn len(&self) -> usize {
        match self {
            ReadData::Fd { len, .. } => *len,
            ReadData::Bytes(b) => b.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// File-system calls on paths relative to the export root. A path is a
/// `/`-separated byte string (names are bytes on Linux, not always UTF-8;
/// a NUL byte is `EINVAL`); the backend must never let one reach outside the
/// export (`..`, absolute or escaping symlinks, magic links). Empty path or
/// `/` is the root. Each call returns what the Linux call would, errno
/// included.
pub trait Backend: Send + Sync + 'static {
    /// An open file or directory.
    type File: Send + Sync;

    /// `open(2)` with Linux flags; returns the file and its attributes.
    fn open(&self, path: &[u8], flags: u32, mode: u32) -> Result<(Self::File, Attr)>;
    /// Up to `len` bytes at `offset`; fewer at end of file, none past it.
    fn read<'f>(&self, file: &'f Self::File, offset: u64, len: usize) -> Result<ReadData<'f>>;
    /// Writes all of `data` at `offset` (at the end if the file was opened
    /// with `O_APPEND`); returns the file offset just past the written bytes.
    fn write(&self, file: &Self::File, offset: u64, data: &[u8]) -> Result<u64>;
    fn fsync(&self, file: &Self::File, datasync: bool) -> Result<()>;
    /// Entries after `cookie` (0 = from the start), at most `max`; `plus`
    /// fills in attributes. Returns the entries and whether the end was hit.
    /// `.` and `..` are included, as `readdir(3)` does.
    fn readdir(&self, dir: &Self::File, cookie: u64, max: usize, plus: bool) -> Result<(Vec<DirEntry>, bool)>;

    fn getattr(&self, node: Node<'_, Self::File>) -> Result<Attr>;
    fn truncate(&self, node: Node<'_, Self::File>, size: u64) -> Result<Attr>;
    fn chmod(&self, node: Node<'_, Self::File>, mode: u32) -> Result<Attr>;
    /// `u32::MAX` leaves an id unchanged.
    fn chown(&self, node: Node<'_, Self::File>, uid: u32, gid: u32) -> Result<Attr>;
    fn utimens(&self, node: Node<'_, Self::File>, atime: Time, mtime: Time) -> Result<Attr>;

    fn mkdir(&self, path: &[u8], mode: u32) -> Result<Attr>;
    /// `mknod(2)`: FIFO, socket, device or regular file, by `mode`'s type.
    fn mknod(&self, path: &[u8], mode: u32, rdev: u64) -> Result<Attr>;
    fn rmdir(&self, path: &[u8]) -> Result<()>;
    fn unlink(&self, path: &[u8]) -> Result<()>;
    fn rename(&self, from: &[u8], to: &[u8], flags: u32) -> Result<()>;
    /// Hard link: `to` becomes another name of `from`.
    fn link(&self, from: &[u8], to: &[u8]) -> Result<Attr>;
    /// Creates `path` as a symlink whose content is `target` (not resolved).
    fn symlink(&self, target: &[u8], path: &[u8]) -> Result<Attr>;
    fn readlink(&self, path: &[u8]) -> Result<Vec<u8>>;
    fn statfs(&self, path: &[u8]) -> Result<StatFs>;
    fn access(&self, path: &[u8], mode: u32) -> Result<()>;

    fn getxattr(&self, node: Node<'_, Self::File>, name: &[u8]) -> Result<Vec<u8>>;
    /// `flags`: `XATTR_CREATE` / `XATTR_REPLACE`.
    fn setxattr(&self, node: Node<'_, Self::File>, name: &[u8], value: &[u8], flags: u32) -> Result<()>;
    /// Names, each followed by a NUL byte, as `listxattr(2)` returns them.
    fn listxattr(&self, node: Node<'_, Self::File>) -> Result<Vec<u8>>;
    fn removexattr(&self, node: Node<'_, Self::File>, name: &[u8]) -> Result<()>;

    /// Every change to what it serves goes through this server (a memory
    /// backend): leases may be promised for long (`WATCHED`) without
    /// watching anything.
    fn sees_every_change(&self) -> bool {
        false
    }

    /// The open file's lasting identity, which `reopen` takes, so a client
    /// finds the same file again after the server restarted. Empty when the
    /// backend has none beyond `(dev, ino)`.
    fn file_id(&self, file: &Self::File) -> Vec<u8>;
    /// Finds the file `id` names (for a path-routing backend, in the export
    /// `path` is in), if it is a file of the export and still the one with
    /// `key` (`dev`, `ino`) — without opening it for reading or writing.
    /// Called with the server's own ids (a kernel file handle needs
    /// privileges), only for an id the server gave the session itself.
    /// `ESTALE` where there is none, or the backend finds files by path only.
    fn locate(&self, _id: &[u8], _path: &[u8], _key: (u64, u64)) -> Result<Self::File> {
        Err(Errno::STALE)
    }
    /// Opens again, with the ids the thread wears (the caller's), the file
    /// a client opened before: `found` (by `locate`), opened as its own
    /// permissions allow; or else the file at `path` if it is still the one
    /// with `key`. Any other file, or none: `ESTALE`. `id` is what the
    /// server gave for the file (empty when it did not give it to this
    /// session). `flags` never create or truncate.
    fn reopen(
        &self,
        found: Option<Self::File>,
        id: &[u8],
        path: &[u8],
        flags: u32,
        key: (u64, u64),
    ) -> Result<(Self::File, Attr)>;

    /// The descriptor of an open regular file, for the server to pass to a
    /// client on its own host (`FileFd`); `None` when the backend has none
    /// (files in memory) or the file is not a regular file. Never a
    /// directory's: `openat` on it would reach past the export's checks.
    fn fd_of<'f>(&self, _file: &'f Self::File) -> Option<std::os::fd::BorrowedFd<'f>> {
        None
    }
}

/// `Backend::reopen` by path: the file at `path` if it is still the one
/// the client had (`same`: its attributes say so).
pub fn reopen_by_path<B: Backend + ?Sized>(
    b: &B,
    path: &[u8],
    flags: u32,
    same: impl Fn(&Attr) -> bool,
) -> Result<(B::File, Attr)> {
    let flags = flags & !((libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC) as u32);
    match b.open(path, flags, 0) {
        Ok((f, a)) if same(&a) => Ok((f, a)),
        Ok(_) | Err(Errno::NOENT) | Err(Errno::NOTDIR) | Err(Errno::LOOP) => Err(Errno::STALE),
        Err(e) => Err(e),
    }
}
