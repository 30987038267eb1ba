//! Record locks on an open [`File`](crate::File): `fcntl` POSIX and OFD
//! locks and `flock`, kept by the server for all its clients.
//!
//! The server never waits: a conflicting lock is refused with `EAGAIN`, and
//! [`File::lock`](crate::File::lock) retries with a growing pause (see
//! PROTOCOL.md, "Waiting for a lock"). Callers that must stay interruptible
//! run their own loop around [`File::try_lock`](crate::File::try_lock) with
//! [`backoff`].

use std::time::Duration;

use ferry_proto::lock;

/// Which kind of lock, and who owns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    /// A POSIX (`F_SETLK`) lock owned by the given id (a process). Closing a
    /// handle does not release it: send an unlock of the whole file, as the
    /// POSIX close rule asks, or end the connection.
    Posix(u64),
    /// An open-file-description lock, owned by the handle and released
    /// when it is closed.
    Ofd,
    /// A whole-file lock owned by the handle, as `flock` takes (it
    /// conflicts with byte-range locks, as on NFS).
    Flock,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockType {
    Read,
    Write,
    Unlock,
}

/// A lock to take, change or release. `len` 0 reaches the end of the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockSpec {
    pub kind: LockKind,
    pub typ: LockType,
    pub start: u64,
    pub len: u64,
    /// Reported to others as the holder by [`File::get_lock`](crate::File::get_lock).
    pub pid: u32,
}

/// A lock that stands in the way (from [`File::get_lock`](crate::File::get_lock)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockHolder {
    /// `Read` or `Write`.
    pub typ: LockType,
    pub start: u64,
    /// 0: to the end of the file.
    pub len: u64,
    pub pid: u32,
}

impl LockSpec {
    /// Wire fields: `(owner, kind, type)`.
    pub(crate) fn wire(&self) -> (u64, u8, u8) {
        let (owner, kind) = match self.kind {
            LockKind::Posix(o) => (o, lock::POSIX),
            LockKind::Ofd => (0, lock::OFD),
            LockKind::Flock => (0, lock::FLOCK),
        };
        let typ = match self.typ {
            LockType::Read => lock::RDLCK,
            LockType::Write => lock::WRLCK,
            LockType::Unlock => lock::UNLCK,
        };
        (owner, kind, typ)
    }
}

pub(crate) fn typ_from_wire(t: u8) -> LockType {
    match t {
        lock::RDLCK => LockType::Read,
        lock::WRLCK => LockType::Write,
        _ => LockType::Unlock,
    }
}

/// The pause before attempt `n` (0-based) of a waiting lock: 1 ms doubling
/// to 50 ms, short enough that a released lock is taken soon, long enough
/// that a long wait costs the server little.
pub fn backoff(n: u32) -> Duration {
    Duration::from_millis((1u64 << n.min(6)).min(50))
}
