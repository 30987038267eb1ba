//! FUSE over io_uring: the ring channel (ferry's addition to fuser 0.18).
//!
//! After `INIT` granted `FUSE_OVER_IO_URING`, each queue (the kernel has one
//! per possible CPU and hands a request to the queue of the CPU it was made
//! on) gets a few rings, each served by one thread and holding `depth`
//! entries. An entry is a header buffer (`fuse_uring_req_header`: the
//! `fuse_in_header`, the operation's own header, the ring's in/out word)
//! and a payload buffer, registered once with `FUSE_IO_URING_CMD_REGISTER`.
//! The kernel fills an entry and completes its command; the request is
//! decoded with fuser's own parser and dispatched to the `Filesystem` as a
//! `/dev/fuse` read would be, and its reply is written into the same
//! buffers and handed back with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which
//! also waits for the next request: no `read` or `writev` per request.
//!
//! `/dev/fuse` stays: `INIT`, `FORGET`, `INTERRUPT` and notifications go
//! through it (kernel documentation, *Limitations*), and so does every
//! request until each queue has an entry.
//!
//! Ownership of an entry's buffers moves kernel → serving thread (its
//! completion) → the one reply (any thread) → kernel (the commit). The
//! request is copied out of the entry before dispatch, except a `WRITE`'s
//! data, which the `Filesystem` reads in place; a reply made while that
//! dispatch still runs is kept and written after it.

use std::alloc::Layout;
use std::cell::Cell;
use std::io;
use std::io::IoSlice;
use std::mem::size_of;
use std::os::fd::AsRawFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::sync::mpsc;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode::UringCmd80;
use io_uring::squeue;
use io_uring::types;
use log::warn;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::dev_fuse::DevFuse;
use crate::ll::fuse_abi as abi;
use crate::ll::fuse_abi::fuse_opcode;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// `fuse_uring_req_header`: `in_out` (128), `op_in` (128), then
/// `fuse_uring_ent_in_out` (flags, commit id, payload size, padding,
/// reserved).
const OP_IN: usize = 128;
const OP_IN_MAX: usize = 128;
const ENT_IN_OUT: usize = 256;
const REQ_HEADER: usize = ENT_IN_OUT + 32;
const COMMIT_ID: usize = ENT_IN_OUT + 8;
const PAYLOAD_SZ: usize = ENT_IN_OUT + 16;

/// `user_data` of the wake-up poll (entries are numbered from 0).
const WAKE: u64 = u64::MAX;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

const IN_HEADER: usize = size_of::<abi::fuse_in_header>();
const OUT_HEADER: usize = size_of::<abi::fuse_out_header>();
const PAGE: usize = 4096;
/// Room before an entry's payload for the request's headers, so that a
/// `WRITE` is one contiguous `/dev/fuse`-shaped request in place; a whole
/// page, so the payload starts on one: a read's data is received from a
/// socket into it and copied by the kernel to the reader from it, and
/// both copies cost 2-4 x more on this machine kind when the payload
/// starts off a cache line (168 bytes in, the headers' size, it made the
/// daemon receive into an aligned buffer of its own and `memcpy` each
/// read over: 13 % of its CPU; docs/benchmarks.md, issue 34).
const PREFIX: usize = (IN_HEADER + OP_IN_MAX).div_ceil(PAGE) * PAGE;

/// How many requests each transport carried (requests the kernel sends
/// only on `/dev/fuse` — `FORGET`, `INTERRUPT` — not counted).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) ring: AtomicU64,
    pub(crate) dev: AtomicU64,
    pub(crate) lent: AtomicU64,
}

/// The transport a session uses, and what it carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transport {
    /// Whether requests are served from io_uring rings, and why not.
    pub ring: RingState,
    /// Requests served from ring entries.
    pub ring_requests: u64,
    /// Requests read from `/dev/fuse` after `INIT` (`FORGET` and
    /// `INTERRUPT` not counted: the kernel sends those there always).
    pub dev_requests: u64,
    /// Replies whose data was written straight into the ring entry's
    /// payload (`ReplyData::buffer`), not copied there.
    pub lent_replies: u64,
}

