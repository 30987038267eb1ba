//! Leases, the client's side (capability `LEASES`, PROTOCOL.md 8.9): what
//! a cache may keep without asking again, until the server breaks it.
//!
//! A program's cache (the preload library's attributes, the mount's kernel
//! entries) gives a [`Leases`] its break handler and asks [`Leases::held`]
//! before it answers from what it keeps. The server sends a break before
//! it acknowledges a change another session made; the connection's reader
//! (whoever waits for a reply, else the watcher thread) runs the handler,
//! then answers `LeaseReturn`. So a change another process was told of
//! has already emptied this cache.
//!
//! A lease also ends with silence: the server stops waiting for a holder
//! that does not answer once `time` has passed since the holder's last
//! request reached it; the client counts from the moment it sent the last
//! request it got an answer to (earlier, so it gives up first). And a lost
//! connection ends them all.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ferry_proto::{Broken, LeaseBreak};

use crate::engine::Engine;

/// What a cache does when leases break: drops what it holds of the
/// objects named (all of it for [`Broken::ALL`]), then drops the
/// [`Return`] — at once, or later from another thread (the server waits
/// for it, up to the lease time).
pub type OnBreak = dyn Fn(&[Broken<'_>], Return) + Send + Sync;

/// A break to answer: dropping it sends `LeaseReturn` (nothing for a break
/// the client made up itself, a lost connection's).
pub struct Return(Option<Box<dyn FnOnce() + Send>>);

impl Return {
    pub(crate) fn new(send: Box<dyn FnOnce() + Send>) -> Return {
        Return(Some(send))
    }

    fn none() -> Return {
        Return(None)
    }
}

impl Drop for Return {
    fn drop(&mut self) {
        if let Some(send) = self.0.take() {
            send();
        }
    }
}

/// One client's leases: its break handler and how long they hold.
pub struct Leases {
    on_break: Box<OnBreak>,
    base: Instant,
    /// The lease time the server gave, in µs (0: no leases).
    time_us: AtomicU64,
    /// When the last request answered was sent, in µs since `base` (+1,
    /// so 0 is never).
    renewed_us: AtomicU64,
    /// Breaks handled (for tests and metrics).
    breaks: AtomicU64,
    /// Which connection carries them (`start`): a connection lost after
    /// another took over does not turn them off.
    conn: AtomicU64,
    /// The promise ran out by the clock and the cache was told (once per
    /// lapse; a renewal that restores it clears this).
    lapsed: AtomicBool,
    /// A keep-alive is on its way (its id + 1; 0: none).
    ping: AtomicU64,
}

/// What the client keeps of the lease time the server gave: a margin for
/// the two clocks' rates and the time the break handler takes.
const MARGIN: f64 = 0.9;

impl Leases {
    pub fn new(on_break: Box<OnBreak>) -> Arc<Leases> {
        Arc::new(Leases {
            on_break,
            base: Instant::now(),
            time_us: AtomicU64::new(0),
            renewed_us: AtomicU64::new(0),
            breaks: AtomicU64::new(0),
            conn: AtomicU64::new(0),
            lapsed: AtomicBool::new(false),
            ping: AtomicU64::new(0),
        })
    }

    /// Whether what the cache keeps is still promised: leases are on, and
    /// the server heard from this client less than a lease time ago. No
    /// system call (the clock is the vDSO's).
    pub fn held(&self) -> bool {
        let time = self.time_us.load(Relaxed);
        let renewed = self.renewed_us.load(Relaxed);
        time != 0 && renewed != 0 && self.now_us() < renewed - 1 + time
    }

    /// Breaks handled so far.
    pub fn breaks(&self) -> u64 {
        self.breaks.load(Relaxed)
    }

    fn now_us(&self) -> u64 {
        self.base.elapsed().as_micros() as u64
    }

    /// A request sent at `at` was answered: the server heard from us then.
    pub(crate) fn renew(&self, at: Instant) {
        let us = at.saturating_duration_since(self.base).as_micros() as u64 + 1;
        self.renewed_us.fetch_max(us, Relaxed);
        if self.lapsed.load(Relaxed) && self.held() {
            self.lapsed.store(false, Relaxed);
        }
    }

    /// Ends the promise by the clock: once a lease time has passed since
    /// the server last heard from us (by our count, which starts earlier
    /// than its own), the server may apply a change without our answer, so
    /// the cache forgets all — before the server can go on. Called by the
    /// watcher; a cache that keeps answers beyond its own look at
    /// [`Leases::held`] (the kernel's, for the mount) relies on it.
    fn lapse_if_due(&self) {
        let (time, renewed) = (self.time_us.load(Relaxed), self.renewed_us.load(Relaxed));
        if time == 0 || renewed == 0 || self.held() || self.lapsed.swap(true, Relaxed) {
            return;
        }
        self.breaks.fetch_add(1, Relaxed);
        (self.on_break)(&[Broken::ALL], Return::none());
    }

    /// Whether an idle client should let the server hear from it, so its
    /// leases keep holding: half the lease time has gone by unrenewed.
    fn renewal_due(&self) -> bool {
        let (time, renewed) = (self.time_us.load(Relaxed), self.renewed_us.load(Relaxed));
        time != 0 && renewed != 0 && self.now_us() >= renewed - 1 + time / 2
    }

    /// The server granted leases of `time` on a connection.
    pub(crate) fn start(&self, time: Duration, asked_at: Instant, conn: u64) {
        self.conn.store(conn, Relaxed);
        self.renew(asked_at);
        self.time_us.store((time.as_micros() as f64 * MARGIN) as u64, Relaxed);
    }

    /// Connection `conn` is gone: if it carried the leases, nothing is
    /// promised any more; either way the cache forgets all.
    pub(crate) fn lost(&self, conn: u64) {
        if self.conn.load(Relaxed) == conn {
            self.time_us.store(0, Relaxed);
        }
        self.breaks.fetch_add(1, Relaxed);
        (self.on_break)(&[Broken::ALL], Return::none());
    }

    pub(crate) fn handle(&self, b: &LeaseBreak<'_>, ret: Return) {
        self.breaks.fetch_add(1, Relaxed);
        (self.on_break)(&b.objects, ret);
    }
}

/// While a caller reads the socket (and so reads any break in order with
/// its replies), the watcher waits for a hang-up only, waking this often
/// to see whether the caller is done: it does not wake at every reply of a
/// busy connection, and a break that comes just after the caller's last
/// reply waits at most this long. At 20 ms, 1–3 % of the breaks of
/// `ferry compare` experiment 11 waited 20 ms (the holder had just had a
/// reply); waking at every reply instead made 6,000 `stat`s under `ferry
/// run` 1.38 × slower.
const BUSY_LOOK: Duration = Duration::from_millis(1);
/// How often an idle watcher looks whether the engine is gone, or a notice
/// waits in a buffer a poll cannot see.
const LOOK: Duration = Duration::from_millis(100);
/// How long a watcher woken by a caller's reply waits for that caller to
/// be done with it, the first time in a row, rather than not listen for
/// `BUSY_LOOK`: a break that follows a lone request at once (a holder that
/// looked, then another client's change) is read as it comes. Before,
/// experiment 11's timeline showed breaks read ~1,030 µs after they were
/// written (4 of the first 15 rounds of a run). A busy connection (woken so twice in a row with nothing for the
/// watcher in between) is not listened to, as before, so its watcher
/// wakes once per `BUSY_LOOK`, not at every reply.
const RELEASE_LOOK: Duration = Duration::from_micros(50);

/// Starts the thread that reads breaks while nobody waits for a reply on
/// `engine`'s connection. It holds the engine only while it looks, so it
/// ends soon after the engine is dropped; and it blocks every signal, so a
/// program's handlers never run on it (the preload library starts it
/// inside other people's programs).
pub(crate) fn watch(engine: &Arc<Engine>) -> std::io::Result<()> {
    let weak = Arc::downgrade(engine);
    let _blocked = SignalsBlocked::new();
    std::thread::Builder::new().name("ferry-leases".into()).stack_size(64 * 1024).spawn(move || run(weak))?;
    Ok(())
}

fn run(weak: Weak<Engine>) {
    use rustix::event::{poll, PollFd, PollFlags};
    // Wakes by input a caller was reading, since the watcher last read
    // something itself.
    let mut callers_input = 0u32;
    loop {
        let Some(e) = weak.upgrade() else { return };
        if e.is_dead() {
            e.leases_lost();
            return;
        }
        let busy = e.reader_busy();
        if let Some(l) = e.leases() {
            l.lapse_if_due();
            if l.renewal_due() {
                keep_alive(&e, l);
            }
        }
        let (flags, look) = match busy {
            true => (PollFlags::RDHUP, BUSY_LOOK),
            false => (PollFlags::IN | PollFlags::RDHUP, LOOK),
        };
        let revents = {
            // SAFETY: the engine (held here) owns the descriptor while we poll.
            let fd = unsafe { BorrowedFd::borrow_raw(e.raw_fd()) };
            let mut fds = [PollFd::new(&fd, flags)];
            let t = rustix::event::Timespec { tv_sec: 0, tv_nsec: look.as_nanos() as i64 };
            match poll(&mut fds, Some(&t)) {
                Ok(n) if n > 0 => fds[0].revents(),
                _ => PollFlags::empty(),
            }
        };
        if revents.intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR) {
            // The server will send nothing more: no break can reach us, so
            // nothing is promised from now on, whoever reads the end.
            e.leases_lost();
        }
        if !revents.is_empty() || (!busy && e.buffered()) {
            if e.watch_once() {
                callers_input = 0;
            } else if revents.contains(PollFlags::IN) {
                callers_input += 1;
                if callers_input == 1 {
                    let until = Instant::now() + RELEASE_LOOK;
                    while e.reader_busy() && Instant::now() < until {
                        std::thread::yield_now();
                    }
                }
            }
        }
    }
}

/// Sends a `Ping` whose answer renews the leases (read by whoever reads
/// next, this watcher when nobody else does); one at a time.
fn keep_alive(e: &Engine, l: &Leases) {
    let pending = l.ping.load(Relaxed);
    if pending != 0 && e.is_outstanding(pending - 1) {
        return;
    }
    // No room in the window (`None`): requests are on their way, and
    // their answers renew the leases as well.
    if let Ok(Some(id)) = e.try_start(&ferry_proto::Request::Ping, 0) {
        e.forget(id);
        l.ping.store(id + 1, Relaxed);
    }
}

/// Every signal blocked in the calling thread while it lives (a thread
/// started meanwhile inherits the mask), the old mask back after.
pub(crate) struct SignalsBlocked(libc::sigset_t);

impl SignalsBlocked {
    pub(crate) fn new() -> SignalsBlocked {
        // SAFETY: sigset_t is plain data; sigfillset and pthread_sigmask
        // only write the sets given, which live on this stack frame.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            SignalsBlocked(old)
        }
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask `new` saved, for this same thread.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}
