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

impl Policy {
    /// The ids to act with for a caller who claims `uid`, `gid`, `groups`.
    pub fn resolve(&self, uid: u32, gid: u32, groups: impl IntoIterator<Item = u32>) -> Creds {
        let map = |m: &[(u32, u32)], id: u32| m.iter().find(|(c, _)| *c == id).map_or(id, |(_, s)| *s);
        let uid = match map(&self.uid_map, uid) {
            0 if self.squash_root => self.anon_uid,
            u => u,
        };
        let group = |g: u32| match map(&self.gid_map, g) {
            0 if self.squash_root => self.anon_gid,
            g => g,
        };
        let gid = group(gid);
        let mut groups: Vec<u32> = groups.into_iter().map(group).collect();
        groups.sort_unstable();
        groups.dedup();
        Creds { uid, gid, groups }
    }

    /// What a request that names no caller runs as: root, squashed.
    pub fn nobody_named(&self) -> Creds {
        self.resolve(0, 0, [])
    }
}

/// Whose ids a request runs with.
pub enum ActsAs {
    /// Its caller's: it names files, or changes them.
    Caller,
    /// The server's: the file was opened, with its checks, already, and
    /// the server opens it again (`Reopen`, the lock's own open file
    /// description).
    Server,
    /// Any: it uses an open handle, which checks nothing more.
    Anyone,
}

pub fn acts_as(req: &Request<'_>) -> ActsAs {
    match req {
        Request::Reopen { .. } | Request::Lock { .. } | Request::GetLock { .. } => ActsAs::Server,
        Request::Close { .. }
        | Request::Read { .. }
        | Request::Write { .. }
        | Request::Pread { .. }
        | Request::Pwrite { .. }
        | Request::Seek { .. }
        | Request::Fsync { .. }
        | Request::ReadDir { .. }
        | Request::FileFd { .. }
        | Request::Ping => ActsAs::Anyone,
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

    /// Switches this thread to `c` (nothing to do if it wears them).
    pub fn wear(&mut self, c: &Creds) -> std::io::Result<()> {
        let current = self.now.as_ref().unwrap_or(&self.own);
        if current == c {
            return Ok(());
        }
        // Back to root first: changing groups and the group id needs
        // CAP_SETGID, which a thread wearing another uid has not.
        if current.uid != self.own.uid {
            rustix::thread::set_thread_res_uid(None, Uid::from_raw(self.own.uid), None)?;
        }
        self.now = None;
        let groups: Vec<Gid> = c.groups.iter().map(|&g| Gid::from_raw(g)).collect();
        rustix::thread::set_thread_groups(&groups)?;
        rustix::thread::set_thread_res_gid(None, Gid::from_raw(c.gid), None)?;
        rustix::thread::set_thread_res_uid(None, Uid::from_raw(c.uid), None)?;
        if *c != self.own {
            self.now = Some(c.clone());
        }
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
        assert_eq!(p.resolve(0, 0, [0, 5, 5]), Creds { uid: 65534, gid: 65534, groups: vec![5, 65534] });
        assert_eq!(p.resolve(1000, 1000, [27]), Creds { uid: 1500, gid: 65534, groups: vec![27] });
        let open = Policy { squash_root: false, ..Policy::default() };
        assert_eq!(open.nobody_named(), Creds { uid: 0, gid: 0, groups: vec![] });
        assert_eq!(parse_map("7=9"), Ok((7, 9)));
        assert!(parse_map("7:9").is_err());
    }
}