/// Whether a session serves requests over io_uring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RingState {
    /// Registered: this many queues (one per possible CPU), each with
    /// `threads` rings of `depth` entries.
    On {
        /// Queues, one per possible CPU.
        queues: usize,
        /// Rings (each with its thread) per queue.
        threads: usize,
        /// Entries per ring.
        depth: usize,
    },
    /// Not asked for (`Config::uring` off).
    Off,
    /// The kernel did not offer `FUSE_OVER_IO_URING` in `INIT` (the `fuse`
    /// module's `enable_uring` is off, or the kernel predates it).
    NotOffered,
    /// Offered and granted, but setting the rings up failed.
    Failed(String),
}

/// A handle that reads a session's [`Transport`] from any thread, for as
/// long as wanted (e.g. a metrics endpoint).
#[derive(Debug, Clone)]
pub struct TransportHandle {
    ring: RingState,
    counters: Arc<Counters>,
}

impl TransportHandle {
    pub(crate) fn new(ring: RingState, counters: &Arc<Counters>) -> TransportHandle {
        TransportHandle {
            ring,
            counters: Arc::clone(counters),
        }
    }

    /// The transport and its counts now.
    pub fn get(&self) -> Transport {
        Transport::new(self.ring.clone(), &self.counters)
    }
}

impl Transport {
    pub(crate) fn new(ring: RingState, counters: &Counters) -> Transport {
        Transport {
            ring,
            ring_requests: counters.ring.load(Ordering::Relaxed),
            dev_requests: counters.dev.load(Ordering::Relaxed),
            lent_replies: counters.lent.load(Ordering::Relaxed),
        }
    }

    /// Whether requests go over the rings.
    pub fn ring_on(&self) -> bool {
        matches!(self.ring, RingState::On { .. })
    }

    pub(crate) fn describe(ring: &RingState) -> String {
        Transport::new(ring.clone(), &Counters::default()).to_string()
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.ring {
            RingState::On {
                queues,
                threads,
                depth,
            } => write!(
                f,
                "FUSE over io_uring: {queues} queues × {threads} rings × {depth} entries"
            ),
            RingState::Off => write!(f, "/dev/fuse reads (io_uring not asked for)"),
            RingState::NotOffered => write!(
                f,
                "/dev/fuse reads (the kernel does not offer FUSE over io_uring: \
                 /sys/module/fuse/parameters/enable_uring is off)"
            ),
            RingState::Failed(e) => {
                write!(f, "/dev/fuse reads (FUSE over io_uring failed: {e})")
            }
        }
    }
}

thread_local! {
    /// The ring this thread serves (its address), if any: its own replies
    /// are submitted with its next wait, not one system call each.
    static SERVING: Cell<usize> = const { Cell::new(0) };
}

/// A zeroed, aligned allocation the kernel reads and writes by address.
struct Buf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: a `Buf` is plain memory; who may touch it when is the entry
// ownership protocol of this module (see the module comment), enforced by
// the kernel handing an entry to one completion at a time.
unsafe impl Send for Buf {}
// SAFETY: as above.
unsafe impl Sync for Buf {}

impl Buf {
    fn new(len: usize) -> io::Result<Buf> {
        let layout = Layout::from_size_align(len.max(1), PAGE)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        Ok(Buf { ptr, layout })
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[derive(Default)]
struct EntryState {
    /// The request's data is being read in place by a dispatch.
    borrowed: bool,
    /// A reply made meanwhile, written once the dispatch ends.
    deferred: Option<Vec<u8>>,
}

struct Entry {
    header: Buf,
    data: Buf,
    /// The two buffers as the kernel reads them at `REGISTER`.
    iov: Box<[libc::iovec; 2]>,
    commit_id: AtomicU64,
    state: Mutex<EntryState>,
}

// SAFETY: `iov` only points into this entry's own buffers.
unsafe impl Send for Entry {}
// SAFETY: as above; the other fields are `Sync`.
unsafe impl Sync for Entry {}

/// One io_uring with its entries, served by one thread.
pub(crate) struct Ring {
    // Declared first: closed first, which cancels the entries' commands
    // before their buffers go.
    uring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// Serialises pushes to the submission queue (replies come from any
    /// thread).
    push: Mutex<()>,
    dev: Arc<DevFuse>,
    qid: u16,
    payload: usize,
    entries: Box<[Entry]>,
    /// Entries whose command the kernel still holds or will get back.
    live: AtomicUsize,
    /// Wakes the serving thread for a reply made on another thread: only
    /// the serving thread submits, because the kernel delivers the next
    /// request to an entry in the context of the task that submitted the
    /// entry's command (task work), and that task must be one that comes
    /// back for it — never an application thread waiting on the mount.
    wake: OwnedFd,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ring(q{}, {} entries)", self.qid, self.entries.len())
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if self.live.load(Ordering::Acquire) != 0 {
            // The kernel may still write into registered buffers: leak
            // them rather than free memory it holds the address of.
            std::mem::forget(std::mem::take(&mut self.entries));
        }
    }
}

/// The ring entry a request came in: where its reply goes.
#[derive(Clone)]
pub(crate) struct RingSlot {
    ring: Arc<Ring>,
    idx: usize,
}

impl std::fmt::Debug for RingSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RingSlot(q{}#{})", self.ring.qid, self.idx)
    }
}

