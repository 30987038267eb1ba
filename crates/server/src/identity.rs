//! Acting as the user who asked (capability `IDENTITY`, PROTOCOL.md 8.8):
//! a caller's claimed ids, mapped and squashed by the export's policy, and
//! the switch of the serving thread's ids to them, so that the kernel
//! checks every permission and gives new files their owner.
//!
//! The switch is per thread (the raw system calls, not libc's, which would
//! change every thread of the process): each connection's thread serves
//! its own requests, so it can wear its caller's ids while a neighbour
//! wears another's.

use ferry_proto::Request;
use rustix::process::{Gid, Uid};

/// How a server turns claimed ids into the ids it acts with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// uid 0 becomes `anon_uid`, gid 0 `anon_gid` (NFS's `root_squash`).
    pub squash_root: bool,
    pub anon_uid: u32,
    pub anon_gid: u32,
    /// Client uid → server uid, for machines whose ids differ.
    pub uid_map: Vec<(u32, u32)>,
    pub gid_map: Vec<(u32, u32)>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy { squash_root: true, anon_uid: 65534, anon_gid: 65534, uid_map: Vec::new(), gid_map: Vec::new() }
    }
}

/// The ids a request runs with.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Creds {
    pub uid: u32,
    pub gid: u32,
    /// Sorted, without duplicates.
    pub groups: Vec<u32>,
}

/// The id the kernel reads as "leave unchanged" (`setresuid(2)`): never a
/// caller's.
pub const UNCHANGED: u32 = u32::MAX;

impl Policy {
    /// The ids to act with for a caller who claims `uid`, `gid`, `groups`;
    /// `EINVAL` for a claim of (uint32)−1, which no user has and which the
    /// kernel would read as "keep the ids the thread wears".
    pub fn resolve(&self, uid: u32, gid: u32, groups: impl IntoIterator<Item = u32>) -> Result<Creds, crate::Errno> {
        let groups: Vec<u32> = groups.into_iter().collect();
        if uid == UNCHANGED || gid == UNCHANGED || groups.contains(&UNCHANGED) {
            return Err(crate::Errno::INVAL);
        }
        let map = |m: &[(u32, u32)], id: u32| m.iter().find(|(c, _)| *c == id).map_or(id, |(_, s)| *s);
        let uid = match map(&self.uid_map, uid) {
            0 if self.squash_root => self.anon_uid,
            UNCHANGED => self.anon_uid,
            u => u,
        };
        let group = |g: u32| match map(&self.gid_map, g) {
            0 if self.squash_root => self.anon_gid,
            UNCHANGED => self.anon_gid,
            g => g,
        };
        let gid = group(gid);
        let mut groups: Vec<u32> = groups.into_iter().map(group).collect();
        groups.sort_unstable();
        groups.dedup();
        Ok(Creds { uid, gid, groups })
    }

    /// Whom a request that names no caller acts for: the anonymous user
    /// (root only where the export lets clients be root).
    pub fn nobody_named(&self) -> Creds {
        if self.squash_root {
            Creds { uid: self.anon_uid, gid: self.anon_gid, groups: Vec::new() }
        } else {
            Creds { uid: 0, gid: 0, groups: Vec::new() }
        }
    }

    /// Refuses a policy that would make someone (uint32)−1.
    pub fn check(&self) -> Result<(), String> {
        let bad = [self.anon_uid, self.anon_gid]
            .into_iter()
            .chain(self.uid_map.iter().chain(&self.gid_map).flat_map(|&(c, s)| [c, s]))
            .any(|id| id == UNCHANGED);
        if bad {
            return Err(format!("{UNCHANGED} is not an id: the kernel reads it as \"unchanged\""));
        }
        Ok(())
    }
}

/// Whose ids a request runs with, when the server acts as callers.
#[derive(Debug, PartialEq, Eq)]
pub enum ActsAs {
    /// Its caller's, named by a slot (unknown: `ENOKEY`, before anything
    /// runs), or the anonymous user's without one: it names files, changes
    /// them, or opens one.
    Caller,
    /// Its caller's if the slot is known, else the anonymous user's: it
    /// uses an open handle, whose open made the checks, but what it does
    /// still depends on who does it (a write clears set-id bits, a
    /// directory listing's attributes need search permission).
    Handle,
    /// Whatever the thread wears: a positional read of an open handle,
    /// which the kernel checks nothing more for.
    Any,
}

pub fn acts_as(req: &Request<'_>) -> ActsAs {
    match req {
        Request::Pread { .. } | Request::Ping | Request::LeaseOn | Request::LeaseReturn { .. } => ActsAs::Any,
        Request::Close { .. }
        | Request::Read { .. }
        | Request::Write { .. }
        | Request::Pwrite { .. }
        | Request::Seek { .. }
        | Request::Fsync { .. }
        | Request::ReadDir { .. }
        | Request::FileFd { .. }
        | Request::Lock { .. }
        | Request::GetLock { .. } => ActsAs::Handle,
        _ => ActsAs::Caller,
    }
}

/// Parses `CLIENT=SERVER` (an id map entry).
pub fn parse_map(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("'{s}': expected CLIENT_ID=SERVER_ID, e.g. 1000=1500");
    let (c, v) = s.split_once('=').ok_or_else(bad)?;
    Ok((c.trim().parse().map_err(|_| bad())?, v.trim().parse().map_err(|_| bad())?))
}

/// The ids the serving thread wears now. The server's own ids are the
/// thread's real and saved ids throughout, so it can always come back.
pub struct ThreadCreds {
    own: Creds,
    now: Option<Creds>,
}

impl Default for ThreadCreds {
    fn default() -> Self {
        Self::new()
    }
}

