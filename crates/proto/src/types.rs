//! Plain data carried by messages: attributes, times, targets, directory entries.

use crate::wire::{Reader, Writer};
use crate::DecodeError;

/// A point in time as `struct timespec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Time {
    pub sec: i64,
    pub nsec: u32,
}

/// `nsec` value meaning "set to the current time" (Linux `UTIME_NOW`).
pub const UTIME_NOW: u32 = (1 << 30) - 1;
/// `nsec` value meaning "leave unchanged" (Linux `UTIME_OMIT`).
pub const UTIME_OMIT: u32 = (1 << 30) - 2;

impl Time {
    pub const NOW: Time = Time { sec: 0, nsec: UTIME_NOW };
    pub const OMIT: Time = Time { sec: 0, nsec: UTIME_OMIT };

    pub(crate) fn put(&self, w: &mut Writer) {
        w.i64(self.sec);
        w.u32(self.nsec);
    }
    pub(crate) fn get(r: &mut Reader) -> Result<Time, DecodeError> {
        Ok(Time { sec: r.i64("time.sec")?, nsec: r.u32("time.nsec")? })
    }
}

/// Every field of `struct stat`, with nanosecond times. 100 bytes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Attr {
    pub dev: u64,
    pub ino: u64,
    pub mode: u32,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub size: u64,
    pub blksize: u32,
    pub blocks: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
}

impl Attr {
    pub const WIRE_LEN: usize = 100;

    pub(crate) fn put(&self, w: &mut Writer) {
        w.u64(self.dev);
        w.u64(self.ino);
        w.u32(self.mode);
        w.u64(self.nlink);
        w.u32(self.uid);
        w.u32(self.gid);
        w.u64(self.rdev);
        w.u64(self.size);
        w.u32(self.blksize);
        w.u64(self.blocks);
        self.atime.put(w);
        self.mtime.put(w);
        self.ctime.put(w);
    }
    pub(crate) fn get(r: &mut Reader) -> Result<Attr, DecodeError> {
        Ok(Attr {
            dev: r.u64("attr.dev")?,
            ino: r.u64("attr.ino")?,
            mode: r.u32("attr.mode")?,
            nlink: r.u64("attr.nlink")?,
            uid: r.u32("attr.uid")?,
            gid: r.u32("attr.gid")?,
            rdev: r.u64("attr.rdev")?,
            size: r.u64("attr.size")?,
            blksize: r.u32("attr.blksize")?,
            blocks: r.u64("attr.blocks")?,
            atime: Time::get(r)?,
            mtime: Time::get(r)?,
            ctime: Time::get(r)?,
        })
    }

    /// File type bits (`S_IFMT`).
    pub fn kind(&self) -> u32 {
        self.mode & 0o170000
    }
    pub fn is_dir(&self) -> bool {
        self.kind() == 0o040000
    }
    pub fn is_file(&self) -> bool {
        self.kind() == 0o100000
    }
    pub fn is_symlink(&self) -> bool {
        self.kind() == 0o120000
    }
}

/// `struct statvfs`, all fields widened to 64 bits. 88 bytes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatFs {
    pub bsize: u64,
    pub frsize: u64,
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub favail: u64,
    pub fsid: u64,
    pub flags: u64,
    pub namemax: u64,
}

impl StatFs {
    pub(crate) fn put(&self, w: &mut Writer) {
        for v in [
            self.bsize,
            self.frsize,
            self.blocks,
            self.bfree,
            self.bavail,
            self.files,
            self.ffree,
            self.favail,
            self.fsid,
            self.flags,
            self.namemax,
        ] {
            w.u64(v);
        }
    }
    pub(crate) fn get(r: &mut Reader) -> Result<StatFs, DecodeError> {
        Ok(StatFs {
            bsize: r.u64("statfs")?,
            frsize: r.u64("statfs")?,
            blocks: r.u64("statfs")?,
            bfree: r.u64("statfs")?,
            bavail: r.u64("statfs")?,
            files: r.u64("statfs")?,
            ffree: r.u64("statfs")?,
            favail: r.u64("statfs")?,
            fsid: r.u64("statfs")?,
            flags: r.u64("statfs")?,
            namemax: r.u64("statfs")?,
        })
    }
}

/// What an operation acts on: an open handle, or a path (following or not
/// following a final symlink). This folds `stat`/`lstat`/`fstat`,
/// `chmod`/`fchmod` and their kin into one message each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    Handle(u64),
    Path(&'a [u8]),
    PathNoFollow(&'a [u8]),
}

impl<'a> Target<'a> {
    pub(crate) fn put(&self, w: &mut Writer) {
        match self {
            Target::Handle(h) => {
                w.u8(0);
                w.u64(*h);
            }
            Target::Path(p) => {
                w.u8(1);
                w.name(p);
            }
            Target::PathNoFollow(p) => {
                w.u8(2);
                w.name(p);
            }
        }
    }
    pub(crate) fn get(r: &mut Reader<'a>) -> Result<Target<'a>, DecodeError> {
        match r.u8("target.kind")? {
            0 => Ok(Target::Handle(r.u64("target.handle")?)),
            1 => Ok(Target::Path(r.name("target.path")?)),
            2 => Ok(Target::PathNoFollow(r.name("target.path")?)),
            _ => Err(DecodeError::Invalid("target.kind")),
        }
    }
}

/// One directory entry. `attr` is present in a readdirplus reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: u64,
    /// `DT_*` value (4 directory, 8 regular file, 10 symlink, 0 unknown).
    pub kind: u8,
    /// Cookie to resume after this entry.
    pub cookie: u64,
    pub attr: Option<Attr>,
}

impl DirEntry {
    /// The name as an `OsStr`, as `std::fs::DirEntry::file_name` gives it.
    pub fn file_name(&self) -> &std::ffi::OsStr {
        std::os::unix::ffi::OsStrExt::from_bytes(&self.name[..])
    }

    pub(crate) fn put(&self, w: &mut Writer) {
        w.name(&self.name);
        w.u64(self.ino);
        w.u8(self.kind);
        w.u64(self.cookie);
        match &self.attr {
            Some(a) => {
                w.u8(1);
                a.put(w);
            }
            None => w.u8(0),
        }
    }
    pub(crate) fn get(r: &mut Reader) -> Result<DirEntry, DecodeError> {
        let name = r.name("dirent.name")?.to_vec();
        let ino = r.u64("dirent.ino")?;
        let kind = r.u8("dirent.kind")?;
        let cookie = r.u64("dirent.cookie")?;
        let attr = if r.bool("dirent.has_attr")? { Some(Attr::get(r)?) } else { None };
        Ok(DirEntry { name, ino, kind, cookie, attr })
    }
}
