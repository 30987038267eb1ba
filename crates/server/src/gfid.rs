//! GlusterFS's own file ids (gfids), which name a file on every mount of a
//! volume: how a gateway finds a file a client opened through another
//! gateway, renamed meanwhile. The kernel's file handles do not do that
//! on GlusterFS (each mount's FUSE handles are its own), while a gfid is the
//! volume's: every mount reads it (`glusterfs.gfid.string`), and a mount
//! made with `-o aux-gfid-mount` opens any file as `.gfid/<uuid>` at its
//! root.
//!
//! A file id (`fileid`) of a file on GlusterFS is then `GFID_TYPE`
//! (`i32`, little-endian), the 16 bytes of the gfid, and the kernel handle's
//! id of the file (possibly empty), which a gateway whose mount lacks
//! `aux-gfid-mount` can still use for its own files (after a restart). The
//! type is negative, which no kernel handle type is (`open_by_handle_at`
//! refuses one), so an id is never taken for the other kind.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};

use crate::backend::{Errno, Result};

/// A GlusterFS gfid: a UUID.
pub type Gfid = [u8; 16];

/// What a file id starts with when it carries a gfid ("GF", negated).
const GFID_TYPE: i32 = -0x4647;

/// The virtual attribute every GlusterFS FUSE mount answers with a file's
/// gfid, as a UUID string.
const XATTR: &str = "glusterfs.gfid.string";

/// The directory at a mount's root where `aux-gfid-mount` shows files by
/// gfid (not listed in the root).
pub const DIR: &[u8] = b".gfid";

/// The volume's root directory's gfid, which every volume has.
const ROOT: Gfid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

/// The gfid of the open file `fd` (not an `O_PATH` descriptor); `None`
/// where the file system gives none.
pub fn of(fd: BorrowedFd<'_>) -> Option<Gfid> {
    let mut buf = [0u8; 64];
    let n = rfs::fgetxattr(fd, XATTR, &mut buf[..]).ok()?;
    parse(&buf[..n])
}

/// A file id carrying `gfid`, and `handle` (a kernel handle's id, or empty).
pub fn id(gfid: &Gfid, handle: &[u8]) -> Vec<u8> {
    [&GFID_TYPE.to_le_bytes()[..], gfid, handle].concat()
}

/// The gfid a file id carries, if it carries one, and the kernel handle's
/// id that follows it (the whole id when there is no gfid).
pub fn split(id: &[u8]) -> (Option<Gfid>, &[u8]) {
    match id.split_first_chunk::<4>() {
        Some((typ, rest)) if i32::from_le_bytes(*typ) == GFID_TYPE => match rest.split_first_chunk::<16>() {
            Some((g, handle)) => (Some(*g), handle),
            None => (None, &[]),
        },
        _ => (None, id),
    }
}

/// Whether the file system mounted at `root` (its root directory, opened)
/// opens files by gfid: a GlusterFS mount made with `-o aux-gfid-mount`.
pub fn opens_by_gfid(root: BorrowedFd<'_>) -> bool {
    rfs::statat(root, path(&ROOT), AtFlags::SYMLINK_NOFOLLOW).is_ok()
}

/// Finds (`O_PATH`, not opened) the file `gfid` names on the mount whose
/// root is `root`; `ESTALE` if there is none. The caller checks that it
/// is the file it wants (`open_by_handle_at` checks a generation; this
/// does not need to, as gfids are never reused, but a gfid came from a
/// client).
pub fn find(root: BorrowedFd<'_>, gfid: &Gfid) -> Result<OwnedFd> {
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match rfs::openat(root.as_fd(), path(gfid), flags, Mode::empty()) {
        Ok(fd) => Ok(fd),
        Err(rustix::io::Errno::NOENT) | Err(rustix::io::Errno::INVAL) => Err(Errno::STALE),
        Err(e) => Err(e.into()),
    }
}

/// `.gfid/<uuid>`: where an `aux-gfid-mount` shows the file `gfid`.
fn path(gfid: &Gfid) -> String {
    format!(".gfid/{}", text(gfid))
}

/// The UUID form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
fn text(g: &Gfid) -> String {
    let h: String = g.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// A gfid from its UUID form (trailing NUL bytes allowed: GlusterFS may
/// count one).
fn parse(s: &[u8]) -> Option<Gfid> {
    let s = &s[..s.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)];
    if s.len() != 36 || [8, 13, 18, 23].iter().any(|&i| s[i] != b'-') {
        return None;
    }
    let hex: Vec<u8> = s.iter().copied().filter(|&b| b != b'-').collect();
    let mut g = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16);
        g[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Some(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gfid_reads_and_writes_in_uuid_form() {
        let s = b"05eddcd2-25f9-4f55-9a9a-0dc4d9f2d4c7";
        let g = parse(s).unwrap();
        assert_eq!(g[0], 0x05);
        assert_eq!(g[15], 0xc7);
        assert_eq!(text(&g).as_bytes(), s);
        assert_eq!(parse(b"05eddcd2-25f9-4f55-9a9a-0dc4d9f2d4c7\0"), Some(g));
        assert_eq!(path(&ROOT), ".gfid/00000000-0000-0000-0000-000000000001");
        for bad in [
            &b"05eddcd2-25f9-4f55-9a9a-0dc4d9f2d4c"[..],
            b"05eddcd2x25f9-4f55-9a9a-0dc4d9f2d4c7",
            b"",
            b"../../../../../../../../../etc/pass",
        ] {
            assert_eq!(parse(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(parse(b"05eddcd2-25f9-4f55-9a9a-0dc4d9f2d4cg"), None);
    }

    #[test]
    fn an_id_carries_a_gfid_before_the_kernel_handle() {
        let g = parse(b"05eddcd2-25f9-4f55-9a9a-0dc4d9f2d4c7").unwrap();
        let handle = [1u8, 0, 0, 0, 9, 9];
        let id = id(&g, &handle);
        assert_eq!(split(&id), (Some(g), &handle[..]));
        assert_eq!(split(&id[..id.len() - handle.len()]), (Some(g), &[][..]));
        // A kernel handle's id is not one (its type is never negative).
        assert_eq!(split(&handle), (None, &handle[..]));
        // Cut short: nothing to use.
        assert_eq!(split(&id[..10]), (None, &[][..]));
        assert_eq!(split(b"ab"), (None, &b"ab"[..]));
    }
}
