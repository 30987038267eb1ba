//! Remote attributes into the C structures programs read.

use ferry_client::{Attr, StatFs};

/// Preferred I/O size reported for remote files: programs that size their
/// buffers by `st_blksize` (cp, cat) then make large requests.
const BLKSIZE: i64 = 1024 * 1024;

pub fn stat(a: &Attr, st: &mut libc::stat64) {
    // SAFETY: stat64 is plain data; all-zero is a valid value.
    *st = unsafe { std::mem::zeroed() };
    st.st_dev = a.dev;
    st.st_ino = a.ino;
    st.st_mode = a.mode;
    st.st_nlink = a.nlink;
    st.st_uid = a.uid;
    st.st_gid = a.gid;
    st.st_rdev = a.rdev;
    st.st_size = a.size as i64;
    st.st_blksize = BLKSIZE.max(a.blksize as i64);
    st.st_blocks = a.blocks as i64;
    st.st_atime = a.atime.sec;
    st.st_atime_nsec = a.atime.nsec as i64;
    st.st_mtime = a.mtime.sec;
    st.st_mtime_nsec = a.mtime.nsec as i64;
    st.st_ctime = a.ctime.sec;
    st.st_ctime_nsec = a.ctime.nsec as i64;
}

pub fn statx(a: &Attr, sx: &mut libc::statx) {
    // SAFETY: statx is plain data; all-zero is a valid value.
    *sx = unsafe { std::mem::zeroed() };
    sx.stx_mask = libc::STATX_BASIC_STATS;
    sx.stx_blksize = BLKSIZE.max(a.blksize as i64) as u32;
    sx.stx_nlink = a.nlink as u32;
    sx.stx_uid = a.uid;
    sx.stx_gid = a.gid;
    sx.stx_mode = a.mode as u16;
    sx.stx_ino = a.ino;
    sx.stx_size = a.size;
    sx.stx_blocks = a.blocks;
    let ts = |t: ferry_client::Time| {
        // SAFETY: plain data; all-zero is valid (the padding stays zero).
        let mut x: libc::statx_timestamp = unsafe { std::mem::zeroed() };
        x.tv_sec = t.sec;
        x.tv_nsec = t.nsec;
        x
    };
    sx.stx_atime = ts(a.atime);
    sx.stx_mtime = ts(a.mtime);
    sx.stx_ctime = ts(a.ctime);
    sx.stx_rdev_major = libc::major(a.rdev);
    sx.stx_rdev_minor = libc::minor(a.rdev);
    sx.stx_dev_major = libc::major(a.dev);
    sx.stx_dev_minor = libc::minor(a.dev);
}

pub fn statfs(s: &StatFs, out: &mut libc::statfs64) {
    // SAFETY: plain data; all-zero is valid.
    *out = unsafe { std::mem::zeroed() };
    out.f_type = 0x6665_7272; // "ferr"
    out.f_bsize = s.bsize as i64;
    out.f_frsize = s.frsize as i64;
    out.f_blocks = s.blocks;
    out.f_bfree = s.bfree;
    out.f_bavail = s.bavail;
    out.f_files = s.files;
    out.f_ffree = s.ffree;
    out.f_namelen = s.namemax as i64;
}

pub fn statvfs(s: &StatFs, out: &mut libc::statvfs64) {
    // SAFETY: plain data; all-zero is valid.
    *out = unsafe { std::mem::zeroed() };
    out.f_bsize = s.bsize;
    out.f_frsize = s.frsize;
    out.f_blocks = s.blocks;
    out.f_bfree = s.bfree;
    out.f_bavail = s.bavail;
    out.f_files = s.files;
    out.f_ffree = s.ffree;
    out.f_favail = s.favail;
    out.f_namemax = s.namemax;
}
