//! The event loop: connections are served by a few threads that follow the
//! work, not one thread each.
//!
//! Every connection whose input is read as it comes (plain TCP and Unix
//! sockets, once their handshake is done) sits in one `epoll` set, armed
//! one-shot. About as many workers as CPUs wait on it; the worker woken for
//! a connection serves it as a connection's own thread would — reads a
//! frame, runs the request inline, writes the reply, so one client's
//! requests never change threads — until nothing more has come, then arms
//! it again. A frame not yet whole stays in the connection's `Inbox`: a
//! client that stalls mid-frame holds no worker.
//!
//! Requests may block (a disk, a lock, a lease break waiting for another
//! client). So a watchdog looks at the workers every [`TICK`]: when one has
//! been blocked in the kernel in the same request for a tick and none waits
//! for events, another worker starts; workers beyond the CPU count leave
//! after a while idle.
//! And a connection's own slow request gives its reading turn away
//! (`turns.rs`): the socket is armed again and the next worker reads on
//! beside it, by the rules of PROTOCOL.md section 10.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use rustix::event::epoll;

use crate::backend::Backend;
use crate::conn::{Conn, End, Kit, Ready};
use crate::turns::TICK;

/// Workers at most (those beyond the CPU count wait on blocked requests).
const MAX_WORKERS: usize = 512;
/// The key of the queue's wake-ups (connections count from 1).
const QUEUED: u64 = 0;
/// How long a worker beyond the CPU count waits idle before it leaves.
const LINGER: Duration = Duration::from_secs(2);

/// One worker's count of the requests it served, for the watchdog.
struct Worker {
    /// Its thread id, for its state in /proc.
    tid: AtomicI32,
    stamp: AtomicU64,
    seen: AtomicU64,
    waiting: AtomicBool,
    gone: AtomicBool,
}

thread_local! {
    static ME: RefCell<Option<Arc<Worker>>> = const { RefCell::new(None) };
}

/// A request was served on this thread (a worker's: it is not stuck).
pub fn progress() {
    ME.with(|m| {
        if let Some(w) = &*m.borrow() {
            w.stamp.fetch_add(1, Relaxed);
        }
    });
}

/// A connection of the loop.
struct Slot<B: Backend> {
    key: u64,
    caps: u64,
    /// Holds of the connection not in use (the first, and any made for a
    /// second worker beside a slow request).
    holds: Mutex<Vec<Conn<B>>>,
    /// Makes more holds.
    template: Mutex<Conn<B>>,
    /// Holds in use by workers.
    out: AtomicUsize,
    added: AtomicBool,
    done: AtomicBool,
    /// When a worker last left it (seconds since the loop started).
    last: AtomicU64,
    inbox: Arc<Mutex<crate::inbox::Inbox>>,
    turns: Arc<crate::turns::Turns>,
    peer: String,
}

pub struct EvLoop<B: Backend> {
    ep: OwnedFd,
    /// Connections to serve whatever their socket says: a reading turn
    /// given away, a worker's turn over — their input may be buffered
    /// already, which no `epoll` event tells. `wake` counts them (an
    /// `eventfd` in the set under key 0, one wake per entry).
    queue: Mutex<VecDeque<u64>>,
    wake: OwnedFd,
    slots: Mutex<HashMap<u64, Arc<Slot<B>>>>,
    /// The connections being served now, and by how many: those whose
    /// request may run long, for the watchdog of `turns.rs`.
    busy: Mutex<HashMap<u64, (usize, Arc<crate::turns::Turns>)>>,
    next: AtomicU64,
    base: usize,
    workers: Mutex<Vec<Arc<Worker>>>,
    total: AtomicUsize,
    waiting: AtomicUsize,
    started: Instant,
    idle_timeout: Duration,
    metrics: Arc<crate::metrics::Metrics>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<B: Backend> EvLoop<B> {
    /// The loop, its workers (one per CPU) and its watchdog.
    pub fn start(idle_timeout: Duration, metrics: Arc<crate::metrics::Metrics>) -> std::io::Result<Arc<Self>> {
        let base = std::thread::available_parallelism().map_or(2, |n| n.get());
        use rustix::event::EventfdFlags;
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let wake = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK | EventfdFlags::SEMAPHORE)?;
        epoll::add(&ep, &wake, epoll::EventData::new_u64(QUEUED), epoll::EventFlags::IN)?;
        let ev = Arc::new(EvLoop {
            ep,
            queue: Mutex::default(),
            wake,
            slots: Mutex::default(),
            busy: Mutex::default(),
            next: AtomicU64::new(1),
            base,
            workers: Mutex::default(),
            total: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            started: Instant::now(),
            idle_timeout,
            metrics,
        });
        for _ in 0..base {
            ev.add_worker()?;
        }
        let weak = Arc::downgrade(&ev);
        std::thread::Builder::new().name("ferry-pool".into()).stack_size(128 * 1024).spawn(move || watch(weak))?;
        Ok(ev)
    }

