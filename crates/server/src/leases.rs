//! Leases (capability `LEASES`, PROTOCOL.md 8.9): the server remembers
//! which sessions were answered what, and takes it back before a change.
//!
//! A session turns leases on with `LeaseOn`; from then every successful
//! reply that carries attributes (a `Stat`, an open, a listing's entries)
//! grants it a lease on those objects, keyed by `(dev, ino)`. Before the
//! server acknowledges a change another session made to a leased object,
//! it sends each holder a `LeaseBreak` and waits until the holder returned
//! it or the holder's lease time ran out (counted from the holder's last
//! request; so a client that stops answering delays a change by at most
//! that). The changing session's own leases are not broken: it knows.
//!
//! The race of a read with a change is settled by a sequence: a request
//! notes the table's sequence before it runs; a change stamps the objects
//! it touched with a new sequence after it ran. A grant for an object
//! stamped after the read began is refused, and the reply goes behind a
//! break on its own connection, so the client never keeps it.
//!
//! Bounded: at most `MAX_PER_HOLDER` objects per session and `MAX_OBJECTS`
//! in all; past either, the session (or every session) gets a break of
//! everything and starts again. Leases live in memory only: a restarted
//! server holds none, and its clients drop theirs with their connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ferry_proto::{Broken, LeaseBreak};
use ferry_sock::Socket;

use crate::locks::FileKey;

/// Objects one session may hold leases on; past it all its leases break.
pub const MAX_PER_HOLDER: usize = 1 << 16;
/// Objects in the table at most; past it, leases no one holds any more are
/// forgotten, and if that is not enough all leases break.
pub const MAX_OBJECTS: usize = 1 << 18;

/// The lease time when none is configured.
pub const DEFAULT_TIME: Duration = Duration::from_secs(2);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a change touched: an object (its attributes or data), a name in a
/// directory, or everything kept by path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Touched {
    Object(FileKey),
    Entry(FileKey, Vec<u8>),
    All,
}

/// The connection a holder's breaks go on.
struct Line {
    tx: Socket,
    wlock: Arc<Mutex<()>>,
}

/// One session with leases on.
pub struct Holder {
    /// Bumped each time its leases all end (`LeaseOn` again, a cap
    /// reached): table entries of an older epoch hold nothing.
    epoch: AtomicU64,
    /// Objects granted in this epoch.
    count: AtomicUsize,
    line: Mutex<Option<Line>>,
    /// Its connection closed from its side: nothing of it is cached
    /// anywhere, no break needs an answer.
    gone: AtomicBool,
    /// When its last request came, µs since the table's `base`.
    heard_us: AtomicU64,
    /// The highest break sequence it returned.
    returned: Mutex<u64>,
    /// The same, read without the lock by a change that looks a while
    /// before it sleeps (`RETURN_SPIN`).
    returned_seq: AtomicU64,
    /// When the last return was read ([`mono_ns`]), for the timeline.
    returned_ns: AtomicU64,
    answered: Condvar,
}

impl Holder {
    /// A request of the session arrived: its leases hold a lease time more.
    pub fn heard(&self, leases: &Leases) {
        self.heard_us.store(leases.now_us(), Relaxed);
    }

    /// `LeaseReturn`: the client dropped what break `seq` named.
    pub fn returned(&self, seq: u64) {
        let mut r = lock(&self.returned);
        if seq > *r {
            *r = seq;
            self.returned_ns.store(mono_ns(), Relaxed);
            self.returned_seq.store(seq, Release);
            self.answered.notify_all();
        }
    }

    /// The connection that carries its breaks ended; `by_client`: closed by
    /// the client (the process is gone or dropped its leases with it).
    pub fn line_ended(&self, tx: &Socket, by_client: bool) {
        let mut line = lock(&self.line);
        if line.as_ref().is_some_and(|l| same_socket(&l.tx, tx)) {
            *line = None;
            if by_client {
                self.gone.store(true, Relaxed);
                // A change waiting for this holder's return waits no more
                // (under the lock it waits with, so the wake-up is not
                // lost between its look and its sleep). Without this it
                // slept to the holder's deadline: `make -j2` under `ferry
                // run` waited 118 ms a break for compilers that had exited.
                let _r = lock(&self.returned);
                self.answered.notify_all();
            }
        }
    }
}

fn same_socket(a: &Socket, b: &Socket) -> bool {
    use std::os::fd::{AsFd, AsRawFd};
    let (Ok(sa), Ok(sb)) = (rustix::fs::fstat(a), rustix::fs::fstat(b)) else {
        return a.as_fd().as_raw_fd() == b.as_fd().as_raw_fd();
    };
    (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)
}

struct Obj {
    /// The sequence of the last change that touched it.
    changed: u64,
    /// Whose change that was (the holder's address; 0: a session without
    /// leases, or a change outside ferry).
    by: usize,
    /// The latest change before `changed` that may have been another's
    /// (an upper bound: a change of `by`'s own may be counted here too).
    before: u64,
    holders: Vec<(Arc<Holder>, u64)>,
    /// Holders sent a break of it that nobody waited for (a change seen
    /// outside the server) and that have not returned it yet: dropped from
    /// `holders`, such a holder may still answer from what it keeps, so a
    /// change that waits waits for these too.
    unreturned: Vec<Owed>,
}

/// A break nobody waited for: its holder, sequence, and the deadline a
/// change waiting for it would have had.
type Owed = (Arc<Holder>, u64, Instant);

/// Breaks a change sent and must wait for: the holders (with each break's
/// sequence and deadline), when they went out, and for the timeline when
/// the first sending began and the last write began ([`mono_ns`]).
#[derive(Default)]
struct Sent {
    waiting: Vec<Owed>,
    start: Option<Instant>,
    start_ns: u64,
    wrote_ns: u64,
}

