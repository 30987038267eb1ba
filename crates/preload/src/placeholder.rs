//! Placeholder fds: every remote file gets a real kernel fd, a sealed,
//! empty memfd. Its number can never collide with a local file; a call
//! that escapes interception reads end-of-file or fails with `EPERM`
//! instead of touching some other file; its kernel offset is the remote
//! file's offset, shared by `dup`, `fork` and `exec` as POSIX says; and an
//! extended attribute on it tells a new program (after `exec`) what it is.

use libc::c_int;

use crate::real;

const NAME: &[u8] = b"ferry\0";
const XATTR: &[u8] = b"user.ferry\0";
const MAGIC: &str = "ferry2";

/// What an inherited placeholder stands for.
#[derive(Debug, PartialEq, Eq)]
pub struct Described {
    pub prefix: String,
    pub url: String,
    /// Paths are bytes (names need not be UTF-8; they may hold newlines):
    /// stored in hex.
    pub path: Vec<u8>,
    pub local: Vec<u8>,
    pub flags: i32,
    pub dir: bool,
}

fn hex(b: &[u8]) -> String {
    // Every open and `opendir` writes two paths: no allocation per byte.
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 * b.len());
    for x in b {
        s.push(DIGITS[usize::from(x >> 4)] as char);
        s.push(DIGITS[usize::from(x & 15)] as char);
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

impl Described {
    fn encode(&self) -> String {
        format!(
            "{MAGIC}\n{}\n{}\n{}\n{}\n{}\n{}",
            self.prefix,
            self.url,
            hex(&self.path),
            hex(&self.local),
            self.flags,
            self.dir as u8
        )
    }

    fn decode(s: &str) -> Option<Described> {
        let mut it = s.split('\n');
        if it.next()? != MAGIC {
            return None;
        }
        Some(Described {
            prefix: it.next()?.to_string(),
            url: it.next()?.to_string(),
            path: unhex(it.next()?)?,
            local: unhex(it.next()?)?,
            flags: it.next()?.parse().ok()?,
            dir: it.next()? == "1",
        })
    }
}

/// A new placeholder fd (close-on-exec if `cloexec`).
pub fn create(d: &Described, cloexec: bool) -> Result<c_int, i32> {
    let mut flags = libc::MFD_ALLOW_SEALING;
    if cloexec {
        flags |= libc::MFD_CLOEXEC;
    }
    // SAFETY: NAME is NUL-terminated.
    let fd = unsafe { libc::memfd_create(NAME.as_ptr().cast(), flags) };
    if fd < 0 {
        return Err(crate::guard::errno());
    }
    let blob = d.encode();
    // SAFETY: fd is ours; the name and value buffers are valid for the call.
    let r = unsafe { libc::fsetxattr(fd, XATTR.as_ptr().cast(), blob.as_ptr().cast(), blob.len(), 0) };
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: fd is ours; F_ADD_SEALS takes an int argument.
    let s = unsafe { real::fcntl(fd, libc::F_ADD_SEALS, seals as usize) };
    if r < 0 || s < 0 {
        let e = crate::guard::errno();
        // SAFETY: closing the fd we just made.
        unsafe { real::close(fd) };
        return Err(e);
    }
    Ok(fd)
}

/// If `fd` is a ferry placeholder (inherited across `exec`), what it is.
pub fn describe(fd: c_int) -> Option<Described> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    if !link.to_string_lossy().starts_with("/memfd:ferry") {
        return None;
    }
    // Two hex-encoded paths of up to PATH_MAX each fit.
    let mut buf = vec![0u8; 65536];
    // SAFETY: buf is valid for buf.len() bytes.
    let n = unsafe { libc::fgetxattr(fd, XATTR.as_ptr().cast(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return None;
    }
    buf.truncate(n as usize);
    Described::decode(std::str::from_utf8(&buf).ok()?)
}

/// The offset of the open file description behind `fd`.
pub fn offset(fd: c_int) -> Result<u64, i32> {
    // SAFETY: lseek on an fd has no memory-safety preconditions.
    let r = unsafe { real::lseek64(fd, 0, libc::SEEK_CUR) };
    if r < 0 {
        Err(crate::guard::errno())
    } else {
        Ok(r as u64)
    }
}

pub fn set_offset(fd: c_int, off: u64) -> Result<(), i32> {
    let off = i64::try_from(off).map_err(|_| libc::EOVERFLOW)?;
    // SAFETY: as above.
    let r = unsafe { real::lseek64(fd, off, libc::SEEK_SET) };
    if r < 0 {
        Err(crate::guard::errno())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn description_round_trips() {
        let d = Described {
            prefix: "/remote".into(),
            url: "ferry://127.0.0.1:7070/x".into(),
            path: b"/x/a b\xff\nc".to_vec(),
            local: b"/remote/a b\xff\nc".to_vec(),
            flags: libc::O_WRONLY | libc::O_APPEND,
            dir: false,
        };
        assert_eq!(Described::decode(&d.encode()), Some(d));
        assert_eq!(Described::decode("other\n"), None);
    }
}
