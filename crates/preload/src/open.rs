//! A remote open file as this process sees it: where it is, how it was
//! opened, and this process's handle on the server with its gathered
//! writes (reads are buffered by the client's `File`).
//!
//! The file offset is not here: it is the kernel offset of the placeholder
//! fd (see `placeholder.rs`), shared by `dup`, `fork` and `exec` exactly as
//! POSIX shares an open file description.

use std::io::{Read, Seek, SeekFrom, Write};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering::Relaxed};

use crate::sync::Mutex;
use ferry_client::{Attr, File, OpenOptions, Target};

use crate::state;

/// Writes smaller than half of this are gathered into requests of up to
/// this size.
pub const CHUNK: usize = 1024 * 1024;

/// `Open::pos` when the offset lives in the placeholder's kernel offset.
const SHARED: u64 = u64::MAX;

/// Change counters, one per hash bucket of (mount, path): a write through
/// one handle makes the read-ahead of other handles of the same file in
/// this process stale.
static GENERATION: [AtomicU32; 256] = [const { AtomicU32::new(0) }; 256];
/// Handles holding gathered (unsent) writes, per bucket: a read, `stat` or
/// open of the same file through another handle sends them first, so the
/// process sees its own writes as POSIX promises.
static GATHERING: [AtomicU32; 256] = [const { AtomicU32::new(0) }; 256];

/// Sends the gathered writes of every handle of (mount, path) in this
/// process. Cheap when there are none (one atomic load).
pub fn send_pending(mount: usize, path: &[u8]) {
    let b = bucket_of(mount, path);
    if GATHERING[b].load(Relaxed) == 0 {
        return;
    }
    for (_, o) in state::all_opens() {
        if o.bucket == b {
            let mut io = o.io.lock();
            let _ = o.send_gathered(&mut io);
        }
    }
}

pub struct Open {
    pub mount: usize,
    /// Path inside the export.
    pub path: Vec<u8>,
    /// The same path as the program named it (for `fchdir`, `*at` calls).
    pub local: Vec<u8>,
    /// `open` flags: access mode, `O_APPEND`, `O_NONBLOCK`, ... (`F_GETFL`).
    pub flags: AtomicI32,
    pub dir: bool,
    io: Mutex<Io>,
    bucket: usize,
    /// The offset while only this process can use it (see `ops::offset`).
    /// `SHARED` once the offset lives in the placeholder.
    pos: AtomicU64,
}

#[derive(Default)]
struct Io {
    epoch: u64,
    file: Option<File>,
    /// The file's size when this handle opened it, when, and the change
    /// counter then: within the attribute timeout, and with no write by
    /// this process since, a read at or past it is end-of-file without a
    /// request (as `stat` answers from the attribute cache; a program
    /// reading to the end asks twice).
    opened: Option<(u64, std::time::Instant, u32)>,
    /// The attribute cache's generation at the open: with `opened`, an
    /// `fstat` is the open's own attributes while no change by this
    /// process anywhere (a `chmod` by another name, say) came since.
    attrs_gen: u64,
    /// The file's change counter when this handle last read.
    rgen: u32,
    wbuf: Vec<u8>,
    wbase: u64,
}

fn bucket_of(mount: usize, path: &[u8]) -> usize {
    let mut h: u32 = 2166136261 ^ mount as u32;
    for &b in path {
        h = (h ^ b as u32).wrapping_mul(16777619);
    }
    (h & 255) as usize
}

impl Open {
    /// A file this process has just opened on the server.
    pub fn new(mount: usize, path: Vec<u8>, local: Vec<u8>, flags: i32, dir: bool, file: Option<File>) -> Open {
        let bucket = bucket_of(mount, &path);
        // Only read-only opens: a program that opens for writing may be one
        // of several processes sharing the file under locks on another file
        // (sqlite's WAL is read under locks on its -shm), whose appends it
        // must see at once.
        let opened = file
            .as_ref()
            .filter(|f| f.attr().mode & libc::S_IFMT == libc::S_IFREG && flags & libc::O_ACCMODE == libc::O_RDONLY)
            .map(|f| (f.attr().size, std::time::Instant::now(), GENERATION[bucket].load(Relaxed)));
        let attrs_gen = crate::attrs::generation();
        let io = Io { epoch: state::EPOCH.load(Relaxed), file, opened, attrs_gen, ..Io::default() };
        Open {
            mount,
            path,
            local,
            flags: AtomicI32::new(flags),
            dir,
            io: Mutex::new(io),
            bucket,
            pos: AtomicU64::new(0),
        }
    }

    /// The in-process offset, unless the offset lives in the kernel.
    pub fn private_pos(&self) -> Option<u64> {
        Some(self.pos.load(Relaxed)).filter(|p| *p != SHARED)
    }

