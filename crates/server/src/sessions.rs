//! Sessions that outlive connections. A connection's state (open handles,
//! their offsets, record locks) is a [`Session`]; a client that asks for it
//! (`SessionNew`) gets it registered here under an id, and any later
//! connection that proves the session's secret (`SessionAttach`) shares it.
//! A session with no connection is kept for the lease, then dropped, which
//! closes its handles and releases its locks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::backend::{Backend, Errno};
use crate::journal::{Journal, Restored, SessionLog};
use crate::replay::Replies;
use crate::session::Session;

/// A session as connections hold it.
pub type Shared<B> = Arc<Session<B>>;

pub struct Sessions<B: Backend> {
    lease: Duration,
    st: Mutex<HashMap<u64, Entry<B>>>,
    /// Where sessions outlive the server process, if anywhere.
    journal: Option<Journal>,
}

struct Entry<B: Backend> {
    /// `None` for a session without handles (one a previous server process
    /// left, or a volatile one whose last connection left): made at the
    /// next attach, with the `pending` replies.
    session: Option<Shared<B>>,
    pending: Option<(Replies, Option<SessionLog>)>,
    /// `false` for a volatile session (`SessionNewVolatile`): handles,
    /// offsets and locks end with its last connection, replies do not.
    keeps_handles: bool,
    secret: [u8; 32],
    /// Capabilities the session was created with: a connection that joins
    /// must have negotiated the same, so every request means the same.
    caps: u64,
    attached: usize,
    /// When the last connection left.
    idle_since: Option<Instant>,
}

impl<B: Backend> Sessions<B> {
    pub fn new(lease: Duration) -> Self {
        Sessions { lease, st: Mutex::new(HashMap::new()), journal: None }
    }

