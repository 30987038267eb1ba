//! Linux's limits on what one call may carry, checked by a sender before it
//! encodes a request. The wire's length fields bound what can be encoded (a
//! name has a u16 length), so without this check a 70,000-byte path would
//! reach the encoder; with it, the caller gets the errno Linux gives.
//!
//! A path from the export root may be longer than `PATH_MAX` (a deep tree
//! reached one directory at a time, as through the FUSE mount); a sender
//! that speaks for a program's own path argument (`ferry run`) checks with
//! `PATH_MAX - 1` as Linux does.

use crate::msg::Request;
use crate::types::Target;

/// `PATH_MAX`: a path of this many bytes or more, counting its NUL, is
/// `ENAMETOOLONG`; so at most `PATH_MAX - 1` bytes travel.
pub const PATH_MAX: usize = 4096;
/// `NAME_MAX`: the longest component of a path.
pub const NAME_MAX: usize = 255;
/// `XATTR_NAME_MAX` and `XATTR_SIZE_MAX`.
pub const XATTR_NAME_MAX: usize = 255;
pub const XATTR_SIZE_MAX: usize = 65536;

/// Which limit a request broke; `errno()` is what Linux answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// A path or one of its components is too long (`ENAMETOOLONG`).
    NameTooLong,
    /// An xattr name is too long (`ERANGE`).
    XattrName,
    /// An xattr value is too large (`E2BIG`).
    XattrValue,
}

impl Limit {
    pub fn errno(self) -> i32 {
        match self {
            Limit::NameTooLong => 36, // ENAMETOOLONG
            Limit::XattrName => 34,   // ERANGE
            Limit::XattrValue => 7,   // E2BIG
        }
    }
}

fn path(p: &[u8], max: usize) -> Result<(), Limit> {
    if p.len() > max || p.split(|b| *b == b'/').any(|c| c.len() > NAME_MAX) {
        return Err(Limit::NameTooLong);
    }
    Ok(())
}

fn target(t: &Target<'_>, max: usize) -> Result<(), Limit> {
    match t {
        Target::Handle(_) => Ok(()),
        Target::Path(p) | Target::PathNoFollow(p) => path(p, max),
    }
}

fn xattr_name(n: &[u8]) -> Result<(), Limit> {
    if n.len() > XATTR_NAME_MAX {
        return Err(Limit::XattrName);
    }
    Ok(())
}

impl Request<'_> {
    /// Checks every path, name and value against Linux's limits, paths
    /// against the wire's (`MAX_PATH`). A request that passes always encodes.
    pub fn check_limits(&self) -> Result<(), Limit> {
        self.check_limits_with(crate::MAX_PATH)
    }

    /// `check_limits` with paths of at most `max_path` bytes (at most
    /// `MAX_PATH`; `PATH_MAX - 1` for a program's own path, as Linux).
    pub fn check_limits_with(&self, max_path: usize) -> Result<(), Limit> {
        let max = max_path.min(crate::MAX_PATH);
        let path = |p: &[u8]| path(p, max);
        let target = |t: &Target<'_>| target(t, max);
        match self {
            Request::Open { path: p, .. }
            | Request::OpenId { path: p, .. }
            | Request::OpenRead { path: p, .. }
            | Request::OpenCached { path: p, .. }
            | Request::CacheSet { path: p, .. }
            | Request::CacheGet { path: p }
            | Request::ListDir { path: p, .. }
            | Request::Reopen { path: p, .. }
            | Request::Mkdir { path: p, .. }
            | Request::Rmdir { path: p }
            | Request::Unlink { path: p }
            | Request::Readlink { path: p }
            | Request::Statfs { path: p }
            | Request::Mknod { path: p, .. }
            | Request::Access { path: p, .. } => path(p),
            Request::Rename { from, to, .. } | Request::Link { from, to } => path(from).and(path(to)),
            // A symlink's target is a string, not a path walked here: only
            // its length counts.
            Request::Symlink { target: t, path: p } => {
                if t.len() >= PATH_MAX {
                    return Err(Limit::NameTooLong);
                }
                path(p)
            }
            Request::Stat { target: t }
            | Request::Truncate { target: t, .. }
            | Request::Chmod { target: t, .. }
            | Request::Chown { target: t, .. }
            | Request::Utimens { target: t, .. }
            | Request::ListXattr { target: t, .. } => target(t),
            Request::GetXattr { target: t, name, .. } | Request::RemoveXattr { target: t, name } => {
                target(t).and(xattr_name(name))
            }
            Request::SetXattr { target: t, name, value, .. } => {
                target(t).and(xattr_name(name))?;
                if value.len() > XATTR_SIZE_MAX {
                    return Err(Limit::XattrValue);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_limits() {
        let ok = |p: &[u8]| Request::Unlink { path: p }.check_limits();
        assert_eq!(ok(&vec![b'a'; 255]), Ok(()));
        assert_eq!(ok(&vec![b'a'; 256]), Err(Limit::NameTooLong));
        let long: Vec<u8> = b"/abc".repeat(1023).into_iter().chain(*b"xyz").collect();
        assert_eq!(long.len(), 4095);
        assert_eq!(ok(&long), Ok(()));
        let program = |p: &[u8]| Request::Unlink { path: p }.check_limits_with(PATH_MAX - 1);
        assert_eq!(program(&long), Ok(()));
        assert_eq!(program(&[&long[..], b"q"].concat()), Err(Limit::NameTooLong));
        // From the export root, a deep tree's paths go past PATH_MAX.
        let deep: Vec<u8> = b"/abc".repeat(16_383).into_iter().chain(*b"xy").collect();
        assert_eq!(deep.len(), crate::MAX_PATH - 1);
        assert_eq!(ok(&deep), Ok(()));
        assert_eq!(ok(&[&deep[..], b"zz"].concat()), Err(Limit::NameTooLong));
        // Every request that carries a path checks it: one past the wire's
        // limit would not encode (the encoder panics on it).
        let over = vec![b'a'; crate::MAX_PATH + 10];
        let p = &over[..];
        for r in [
            Request::OpenCached { path: p, flags: 0, mode: 0, max: 0 },
            Request::CacheSet { path: p, policy: 0 },
            Request::CacheGet { path: p },
            Request::OpenRead { path: p, flags: 0, mode: 0, max: 0 },
            Request::OpenId { path: p, flags: 0, mode: 0 },
        ] {
            assert_eq!(r.check_limits(), Err(Limit::NameTooLong), "{r:?}");
        }
        assert_eq!(ok(&vec![b'/'; 70_000]), Err(Limit::NameTooLong));
        let big = vec![0u8; 65537];
        let set = Request::SetXattr { target: Target::Handle(1), name: b"user.x", value: &big, flags: 0 };
        assert_eq!(set.check_limits(), Err(Limit::XattrValue));
        let name = vec![b'n'; 256];
        assert_eq!(
            Request::RemoveXattr { target: Target::Handle(1), name: &name }.check_limits(),
            Err(Limit::XattrName)
        );
        assert_eq!(
            Request::Symlink { target: &vec![b'x'; 300], path: b"/l" }.check_limits(),
            Ok(()),
            "a target's components are not limited"
        );
    }
}