/// A change whose breaks went out before it ran (`Leases::begin_change`).
/// Dropped without [`Early::finish`] (a request that ended on an I/O
/// error), its marks come off and its breaks are owed, as a change seen
/// outside the server's are: the next change waits for them.
pub struct Early {
    leases: Arc<Leases>,
    keys: Vec<FileKey>,
    all: bool,
    sent: Sent,
}

impl Early {
    /// The change ran: `touched` is all it changed (empty if it failed, so
    /// nothing is stamped; the early breaks are still waited for, or a
    /// holder slow to read one might keep answering from what it named
    /// past the next change, which would find it no longer a holder).
    /// Stamps and breaks as [`Leases::changed`], takes the marks off, and
    /// returns once every holder broken here or early returned or ran out
    /// of time. Returns the change's sequence, for `grant_after`.
    pub fn finish(mut self, mine: Option<&Arc<Holder>>, touched: &[Touched]) -> u64 {
        let l = Arc::clone(&self.leases);
        // Stamped before the marks come off: a read that began before the
        // change is refused by the stamp once the mark no longer does.
        let (seq, mut sent) = l.breaks_of(mine, touched, true, self.all);
        l.unmark(&std::mem::take(&mut self.keys), std::mem::take(&mut self.all));
        let early = std::mem::take(&mut self.sent);
        match (early.start, sent.start) {
            (Some(_), None) => sent = early,
            (Some(s), Some(_)) => {
                sent.waiting.extend(early.waiting);
                sent.start = Some(s);
                sent.start_ns = early.start_ns;
            }
            _ => {}
        }
        l.wait_for(sent);
        seq
    }
}

impl Drop for Early {
    fn drop(&mut self) {
        self.leases.unmark(&self.keys, self.all);
        let owed = std::mem::take(&mut self.sent.waiting);
        if owed.is_empty() {
            return;
        }
        lock(&self.leases.table).unreturned_all.extend(owed);
    }
}

impl Holder {
    /// Whether the holder may still keep what break `seq` named.
    fn owes(&self, seq: u64, deadline: Instant) -> bool {
        !self.gone.load(Relaxed) && *lock(&self.returned) < seq && Instant::now() < deadline
    }

    /// The latest a change may wait for it, from now.
    fn deadline(&self, leases: &Leases) -> Instant {
        leases.base + Duration::from_micros(self.heard_us.load(Relaxed)) + leases.time
    }
}

fn id_of(h: &Arc<Holder>) -> usize {
    Arc::as_ptr(h) as usize
}

struct Table {
    seq: u64,
    objects: HashMap<FileKey, Obj>,
    /// The latest `changed` of the objects forgotten: a read that began
    /// before it gets no lease on an object the table no longer knows.
    forgot: u64,
    holders: Vec<std::sync::Weak<Holder>>,
    /// Entries made since the last prune.
    added: usize,
    /// Holders sent a break of everything nobody waited for, until they
    /// return it (as `Obj::unreturned`, for every object).
    unreturned_all: Vec<Owed>,
    /// Files whose descriptor a client on this host writes through
    /// (`FileFd`): the server does not see those changes, so nobody gets
    /// a lease on them while one is lent.
    lent: HashMap<FileKey, Lent>,
    /// Objects a change has broken the leases of and not yet finished
    /// (`Leases::begin_change`), with how many such changes: nobody is
    /// granted a lease on them meanwhile (what a read of one answers may be
    /// from before the change or after it).
    changing: HashMap<FileKey, u32>,
    /// Changes of everything kept by path (`Touched::All`) begun and not
    /// finished: no grant at all meanwhile.
    changing_all: u32,
}

/// A file lent for writing, or lent until a moment ago.
#[derive(Default)]
struct Lent {
    /// Descriptors lent now.
    count: usize,
    /// The sessions they were lent to: the kernel's notices of their
    /// writes (`watch.rs`) are their own changes, not news to them.
    by: Vec<std::sync::Weak<Holder>>,
    /// When the last one was given back: notices of writes through it may
    /// still be on their way for a moment.
    closed: Option<Instant>,
}

/// How long after a lent descriptor's close its writes' notices are still
/// taken for its session's own.
const LATE_NOTICE: Duration = Duration::from_secs(2);

/// Entries made between two prunes of those no lease needs.
const PRUNE_EVERY: usize = 1 << 14;
/// How long a change looks for a holder's return before it sleeps for it.
const RETURN_SPIN: Duration = Duration::from_micros(100);

/// What the metrics count of leases.
#[derive(Default)]
pub struct Counts {
    pub granted: AtomicU64,
    pub refused: AtomicU64,
    pub breaks: AtomicU64,
    pub waits: AtomicU64,
    pub waited_us: AtomicU64,
    pub timeouts: AtomicU64,
    pub last: Timeline,
    /// Notices of changes outside ferry looked at (`watch.rs`), and the
    /// file handles opened to learn what they named.
    pub outside_notices: AtomicU64,
    pub outside_opened: AtomicU64,
}

/// The steps of the last change that waited for exactly one holder and
/// got its return, in [`mono_ns`]: with the client's own stamps (the
/// same clock, on the same host) they lay out where a break's time goes
/// (`ferry compare` experiment 11 reads them from the metrics).
#[derive(Default)]
pub struct Timeline {
    /// Its breaks are about to go out: before the change runs (most
    /// changes, `Leases::begin_change`), else once it ran.
    pub start: AtomicU64,
    /// The break.s write to the holder.s connection began.
    pub wrote: AtomicU64,
    /// A worker read the holder's `LeaseReturn`.
    pub returned: AtomicU64,
    /// The change's thread saw the return and went on to its reply.
    pub resumed: AtomicU64,
}

/// `CLOCK_MONOTONIC` in ns: one clock for every process of the host.
pub fn mono_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