    fn add_worker(self: &Arc<Self>) -> std::io::Result<()> {
        let w = Arc::new(Worker {
            tid: AtomicI32::new(0),
            stamp: AtomicU64::new(0),
            seen: AtomicU64::new(0),
            waiting: AtomicBool::new(false),
            gone: AtomicBool::new(false),
        });
        self.total.fetch_add(1, SeqCst);
        let (ev, me) = (Arc::clone(self), Arc::clone(&w));
        let spawned = std::thread::Builder::new().name("ferry-worker".into()).stack_size(256 * 1024).spawn(move || {
            me.tid.store(rustix::thread::gettid().as_raw_nonzero().get(), Relaxed);
            ME.with(|m| *m.borrow_mut() = Some(Arc::clone(&me)));
            ev.work(&me);
        });
        match spawned {
            Ok(_) => {
                lock(&self.workers).push(w);
                Ok(())
            }
            Err(e) => {
                self.total.fetch_sub(1, SeqCst);
                Err(e)
            }
        }
    }

    fn now(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    fn work(&self, me: &Worker) {
        let mut kit = Kit::new();
        let mut events = Vec::with_capacity(1);
        loop {
            let beyond = self.total.load(SeqCst) > self.base;
            let timeout = rustix::event::Timespec { tv_sec: LINGER.as_secs() as i64, tv_nsec: 0 };
            me.waiting.store(true, Relaxed);
            self.waiting.fetch_add(1, SeqCst);
            events.clear();
            // One connection per wake: each worker takes the next ready one.
            let r = epoll::wait(&self.ep, rustix::buffer::spare_capacity(&mut events), beyond.then_some(&timeout));
            self.waiting.fetch_sub(1, SeqCst);
            me.waiting.store(false, Relaxed);
            match r {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    tracing::error!("waiting for connections failed: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            }
            if events.is_empty() {
                let total = self.total.load(SeqCst);
                if total > self.base && self.total.compare_exchange(total, total - 1, SeqCst, SeqCst).is_ok() {
                    me.gone.store(true, Relaxed);
                    return;
                }
                continue;
            }
            for e in events.drain(..) {
                me.stamp.fetch_add(1, Relaxed);
                let mut key = e.data.u64();
                if key == QUEUED {
                    let mut one = [0u8; 8];
                    if rustix::io::read(&self.wake, &mut one).is_err() {
                        // Another worker took this wake-up.
                        continue;
                    }
                    let Some(k) = lock(&self.queue).pop_front() else { continue };
                    key = k;
                }
                let slot = lock(&self.slots).get(&key).cloned();
                if let Some(slot) = slot {
                    self.serve(&slot, &mut kit);
                }
                me.stamp.fetch_add(1, Relaxed);
            }
        }
    }

    /// Takes a connection whose handshake is done (on its thread, which
    /// serves what already came, then leaves it to the loop).
    pub fn adopt(self: &Arc<Self>, conn: Conn<B>, caps: u64) {
        let template = match conn.another() {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(peer = %conn.peer(), "connection not served: {e}");
                conn.shut();
                let _ = conn.finish();
                return;
            }
        };
        lock(conn.inbox()).nonblocking = true;
        let key = self.next.fetch_add(1, Relaxed);
        let slot = Arc::new(Slot {
            key,
            caps,
            inbox: Arc::clone(conn.inbox()),
            turns: Arc::clone(conn.turns()),
            peer: conn.peer(),
            holds: Mutex::new(vec![conn]),
            template: Mutex::new(template),
            out: AtomicUsize::new(0),
            added: AtomicBool::new(false),
            done: AtomicBool::new(false),
            last: AtomicU64::new(self.now()),
        });
        // A slow request gives its reading turn to the next free worker,
        // through the queue (its next requests may be buffered already).
        let (weak, ev) = (Arc::downgrade(&slot), Arc::downgrade(self));
        slot.turns.watch(Box::new(move || match (weak.upgrade(), ev.upgrade()) {
            (Some(s), Some(ev)) => ev.requeue(s.key),
            _ => false,
        }));
        lock(&self.slots).insert(key, Arc::clone(&slot));
        let mut kit = Kit::new();
        self.serve(&slot, &mut kit);
    }

    /// Serves what came on `slot` with one of its holds.
    fn serve(&self, slot: &Arc<Slot<B>>, kit: &mut Kit) {
        slot.out.fetch_add(1, SeqCst);
        let hold = lock(&slot.holds).pop();
        let hold = match hold {
            Some(h) => Some(h),
            None => lock(&slot.template).another().ok(),
        };
        let Some(mut hold) = hold else {
            slot.turns.over();
            self.put(slot, None);
            return;
        };
        let ready = if slot.turns.is_over() {
            Ready::Ended
        } else {
            let rights = slot.turns.rights();
            self.busy(slot, true);
            hold.enter(kit);
            let r = {
                let _span = tracing::info_span!("conn", peer = %slot.peer).entered();
                hold.serve_ready(slot.caps, rights)
            };
            hold.leave(kit);
            self.busy(slot, false);
            r
        };
        slot.last.store(self.now(), Relaxed);
        match ready {
            Ready::Yield => {
                self.put(slot, Some(hold));
                if !self.requeue(slot.key) {
                    slot.turns.over();
                    self.serve_end(slot);
                }
            }
            Ready::Idle => {
                lock(&slot.inbox).rest();
                self.put(slot, Some(hold));
                if !self.arm(slot) {
                    slot.turns.over();
                    self.serve_end(slot);
                }
            }
            Ready::Handed => {
                slot.turns.leave();
                self.put(slot, Some(hold));
            }
            Ready::Ended => {
                hold.shut();
                self.put(slot, Some(hold));
            }
        }
    }

    /// Counts a worker in or out of serving `slot`.
    fn busy(&self, slot: &Slot<B>, on: bool) {
        let mut busy = lock(&self.busy);
        if on {
            busy.entry(slot.key).or_insert_with(|| (0, Arc::clone(&slot.turns))).0 += 1;
        } else if let Some(b) = busy.get_mut(&slot.key) {
            b.0 -= 1;
            if b.0 == 0 {
                busy.remove(&slot.key);
            }
        }
    }

    /// The connections being served: one whose request ran a whole tick
    /// with none reading on gets another worker (`Turns::look`).
    fn look_busy(&self) {
        let busy: Vec<Arc<crate::turns::Turns>> = lock(&self.busy).values().map(|(_, t)| Arc::clone(t)).collect();
        for t in busy {
            t.look();
        }
    }

    /// A connection found over with no hold out: finished here.
    fn serve_end(&self, slot: &Arc<Slot<B>>) {
        slot.out.fetch_add(1, SeqCst);
        self.put(slot, None);
    }

    /// A hold back; the last one of a connection that ended finishes it.
    fn put(&self, slot: &Arc<Slot<B>>, hold: Option<Conn<B>>) {
        if let Some(h) = hold {
            lock(&slot.holds).push(h);
        }
        if slot.out.fetch_sub(1, SeqCst) == 1 && slot.turns.is_over() && !slot.done.swap(true, SeqCst) {
            self.finish(slot);
        }
    }

    fn finish(&self, slot: &Arc<Slot<B>>) {
        lock(&self.slots).remove(&slot.key);
        slot.turns.unwatch();
        {
            let inbox = lock(&slot.inbox);
            if slot.added.load(SeqCst) {
                let _ = epoll::delete(&self.ep, &inbox.timed.stream);
            }
        }
        let holds = std::mem::take(&mut *lock(&slot.holds));
        let Some(first) = holds.first() else { return };
        first.shut();
        let end = first.finish();
        log_end(&slot.peer, end, &self.metrics);
        // The descriptors close here, whoever still holds the slot.
        drop(holds);
    }

    /// Has a worker serve connection `key` soon, whatever its socket says.
    fn requeue(&self, key: u64) -> bool {
        lock(&self.queue).push_back(key);
        match rustix::io::write(&self.wake, &1u64.to_ne_bytes()) {
            Ok(_) => true,
            Err(e) => {
                lock(&self.queue).retain(|k| *k != key);
                tracing::warn!("cannot wake a worker ({e})");
                false
            }
        }
    }

    /// Arms the connection's socket for its next input: whether it could.
    fn arm(&self, slot: &Slot<B>) -> bool {
        let inbox = lock(&slot.inbox);
        // Another worker of the connection (one that ran a slow request
        // beside this one) may have found its end and finished it, taking
        // the socket out of the set, between this worker's `put` and here:
        // nothing is left to watch. Armed anyway, `EPOLL_CTL_MOD` failed
        // with `ENOENT` and logged a "connection not watched" warning for
        // a connection that had ended normally. (`finish` takes the socket
        // out under this same lock, after `done` is set.)
        if slot.done.load(SeqCst) {
            return true;
        }
        let flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP | epoll::EventFlags::ONESHOT;
        let data = epoll::EventData::new_u64(slot.key);
        let r = if slot.added.swap(true, SeqCst) {
            epoll::modify(&self.ep, &inbox.timed.stream, data, flags)
        } else {
            epoll::add(&self.ep, &inbox.timed.stream, data, flags)
        };
        match r {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(peer = %slot.peer, "connection not watched ({e}): closing it");
                false
            }
        }
    }

    /// The watchdog's look: another worker if one is stuck in a request
    /// and none waits for events.
    fn look(self: &Arc<Self>) {
        let mut stuck = 0;
        lock(&self.workers).retain(|w| {
            let stamp = w.stamp.load(Relaxed);
            if !w.waiting.load(Relaxed) && w.seen.swap(stamp, Relaxed) == stamp && blocked(w.tid.load(Relaxed)) {
                stuck += 1;
            }
            !w.gone.load(Relaxed)
        });
        if stuck > 0 && self.waiting.load(SeqCst) == 0 && self.total.load(SeqCst) < MAX_WORKERS {
            if let Err(e) = self.add_worker() {
                tracing::warn!("no worker more ({e}): blocked requests hold up others");
            }
        }
    }

    /// Connections idle past the idle timeout are shut (their worker then
    /// finds them closed).
    fn sweep(&self) {
        let now = self.now();
        let limit = self.idle_timeout.as_secs().max(1);
        let slots: Vec<Arc<Slot<B>>> = lock(&self.slots).values().cloned().collect();
        for s in slots {
            if now.saturating_sub(s.last.load(Relaxed)) >= limit && s.out.load(SeqCst) == 0 {
                tracing::debug!(peer = %s.peer, "idle timeout");
                let _ = lock(&s.inbox).timed.stream.shutdown_both();
            }
        }
    }
}

fn watch<B: Backend>(ev: Weak<EvLoop<B>>) {
    let mut n: u64 = 0;
    loop {
        std::thread::sleep(TICK);
        let Some(ev) = ev.upgrade() else { return };
        ev.look_busy();
        ev.look();
        n += 1;
        if n.is_multiple_of(100) {
            ev.sweep();
        }
    }
}

/// Whether thread `tid` of this process waits in the kernel (a disk, a
/// lock, a socket) rather than runs or waits for a CPU. A worker that went
/// a tick without a request done only because the CPUs were busy (200
/// client processes on 2 cores) is not stuck: another worker would only
/// compete with it (such workers grew the loop to 100 threads).
fn blocked(tid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else { return true };
    // The state follows the command name, which may hold spaces and ')'.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    state != Some('R')
}

/// The one log line a connection's end gets.
pub fn log_end(peer: &str, end: End, metrics: &crate::metrics::Metrics) {
    if let End::Protocol(_) = &end {
        metrics.protocol_errors.fetch_add(1, Relaxed);
    }
    match end {
        End::Closed => tracing::debug!(peer = %peer, "connection closed"),
        // A client that exits with a reply it no longer wanted unread (a
        // close it did not wait for, read-ahead it did not need) resets
        // rather than closes, or is gone while those replies are sent: a
        // normal end, nothing to report.
        End::Io(e) if matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe) => {}
        End::Io(e) => tracing::warn!(peer = %peer, "connection error: {e}"),
        End::Protocol(m) => tracing::warn!(peer = %peer, "protocol error, closing: {m}"),
        End::AuthFailed => tracing::warn!(peer = %peer, "authentication failed"),
    }
}
