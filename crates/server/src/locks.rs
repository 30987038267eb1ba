//! Record locks, shared by every connection of a server.
//!
//! Where the backend has a descriptor of the file, each owner's locks are
//! also taken on the file itself (`ofd`), so gateways of one shared file
//! system exclude each other's clients; the table stays the record of who
//! holds what here (owners, process ids) and answers first. What is taken
//! on the file is never stronger than the handle asking could take with
//! `fcntl` itself: an exclusive lock through a handle not open for writing
//! (a `flock`, which needs no particular access) is a shared one there, so
//! a client that may only read a file cannot keep the host's readers from
//! locking it. Among this server's clients the table keeps it exclusive.
//!
//! Locks are kept per file identity (`dev`, `ino`), so locks taken through
//! different handles or connections on one file see each other. An owner is
//! a connection plus either a client-chosen process id (POSIX locks) or a
//! handle (OFD and `flock` locks); the connection part is where a future
//! session id goes. Requests never wait here: a conflict is answered at once
//! and the client retries (see PROTOCOL.md, "Waiting for a lock"), so no
//! connection thread is ever parked on a lock.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::ofd::Ofd;

/// A file's identity on the server: `(dev, ino)`.
pub type FileKey = (u64, u64);

/// The file itself, where the backend has a descriptor of it: a lock is
/// taken there too.
#[derive(Clone, Copy, Debug)]
pub struct OnFile<'a> {
    pub fd: BorrowedFd<'a>,
    /// Whether the handle the lock is asked through is open for writing:
    /// only then is an exclusive lock exclusive on the file (`F_WRLCK`
    /// needs a descriptor open for writing; the server's own, which could,
    /// must not lend that to a reader).
    pub writable: bool,
}

impl OnFile<'_> {
    /// The lock taken on the file for `mode` asked through this handle.
    fn mode(&self, mode: Mode) -> Mode {
        if self.writable {
            mode
        } else {
            Mode::Read
        }
    }
}

/// Who holds a lock, within one connection.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum OwnerId {
    /// A POSIX lock owner chosen by the client (a process).
    Process(u64),
    /// An OFD or `flock` lock: the handle (open file description).
    Handle(u64),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct Owner {
    pub conn: u64,
    pub id: OwnerId,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Read,
    Write,
}

/// One held lock over `start..=end` (`end = u64::MAX`: to the end of file).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Lock {
    pub owner: Owner,
    pub mode: Mode,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

impl Lock {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }

    fn conflicts(&self, owner: Owner, mode: Mode, start: u64, end: u64) -> bool {
        self.owner != owner && self.overlaps(start, end) && (mode == Mode::Write || self.mode == Mode::Write)
    }
}

/// Every lock held on the server.
#[derive(Default, Debug)]
pub struct LockTable {
    t: Mutex<Table>,
}

#[derive(Default, Debug)]
struct Table {
    files: HashMap<FileKey, Vec<Lock>>,
    /// Each owner's open file description of a file it holds locks on, where
    /// the file has a descriptor: closing it ends the owner's kernel locks.
    ofds: HashMap<(FileKey, Owner), Ofd>,
}

/// The owner of a lock taken elsewhere than on this server (seen through
/// the kernel): connection 0 is never a connection's.
const ELSEWHERE: Owner = Owner { conn: 0, id: OwnerId::Process(0) };

/// Connection ids for lock owners, unique for the server's life.
static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

pub fn new_conn_id() -> u64 {
    NEXT_CONN.fetch_add(1, Ordering::Relaxed)
}

/// The inclusive byte range of `start`/`len` (`len` 0: to the end of file),
/// or `None` beyond the largest file offset, as `fcntl` gives `EINVAL`.
pub fn range(start: u64, len: u64) -> Option<(u64, u64)> {
    const MAX: u64 = i64::MAX as u64;
    if start > MAX {
        return None;
    }
    if len == 0 {
        return Some((start, u64::MAX));
    }
    let end = start.checked_add(len - 1)?;
    (end <= MAX).then_some((start, end))
}

/// `start`/`len` of an inclusive range, `len` 0 reaching the end of file.
pub fn start_len(start: u64, end: u64) -> (u64, u64) {
    if end == u64::MAX {
        (start, 0)
    } else {
        (start, end - start + 1)
    }
}