pub struct Leases {
    time: Duration,
    base: Instant,
    table: Mutex<Table>,
    /// Sessions that turned leases on and may hold some: none, and a
    /// change skips the table.
    active: AtomicUsize,
    pub counts: Counts,
}

impl Leases {
    pub fn new(time: Duration) -> Leases {
        Leases {
            time,
            base: Instant::now(),
            table: Mutex::new(Table {
                seq: 1,
                objects: HashMap::new(),
                forgot: 0,
                holders: Vec::new(),
                added: 0,
                unreturned_all: Vec::new(),
                lent: HashMap::new(),
                changing: HashMap::new(),
                changing_all: 0,
            }),
            active: AtomicUsize::new(0),
            counts: Counts::default(),
        }
    }

    pub fn time(&self) -> Duration {
        self.time
    }

    fn now_us(&self) -> u64 {
        self.base.elapsed().as_micros() as u64
    }

    /// Whether any session may hold a lease (else changes skip the work).
    pub fn active(&self) -> bool {
        self.active.load(Relaxed) > 0
    }

    /// Objects leased now (for the metrics).
    pub fn objects(&self) -> usize {
        lock(&self.table).objects.len()
    }

    /// `LeaseOn` on connection `tx` (write lock `wlock`) of a session whose
    /// holder is `slot` (made here the first time). Whatever the session
    /// held before ends: its client starts with an empty cache.
    pub fn turn_on(&self, slot: &std::sync::OnceLock<Arc<Holder>>, tx: Socket, wlock: Arc<Mutex<()>>) -> Arc<Holder> {
        let h = slot.get_or_init(|| {
            let h = Arc::new(Holder {
                epoch: AtomicU64::new(0),
                count: AtomicUsize::new(0),
                line: Mutex::new(None),
                gone: AtomicBool::new(false),
                heard_us: AtomicU64::new(0),
                returned: Mutex::new(0),
                returned_seq: AtomicU64::new(0),
                returned_ns: AtomicU64::new(0),
                answered: Condvar::new(),
            });
            let mut t = lock(&self.table);
            t.holders.retain(|w| w.strong_count() > 0);
            t.holders.push(Arc::downgrade(&h));
            self.active.store(t.holders.len(), Relaxed);
            h
        });
        h.epoch.fetch_add(1, Relaxed);
        h.count.store(0, Relaxed);
        h.gone.store(false, Relaxed);
        *lock(&h.line) = Some(Line { tx, wlock });
        h.heard(self);
        Arc::clone(h)
    }

    /// The sequence a request notes before it runs (see the module text).
    pub fn seq(&self) -> u64 {
        lock(&self.table).seq
    }

    /// Grants `holder` leases on `keys`, read by a request that began at
    /// `seen`. Returns the keys refused (changed since): the caller puts a
    /// break of them before the reply.
    #[cfg(test)]
    pub fn grant(&self, holder: &Arc<Holder>, keys: &[FileKey], seen: u64) -> Vec<FileKey> {
        self.grant_after(holder, keys, seen, 0)
    }

    /// `grant`, for the reply of a request that itself changed the objects
    /// (its `changed` returned `own`): that change is no reason to refuse,
    /// another session's since `seen` still is. Without this, every
    /// change's own reply was refused and broke the changer's copy of what
    /// it had just made (tar x through the mount: a `GETATTR` and a
    /// `GETXATTR` more per file; `ferry run` emptied its caches).
    pub fn grant_after(&self, holder: &Arc<Holder>, keys: &[FileKey], seen: u64, own: u64) -> Vec<FileKey> {
        let me = id_of(holder);
        let epoch = holder.epoch.load(Relaxed);
        let mut refused = Vec::new();
        let mut reset = false;
        {
            let mut t = lock(&self.table);
            let forgot = t.forgot;
            for &key in keys {
                let stale = match t.objects.get(&key) {
                    None => forgot > seen,
                    Some(o) => {
                        let mine = own != 0 && o.changed == own && o.by == me;
                        o.before > seen || (o.changed > seen && !mine)
                    }
                };
                let changing = t.changing_all > 0 || t.changing.contains_key(&key);
                if stale || changing || t.lent.get(&key).is_some_and(|l| l.count > 0) {
                    refused.push(key);
                    continue;
                }
                if !t.objects.contains_key(&key) {
                    t.added += 1;
                }
                let obj = t.objects.entry(key).or_insert_with(|| Obj {
                    changed: forgot.min(seen),
                    by: 0,
                    before: forgot.min(seen),
                    holders: Vec::new(),
                    unreturned: Vec::new(),
                });
                match obj.holders.iter_mut().find(|(h, _)| Arc::ptr_eq(h, holder)) {
                    Some((_, e)) if *e == epoch => continue,
                    Some((_, e)) => *e = epoch,
                    None => obj.holders.push((Arc::clone(holder), epoch)),
                }
                if holder.count.fetch_add(1, Relaxed) + 1 > MAX_PER_HOLDER {
                    reset = true;
                }
            }
            if t.added > PRUNE_EVERY || t.objects.len() > MAX_OBJECTS {
                self.prune(&mut t);
            }
        }
        self.counts.granted.fetch_add((keys.len() - refused.len()) as u64, Relaxed);
        self.counts.refused.fetch_add(refused.len() as u64, Relaxed);
        if reset {
            // The oldest of its leases are not known apart from the rest:
            // all go, unasked for (nobody waits on this break).
            holder.epoch.fetch_add(1, Relaxed);
            holder.count.store(0, Relaxed);
            let seq = self.next_seq();
            self.send(holder, seq, &[Broken::ALL], Instant::now() + self.time);
        }
        refused
    }

