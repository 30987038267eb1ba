//! Requests of one connection side by side. A connection is served by one
//! thread that reads a request, runs it and replies, so nothing changes
//! threads on the way (ATOMIC). But one request that waits — a stalled
//! network file system under a gateway, a huge directory, a disk under
//! load — would hold up every request behind it, and a client sends all
//! its threads' requests (all users of a mount) on one connection.
//!
//! So the event loop's watchdog looks each [`TICK`] at the connections its
//! workers are serving (not at every connection: 5,000 idle ones made a
//! scan of them all a millisecond of every ten): one whose request has run
//! for a tick with no worker reading the socket gets another worker, which
//! reads on and runs what follows beside the slow request — as long as
//! what follows may overtake it ([`Kind`], the rules of PROTOCOL.md section
//! 10). A fast connection never meets a second worker.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use ferry_proto::Request;

/// How long a request runs before what follows it may run beside it.
pub const TICK: Duration = Duration::from_millis(10);

/// Threads serving one connection at most (its first included).
pub const MAX_THREADS: usize = 8;

/// What a request means for those around it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kind {
    /// The handle it uses: requests on one handle run in order (its
    /// offset, and a commit covers the writes before it).
    handle: Option<u64>,
    /// Nothing sent after it may start before it ends: data writes, which
    /// clients send without waiting for the reply (write behind),
    /// counting on every later request seeing them. (A client sends a
    /// `Close` without waiting only for a read-only handle that holds no
    /// lock, which nothing later can tell closed or not.)
    barrier: bool,
    /// Runs with nothing beside it: it changes the connection itself
    /// (sessions, caller slots, descriptors passed).
    alone: bool,
}

impl Kind {
    pub fn of(req: &Request<'_>) -> Kind {
        let handle = req.handle();
        let barrier = matches!(req, Request::Write { .. } | Request::Pwrite { .. });
        let alone = matches!(
            req,
            Request::SessionNew
                | Request::SessionNewVolatile
                | Request::SessionAttach { .. }
                | Request::SessionFence { .. }
                | Request::Caller { .. }
                | Request::FileFd { .. }
                | Request::LocalAddr
        );
        Kind { handle, barrier, alone }
    }

    /// A request of this kind may start while `earlier` still runs.
    fn may_pass(&self, earlier: &Kind) -> bool {
        !(self.alone || earlier.alone || earlier.barrier || (self.handle.is_some() && self.handle == earlier.handle))
    }
}

/// One connection's requests and threads.
pub struct Turns {
    running: Mutex<Running>,
    done: Condvar,
    /// Requests started, a ticket each.
    started: AtomicU64,
    /// What the watchdog saw of `started` at its previous look.
    seen: AtomicU64,
    /// A thread holds the socket for reading (waits for the next request).
    reading: AtomicBool,
    /// The connection ended (a thread found out): the others stop.
    over: AtomicBool,
    threads: AtomicUsize,
    /// Starts another thread for the connection; taken when it ends.
    grow: Mutex<Option<Box<dyn Fn() -> bool + Send>>>,
    /// Counts the reading turns given away by the watchdog: on the event
    /// loop the worker of a slow request keeps reading afterwards only if
    /// it still holds the turn it started with (`resume`).
    rights: Mutex<u64>,
}