    /// Sets the in-process offset; false if it lives in the kernel.
    pub fn set_private_pos(&self, p: u64) -> bool {
        let mut cur = self.pos.load(Relaxed);
        loop {
            if cur == SHARED {
                return false;
            }
            match self.pos.compare_exchange_weak(cur, p, Relaxed, Relaxed) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Moves the offset into the placeholder `fd` for good (another process
    /// may share it from now on). The placeholder is set *before* the switch
    /// and the switch only succeeds if no thread moved the offset meanwhile:
    /// a thread that then finds the switch made writes the placeholder
    /// itself, after us, so no update is lost.
    pub fn share(&self, fd: i32) {
        let mut cur = self.pos.load(Relaxed);
        while cur != SHARED {
            let _ = crate::placeholder::set_offset(fd, cur);
            match self.pos.compare_exchange(cur, SHARED, Relaxed, Relaxed) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// For a placeholder inherited with its offset already in the kernel.
    pub fn make_shared(&self) {
        self.pos.store(SHARED, Relaxed);
    }

    /// The path this file was opened by, for path calls on it.
    pub fn remote(&self) -> crate::mounts::Remote {
        crate::mounts::Remote { mount: self.mount, path: self.path.clone(), local: self.local.clone() }
    }

    pub fn access_mode(&self) -> i32 {
        self.flags.load(Relaxed) & libc::O_ACCMODE
    }

    fn errno(&self, e: ferry_client::Error) -> i32 {
        state::errno_of(self.mount, &e)
    }

    /// This process's handle, opened again by path after `fork` or `exec`
    /// (the server's handles belong to the connection that opened them).
    fn file<'a>(&self, io: &'a mut Io) -> Result<&'a mut File, i32> {
        if io.epoch != state::EPOCH.load(Relaxed) {
            self.forget_parent(io);
        }
        if io.file.is_none() {
            let client = state::client(self.mount)?;
            let keep = !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_CLOEXEC);
            let flags = (self.flags.load(Relaxed) & keep) as u32;
            let f = client
                .open(crate::mounts::as_path(&self.path), OpenOptions::new().custom_flags(flags))
                .map_err(|e| self.errno(e))?;
            io.file = Some(f);
        }
        Ok(io.file.as_mut().expect("just opened"))
    }

    /// In a `fork` child: the handle is the parent's, on the parent's
    /// connection (forgotten, never closed), and so are gathered writes.
    fn forget_parent(&self, io: &mut Io) {
        std::mem::forget(io.file.take());
        if !io.wbuf.is_empty() {
            GATHERING[self.bucket].fetch_sub(1, Relaxed);
            io.wbuf.clear();
        }
        io.epoch = state::EPOCH.load(Relaxed);
    }

    /// Before `fork`: sends what is gathered and keeps this file's lock
    /// held across the fork, so the child finds it free.
    pub fn hold_for_fork(&self) {
        let mut io = self.io.lock();
        let _ = self.sync_locked(&mut io);
        std::mem::forget(io);
    }

    /// After `fork`, in both processes.
    ///
    /// # Safety
    /// Only after `hold_for_fork` in this thread.
    pub unsafe fn release_after_fork(&self) {
        // SAFETY: per the function's contract, this thread holds the lock.
        unsafe { self.io.force_unlock() };
    }

    fn generation(&self) -> u32 {
        GENERATION[self.bucket].load(Relaxed)
    }

    fn changed(&self) {
        GENERATION[self.bucket].fetch_add(1, Relaxed);
        crate::attrs::changed();
    }

    /// Another process may have changed any remote file (a child this one
    /// waited for): what this process keeps of them — attributes, open
    /// answers, read-ahead — is not to be believed any more.
    pub fn all_changed() {
        for g in &GENERATION {
            g.fetch_add(1, Relaxed);
        }
        crate::attrs::changed();
    }

    /// Sends gathered writes (without waiting for the server).
    fn send_gathered(&self, io: &mut Io) -> Result<(), i32> {
        if io.wbuf.is_empty() {
            return Ok(());
        }
        GATHERING[self.bucket].fetch_sub(1, Relaxed);
        let data = std::mem::take(&mut io.wbuf);
        let base = io.wbase;
        let f = self.file(io)?;
        let r = f.seek(SeekFrom::Start(base)).and_then(|_| f.write_all(&data));
        io.wbuf = data;
        io.wbuf.clear();
        r.map_err(|e| io_errno(self, e))
    }

    /// Everything written is acknowledged by the server; reports the first
    /// failure of a write that was sent earlier.
    pub fn sync_writes(&self) -> Result<(), i32> {
        let mut io = self.io.lock();
        self.sync_locked(&mut io)
    }

    fn sync_locked(&self, io: &mut Io) -> Result<(), i32> {
        if io.epoch != state::EPOCH.load(Relaxed) {
            // After `fork`: what is gathered is the parent's to send, and
            // there is no handle of ours to flush (nor a reason to open one
            // just to exit or exec).
            self.forget_parent(io);
            return Ok(());
        }
        if io.file.is_none() && io.wbuf.is_empty() {
            return Ok(());
        }
        self.send_gathered(io)?;
        let f = self.file(io)?;
        f.flush_writes().map_err(|e| self.errno(e))
    }

    /// The program moved the offset itself: the read sequence is broken.
    pub fn seeked(&self) {
        if let Some(f) = self.io.lock().file.as_ref() {
            f.discard_read_ahead();
        }
    }

    /// Reads at `pos` through the client's `File`, whose small-read buffer
    /// and read-ahead serve sequential reads of any size.
    pub fn read(&self, pos: u64, buf: &mut [u8]) -> Result<usize, i32> {
        send_pending(self.mount, &self.path);
        let mut guard = self.io.lock();
        let io = &mut *guard;
        self.send_gathered(io)?;
        let gen = self.generation();
        let known_end = self.opened_still(io);
        if known_end.is_some_and(|end| pos >= end) {
            return Ok(0);
        }
        let stale = io.rgen != gen;
        io.rgen = gen;
        let f = self.file(io)?;
        if stale {
            // Another handle of this process wrote to the file.
            f.discard_read_ahead();
        }
        f.seek(SeekFrom::Start(pos)).map_err(|e| io_errno(self, e))?;
        let mut done = 0;
        while done < buf.len() {
            let n = f.read(&mut buf[done..]).map_err(|e| io_errno(self, e))?;
            if n == 0 {
                break;
            }
            done += n;
            if known_end.is_some_and(|end| pos + done as u64 >= end) {
                break;
            }
        }
        Ok(done)
    }

    /// Writes at `pos`; returns the offset after the write (for `O_APPEND`,
    /// wherever the server put the end).
    pub fn write(&self, pos: u64, data: &[u8], append: bool) -> Result<u64, i32> {
        let mut guard = self.io.lock();
        let io = &mut *guard;
        if io.epoch != state::EPOCH.load(Relaxed) {
            // First call in a `fork` child: what follows is the child's
            // (gathered below, it must not count as the parent's).
            self.forget_parent(io);
        }
        self.changed();
        if append {
            self.send_gathered(io)?;
            let f = self.file(io)?;
            // Not `write_all`: it repeats a write that failed as
            // `Interrupted`, and an append must never be sent twice (the
            // client has already sent it again where that is safe).
            let mut done = 0;
            while done < data.len() {
                match f.write(&data[done..]) {
                    Ok(0) => return Err(libc::EIO),
                    Ok(n) => done += n,
                    Err(e) => return Err(io_errno(self, e)),
                }
            }
            let end = f.stream_position().map_err(|e| io_errno(self, e))?;
            return Ok(end);
        }
        let end = pos + data.len() as u64;
        let gather = data.len() < CHUNK / 2 && !state::EXITING.load(Relaxed);
        if gather {
            // A file the client must open again (it moved to another
            // gateway, or the server restarted; for a file holding locks,
            // also a connection the server closed) is opened again now,
            // its locks taken again: a lock someone else took meanwhile
            // fails this write, rather than a later call after more writes
            // were gathered under a lock no longer held.
            if let Some(f) = io.file.as_ref() {
                f.ensure_live().map_err(|e| self.errno(e))?;
            }
            let follows = io.wbase + io.wbuf.len() as u64 == pos;
            if !io.wbuf.is_empty() && (!follows || io.wbuf.len() + data.len() > CHUNK) {
                self.send_gathered(io)?;
            }
            if io.wbuf.is_empty() {
                GATHERING[self.bucket].fetch_add(1, Relaxed);
                io.wbase = pos;
                if io.wbuf.capacity() == 0 {
                    io.wbuf.reserve(CHUNK);
                }
            }
            io.wbuf.extend_from_slice(data);
            if io.wbuf.len() >= CHUNK {
                self.send_gathered(io)?;
            }
            return Ok(end);
        }
        self.send_gathered(io)?;
        let f = self.file(io)?;
        f.seek(SeekFrom::Start(pos)).and_then(|_| f.write_all(data)).map_err(|e| io_errno(self, e))?;
        if state::EXITING.load(Relaxed) {
            f.flush_writes().map_err(|e| self.errno(e))?;
        }
        Ok(end)
    }

    pub fn stat(&self) -> Result<Attr, i32> {
        if let Some(a) = self.attr_at_open() {
            return Ok(a);
        }
        send_pending(self.mount, &self.path);
        let mut io = self.io.lock();
        self.sync_locked(&mut io)?;
        let f = self.file(&mut io)?;
        f.metadata().map_err(|e| self.errno(e))
    }

    /// The attributes the open of a file for reading returned, for an
    /// `fstat` that follows it (`std::fs::read`, `cat`, `cp` all ask one
    /// for the size) within the attribute timeout, as a `stat` by path
    /// would be answered from the cache; never after this process changed
    /// something.
    fn attr_at_open(&self) -> Option<Attr> {
        let io = self.io.lock();
        self.opened_still(&io)?;
        (io.attrs_gen == crate::attrs::generation()).then(|| io.file.as_ref().map(|f| *f.attr()))?
    }

    /// The size the open of a file for reading saw, while it still stands:
    /// within the attribute timeout, with no change to the file by this
    /// process and no `fork` or `exec` since.
    fn opened_still(&self, io: &Io) -> Option<u64> {
        let (size, at, g) = io.opened?;
        let fresh =
            at.elapsed() < crate::attrs::timeout()? && g == self.generation() && io.epoch == state::EPOCH.load(Relaxed);
        fresh.then_some(size)
    }

    pub fn truncate(&self, size: u64) -> Result<(), i32> {
        let mut io = self.io.lock();
        self.changed();
        self.sync_locked(&mut io)?;
        let f = self.file(&mut io)?;
        f.set_len(size).map_err(|e| self.errno(e))?;
        drop(io);
        crate::maps::truncated(self.mount, &self.path, size);
        Ok(())
    }

    /// `fsync`: what this process wrote, through fds and mappings, is stable.
    pub fn fsync(&self, data_only: bool) -> Result<(), i32> {
        crate::maps::write_back(Some((self.mount, &self.path)), false)?;
        self.fsync_writes(data_only)
    }

    /// What this handle wrote is stable (not looking at mappings).
    pub fn fsync_writes(&self, data_only: bool) -> Result<(), i32> {
        let mut io = self.io.lock();
        self.sync_locked(&mut io)?;
        let f = self.file(&mut io)?;
        if data_only { f.sync_data() } else { f.sync_all() }.map_err(|e| self.errno(e))
    }

    /// A target naming this open file for attribute calls.
    pub fn with_handle<T>(
        &self,
        mut f: impl FnMut(&ferry_client::Client, Target<'_>) -> ferry_client::Result<T>,
    ) -> Result<T, i32> {
        let mut io = self.io.lock();
        self.sync_locked(&mut io)?;
        crate::attrs::changed();
        let client = state::client(self.mount)?;
        let mut tries = 0;
        loop {
            let (handle, epoch) = self.file(&mut io)?.current_handle_in().map_err(|e| self.errno(e))?;
            tries += 1;
            match f(&client, Target::Handle(handle)) {
                // Another thread reconnected to a restarted server between
                // the two: it never knew that handle; the file is opened
                // again and asked again.
                Err(e) if tries < 8 && matches!(e.errno(), libc::EBADF | libc::ESTALE) && client.epoch() != epoch => {}
                r => return r.map_err(|e| self.errno(e)),
            }
        }
    }

    /// Runs a record-lock call on this process's handle. Gathered writes go
    /// out first (the server runs a connection's requests in order, so they
    /// land before an unlock), and the read-ahead of every handle of the
    /// file in this process is dropped (after a lock, the data may differ).
    pub fn with_lock<T>(&self, f: impl FnOnce(&File) -> ferry_client::Result<T>) -> Result<T, i32> {
        let mut io = self.io.lock();
        self.send_gathered(&mut io)?;
        self.changed();
        let file = self.file(&mut io)?;
        f(file).map_err(|e| self.errno(e))
    }

    /// Closes this process's handle, reporting a failed write-behind.
    pub fn close(&self) -> Result<(), i32> {
        let mut io = self.io.lock();
        if io.epoch != state::EPOCH.load(Relaxed) {
            self.forget_parent(&mut io);
            return Ok(());
        }
        let sent = self.send_gathered(&mut io);
        let closed = match io.file.take() {
            Some(f) => f.close().map_err(|e| self.errno(e)),
            None => Ok(()),
        };
        sent.and(closed)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

fn io_errno(o: &Open, e: std::io::Error) -> i32 {
    match e.raw_os_error() {
        Some(n) => n,
        // The connection broke: forget it so the next call connects again.
        None => state::errno_of(o.mount, &ferry_client::Error::Protocol(e.to_string())),
    }
}