/// The queues the kernel makes: one per possible CPU.
fn possible_cpus() -> usize {
    let parsed = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            let mut n = 0;
            for part in s.trim().split(',') {
                let (a, b) = part.split_once('-').unwrap_or((part, part));
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                n = n.max(b + 1).max(a + 1);
            }
            Some(n)
        });
    // SAFETY: sysconf has no memory effects.
    parsed.unwrap_or_else(|| unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize)
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain system call; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor this function owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The header size of each operation's first argument — what the kernel
/// puts in `op_in` (the rest of a request is in the payload buffer). The
/// sizes are those of the structs fuser parses, so a request rebuilt from
/// an entry reads as a `/dev/fuse` one.
fn op_header_size(opcode: u32) -> Option<usize> {
    use fuse_opcode::*;
    let op = fuse_opcode::try_from(opcode).ok()?;
    Some(match op {
        FUSE_LOOKUP | FUSE_READLINK | FUSE_SYMLINK | FUSE_UNLINK | FUSE_RMDIR | FUSE_STATFS
        | FUSE_REMOVEXATTR | FUSE_DESTROY => 0,
        FUSE_FORGET => size_of::<abi::fuse_forget_in>(),
        FUSE_GETATTR => size_of::<abi::fuse_getattr_in>(),
        FUSE_SETATTR => size_of::<abi::fuse_setattr_in>(),
        FUSE_MKNOD => size_of::<abi::fuse_mknod_in>(),
        FUSE_MKDIR => size_of::<abi::fuse_mkdir_in>(),
        FUSE_RENAME => size_of::<abi::fuse_rename_in>(),
        FUSE_RENAME2 => size_of::<abi::fuse_rename2_in>(),
        FUSE_LINK => size_of::<abi::fuse_link_in>(),
        FUSE_OPEN | FUSE_OPENDIR => size_of::<abi::fuse_open_in>(),
        FUSE_READ | FUSE_READDIR | FUSE_READDIRPLUS => size_of::<abi::fuse_read_in>(),
        FUSE_WRITE => size_of::<abi::fuse_write_in>(),
        FUSE_RELEASE | FUSE_RELEASEDIR => size_of::<abi::fuse_release_in>(),
        FUSE_FSYNC | FUSE_FSYNCDIR => size_of::<abi::fuse_fsync_in>(),
        FUSE_SETXATTR => size_of::<abi::fuse_setxattr_in>(),
        FUSE_GETXATTR | FUSE_LISTXATTR => size_of::<abi::fuse_getxattr_in>(),
        FUSE_FLUSH => size_of::<abi::fuse_flush_in>(),
        FUSE_GETLK | FUSE_SETLK | FUSE_SETLKW => size_of::<abi::fuse_lk_in>(),
        FUSE_ACCESS => size_of::<abi::fuse_access_in>(),
        FUSE_CREATE => size_of::<abi::fuse_create_in>(),
        FUSE_INTERRUPT => size_of::<abi::fuse_interrupt_in>(),
        FUSE_BMAP => size_of::<abi::fuse_bmap_in>(),
        FUSE_IOCTL => size_of::<abi::fuse_ioctl_in>(),
        FUSE_POLL => size_of::<abi::fuse_poll_in>(),
        FUSE_FALLOCATE => size_of::<abi::fuse_fallocate_in>(),
        FUSE_LSEEK => size_of::<abi::fuse_lseek_in>(),
        FUSE_COPY_FILE_RANGE => size_of::<abi::fuse_copy_file_range_in>(),
        FUSE_BATCH_FORGET => size_of::<abi::fuse_batch_forget_in>(),
        FUSE_NOTIFY_REPLY => size_of::<abi::fuse_notify_retrieve_in>(),
        _ => return None,
    })
}