    /// `grant`, for a reply about to be written to `out`: a break of the
    /// refused keys goes into `out` first, so the client drops them before
    /// it sees the reply.
    pub fn grant_into(&self, holder: &Arc<Holder>, keys: &[FileKey], seen: u64, own: u64, out: &mut Vec<u8>) {
        if keys.is_empty() {
            return;
        }
        let refused = self.grant_after(holder, keys, seen, own);
        if !refused.is_empty() {
            let objects = refused.iter().map(|k| Broken { dev: k.0, ino: k.1, name: b"" }).collect();
            LeaseBreak { seq: self.seq(), objects }.encode(out);
        }
    }

    fn next_seq(&self) -> u64 {
        let mut t = lock(&self.table);
        t.seq += 1;
        t.seq
    }

    /// Forgets entries no live lease needs; if the table is still too big,
    /// every holder loses everything (a break of all, unasked for).
    fn prune(&self, t: &mut Table) {
        t.added = 0;
        let mut forgot = t.forgot;
        t.unreturned_all.retain(|(h, s, d)| h.owes(*s, *d));
        t.objects.retain(|_, o| {
            o.holders.retain(|(h, e)| !h.gone.load(Relaxed) && h.epoch.load(Relaxed) == *e);
            o.unreturned.retain(|(h, s, d)| h.owes(*s, *d));
            let keep = !o.holders.is_empty() || !o.unreturned.is_empty();
            if !keep {
                forgot = forgot.max(o.changed);
            }
            keep
        });
        if t.objects.len() > MAX_OBJECTS / 2 {
            for o in t.objects.values() {
                forgot = forgot.max(o.changed);
            }
            t.objects.clear();
            t.seq += 1;
            let seq = t.seq;
            for h in t.holders.iter().filter_map(std::sync::Weak::upgrade) {
                h.epoch.fetch_add(1, Relaxed);
                h.count.store(0, Relaxed);
                self.send(&h, seq, &[Broken::ALL], Instant::now());
            }
        }
        t.forgot = forgot;
    }

