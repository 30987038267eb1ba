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

/// What one owner holds on one file, as `fcntl` leaves it (a lock over a
/// range replaces what the owner held there): kept by the client so that
/// a server that lost its locks (restarted, or another gateway) can be
/// asked for them again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Held {
    /// Disjoint inclusive ranges, `Read` or `Write`, with the pid to report.
    ranges: Vec<(u64, u64, LockType, u32)>,
}

impl Held {
    /// Records a granted lock or unlock.
    pub(crate) fn set(&mut self, spec: &LockSpec) {
        let (start, end) = match spec.kind {
            LockKind::Flock => (0, u64::MAX),
            _ if spec.len == 0 => (spec.start, u64::MAX),
            _ => (spec.start, spec.start.saturating_add(spec.len - 1)),
        };
        let mut out = Vec::with_capacity(self.ranges.len() + 2);
        for &(s, e, t, p) in &self.ranges {
            if e < start || s > end {
                out.push((s, e, t, p));
                continue;
            }
            if s < start {
                out.push((s, start - 1, t, p));
            }
            if e > end {
                out.push((end + 1, e, t, p));
            }
        }
        if spec.typ != LockType::Unlock {
            out.push((start, end, spec.typ, spec.pid));
        }
        self.ranges = out;
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The locks to take again to hold what is recorded.
    pub(crate) fn specs(&self, kind: LockKind) -> impl Iterator<Item = LockSpec> + '_ {
        self.ranges.iter().map(move |&(start, end, typ, pid)| {
            let len = if end == u64::MAX { 0 } else { end - start + 1 };
            LockSpec { kind, typ, start, len, pid }
        })
    }
}

/// The pause before attempt `n` (0-based) of a waiting lock: 1 ms doubling
/// to 50 ms, short enough that a released lock is taken soon, long enough
/// that a long wait costs the server little.
pub fn backoff(n: u32) -> Duration {
    Duration::from_millis((1u64 << n.min(6)).min(50))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(typ: LockType, start: u64, len: u64) -> LockSpec {
        LockSpec { kind: LockKind::Posix(1), typ, start, len, pid: 9 }
    }

    #[test]
    fn held_locks_follow_fcntl_replacement() {
        let mut h = Held::default();
        h.set(&spec(LockType::Write, 0, 0));
        h.set(&spec(LockType::Read, 10, 10));
        h.set(&spec(LockType::Unlock, 100, 0));
        let mut got: Vec<_> = h.specs(LockKind::Posix(1)).map(|s| (s.typ, s.start, s.len)).collect();
        got.sort_by_key(|x| x.1);
        assert_eq!(got, [(LockType::Write, 0, 10), (LockType::Read, 10, 10), (LockType::Write, 20, 80)]);
        h.set(&spec(LockType::Unlock, 0, 0));
        assert!(h.is_empty());
        let mut f = Held::default();
        f.set(&LockSpec { kind: LockKind::Flock, typ: LockType::Read, start: 5, len: 1, pid: 0 });
        assert_eq!(f.specs(LockKind::Flock).map(|s| (s.start, s.len)).collect::<Vec<_>>(), [(0, 0)]);
    }
}