impl LockTable {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // A panic while holding the table cannot leave it half-changed in a
        // way that matters more than losing every lock: keep going.
        self.t.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The first lock of another owner that conflicts with `mode` over the
    /// range: one of this server's, else (asked of the kernel through
    /// `file`, a descriptor of it, if there is one) one taken elsewhere,
    /// whose process id is not known here (0).
    pub fn test(
        &self,
        key: FileKey,
        owner: Owner,
        mode: Mode,
        start: u64,
        end: u64,
        file: Option<BorrowedFd<'_>>,
    ) -> Option<Lock> {
        let t = self.table();
        if let Some(l) = t.files.get(&key).and_then(|ls| ls.iter().find(|l| l.conflicts(owner, mode, start, end))) {
            return Some(*l);
        }
        // The owner's own description, so that its own locks are no conflict.
        let fd = t.ofds.get(&(key, owner)).map(Ofd::as_fd).or(file)?;
        let (mode, start, end) = crate::ofd::conflict(fd, mode, start, end).ok()??;
        Some(Lock { owner: ELSEWHERE, mode, start, end, pid: 0 })
    }

    /// Sets the owner's lock over the range to `mode` (`None` unlocks),
    /// replacing, splitting and merging what it held there as `fcntl` does,
    /// on the file itself too (as `OnFile::mode` says) when `file` is given.
    /// A conflict with another owner — here, or elsewhere as the kernel
    /// says — changes nothing and returns that lock.
    #[allow(clippy::too_many_arguments)]
    pub fn set(
        &self,
        key: FileKey,
        owner: Owner,
        mode: Option<Mode>,
        start: u64,
        end: u64,
        pid: u32,
        file: Option<OnFile<'_>>,
    ) -> Result<(), Lock> {
        let mut t = self.table();
        let Table { files, ofds } = &mut *t;
        let locks = files.entry(key).or_default();
        if let Some(m) = mode {
            if let Some(c) = locks.iter().find(|l| l.conflicts(owner, m, start, end)) {
                return Err(*c);
            }
        }
        // The kernel's turn. A description that cannot be had (no such
        // file any more, no access) leaves the lock to this table alone.
        if let Some(f) = file.filter(|_| mode.is_some() || ofds.contains_key(&(key, owner))) {
            let ofd = match ofds.entry((key, owner)) {
                Entry::Occupied(o) => Some(o.into_mut()),
                Entry::Vacant(v) => Ofd::open(f.fd).ok().map(|o| v.insert(o)),
            };
            if let Some(ofd) = ofd {
                let there = mode.map(|m| f.mode(m));
                if let Ok(false) = ofd.set(there, start, end) {
                    if locks.is_empty() {
                        files.remove(&key);
                    }
                    let m = there.unwrap_or(Mode::Write);
                    let held = crate::ofd::conflict(ofd.as_fd(), m, start, end).ok().flatten();
                    let (mode, start, end) = held.unwrap_or((m, start, end));
                    return Err(Lock { owner: ELSEWHERE, mode, start, end, pid: 0 });
                }
            }
        }
        carve(locks, owner, start, end);
        if let Some(mode) = mode {
            let (mut s, mut e) = (start, end);
            // After carving, the owner's same-mode locks can only touch the
            // new range at its edges: absorb them.
            locks.retain(|l| {
                if l.owner != owner || l.mode != mode {
                    return true;
                }
                if l.end.checked_add(1) == Some(s) {
                    s = l.start;
                    false
                } else if e.checked_add(1) == Some(l.start) {
                    e = l.end;
                    false
                } else {
                    true
                }
            });
            locks.push(Lock { owner, mode, start: s, end: e, pid });
        }
        if !locks.iter().any(|l| l.owner == owner) {
            ofds.remove(&(key, owner));
        }
        if locks.is_empty() {
            files.remove(&key);
        }
        Ok(())
    }

    /// Releases every lock of `owner` on `file`.
    pub fn release(&self, key: FileKey, owner: Owner) {
        let mut t = self.table();
        t.ofds.remove(&(key, owner));
        if let Some(locks) = t.files.get_mut(&key) {
            locks.retain(|l| l.owner != owner);
            if locks.is_empty() {
                t.files.remove(&key);
            }
        }
    }

    /// Releases every lock of a connection (it ended).
    pub fn release_conn(&self, conn: u64) {
        let mut t = self.table();
        t.ofds.retain(|(_, o), _| o.conn != conn);
        t.files.retain(|_, locks| {
            locks.retain(|l| l.owner.conn != conn);
            !locks.is_empty()
        });
    }

    /// Files with locks held (for metrics).
    pub fn files_locked(&self) -> usize {
        self.table().files.len()
    }

    /// The locks held on `file`, for tests.
    #[cfg(test)]
    pub fn held(&self, key: FileKey) -> Vec<Lock> {
        self.table().files.get(&key).cloned().unwrap_or_default()
    }
}

