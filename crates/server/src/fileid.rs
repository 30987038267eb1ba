//! Lasting identities of files (`name_to_handle_at`), and opening a file by
//! one (`open_by_handle_at`): how a client finds the same file again after
//! the server restarted, even if it was renamed meanwhile.
//!
//! An id is the handle type (`i32`, little-endian) followed by the handle's
//! bytes. Ids come back from clients, so they are untrusted: the kernel
//! checks a handle's generation, and the caller must check that the file
//! it opens lies inside the export. On GlusterFS, whose mounts do not
//! share handles, an id leads with the file's gfid (`gfid`).

use std::ffi::c_int;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use rustix::fs::OFlags;

use crate::backend::{Errno, Result};

/// Linux's `MAX_HANDLE_SZ`.
const MAX_HANDLE_SZ: usize = 128;

/// `struct file_handle` with room for the largest handle.
#[repr(C)]
struct HandleBuf {
    bytes: u32,
    typ: c_int,
    f: [u8; MAX_HANDLE_SZ],
}

/// The id of the open file `fd`, or `None` where the file system has no
/// handles (some FUSE file systems, `/proc`).
pub fn of(fd: BorrowedFd<'_>) -> Option<Vec<u8>> {
    let mut h = HandleBuf { bytes: MAX_HANDLE_SZ as u32, typ: 0, f: [0; MAX_HANDLE_SZ] };
    let mut mount_id: c_int = 0;
    // SAFETY: `h` is a `file_handle` header followed by the MAX_HANDLE_SZ
    // bytes its `handle_bytes` announces; the path is an empty C string,
    // which AT_EMPTY_PATH makes name `fd` itself; `mount_id` is writable.
    let r = unsafe {
        libc::name_to_handle_at(
            fd.as_raw_fd(),
            c"".as_ptr(),
            (&raw mut h).cast::<libc::file_handle>(),
            &mut mount_id,
            libc::AT_EMPTY_PATH,
        )
    };
    if r != 0 {
        return None;
    }
    let n = (h.bytes as usize).min(MAX_HANDLE_SZ);
    Some([&h.typ.to_le_bytes()[..], &h.f[..n]].concat())
}

/// Opens the file `id` names on the file system of `mount`. Needs
/// `CAP_DAC_READ_SEARCH` (`EPERM` without it); a removed file is `ESTALE`.
pub fn open(mount: BorrowedFd<'_>, id: &[u8], flags: OFlags) -> Result<OwnedFd> {
    let Some((typ, bytes)) = id.split_first_chunk::<4>() else { return Err(Errno::STALE) };
    if bytes.len() > MAX_HANDLE_SZ {
        return Err(Errno::STALE);
    }
    let mut h = HandleBuf { bytes: bytes.len() as u32, typ: c_int::from_le_bytes(*typ), f: [0; MAX_HANDLE_SZ] };
    h.f[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: `h` is a `file_handle` whose `handle_bytes` bytes follow it;
    // the kernel only reads it. The result is a new descriptor or -1.
    let fd = unsafe {
        libc::open_by_handle_at(mount.as_raw_fd(), (&raw mut h).cast::<libc::file_handle>(), flags.bits() as c_int)
    };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