/// The 80-byte command area: `fuse_uring_cmd_req` (flags, commit id, qid).
fn cmd_area(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    cmd
}

impl Ring {
    fn new(
        dev: &Arc<DevFuse>,
        qid: u16,
        depth: usize,
        payload: usize,
        counters: &Arc<Counters>,
    ) -> io::Result<Ring> {
        let sq = (depth as u32).next_power_of_two().max(2);
        let uring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_cqsize(sq * 2)
            .build(sq)?;
        let mut entries = Vec::with_capacity(depth);
        for _ in 0..depth {
            let header = Buf::new(PAGE)?;
            let data = Buf::new(PREFIX + payload)?;
            let iov = Box::new([
                libc::iovec {
                    iov_base: header.ptr.as_ptr().cast(),
                    iov_len: REQ_HEADER,
                },
                libc::iovec {
                    // SAFETY: within the allocation of PREFIX + payload bytes.
                    iov_base: unsafe { data.ptr.as_ptr().add(PREFIX) }.cast(),
                    iov_len: payload,
                },
            ]);
            entries.push(Entry {
                header,
                data,
                iov,
                commit_id: AtomicU64::new(0),
                state: Mutex::new(EntryState::default()),
            });
        }
        Ok(Ring {
            uring,
            push: Mutex::new(()),
            dev: Arc::clone(dev),
            qid,
            payload,
            entries: entries.into_boxed_slice(),
            live: AtomicUsize::new(0),
            wake: eventfd()?,
            counters: Arc::clone(counters),
        })
    }

    fn fd(&self) -> types::Fd {
        types::Fd(self.dev.as_raw_fd())
    }

    fn push(&self, sqe: &squeue::Entry128) -> io::Result<()> {
        let _g = self.push.lock();
        loop {
            // SAFETY: pushes are serialised by `self.push`; the SQE points
            // at an entry's iovec (REGISTER), which lives as long as the
            // ring, or at nothing (COMMIT).
            let pushed = unsafe { self.uring.submission_shared().push(sqe) };
            if pushed.is_ok() {
                return Ok(());
            }
            // Full: cannot happen with one SQE per entry at most, but
            // submitting frees room whatever the reason.
            self.uring.submitter().submit()?;
        }
    }

    /// Watches the wake-up descriptor (multishot: once for the ring's
    /// life, re-armed if the kernel ends it).
    fn arm_wake(&self) -> io::Result<()> {
        let sqe =
            io_uring::opcode::PollAdd::new(types::Fd(self.wake.as_raw_fd()), libc::POLLIN as u32)
                .multi(true)
                .build()
                .user_data(WAKE);
        self.push(&sqe.into())
    }

    /// Registers every entry with the kernel; run by the serving thread
    /// (see `wake`). Returns completions already there.
    fn register(&self) -> io::Result<Vec<cqueue::Entry>> {
        self.arm_wake()?;
        for (idx, e) in self.entries.iter().enumerate() {
            let sqe = UringCmd80::new(self.fd(), CMD_REGISTER)
                .cmd(cmd_area(0, self.qid))
                .addr(Some(e.iov.as_ptr() as u64))
                .build()
                .user_data(idx as u64);
            self.push(&with_iov_count(sqe, 2))?;
        }
        self.live.store(self.entries.len(), Ordering::Release);
        self.uring.submitter().submit()?;
        // A registration the kernel refused completes at once with its
        // error; a good one completes only with a request.
        // SAFETY: only the serving thread reads the completion queue.
        let done: Vec<cqueue::Entry> = unsafe { self.uring.completion_shared() }.collect();
        if let Some(bad) = done
            .iter()
            .find(|c| c.user_data() != WAKE && c.result() < 0)
        {
            return Err(io::Error::from_raw_os_error(-bad.result()));
        }
        Ok(done)
    }