    /// A descriptor of `key` is lent for writing: no lease on it until the
    /// mark is dropped (with the handle that lent it).
    pub fn lend(self: &Arc<Self>, key: FileKey, by: Option<&Arc<Holder>>) -> LentMark {
        let mut t = lock(&self.table);
        let l = t.lent.entry(key).or_default();
        l.count += 1;
        l.closed = None;
        if let Some(h) = by {
            if !l.by.iter().any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(h))) {
                l.by.push(Arc::downgrade(h));
            }
        }
        drop(t);
        LentMark { leases: Arc::clone(self), key }
    }

    /// A change of `touched` by the session of `mine` has been made: breaks
    /// every other holder's leases on them, and returns once each returned
    /// them or its lease time ran out.
    /// Returns the change's sequence (0: nothing recorded), for
    /// `grant_after`.
    pub fn changed(&self, mine: Option<&Arc<Holder>>, touched: &[Touched]) -> u64 {
        let (seq, sent) = self.breaks_for(mine, touched, true);
        self.wait_for(sent);
        seq
    }

    /// A change of `touched` by the session of `mine` is about to run:
    /// breaks every other holder's leases on them now, so the break's
    /// round trip runs beside the change, and marks them changing (no
    /// grant) until [`Early::finish`] — called once the change ran,
    /// whether it did anything or not — stamps them changed and waits for
    /// the returns. A read of one of them meanwhile is answered without a
    /// lease, whatever it found; a grant that came before the mark is a
    /// holder the break reaches now, and one the mark missed (an object
    /// known only from the change's reply) is broken by `finish` as
    /// `changed` would. So the change is acknowledged, as before, only
    /// once nobody can keep its object's old state.
    pub fn begin_change(self: &Arc<Self>, mine: Option<&Arc<Holder>>, touched: &[Touched]) -> Early {
        let mut early = Early { leases: Arc::clone(self), keys: Vec::new(), all: false, sent: Sent::default() };
        if touched.is_empty() || !self.active() {
            return early;
        }
        {
            // Marked before the holders are taken off: a grant from now on
            // is refused, one before is a holder this break reaches.
            let mut t = lock(&self.table);
            for c in touched {
                match c {
                    Touched::All if !early.all => {
                        early.all = true;
                        t.changing_all += 1;
                    }
                    Touched::All => {}
                    Touched::Object(k) | Touched::Entry(k, _) => {
                        if !early.keys.contains(k) {
                            early.keys.push(*k);
                            *t.changing.entry(*k).or_insert(0) += 1;
                        }
                    }
                }
            }
        }
        early.sent = self.breaks_for(mine, touched, true).1;
        early
    }

    /// Takes off the marks `begin_change` made.
    fn unmark(&self, keys: &[FileKey], all: bool) {
        if keys.is_empty() && !all {
            return;
        }
        let mut t = lock(&self.table);
        for k in keys {
            if let Some(n) = t.changing.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    t.changing.remove(k);
                }
            }
        }
        if all {
            t.changing_all = t.changing_all.saturating_sub(1);
        }
    }

    /// A change of `touched` made outside the server has been seen (it is
    /// done already): breaks every holder's leases on them, without
    /// waiting for their returns.
    pub fn changed_outside(&self, touched: &[Touched]) {
        self.breaks_for(None, touched, false);
    }

    /// Takes the holders of `touched` off them and sends their breaks;
    /// returns the change's sequence and, if `wait`, whom to wait for.
    fn breaks_for(&self, mine: Option<&Arc<Holder>>, touched: &[Touched], wait: bool) -> (u64, Sent) {
        self.breaks_of(mine, touched, wait, false)
    }

    /// `breaks_for`; `all_broken`: the holders got a break of everything
    /// already (`begin_change`) and were granted nothing since, so a
    /// `Touched::All` only stamps the table.
    fn breaks_of(&self, mine: Option<&Arc<Holder>>, touched: &[Touched], wait: bool, all_broken: bool) -> (u64, Sent) {
        if touched.is_empty() || !self.active() {
            return (0, Sent::default());
        }
        let me = mine.map_or(0, id_of);
        // Per holder, what it loses: each touched object it held, with the
        // entry's name for each name touched in a directory it held.
        let mut breaks: Vec<(Arc<Holder>, Vec<Broken<'_>>)> = Vec::new();
        // Holders an earlier break nobody waited for still owes an answer
        // (holder, that break's sequence): this change waits for them too,
        // or one might answer from what the earlier break named after this
        // change is acknowledged.
        let mut owed: Vec<Owed> = Vec::new();
        let seq = {
            let mut t = lock(&self.table);
            t.seq += 1;
            let seq = t.seq;
            t.unreturned_all.retain(|(h, s, d)| h.owes(*s, *d));
            if wait {
                owed.extend(t.unreturned_all.iter().filter(|(h, ..)| mine.is_none_or(|m| !Arc::ptr_eq(m, h))).cloned());
            }
            // The holders each touched key had (taken once per key).
            let mut held: Vec<(FileKey, Vec<Arc<Holder>>)> = Vec::new();
            for c in touched {
                let key = match c {
                    Touched::All => {
                        let all: Vec<Arc<Holder>> = match all_broken {
                            true => Vec::new(),
                            false => t.holders.iter().filter_map(std::sync::Weak::upgrade).collect(),
                        };
                        for h in all {
                            if mine.is_some_and(|m| Arc::ptr_eq(m, &h)) || h.gone.load(Relaxed) {
                                continue;
                            }
                            h.epoch.fetch_add(1, Relaxed);
                            h.count.store(0, Relaxed);
                            add(&mut breaks, &h, Broken::ALL);
                            if !wait {
                                let d = h.deadline(self);
                                t.unreturned_all.push((h, seq, d));
                            }
                        }
                        // What earlier unwaited breaks of objects are owed
                        // outlives the objects.
                        let pending: Vec<Owed> = t
                            .objects
                            .values_mut()
                            .flat_map(|o| o.unreturned.drain(..))
                            .filter(|(h, s, d)| h.owes(*s, *d))
                            .collect();
                        match wait {
                            true => owed
                                .extend(pending.into_iter().filter(|(h, ..)| mine.is_none_or(|m| !Arc::ptr_eq(m, h)))),
                            false => t.unreturned_all.extend(pending),
                        }
                        // Nothing the table knows holds now but the
                        // changer's own leases, which a change of its own
                        // does not break: forgotten, the next change of
                        // one of them by another session would find no
                        // holder to break, and the changer would keep
                        // answering from it (a mount that renamed a
                        // directory kept its misses and listings of every
                        // directory unbroken).
                        let forgot = t.objects.values().map(|o| o.changed).max().unwrap_or(0);
                        t.forgot = t.forgot.max(forgot).max(seq);
                        // Each kept one is touched by this change, as any
                        // object is (a read begun before it is refused).
                        t.objects.retain(|_, o| {
                            o.holders.retain(|(h, _)| mine.is_some_and(|m| Arc::ptr_eq(m, h)));
                            if me == 0 || o.by != me {
                                o.before = o.changed;
                            }
                            o.by = me;
                            o.changed = seq;
                            !o.holders.is_empty()
                        });
                        continue;
                    }
                    Touched::Object(k) | Touched::Entry(k, _) => *k,
                };
                if !held.iter().any(|(k, _)| *k == key) {
                    // Kept even with no holder: a read that began before
                    // this change must not be granted after it (until a
                    // prune forgets it, raising `forgot` instead).
                    if !t.objects.contains_key(&key) {
                        t.added += 1;
                    }
                    let obj = t.objects.entry(key).or_insert_with(|| Obj {
                        changed: 0,
                        by: 0,
                        before: 0,
                        holders: Vec::new(),
                        unreturned: Vec::new(),
                    });
                    if me == 0 || obj.by != me {
                        obj.before = obj.changed;
                    }
                    obj.by = me;
                    obj.changed = seq;
                    let mut kept = Vec::new();
                    let mut losing = Vec::new();
                    // Seen by the kernel's notice, a write through a lent
                    // descriptor is its borrower's own change.
                    let lenders = match wait {
                        false => t.lent.get(&key).map(|l| l.by.clone()).unwrap_or_default(),
                        true => Vec::new(),
                    };
                    let obj = t.objects.get_mut(&key).expect("just made");
                    obj.unreturned.retain(|(h, s, d)| h.owes(*s, *d));
                    if wait {
                        let others = obj.unreturned.iter().filter(|(h, ..)| mine.is_none_or(|m| !Arc::ptr_eq(m, h)));
                        owed.extend(others.cloned());
                    }
                    for (h, e) in obj.holders.drain(..) {
                        let lender = lenders.iter().any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&h)));
                        if lender || mine.is_some_and(|m| Arc::ptr_eq(m, &h)) {
                            kept.push((h, e));
                        } else if !h.gone.load(Relaxed) && h.epoch.load(Relaxed) == e {
                            h.count.fetch_sub(1, Relaxed);
                            losing.push(h);
                        }
                    }
                    obj.holders = kept;
                    if !wait {
                        obj.unreturned.extend(losing.iter().map(|h| (Arc::clone(h), seq, h.deadline(self))));
                    }
                    held.push((key, losing));
                }
                let name: &[u8] = match c {
                    Touched::Entry(_, n) => n,
                    _ => b"",
                };
                if let Some((_, losing)) = held.iter().find(|(k, _)| *k == key) {
                    for h in losing {
                        add(&mut breaks, h, Broken { dev: key.0, ino: key.1, name });
                    }
                }
            }
            if t.added > PRUNE_EVERY {
                self.prune(&mut t);
            }
            seq
        };
        if breaks.is_empty() && owed.is_empty() {
            return (seq, Sent::default());
        }
        let start = Instant::now();
        let mut sent = Sent { start: Some(start), start_ns: mono_ns(), ..Sent::default() };
        for (h, objects) in breaks {
            let heard = self.base + Duration::from_micros(h.heard_us.load(Relaxed));
            let deadline = heard + self.time;
            if deadline <= start {
                continue;
            }
            self.counts.breaks.fetch_add(1, Relaxed);
            sent.wrote_ns = self.send(&h, seq, &objects, deadline);
            sent.waiting.push((h, seq, deadline));
        }
        for (h, owed_seq, deadline) in owed {
            if deadline > start {
                sent.waiting.push((h, owed_seq, deadline));
            }
        }
        if !wait {
            return (seq, Sent::default());
        }
        (seq, sent)
    }

    /// Returns once every holder `sent` names returned its break, went
    /// away, or ran out of lease time.
    fn wait_for(&self, sent: Sent) {
        let Some(start) = sent.start.filter(|_| !sent.waiting.is_empty()) else { return };
        self.counts.waits.fetch_add(1, Relaxed);
        let alone = sent.waiting.len() == 1;
        for (h, seq, deadline) in sent.waiting {
            // A return comes about one round trip after its break: looking
            // for it that long spares the waking of a sleeping thread.
            let look_until = Instant::now() + RETURN_SPIN;
            while h.returned_seq.load(Acquire) < seq && !h.gone.load(Relaxed) && Instant::now() < look_until {
                std::thread::yield_now();
            }
            let mut r = lock(&h.returned);
            let got = loop {
                if *r >= seq {
                    break true;
                }
                if h.gone.load(Relaxed) {
                    break false;
                }
                let now = Instant::now();
                if now >= deadline {
                    drop(r);
                    self.counts.timeouts.fetch_add(1, Relaxed);
                    // A holder that let a break go unanswered holds
                    // nothing more: the next change does not wait for it
                    // again until it is granted something new (and its
                    // client, when it reads this, forgets all).
                    h.epoch.fetch_add(1, Relaxed);
                    h.count.store(0, Relaxed);
                    self.send(&h, seq, &[Broken::ALL], now);
                    break false;
                }
                r = h.answered.wait_timeout(r, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
            };
            if alone && got && sent.wrote_ns != 0 {
                let l = &self.counts.last;
                l.start.store(sent.start_ns, Relaxed);
                l.wrote.store(sent.wrote_ns, Relaxed);
                l.returned.store(h.returned_ns.load(Relaxed), Relaxed);
                l.resumed.store(mono_ns(), Relaxed);
            }
        }
        self.counts.waited_us.fetch_add(start.elapsed().as_micros() as u64, Relaxed);
    }

    /// Sends a break to `h`, giving up at `deadline` (a connection that
    /// takes nothing in: the holder then keeps nothing after its lease
    /// time, and a frame cut half-way ends the connection). Returns when
    /// the write began ([`mono_ns`]; 0: not sent): the holder may have it
    /// before the write returns.
    fn send(&self, h: &Holder, seq: u64, objects: &[Broken<'_>], deadline: Instant) -> u64 {
        let mut frame = Vec::with_capacity(64);
        for chunk in objects.chunks(LeaseBreak::MAX_OBJECTS) {
            LeaseBreak { seq, objects: chunk.to_vec() }.encode(&mut frame);
        }
        let line = lock(&h.line);
        let Some(l) = line.as_ref() else { return 0 };
        // The lock is mostly held by the worker that wrote the holder's
        // last reply, put off the CPU inside its write by the very client
        // it woke: yielding gives it the CPU back. Sleeping at once made
        // 477 of 2,000 of experiment 11's breaks late, a median 274 µs in
        // this wait (its timeline).
        let spin_until = Instant::now() + RETURN_SPIN;
        let _w = loop {
            match l.wlock.try_lock() {
                Ok(g) => break g,
                Err(std::sync::TryLockError::Poisoned(e)) => break e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < spin_until => std::thread::yield_now(),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err(std::sync::TryLockError::WouldBlock) => return 0,
            }
        };
        if !writable(&l.tx, deadline) {
            return 0;
        }
        let at = mono_ns();
        if l.tx.write_parts(&[&frame]).is_err() {
            let _ = l.tx.shutdown_both();
            return 0;
        }
        at
    }
}

/// Puts `b` in `h`'s list of what it loses.
fn add<'a>(breaks: &mut Vec<(Arc<Holder>, Vec<Broken<'a>>)>, h: &Arc<Holder>, b: Broken<'a>) {
    match breaks.iter_mut().find(|(x, _)| Arc::ptr_eq(x, h)) {
        Some((_, v)) => v.push(b),
        None => breaks.push((Arc::clone(h), vec![b])),
    }
}