    /// Sessions kept in `journal`, starting with those a previous server
    /// process left there (their lease starts now).
    pub fn with_journal(lease: Duration, journal: Journal, restored: Vec<Restored>) -> Self {
        let now = Instant::now();
        let st = restored
            .into_iter()
            .map(|r: Restored| {
                let log = journal.resume(&r).ok();
                let e = Entry {
                    session: None,
                    secret: r.secret,
                    caps: r.caps,
                    attached: 0,
                    idle_since: Some(now),
                    pending: Some((Replies::restored(r.replies, r.unknown), log)),
                    keeps_handles: true,
                };
                (r.id, e)
            })
            .collect();
        Sessions { lease, st: Mutex::new(st), journal: Some(journal) }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Entry<B>>> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The key the server's file ids are sealed with: kept with its
    /// sessions when it keeps them, so that ids outlive a restart.
    pub fn seals(&self) -> crate::fileseal::Seals {
        match &self.journal {
            Some(j) => crate::fileseal::Seals::with_key(&j.key()),
            None => crate::fileseal::Seals::default(),
        }
    }

    /// Sessions held, connected or not.
    pub fn count(&self) -> usize {
        self.st.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Registers a connection's session; it counts as attached once.
    pub fn create(&self, session: Shared<B>, secret: [u8; 32], caps: u64, keeps_handles: bool) -> u64 {
        let mut st = self.lock();
        let id = loop {
            let mut b = [0u8; 8];
            // A weak id only makes a collision likelier; the secret guards it.
            let _ = getrandom::getrandom(&mut b);
            let id = u64::from_le_bytes(b);
            if id != 0 && !st.contains_key(&id) {
                break id;
            }
        };
        if let Some(j) = &self.journal {
            match j.session(id, &secret, caps) {
                Ok(log) => session.once().log = Some(log),
                Err(e) => tracing::warn!("session state not kept (exactly-once only within this process): {e}"),
            }
        }
        let e =
            Entry { session: Some(session), secret, caps, attached: 1, idle_since: None, pending: None, keeps_handles };
        st.insert(id, e);
        id
    }

    /// Joins session `id` if `proves(secret)` holds: `ESTALE` for a session
    /// that does not exist (never, or no longer: lease over, server
    /// restarted without its state), `EACCES` for a wrong proof, `EINVAL`
    /// for other caps. A session a previous server process left is made
    /// now by `make`, with its reply cache.
    pub fn attach(
        &self,
        id: u64,
        caps: u64,
        proves: impl Fn(&[u8; 32]) -> bool,
        make: impl FnOnce() -> Session<B>,
    ) -> Result<Shared<B>, Errno> {
        let mut st = self.lock();
        let e = st.get_mut(&id).ok_or(Errno(libc::ESTALE))?;
        if !proves(&e.secret) {
            return Err(Errno::ACCES);
        }
        if e.caps != caps {
            return Err(Errno::INVAL);
        }
        let session = match &e.session {
            Some(s) => Arc::clone(s),
            None => {
                let s = make();
                if let Some((replies, log)) = e.pending.take() {
                    let mut once = s.once();
                    once.replies = replies;
                    once.log = log;
                }
                let s = Arc::new(s);
                e.session = Some(Arc::clone(&s));
                s
            }
        };
        e.attached += 1;
        e.idle_since = None;
        Ok(session)
    }

    /// A connection of session `id` ended.
    pub fn detach(&self, id: u64) {
        let mut st = self.lock();
        if let Some(e) = st.get_mut(&id) {
            e.attached = e.attached.saturating_sub(1);
            if e.attached == 0 {
                e.idle_since = Some(Instant::now());
                if !e.keeps_handles {
                    // Its handles and locks go with the last reference
                    // (the leaving connection's); its replies stay.
                    if let Some(s) = e.session.take() {
                        let mut g = s.once();
                        e.pending = Some((std::mem::take(&mut g.replies), g.log.take()));
                    }
                }
            }
        }
    }

    /// Drops session `id` at once, its lease or connections notwithstanding
    /// (it was fenced: its client moved to another gateway). Its handles
    /// close and its locks go with the last connection's hold of it.
    pub fn drop_fenced(&self, id: u64) {
        let gone = self.lock().remove(&id);
        if gone.is_some() {
            if let Some(j) = &self.journal {
                j.forget(id);
            }
        }
    }

    /// Drops sessions whose lease ran out; returns how many.
    pub fn reap(&self, now: Instant) -> usize {
        let expired: Vec<(u64, Entry<B>)> = {
            let mut st = self.lock();
            let ids: Vec<u64> = st
                .iter()
                .filter(|(_, e)| e.idle_since.is_some_and(|t| now.saturating_duration_since(t) >= self.lease))
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| st.remove(id).map(|e| (*id, e))).collect()
        };
        if let Some(j) = &self.journal {
            for (id, _) in &expired {
                j.forget(*id);
            }
        }
        // Closing handles happens here, outside the table's lock.
        expired.len()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryBackend;
    use crate::session::{HandleBudget, Policy};

    fn make() -> Session<MemoryBackend> {
        Arc::try_unwrap(session()).ok().unwrap()
    }

    fn session() -> Shared<MemoryBackend> {
        let policy = Policy {
            budget: Arc::new(HandleBudget::new(100)),
            read_only: false,
            allow_devices: false,
            max_handles: 10,
            caps: 0,
            max_read: 1 << 20,
            locks: Arc::default(),
            changes: Arc::default(),
            dirs: Arc::default(),
            seals: Arc::default(),
        };
        Arc::new(Session::new(Arc::new(MemoryBackend::new()), policy))
    }

    #[test]
    fn attach_needs_the_secret_and_the_same_caps() {
        let t = Sessions::new(Duration::from_secs(60));
        let id = t.create(session(), [7; 32], 3, true);
        assert_eq!(t.attach(id, 3, |s| s == &[7; 32], make).map(|_| ()), Ok(()));
        assert_eq!(t.attach(id, 3, |s| s == &[8; 32], make).map(|_| ()), Err(Errno::ACCES));
        assert_eq!(t.attach(id, 1, |_| true, make).map(|_| ()), Err(Errno::INVAL));
        assert_eq!(t.attach(id ^ 1, 3, |_| true, make).map(|_| ()), Err(Errno(libc::ESTALE)));
    }

    #[test]
    fn a_session_outlives_its_connections_for_the_lease_only() {
        let t = Sessions::new(Duration::from_secs(60));
        let id = t.create(session(), [1; 32], 0, true);
        let now = Instant::now();
        assert_eq!(t.reap(now + Duration::from_secs(3600)), 0, "attached sessions never expire");
        t.detach(id);
        assert_eq!(t.reap(now + Duration::from_secs(30)), 0);
        assert!(t.attach(id, 0, |_| true, make).is_ok(), "within the lease the session is there");
        t.detach(id);
        assert_eq!(t.reap(Instant::now() + Duration::from_secs(61)), 1);
        assert_eq!(t.len(), 0);
        assert_eq!(t.attach(id, 0, |_| true, make).map(|_| ()), Err(Errno(libc::ESTALE)));
    }

    #[test]
    fn a_volatile_session_keeps_only_its_replies_when_its_connection_leaves() {
        let t = Sessions::new(Duration::from_secs(60));
        let first = session();
        first.once().replies.keep(5, 9, 1, vec![42]);
        let id = t.create(Arc::clone(&first), [1; 32], 0, false);
        t.detach(id);
        assert_eq!(Arc::strong_count(&first), 1, "the table let go of its handles");
        let again = t.attach(id, 0, |_| true, make).unwrap();
        assert!(!Arc::ptr_eq(&first, &again), "a new session");
        assert_eq!(again.once().replies.get(5, 9, 1), Some((&[42u8][..], false)));
    }
}