    /// Hands entry `idx` back with its reply (written already).
    fn commit(&self, idx: usize) -> io::Result<()> {
        let commit_id = self.entries[idx].commit_id.load(Ordering::Acquire);
        let sqe = UringCmd80::new(self.fd(), CMD_COMMIT_AND_FETCH)
            .cmd(cmd_area(commit_id, self.qid))
            .build()
            .user_data(idx as u64);
        self.push(&sqe)?;
        if SERVING.with(Cell::get) != self as *const Ring as usize {
            // The serving thread submits it (see `wake`).
            let one = 1u64.to_ne_bytes();
            // SAFETY: an 8-byte write from a live buffer to our eventfd.
            let n = unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
            if n != 8 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// Writes a reply's `fuse_out_header` and payload size into entry
    /// `idx`, whose payload holds the reply's data already.
    fn write_header(&self, idx: usize, out: &[u8; OUT_HEADER], len: usize) {
        let h = self.entries[idx].header.ptr.as_ptr();
        // SAFETY: the entry is this reply's (the kernel completed it and it
        // is not committed yet); both writes stay inside the header page.
        unsafe {
            std::ptr::copy_nonoverlapping(out.as_ptr(), h, OUT_HEADER);
            std::ptr::copy_nonoverlapping(
                (len as u32).to_ne_bytes().as_ptr(),
                h.add(PAYLOAD_SZ),
                4,
            );
        }
    }

    /// Writes a reply (`fuse_out_header` then its payload) into entry `idx`.
    fn write_reply(&self, idx: usize, parts: &[&[u8]]) {
        let e = &self.entries[idx];
        let mut out = [0u8; OUT_HEADER];
        let mut rest: Vec<&[u8]> = Vec::with_capacity(parts.len());
        let mut filled = 0;
        for p in parts {
            if filled < OUT_HEADER {
                let n = (OUT_HEADER - filled).min(p.len());
                out[filled..filled + n].copy_from_slice(&p[..n]);
                filled += n;
                if n < p.len() {
                    rest.push(&p[n..]);
                }
            } else {
                rest.push(p);
            }
        }
        let mut len: usize = rest.iter().map(|p| p.len()).sum();
        if len > self.payload {
            // The kernel would refuse it: say so to the caller instead.
            warn!(
                "FUSE reply of {len} bytes exceeds the ring's {} byte payload",
                self.payload
            );
            out[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
            out[0..4].copy_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
            rest.clear();
            len = 0;
        }
        // SAFETY: the entry is this reply's (the kernel completed it and it
        // is not committed yet) and no dispatch reads it in place (the
        // caller checked `borrowed`); the writes stay inside the payload
        // (`len` was checked against it above).
        unsafe {
            let mut at = e.data.ptr.as_ptr().add(PREFIX);
            for p in rest {
                std::ptr::copy_nonoverlapping(p.as_ptr(), at, p.len());
                at = at.add(p.len());
            }
        }
        self.write_header(idx, &out, len);
    }
}

/// Sets an SQE's `len` (the iovec count `REGISTER` reads), which
/// `UringCmd80` does not expose.
fn with_iov_count(sqe: squeue::Entry128, n: u32) -> squeue::Entry128 {
    // SAFETY: `Entry128` is `repr(C)`, 128 bytes of plain data laid out as
    // `struct io_uring_sqe` (with the command area after it); `len` is the
    // `u32` at offset 24.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&n.to_ne_bytes());
    // SAFETY: as above; every bit pattern is a valid SQE value.
    unsafe { std::mem::transmute(raw) }
}

impl RingSlot {
    /// Sends a reply: writes it into the entry and commits the entry.
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let e = &self.ring.entries[self.idx];
        let mut st = e.state.lock();
        if st.borrowed {
            st.deferred = Some(data.iter().flat_map(|s| s.iter().copied()).collect());
            return Ok(());
        }
        let parts: Vec<&[u8]> = data.iter().map(|s| &s[..]).collect();
        self.ring.write_reply(self.idx, &parts);
        drop(st);
        self.ring.commit(self.idx)
    }

    /// The entry's payload, lent to the reply for its data to be written
    /// in place (a `READ`'s, received straight from where it comes),
    /// `size` bytes of it; `None` if `size` exceeds the payload (the reply
    /// then goes the copying way, which says why it cannot fit) or a
    /// dispatch reads the request's data in place (never for a reply that
    /// carries data: only a `WRITE`'s is read in place).
    ///
    /// `&mut self`: the one reply made for the request holds the only
    /// `RingSlot` that writes the entry, so the borrow is exclusive; it
    /// ends before the reply is sent, which takes the reply by value.
    pub(crate) fn lend(&mut self, size: usize) -> Option<&mut [u8]> {
        if size > self.ring.payload || self.ring.entries[self.idx].state.lock().borrowed {
            return None;
        }
        // SAFETY: the kernel completed this entry and it is not committed:
        // its buffers are this request's until its one reply commits it,
        // and that reply holds this slot mutably borrowed while the slice
        // lives. The request's own bytes were copied out before dispatch
        // (it is not read in place, checked above), so nothing else reads
        // or writes the payload; `size` is within it. The memory outlives
        // the borrow: `self.ring` keeps the ring (and its entries) alive.
        Some(unsafe {
            std::slice::from_raw_parts_mut(
                self.ring.entries[self.idx].data.ptr.as_ptr().add(PREFIX),
                size,
            )
        })
    }

    /// Sends a reply whose data, `len` bytes, was written into the lent
    /// payload: writes the header and commits the entry. No copy.
    pub(crate) fn send_lent(&self, unique: u64, len: usize) -> io::Result<()> {
        let e = &self.ring.entries[self.idx];
        let st = e.state.lock();
        // `lend` refused while borrowed, and a lent reply is made by the
        // dispatch's own request, never in place.
        debug_assert!(!st.borrowed);
        let mut out = [0u8; OUT_HEADER];
        out[0..4].copy_from_slice(&((OUT_HEADER + len) as u32).to_ne_bytes());
        out[8..16].copy_from_slice(&unique.to_ne_bytes());
        self.ring.write_header(self.idx, &out, len);
        drop(st);
        self.ring.counters.lent.fetch_add(1, Ordering::Relaxed);
        self.ring.commit(self.idx)
    }
}

/// A ring's serving thread, waiting for the session's dispatcher.
pub(crate) struct RingThread<FS: Filesystem> {
    go: mpsc::SyncSender<SessionEventLoop<FS>>,
    thread: std::thread::JoinHandle<io::Result<()>>,
}

impl<FS: Filesystem> std::fmt::Debug for RingThread<FS> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RingThread({:?})", self.thread.thread().name())
    }
}