#[derive(Default)]
struct Running {
    list: Vec<(u64, Kind)>,
    /// A request waits to start (told when one ends).
    waiting: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Turns {
    /// A connection's, served by its first thread; `grow` starts another.
    pub fn new() -> Arc<Turns> {
        Arc::new(Turns {
            running: Mutex::default(),
            done: Condvar::new(),
            started: AtomicU64::new(0),
            seen: AtomicU64::new(0),
            reading: AtomicBool::new(false),
            over: AtomicBool::new(false),
            threads: AtomicUsize::new(1),
            grow: Mutex::new(None),
            rights: Mutex::new(0),
        })
    }

    /// Lets the watchdog add threads to this connection.
    pub fn watch(&self, grow: Box<dyn Fn() -> bool + Send>) {
        *lock(&self.grow) = Some(grow);
    }

    /// Held by the thread that reads the socket, from the wait for a
    /// request to the moment it may start.
    pub fn reading(&self, yes: bool) {
        self.reading.store(yes, Relaxed);
    }

    /// Tells the connection's other threads it ended.
    pub fn over(&self) {
        self.over.store(true, Relaxed);
    }

    pub fn is_over(&self) -> bool {
        self.over.load(Relaxed)
    }

    /// Whether a request of `kind` could start now.
    pub fn free_for(&self, kind: Kind) -> bool {
        lock(&self.running).list.iter().all(|(_, k)| kind.may_pass(k))
    }

    /// Waits until a request of `kind` may start, and counts it running.
    /// Called by the reading thread, so requests start in arrival order.
    pub fn start(&self, kind: Kind) -> u64 {
        let mut running = lock(&self.running);
        while !running.list.iter().all(|(_, k)| kind.may_pass(k)) {
            running.waiting = true;
            running = self.done.wait(running).unwrap_or_else(|e| e.into_inner());
        }
        running.waiting = false;
        let ticket = self.started.fetch_add(1, Relaxed) + 1;
        running.list.push((ticket, kind));
        ticket
    }

    /// Request `ticket` ended.
    pub fn end(&self, ticket: u64) {
        let mut running = lock(&self.running);
        running.list.retain(|(t, _)| *t != ticket);
        // Only a request's start waits here while requests run, so the
        // common case (nothing waits) costs no wake-up.
        let waiting = running.waiting;
        drop(running);
        if waiting {
            self.done.notify_all();
        }
    }

    /// The reading turn now (a worker of the event loop takes it with the
    /// socket).
    pub fn rights(&self) -> u64 {
        *lock(&self.rights)
    }

    /// After a request: whether the worker that read it holds the reading
    /// turn still (then it reads on, counted reading), or the watchdog gave
    /// it away meanwhile (then the worker leaves, see `leave`).
    pub fn resume(&self, rights: u64) -> bool {
        let now = lock(&self.rights);
        if *now != rights {
            return false;
        }
        self.reading.store(true, Relaxed);
        true
    }

    /// The connection ended: no more workers for it.
    pub fn unwatch(&self) {
        lock(&self.grow).take();
    }

    /// A helper thread left.
    pub fn leave(&self) {
        let _running = lock(&self.running);
        self.threads.fetch_sub(1, Relaxed);
        self.done.notify_all();
    }

    /// The watchdog's look: a thread more if a request ran a whole tick
    /// with no thread reading. Returns whether the connection still lives.
    pub fn look(&self) -> bool {
        let started = self.started.load(Relaxed);
        let before = self.seen.swap(started, Relaxed);
        let grow = lock(&self.grow);
        let Some(grow) = grow.as_ref() else { return false };
        // Decided and done under the turn's lock: a worker that ends its
        // request meanwhile either reads on before (so none is stuck) or
        // finds its turn given away after.
        let mut rights = lock(&self.rights);
        let stuck = started == before && !self.reading.load(Relaxed) && !lock(&self.running).list.is_empty();
        if stuck && self.threads.load(Relaxed) < MAX_THREADS {
            self.threads.fetch_add(1, Relaxed);
            // Counted before it starts, so the next look waits for it.
            self.reading.store(true, Relaxed);
            *rights += 1;
            if !grow() {
                *rights -= 1;
                self.reading.store(false, Relaxed);
                self.threads.fetch_sub(1, Relaxed);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::Target;

    #[test]
    fn what_may_overtake_what() {
        let stat = Kind::of(&Request::Stat { target: Target::Path(b"/a") });
        let fstat = Kind::of(&Request::Stat { target: Target::Handle(7) });
        let mkdir = Kind::of(&Request::Mkdir { path: b"/d", mode: 0o755 });
        let write = Kind::of(&Request::Pwrite { handle: 7, offset: 0, data: b"x" });
        let read8 = Kind::of(&Request::Pread { handle: 8, offset: 0, count: 1 });
        let close = Kind::of(&Request::Close { handle: 9 });
        let fsync = Kind::of(&Request::Fsync { handle: 7, datasync: false });
        let attach = Kind::of(&Request::SessionAttach { id: 1, proof: [0; 32] });
        assert!(stat.may_pass(&mkdir) && mkdir.may_pass(&stat), "unrelated names");
        assert!(write.may_pass(&stat), "a write may overtake a slow stat");
        assert!(!stat.may_pass(&write), "nothing overtakes a write sent without waiting");
        assert!(stat.may_pass(&close), "a close is waited for when it matters");
        assert!(!fstat.may_pass(&Kind::of(&Request::Close { handle: 7 })), "but keeps its place on its handle");
        assert!(!fsync.may_pass(&fstat), "one handle, in order");
        assert!(read8.may_pass(&fstat), "another handle");
        assert!(!stat.may_pass(&attach) && !attach.may_pass(&stat), "sessions change alone");
    }

    #[test]
    fn a_request_that_may_not_pass_waits_for_the_one_running() {
        let t = Turns::new();
        t.threads.store(2, Relaxed);
        let write = t.start(Kind::of(&Request::Pwrite { handle: 1, offset: 0, data: b"x" }));
        let t2 = Arc::clone(&t);
        let after = std::thread::spawn(move || {
            let ticket = t2.start(Kind::of(&Request::Stat { target: Target::Path(b"/a") }));
            t2.end(ticket);
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!after.is_finished(), "the stat waits for the write");
        t.end(write);
        after.join().unwrap();
    }
}