impl ThreadCreds {
    /// For the calling thread, which wears the process's ids.
    pub fn new() -> Self {
        let groups = rustix::process::getgroups().unwrap_or_default().iter().map(|g| g.as_raw()).collect();
        let own = Creds { uid: rustix::process::geteuid().as_raw(), gid: rustix::process::getegid().as_raw(), groups };
        ThreadCreds { own, now: None }
    }

    /// Switches this thread to `c` (nothing to do if it wears them): the
    /// groups, the real, effective and saved group ids and the effective
    /// user id are all the caller's, set afresh from `c`, never kept from
    /// an earlier request. The real and saved user ids stay the server's:
    /// that is what lets the thread come back, and what keeps a user of the
    /// server's host from signalling a thread that wears their uid (the
    /// kernel lets a process signal one whose real or saved uid is its
    /// own). Checks that would judge the real uid (`access`) are made with
    /// `AT_EACCESS`.
    pub fn wear(&mut self, c: &Creds) -> std::io::Result<()> {
        let current = self.now.as_ref().unwrap_or(&self.own);
        if current == c {
            return Ok(());
        }
        // Back to the server's uid first: changing groups and the group ids
        // needs CAP_SETGID, which a thread wearing another uid has not. From
        // here until the switch is whole the thread counts as wearing its
        // own ids; a failure half-way goes back to them whole.
        if current.uid != self.own.uid {
            rustix::thread::set_thread_res_uid(None, Uid::from_raw(self.own.uid), None)?;
        }
        self.now = None;
        let switched = Self::switch(c);
        if switched.is_err() {
            let own = self.own.clone();
            // The connection ends on the error; this keeps the thread from
            // leaving with ids half switched whatever the second try says.
            let _ = Self::switch(&own);
            return switched;
        }
        if *c != self.own {
            self.now = Some(c.clone());
        }
        Ok(())
    }

    fn switch(c: &Creds) -> std::io::Result<()> {
        let groups: Vec<Gid> = c.groups.iter().map(|&g| Gid::from_raw(g)).collect();
        let gid = Gid::from_raw(c.gid);
        rustix::thread::set_thread_groups(&groups)?;
        rustix::thread::set_thread_res_gid(gid, gid, gid)?;
        rustix::thread::set_thread_res_uid(None, Uid::from_raw(c.uid), None)?;
        Ok(())
    }

    /// Back to the server's own ids (for its own files: the journal).
    pub fn wear_own(&mut self) -> std::io::Result<()> {
        if self.now.is_none() {
            return Ok(());
        }
        let own = self.own.clone();
        self.wear(&own)
    }
}

impl Drop for ThreadCreds {
    fn drop(&mut self) {
        // The thread may serve someone else next (or be reused): leave it
        // as it was found.
        let _ = self.wear_own();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_squashed_unless_allowed_and_maps_apply_first() {
        let p = Policy { uid_map: vec![(1000, 1500)], gid_map: vec![(1000, 0)], ..Policy::default() };
        assert_eq!(p.resolve(0, 0, [0, 5, 5]), Ok(Creds { uid: 65534, gid: 65534, groups: vec![5, 65534] }));
        assert_eq!(p.resolve(1000, 1000, [27]), Ok(Creds { uid: 1500, gid: 65534, groups: vec![27] }));
        assert_eq!(p.nobody_named(), Creds { uid: 65534, gid: 65534, groups: vec![] });
        let open = Policy { squash_root: false, ..Policy::default() };
        assert_eq!(open.nobody_named(), Creds { uid: 0, gid: 0, groups: vec![] });
        assert_eq!(open.resolve(0, 0, [0]), Ok(Creds { uid: 0, gid: 0, groups: vec![0] }));
        assert_eq!(parse_map("7=9"), Ok((7, 9)));
        assert!(parse_map("7:9").is_err());
        assert!(Policy { anon_uid: UNCHANGED, ..Policy::default() }.check().is_err());
        assert!(Policy { gid_map: vec![(5, UNCHANGED)], ..Policy::default() }.check().is_err());
        assert!(Policy::default().check().is_ok());
    }

    proptest::proptest! {
        /// Whatever a client claims, the ids acted with are never (uint32)−1,
        /// and never root's (uid, gid or a group 0) where root is squashed.
        #[test]
        fn no_claim_acts_as_root_or_unchanged(
            uid in proptest::prop_oneof![proptest::strategy::Just(0u32), proptest::strategy::Just(UNCHANGED), proptest::strategy::Just(UNCHANGED - 1), proptest::num::u32::ANY],
            gid in proptest::prop_oneof![proptest::strategy::Just(0u32), proptest::strategy::Just(UNCHANGED), proptest::num::u32::ANY],
            groups in proptest::collection::vec(proptest::prop_oneof![proptest::strategy::Just(0u32), proptest::strategy::Just(UNCHANGED), proptest::num::u32::ANY], 0..6),
            squash in proptest::bool::ANY,
        ) {
            let p = Policy { squash_root: squash, ..Policy::default() };
            let claimed_unchanged = uid == UNCHANGED || gid == UNCHANGED || groups.contains(&UNCHANGED);
            match p.resolve(uid, gid, groups.iter().copied()) {
                Err(_) => proptest::prop_assert!(claimed_unchanged),
                Ok(c) => {
                    proptest::prop_assert!(!claimed_unchanged);
                    let all: Vec<u32> = [c.uid, c.gid].into_iter().chain(c.groups.iter().copied()).collect();
                    proptest::prop_assert!(!all.contains(&UNCHANGED));
                    if squash {
                        proptest::prop_assert!(!all.contains(&0), "{c:?}");
                    }
                }
            }
        }
    }
}