/// A file lent for writing (`Leases::lend`), until dropped.
pub struct LentMark {
    leases: Arc<Leases>,
    key: FileKey,
}

impl Drop for LentMark {
    fn drop(&mut self) {
        let mut t = lock(&self.leases.table);
        if let Some(l) = t.lent.get_mut(&self.key) {
            l.count = l.count.saturating_sub(1);
            if l.count == 0 {
                l.closed = Some(Instant::now());
            }
        }
        t.lent.retain(|_, l| l.count > 0 || l.closed.is_some_and(|c| c.elapsed() < LATE_NOTICE));
    }
}

/// Waits until `tx` takes a small frame without blocking, or `deadline`.
fn writable(tx: &Socket, deadline: Instant) -> bool {
    use rustix::event::{poll, PollFd, PollFlags};
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut fds = [PollFd::new(tx, PollFlags::OUT)];
        let t = rustix::event::Timespec { tv_sec: left.as_secs() as i64, tv_nsec: left.subsec_nanos() as i64 };
        match poll(&mut fds, Some(&t)) {
            Ok(n) if n > 0 => return fds[0].revents().contains(PollFlags::OUT),
            Ok(_) => return false,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(l: &Leases) -> Arc<Holder> {
        let slot = std::sync::OnceLock::new();
        // A holder with no connection: breaks to it wait out its lease.
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let h = l.turn_on(&slot, Socket::from_fd(a.into(), true), Arc::default());
        *lock(&h.line) = None;
        h
    }

    #[test]
    fn a_grant_is_refused_for_an_object_changed_since_the_read_began() {
        let l = Leases::new(Duration::from_millis(50));
        let (a, b) = (holder(&l), holder(&l));
        let seen = l.seq();
        assert!(l.grant(&a, &[(1, 1)], seen).is_empty());
        let seen = l.seq();
        // b changes (1, 2) while a's read of it runs.
        l.changed(Some(&b), &[Touched::Object((1, 2))]);
        assert_eq!(l.grant(&a, &[(1, 2), (1, 3)], seen), vec![(1, 2)]);
        // Read again after the change: granted.
        assert!(l.grant(&a, &[(1, 2)], l.seq()).is_empty());
    }

    #[test]
    fn a_change_waits_for_a_silent_holder_at_most_its_lease_time_and_never_for_itself() {
        let l = Leases::new(Duration::from_millis(300));
        let (a, b) = (holder(&l), holder(&l));
        assert!(l.grant(&a, &[(1, 1)], l.seq()).is_empty());
        let t = Instant::now();
        l.changed(Some(&a), &[Touched::Object((1, 1))]);
        assert!(t.elapsed() < Duration::from_millis(100), "its own change: no wait");
        let t = Instant::now();
        l.changed(Some(&b), &[Touched::Object((1, 1))]);
        let waited = t.elapsed();
        assert!(waited >= Duration::from_millis(150) && waited < Duration::from_secs(2), "{waited:?}");
        // The break took the lease: the next change does not wait.
        let t = Instant::now();
        l.changed(Some(&b), &[Touched::Object((1, 1))]);
        assert!(t.elapsed() < Duration::from_millis(100));
        // A returned break ends the wait at once.
        assert!(l.grant(&a, &[(1, 1)], l.seq()).is_empty());
        let a2 = Arc::clone(&a);
        let seq = l.seq() + 1;
        let r = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            a2.returned(seq);
        });
        let t = Instant::now();
        l.changed(Some(&b), &[Touched::Object((1, 1))]);
        assert!(t.elapsed() < Duration::from_millis(200), "{:?}", t.elapsed());
        r.join().unwrap();
        assert_eq!(l.counts.timeouts.load(Relaxed), 1);
    }

    /// A break nobody waits for (a change seen on the server's disk, or
    /// the late notice of a write through a lent descriptor) takes the
    /// holder off the object at once, but the holder answers from what it
    /// keeps until it has handled that break: a change through the server
    /// just after must wait for its return too. Before, it found no holder
    /// and was acknowledged at once, and a mount still answered the old
    /// attributes (10,000 rounds of the leases tests: a few stale answers).
    #[test]
    fn a_change_waits_for_a_holder_yet_to_return_a_break_nobody_waited_for() {
        for outside in [Touched::Object((1, 1)), Touched::All] {
            let l = Arc::new(Leases::new(Duration::from_secs(60)));
            let (a, b) = (holder(&l), holder(&l));
            assert!(l.grant(&a, &[(1, 1)], l.seq()).is_empty());
            l.changed_outside(std::slice::from_ref(&outside));
            let seq = l.seq();
            let (tx, rx) = std::sync::mpsc::channel();
            let (l2, b2) = (Arc::clone(&l), Arc::clone(&b));
            let change = std::thread::spawn(move || {
                l2.changed(Some(&b2), &[Touched::Object((1, 1))]);
                let _ = tx.send(());
            });
            let early = rx.recv_timeout(Duration::from_millis(300));
            a.returned(seq);
            change.join().unwrap();
            assert!(early.is_err(), "after {outside:?}: acknowledged before the holder returned its break");
            assert_eq!(l.counts.timeouts.load(Relaxed), 0);
            // Returned: the next change waits for nobody.
            l.changed(Some(&b), &[Touched::Object((1, 1))]);
        }
    }

    #[test]
    fn a_holder_past_its_cap_starts_again_and_the_table_stays_bounded() {
        // A long lease time: waiting for the gone holder would show as a
        // wait of 10 s, not as a few milliseconds a loaded machine also
        // takes (CI once took over 5 ms with a 10 ms lease time).
        let l = Leases::new(Duration::from_secs(10));
        let a = holder(&l);
        for i in 0..(MAX_PER_HOLDER as u64 + 10) {
            l.grant(&a, &[(7, i)], l.seq());
        }
        assert!(a.count.load(Relaxed) < 100, "the cap reset its count");
        assert!(l.objects() <= MAX_OBJECTS);
        // A holder gone (its client closed) is never waited for.
        let b = holder(&l);
        assert!(l.grant(&b, &[(9, 9)], l.seq()).is_empty());
        b.gone.store(true, Relaxed);
        let t = Instant::now();
        l.changed(None, &[Touched::Object((9, 9))]);
        assert_eq!(l.counts.waits.load(Relaxed), 0, "waited for a holder that is gone");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }

    /// The reply of a change is granted to its changer; not if another
    /// session changed the object since the request began, nor for another
    /// request of the changer that ran beside it.
    #[test]
    fn a_change_is_granted_to_its_changer_and_only_for_its_own_reply() {
        let l = Leases::new(Duration::from_millis(10));
        let (a, b) = (holder(&l), holder(&l));
        *lock(&a.line) = None;
        let seen = l.seq();
        let own = l.changed(Some(&a), &[Touched::Object((1, 1))]);
        assert!(l.grant_after(&a, &[(1, 1)], seen, own).is_empty(), "its own change's reply");
        // Another request of `a` that began before that change.
        assert_eq!(l.grant_after(&a, &[(1, 1)], seen, 0), vec![(1, 1)]);
        // `b` changed it, then `a`: `a`'s reply may predate `b`'s change.
        let seen = l.seq();
        l.changed(Some(&b), &[Touched::Object((2, 2))]);
        let own = l.changed(Some(&a), &[Touched::Object((2, 2))]);
        assert_eq!(l.grant_after(&a, &[(2, 2)], seen, own), vec![(2, 2)]);
        // A change outside ferry, then `a`'s own.
        let seen = l.seq();
        l.changed_outside(&[Touched::Object((3, 3))]);
        let own = l.changed(Some(&a), &[Touched::Object((3, 3))]);
        assert_eq!(l.grant_after(&a, &[(3, 3)], seen, own), vec![(3, 3)]);
        // `a` twice in a row, nobody else: the second reply is granted.
        let seen = l.seq();
        l.changed(Some(&a), &[Touched::Object((4, 4))]);
        let own = l.changed(Some(&a), &[Touched::Object((4, 4))]);
        assert!(l.grant_after(&a, &[(4, 4)], seen, own).is_empty());
        // And `b` may not use `a`'s own change as its.
        let seen = l.seq();
        let own = l.changed(Some(&a), &[Touched::Object((5, 5))]);
        assert_eq!(l.grant_after(&b, &[(5, 5)], seen, own), vec![(5, 5)]);
    }

    /// A change whose breaks went out before it ran: nobody is granted a
    /// lease on its objects until it finished (a read meanwhile may have
    /// seen either state), a read begun before its end is refused after,
    /// and its end waits for the early breaks' returns. Dropped unfinished,
    /// its marks come off and its breaks are owed to the next change.
    #[test]
    fn a_change_begun_early_grants_nothing_meanwhile_and_waits_for_its_breaks_at_its_end() {
        let l = Arc::new(Leases::new(Duration::from_secs(60)));
        let (a, b) = (holder(&l), holder(&l));
        assert!(l.grant(&a, &[(1, 1)], l.seq()).is_empty());
        let early = l.begin_change(Some(&b), &[Touched::Object((1, 1))]);
        let break_seq = l.seq();
        // `a` got the break and reads again while the change runs.
        let seen = l.seq();
        assert_eq!(l.grant(&a, &[(1, 1)], seen), vec![(1, 1)], "granted while the change runs");
        assert!(l.grant(&a, &[(1, 2)], seen).is_empty(), "another object is not held up");
        let (tx, rx) = std::sync::mpsc::channel();
        let (l2, b2) = (Arc::clone(&l), Arc::clone(&b));
        let end = std::thread::spawn(move || {
            let own = early.finish(Some(&b2), &[Touched::Object((1, 1))]);
            let _ = tx.send(());
            (own, l2.seq())
        });
        let early_ack = rx.recv_timeout(Duration::from_millis(300));
        assert!(early_ack.is_err(), "acknowledged before the holder returned the early break");
        a.returned(break_seq);
        let (own, _) = end.join().unwrap();
        assert!(own > break_seq);
        // A read begun during the change is refused after it too; one
        // begun after is granted, and so is the changer's own reply.
        assert_eq!(l.grant(&a, &[(1, 1)], seen), vec![(1, 1)]);
        assert!(l.grant(&a, &[(1, 1)], l.seq()).is_empty());
        assert!(l.grant_after(&b, &[(1, 1)], seen, own).is_empty());
        // Unfinished: the mark goes, the break is owed.
        let early = l.begin_change(Some(&b), &[Touched::Object((1, 1))]);
        let owed_seq = l.seq();
        drop(early);
        assert!(l.grant(&b, &[(1, 1)], l.seq()).is_empty(), "the mark stayed");
        let (tx, rx) = std::sync::mpsc::channel();
        let l2 = Arc::clone(&l);
        let next = std::thread::spawn(move || {
            l2.changed(None, &[Touched::Object((9, 9))]);
            let _ = tx.send(());
        });
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "the owed break was not waited for");
        a.returned(owed_seq);
        next.join().unwrap();
        // `Touched::All` holds up every grant while it runs.
        let early = l.begin_change(None, &[Touched::All]);
        assert_eq!(l.grant(&a, &[(5, 5)], l.seq()), vec![(5, 5)]);
        let seq = l.seq();
        let (a2, b2) = (Arc::clone(&a), Arc::clone(&b));
        let r = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            a2.returned(seq);
            b2.returned(seq);
        });
        early.finish(None, &[Touched::All]);
        r.join().unwrap();
        assert!(l.grant(&a, &[(5, 5)], l.seq()).is_empty());
        assert_eq!(l.counts.timeouts.load(Relaxed), 0);
    }

    /// A holder whose client closes while a change waits for its return
    /// ends the wait then, not at its lease time.
    #[test]
    fn a_holder_that_goes_away_during_a_wait_ends_it() {
        use std::os::unix::net::UnixStream;
        let l = Arc::new(Leases::new(Duration::from_secs(20)));
        let (a, _b) = UnixStream::pair().unwrap();
        let ours = a.try_clone().unwrap();
        let slot = std::sync::OnceLock::new();
        let h = l.turn_on(&slot, Socket::from_fd(a.into(), true), Arc::default());
        let tx = Socket::from_fd(ours.into(), true);
        h.heard(&l);
        assert!(l.grant(&h, &[(5, 5)], l.seq()).is_empty());
        let changer = {
            let l = Arc::clone(&l);
            std::thread::spawn(move || {
                let t = Instant::now();
                l.changed(None, &[Touched::Object((5, 5))]);
                t.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(200));
        h.line_ended(&tx, true);
        let waited = changer.join().unwrap();
        assert!(waited < Duration::from_secs(10), "the change waited {waited:?} for a holder that was gone");
    }
}