impl<FS: Filesystem> RingThread<FS> {
    /// Starts serving with `se`; the handle ends when the ring does.
    pub(crate) fn go(self, se: SessionEventLoop<FS>) -> std::thread::JoinHandle<io::Result<()>> {
        // A thread that already ended (it could not register) drops `se`.
        let _ = self.go.send(se);
        self.thread
    }
}

/// Sets up the rings after `INIT` granted `FUSE_OVER_IO_URING`: each gets
/// its thread, which registers the entries (see `Ring::wake` for why that
/// thread) and then waits for `RingThread::go`.
pub(crate) fn start<FS: Filesystem>(
    dev: &Arc<DevFuse>,
    max_write: usize,
    (threads, n_threads): (usize, usize),
    depth: usize,
    counters: &Arc<Counters>,
) -> Result<(Vec<RingThread<FS>>, RingState), String> {
    let queues = possible_cpus();
    // 0: as many serving threads in all as the session's readers.
    let threads = if threads == 0 {
        n_threads.div_ceil(queues)
    } else {
        threads
    };
    // The kernel's smallest acceptable payload buffer is its largest
    // request or reply: max(8 KiB, max_write, max_pages pages).
    let payload = max_write.max(8192).div_ceil(PAGE) * PAGE;
    let (threads, depth) = (threads.max(1), depth.max(1));
    let mut started = Vec::with_capacity(queues * threads);
    let (ready_tx, ready_rx) = mpsc::channel::<(u16, io::Result<()>)>();
    for qid in 0..queues {
        for t in 0..threads {
            let ring = Ring::new(dev, qid as u16, depth, payload, counters)
                .map_err(|e| format!("io_uring setup: {e}"))?;
            let (go, wait) = mpsc::sync_channel::<SessionEventLoop<FS>>(1);
            let ready = ready_tx.clone();
            let thread = std::thread::Builder::new()
                .name(format!("fuser-ring-{qid}-{t}"))
                .spawn(move || ring_thread(Arc::new(ring), ready, wait))
                .map_err(|e| format!("starting a ring thread: {e}"))?;
            started.push(RingThread { go, thread });
        }
    }
    drop(ready_tx);
    for _ in 0..started.len() {
        match ready_rx.recv() {
            Ok((_, Ok(()))) => {}
            Ok((qid, Err(e))) => return Err(format!("registering queue {qid}'s entries: {e}")),
            Err(_) => return Err("a ring thread ended before registering".into()),
        }
    }
    Ok((
        started,
        RingState::On {
            queues,
            threads,
            depth,
        },
    ))
}