/// Removes the owner's hold on `start..=end`, keeping the parts of its
/// locks outside the range.
fn carve(locks: &mut Vec<Lock>, owner: Owner, start: u64, end: u64) {
    let mut kept = Vec::new();
    locks.retain(|l| {
        if l.owner != owner || !l.overlaps(start, end) {
            return true;
        }
        if l.start < start {
            kept.push(Lock { end: start - 1, ..*l });
        }
        if l.end > end {
            kept.push(Lock { start: end + 1, ..*l });
        }
        false
    });
    locks.extend(kept);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const F: FileKey = (1, 2);

    fn p(n: u64) -> Owner {
        Owner { conn: 1, id: OwnerId::Process(n) }
    }

    fn sorted(t: &LockTable) -> Vec<(Owner, Mode, u64, u64)> {
        let mut v: Vec<_> = t.held(F).iter().map(|l| (l.owner, l.mode, l.start, l.end)).collect();
        v.sort_by_key(|x| (x.2, x.3));
        v
    }

    #[test]
    fn split_merge_upgrade_and_unlock() {
        let t = LockTable::default();
        t.set(F, p(1), Some(Mode::Read), 0, 99, 1, None).unwrap();
        // A write lock in the middle splits the read lock in three.
        t.set(F, p(1), Some(Mode::Write), 10, 19, 1, None).unwrap();
        assert_eq!(sorted(&t), vec![(p(1), Mode::Read, 0, 9), (p(1), Mode::Write, 10, 19), (p(1), Mode::Read, 20, 99)]);
        // Downgrading it again merges everything back into one lock.
        t.set(F, p(1), Some(Mode::Read), 10, 19, 1, None).unwrap();
        assert_eq!(sorted(&t), vec![(p(1), Mode::Read, 0, 99)]);
        // Another owner may share a read lock but not write over it.
        t.set(F, p(2), Some(Mode::Read), 50, u64::MAX, 2, None).unwrap();
        let c = t.set(F, p(2), Some(Mode::Write), 90, 95, 2, None).unwrap_err();
        assert_eq!((c.owner, c.start, c.end), (p(1), 0, 99));
        assert_eq!(t.test(F, p(3), Mode::Write, 200, 300, None).map(|l| l.owner), Some(p(2)));
        t.set(F, p(1), None, 0, u64::MAX, 1, None).unwrap();
        t.set(F, p(2), Some(Mode::Write), 90, 95, 2, None).unwrap();
        t.release(F, p(2));
        assert!(t.held(F).is_empty());
    }

    /// Two servers (two tables) with a descriptor of one file: each one's
    /// owners are excluded by the other's locks, through the kernel, and
    /// ending an owner or a connection frees the file for the other.
    #[test]
    fn two_servers_of_one_file_exclude_each_other() {
        use std::os::fd::AsFd;
        let dir = std::env::temp_dir().join(format!("ferry-locks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f"), b"data").unwrap();
        let (fa, fb) = (std::fs::File::open(dir.join("f")).unwrap(), std::fs::File::open(dir.join("f")).unwrap());
        let (a, b) = (LockTable::default(), LockTable::default());
        let (on_a, on_b) =
            (Some(OnFile { fd: fa.as_fd(), writable: true }), Some(OnFile { fd: fb.as_fd(), writable: true }));
        a.set(F, p(1), Some(Mode::Read), 0, 9, 1, on_a).unwrap();
        b.set(F, p(1), Some(Mode::Read), 5, 20, 1, on_b).unwrap();
        let c = b.set(F, p(2), Some(Mode::Write), 0, 0, 2, on_b).unwrap_err();
        assert_eq!((c.mode, c.start, c.end, c.pid), (Mode::Read, 0, 9, 0), "conflict reported: {c:?}");
        assert!(b.held(F).iter().all(|l| l.owner == p(1)), "a refused lock was kept: {:?}", b.held(F));
        assert_eq!(
            b.test(F, p(2), Mode::Write, 0, 3, Some(fb.as_fd())).map(|l| (l.mode, l.start)),
            Some((Mode::Read, 0))
        );
        // An owner that unlocks, or whose connection ends, frees the file.
        a.set(F, p(1), None, 0, u64::MAX, 1, on_a).unwrap();
        b.set(F, p(2), Some(Mode::Write), 0, 3, 2, on_b).unwrap();
        assert!(a.set(F, p(1), Some(Mode::Read), 2, 2, 1, on_a).is_err());
        b.release_conn(p(2).conn);
        a.set(F, p(1), Some(Mode::Write), 0, 4, 1, on_a).unwrap();
        assert!(b.set(F, p(1), Some(Mode::Read), 4, 4, 1, on_b).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An exclusive lock through a handle open only for reading is shared
    /// on the file: the host's readers lock it still, its writers do not,
    /// and this server's other owners are kept out by the table.
    #[test]
    fn a_readers_exclusive_lock_is_shared_on_the_file() {
        use std::os::fd::AsFd;
        let dir = std::env::temp_dir().join(format!("ferry-locks-ro-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f"), b"data").unwrap();
        let f = std::fs::File::open(dir.join("f")).unwrap();
        let t = LockTable::default();
        let reader = Some(OnFile { fd: f.as_fd(), writable: false });
        t.set(F, p(1), Some(Mode::Write), 0, u64::MAX, 1, reader).unwrap();
        let host = Ofd::open(f.as_fd()).unwrap();
        assert!(host.set(Some(Mode::Read), 0, u64::MAX).unwrap(), "a host reader was kept out");
        assert!(host.set(None, 0, u64::MAX).unwrap());
        assert!(!host.set(Some(Mode::Write), 0, 0).unwrap(), "a host writer got past it");
        assert!(t.set(F, p(2), Some(Mode::Read), 0, 0, 2, reader).is_err(), "the table keeps it exclusive");
        // Through a handle open for writing, exclusive there too.
        t.set(F, p(1), None, 0, u64::MAX, 1, reader).unwrap();
        t.set(F, p(1), Some(Mode::Write), 0, u64::MAX, 1, Some(OnFile { fd: f.as_fd(), writable: true })).unwrap();
        assert!(!host.set(Some(Mode::Read), 0, 0).unwrap(), "a writer's exclusive lock let a host reader in");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_connection_ending_releases_its_locks_only() {
        let t = LockTable::default();
        let other = Owner { conn: 2, id: OwnerId::Handle(7) };
        t.set(F, p(1), Some(Mode::Write), 0, 0, 1, None).unwrap();
        t.set(F, other, Some(Mode::Write), 5, 5, 9, None).unwrap();
        t.release_conn(1);
        assert_eq!(sorted(&t), vec![(other, Mode::Write, 5, 5)]);
    }

    #[test]
    fn ranges() {
        assert_eq!(range(5, 0), Some((5, u64::MAX)));
        assert_eq!(range(5, 1), Some((5, 5)));
        assert_eq!(range(i64::MAX as u64, 2), None);
        assert_eq!(range(u64::MAX, 0), None);
        assert_eq!(start_len(5, u64::MAX), (5, 0));
        assert_eq!(start_len(5, 9), (5, 5));
    }

    /// Bytes 0..N of three owners, each byte unlocked, read- or write-locked.
    const N: usize = 24;
    type Model = [[Option<Mode>; N]; 3];

    fn model_of(t: &LockTable) -> Model {
        let mut m: Model = [[None; N]; 3];
        for l in t.held(F) {
            let OwnerId::Process(o) = l.owner.id else { unreachable!() };
            for b in l.start..=l.end.min(N as u64 - 1) {
                assert!(m[o as usize][b as usize].is_none(), "owner {o} holds byte {b} twice");
                m[o as usize][b as usize] = Some(l.mode);
            }
        }
        m
    }

    proptest! {
        /// The table against a byte-by-byte model: same conflicts, same
        /// bytes held, and an owner's locks never overlap and are merged.
        #[test]
        fn matches_a_byte_model(ops in proptest::collection::vec((0u64..3, 0u8..3, 0u64..N as u64 - 1, 0u64..8), 1..40)) {
            let t = LockTable::default();
            let mut model: Model = [[None; N]; 3];
            for (o, kind, start, len) in ops {
                let mode = match kind { 0 => Some(Mode::Read), 1 => Some(Mode::Write), _ => None };
                // len 0 is "to the end": the model's last byte stands for
                // everything from there on, which only such locks reach.
                let end = if len == 0 { u64::MAX } else { (start + len - 1).min(N as u64 - 2) };
                let last = end.min(N as u64 - 1) as usize;
                let conflict = mode.is_some() && (0..3).any(|other| other != o as usize && (start as usize..=last).any(|b| {
                    matches!((model[other][b], mode), (Some(Mode::Write), _) | (Some(_), Some(Mode::Write)))
                }));
                let got = t.set(F, p(o), mode, start, end, 0, None);
                prop_assert_eq!(got.is_err(), conflict);
                if !conflict {
                    model[o as usize][start as usize..=last].fill(mode);
                }
                prop_assert_eq!(model_of(&t), model);
                let mine: Vec<_> = t.held(F).into_iter().filter(|l| l.owner == p(o)).collect();
                for a in &mine {
                    for b in &mine {
                        if a != b && a.mode == b.mode {
                            prop_assert!(a.end.checked_add(1) != Some(b.start), "unmerged {:?} {:?}", a, b);
                        }
                    }
                }
            }
        }
    }
}