fn ring_thread<FS: Filesystem>(
    ring: Arc<Ring>,
    ready: mpsc::Sender<(u16, io::Result<()>)>,
    wait: mpsc::Receiver<SessionEventLoop<FS>>,
) -> io::Result<()> {
    SERVING.with(|s| s.set(Arc::as_ptr(&ring) as usize));
    let early = match ring.register() {
        Ok(early) => {
            let _ = ready.send((ring.qid, Ok(())));
            early
        }
        Err(e) => {
            let _ = ready.send((ring.qid, Err(e)));
            return Ok(());
        }
    };
    drop(ready);
    // Requests that come meanwhile wait in the completion queue.
    let Ok(se) = wait.recv() else {
        // The session was dropped before it ran: ending this thread
        // cancels its entries.
        return Ok(());
    };
    serve(ring, early, &se)
}

/// A request's bytes laid out as `/dev/fuse` gives them, 8-aligned.
struct Scratch(Vec<u64>);

impl Scratch {
    fn bytes(&mut self, len: usize) -> &mut [u8] {
        let words = len.div_ceil(8);
        if self.0.len() < words {
            self.0.resize(words, 0);
        }
        // SAFETY: u64s viewed as bytes, within the vector.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<u8>(), len) }
    }
}

/// Serves one ring until the kernel gives back all its entries (unmount).
fn serve<FS: Filesystem>(
    ring: Arc<Ring>,
    mut cqes: Vec<cqueue::Entry>,
    se: &SessionEventLoop<FS>,
) -> io::Result<()> {
    let mut scratch = Scratch(Vec::new());
    loop {
        for c in cqes.drain(..) {
            if c.user_data() == WAKE {
                let mut count = [0u8; 8];
                // SAFETY: an 8-byte read into a live buffer from our
                // (non-blocking) eventfd.
                let _ = unsafe { libc::read(ring.wake.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
                if !cqueue::more(c.flags()) {
                    ring.arm_wake()?;
                }
                continue;
            }
            let idx = c.user_data() as usize;
            let res = c.result();
            if idx >= ring.entries.len() {
                continue;
            }
            if res == -libc::EINTR || res == -libc::EAGAIN {
                // Not taken: ask again for the next request.
                ring.commit(idx)?;
                continue;
            }
            if res < 0 {
                // Unmount (ENOTCONN) or the ring going away (ECANCELED):
                // the kernel is done with this entry.
                if res != -libc::ENOTCONN && res != -libc::ECANCELED && res != -libc::ENODEV {
                    warn!(
                        "FUSE ring entry ended: {}",
                        io::Error::from_raw_os_error(-res)
                    );
                }
                ring.live.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            ring.counters.ring.fetch_add(1, Ordering::Relaxed);
            handle(&ring, idx, &mut scratch, se)?;
        }
        if ring.live.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        match ring.uring.submitter().submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
        // SAFETY: only this thread reads the completion queue.
        cqes.extend(unsafe { ring.uring.completion_shared() });
    }
}

/// Decodes the request in entry `idx` and dispatches it.
fn handle<FS: Filesystem>(
    ring: &Arc<Ring>,
    idx: usize,
    scratch: &mut Scratch,
    se: &SessionEventLoop<FS>,
) -> io::Result<()> {
    let e = &ring.entries[idx];
    let mut head = [0u8; REQ_HEADER];
    // SAFETY: the kernel completed this entry: its buffers are ours until
    // the commit; the header buffer is a page.
    unsafe { std::ptr::copy_nonoverlapping(e.header.ptr.as_ptr(), head.as_mut_ptr(), REQ_HEADER) };
    let word = |at: usize| u32::from_ne_bytes(head[at..at + 4].try_into().unwrap());
    let opcode = word(4);
    let unique = u64::from_ne_bytes(head[8..16].try_into().unwrap());
    let commit_id = u64::from_ne_bytes(head[COMMIT_ID..COMMIT_ID + 8].try_into().unwrap());
    let payload_sz = word(PAYLOAD_SZ) as usize;
    e.commit_id.store(commit_id, Ordering::Release);
    let slot = RingSlot {
        ring: Arc::clone(ring),
        idx,
    };
    if opcode == fuse_opcode::FUSE_DESTROY as u32 {
        // The session ends with the unmount that follows; nothing to do
        // (on /dev/fuse it ends the reading thread, here the kernel gives
        // the entries back).
        return reply_errno(&slot, unique, 0);
    }
    let op = op_header_size(opcode).filter(|&n| n <= OP_IN_MAX);
    let (Some(op), true) = (op, payload_sz <= ring.payload) else {
        // Unknown to this decoder: an error, as for an unparsable read.
        return reply_errno(&slot, unique, libc::ENOSYS);
    };
    let total = IN_HEADER + op + payload_sz;
    let len_field = (total as u32).to_ne_bytes();
    let ch = se.ch.sender();
    let in_place = opcode == fuse_opcode::FUSE_WRITE as u32;
    let bytes: &[u8] = if in_place {
        let start = PREFIX - IN_HEADER - op;
        // SAFETY: the headers go into the room before the payload, inside
        // the data buffer; nothing else touches the entry now.
        unsafe {
            let d = e.data.ptr.as_ptr().add(start);
            std::ptr::copy_nonoverlapping(head.as_ptr(), d, IN_HEADER);
            std::ptr::copy_nonoverlapping(len_field.as_ptr(), d, 4);
            std::ptr::copy_nonoverlapping(head.as_ptr().add(OP_IN), d.add(IN_HEADER), op);
        }
        e.state.lock().borrowed = true;
        // SAFETY: as above; the slice ends at the payload's end, and
        // replies are held back until `borrowed` is cleared below.
        unsafe { std::slice::from_raw_parts(e.data.ptr.as_ptr().add(start), total) }
    } else {
        let b = scratch.bytes(total);
        b[..IN_HEADER].copy_from_slice(&head[..IN_HEADER]);
        b[..4].copy_from_slice(&len_field);
        b[IN_HEADER..IN_HEADER + op].copy_from_slice(&head[OP_IN..OP_IN + op]);
        // SAFETY: the payload buffer holds `payload_sz` bytes of request.
        let payload =
            unsafe { std::slice::from_raw_parts(e.data.ptr.as_ptr().add(PREFIX), payload_sz) };
        b[IN_HEADER + op..].copy_from_slice(payload);
        b
    };
    match RequestWithSender::new(ch, bytes) {
        Some(req) => req.with_ring(slot.clone()).dispatch(se),
        None => {
            if in_place {
                e.state.lock().borrowed = false;
            }
            return reply_errno(&slot, unique, libc::EIO);
        }
    }
    if in_place {
        let mut st = e.state.lock();
        st.borrowed = false;
        if let Some(reply) = st.deferred.take() {
            ring.write_reply(idx, &[&reply]);
            drop(st);
            ring.commit(idx)?;
        }
    }
    Ok(())
}

/// An answer without data: `errno` 0 for success.
fn reply_errno(slot: &RingSlot, unique: u64, errno: i32) -> io::Result<()> {
    let mut out = [0u8; OUT_HEADER];
    out[0..4].copy_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
    out[4..8].copy_from_slice(&(-errno).to_ne_bytes());
    out[8..16].copy_from_slice(&unique.to_ne_bytes());
    slot.send(&[IoSlice::new(&out)])
}
