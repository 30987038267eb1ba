//! The cache on the client's disk, shared by every process of one user on
//! the machine (the mount, each `ferry run` process, the CLI).
//!
//! Layout, in `DIR/v1/`: per remote file (its key hashed to 32 hex digits
//! `K`), a metadata file `K.meta` and, per version of the file's data,
//! `K-V.data` (`V` the version hashed), sparse, filled chunk by chunk.
//! `K.meta` holds a header (magic, the boot it was made in, key, version,
//! size) and one byte per 1 MiB chunk: 1 once the chunk's data is in
//! `K-V.data`. Rules that make sharing safe without locks on the data path:
//!
//! - a chunk is marked after its data is written (`pwrite` then `pwrite`),
//!   and the page cache is coherent between processes, so a reader that
//!   sees a mark sees the data; a process killed between the two leaves an
//!   unmarked chunk, fetched again by the next reader;
//! - a version's data file is never truncated or rewritten with other
//!   bytes: fillers of one version write identical bytes; a new version is
//!   a new file, and a reader holding the old one keeps reading old data;
//! - a metadata file made in another boot is not trusted (its marks may
//!   have reached the disk before the data did), nor one whose header does
//!   not parse or name the same key;
//! - metadata files are made under a temporary name and renamed into
//!   place whole.
//!
//! Least recently used entries (the metadata file's mtime, touched on use)
//! are removed when the data held passes the limit, by one process at a
//! time (an `flock` on `DIR/v1/lock`). What is held is counted in
//! `DIR/v1/usage` (a little-endian u64 under an `flock`), which every
//! process adds its fills to: no process lists the store to learn it,
//! except to initialise the count once and to evict, and both are done by
//! a thread of their own, never on the path of an open, a read or a fill
//! — so a file's cost never grows with the store (a store of a million
//! entries is listed in seconds).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// The unit of filling and of the marks.
pub const CHUNK: u64 = 1 << 20;

const MAGIC: &[u8; 8] = b"FRYCACH1";

/// How often a use refreshes an entry's place in the LRU order.
const TOUCH_EVERY: Duration = Duration::from_secs(1);

/// The store: a directory and a size limit. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    limit: u64,
    boot: Vec<u8>,
    /// Data held as of the last scan, plus what this process filled since
    /// (used only where the shared count cannot be).
    usage: AtomicU64,
    scanned: AtomicBool,
    /// `DIR/v1/usage`: the count every process shares.
    counter: Option<File>,
    /// The process whose thread of `in_background` is counting or
    /// evicting (0: none). A process id, not a flag: a child forked
    /// meanwhile has no such thread, and must not wait for it.
    busy: AtomicU32,
}

/// One version of one remote file's data.
pub struct Entry {
    store: Store,
    meta: File,
    data: File,
    /// Offset of the first mark in `meta`.
    marks_at: u64,
    size: u64,
    /// Chunks seen marked (a mark is never taken back within a version).
    known: Vec<AtomicBool>,
    meta_path: PathBuf,
    touched: Mutex<Instant>,
    /// Which file and version this is (the metadata header).
    tag: Vec<u8>,
}

impl Store {
    pub fn open(dir: &Path, limit: u64) -> io::Result<Store> {
        let boot = fs::read("/proc/sys/kernel/random/boot_id")?;
        Store::open_with_boot_id(dir, limit, boot.trim_ascii())
    }

    /// `open` as if the machine's boot id were `boot` (tests of a reboot).
    #[doc(hidden)]
    pub fn open_with_boot_id(dir: &Path, limit: u64, boot: &[u8]) -> io::Result<Store> {
        let v1 = dir.join("v1");
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&v1)?;
        let counter = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(v1.join("usage"))
            .ok();
        let inner = Inner {
            dir: v1,
            limit,
            boot: boot.to_vec(),
            usage: AtomicU64::new(0),
            scanned: AtomicBool::new(false),
            counter,
            busy: AtomicU32::new(0),
        };
        Ok(Store { inner: Arc::new(inner) })
    }

    /// `$XDG_CACHE_HOME/ferry`, else `$HOME/.cache/ferry`.
    pub fn default_dir() -> Option<PathBuf> {
        match std::env::var_os("XDG_CACHE_HOME") {
            Some(x) if !x.is_empty() => Some(PathBuf::from(x).join("ferry")),
            _ => Some(PathBuf::from(std::env::var_os("HOME")?).join(".cache/ferry")),
        }
    }

    fn paths(&self, key: &[u8], version: &[u8]) -> (PathBuf, PathBuf) {
        let k = hex(key);
        let d = &self.inner.dir;
        (d.join(format!("{k}.meta")), d.join(format!("{k}-{}.data", hex(version))))
    }

    /// The entry of `key` in `version`, `size` bytes long: the one held if
    /// it is that version (and trustworthy), else a new one in its place.
    pub fn entry(&self, key: &[u8], version: &[u8], size: u64) -> io::Result<Entry> {
        let (meta_path, data_path) = self.paths(key, version);
        let header = self.header(key, version, size);
        let meta = match open_rw(&meta_path) {
            Ok(f) if read_header(&f, header.len()).is_some_and(|h| h == header) => f,
            _ => {
                self.forget(key)?;
                self.create_meta(&meta_path, &header, size)?
            }
        };
        let data =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o600).open(&data_path)?;
        if data.metadata()?.len() < size {
            data.set_len(size)?;
        }
        let chunks = size.div_ceil(CHUNK) as usize;
        let e = Entry {
            store: self.clone(),
            meta,
            data,
            marks_at: header.len() as u64,
            size,
            known: (0..chunks).map(|_| AtomicBool::new(false)).collect(),
            meta_path,
            touched: Mutex::new(Instant::now()),
            tag: header,
        };
        let _ = e.meta.set_modified(SystemTime::now());
        Ok(e)
    }

    /// The entry of `key` in `version`, `size` bytes long, if the store
    /// holds it whole (nothing made or dropped otherwise): a copy a lease
    /// vouches for, opened again without asking the server.
    pub fn complete(&self, key: &[u8], version: &[u8], size: u64) -> Option<Entry> {
        let (meta_path, _) = self.paths(key, version);
        let header = self.header(key, version, size);
        let meta = open_rw(&meta_path).ok()?;
        if read_header(&meta, header.len())? != header {
            return None;
        }
        drop(meta);
        let e = self.entry(key, version, size).ok()?;
        e.is_complete().then_some(e)
    }

    fn header(&self, key: &[u8], version: &[u8], size: u64) -> Vec<u8> {
        let mut h = MAGIC.to_vec();
        for part in [&self.inner.boot[..], key, version] {
            h.extend_from_slice(&(part.len() as u32).to_le_bytes());
            h.extend_from_slice(part);
        }
        h.extend_from_slice(&size.to_le_bytes());
        h
    }

    /// A metadata file with no chunk marked, put in place whole.
    fn create_meta(&self, path: &Path, header: &[u8], size: u64) -> io::Result<File> {
        let mut rnd = [0u8; 8];
        let _ = getrandom::getrandom(&mut rnd);
        let tmp = self.inner.dir.join(format!("tmp.{}.{}", std::process::id(), u64::from_le_bytes(rnd)));
        let f = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&tmp)?;
        let made = f.write_all_at(header, 0).and_then(|_| f.set_len(header.len() as u64 + size.div_ceil(CHUNK)));
        let made = made.and_then(|_| fs::rename(&tmp, path));
        if made.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        made.map(|_| f)
    }

    /// Drops whatever the store holds for `key`: the version its metadata
    /// names, found from that file alone — never by listing the store, whose
    /// size must not be paid per entry. A data file no metadata names (a
    /// process killed between the two) is left to eviction, which takes
    /// such files first.
    pub fn forget(&self, key: &[u8]) -> io::Result<()> {
        let k = hex(key);
        let meta = self.inner.dir.join(format!("{k}.meta"));
        if let Some(version) = fs::read(&meta).ok().as_deref().and_then(version_in) {
            let _ = fs::remove_file(self.inner.dir.join(format!("{k}-{}.data", hex(version))));
        }
        let _ = fs::remove_file(meta);
        Ok(())
    }

    /// Bytes of data held (the blocks of the data files), scanned now.
    pub fn usage(&self) -> io::Result<u64> {
        Ok(self.scan()?.iter().map(|e| e.bytes).sum())
    }

    /// Every entry with its data files, the temporary files left by a
    /// process killed while making one, and the data files of no entry.
    fn scan(&self) -> io::Result<Vec<Held>> {
        let mut held: std::collections::HashMap<String, Held> = Default::default();
        let now = SystemTime::now();
        for e in fs::read_dir(&self.inner.dir)?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(m) = e.metadata() else { continue };
            if name.starts_with("tmp.") {
                if now.duration_since(m.modified()?).unwrap_or_default() > Duration::from_secs(60) {
                    let _ = fs::remove_file(e.path());
                }
                continue;
            }
            let Some(k) = name.get(..32) else { continue };
            let h = held.entry(k.to_string()).or_insert_with(|| Held {
                used: SystemTime::UNIX_EPOCH,
                bytes: 0,
                files: Vec::new(),
            });
            if name.ends_with(".meta") {
                h.used = m.modified()?;
                h.files.insert(0, e.path());
            } else {
                h.bytes += m.blocks() * 512;
                h.files.push(e.path());
            }
        }
        Ok(held.into_values().collect())
    }

    /// Counts `n` bytes just filled; if the store is over its limit (or
    /// nobody counted it yet), a thread of its own lists it and removes
    /// least recently used entries: the filler does not wait for that.
    fn filled(&self, n: u64) {
        let i = &self.inner;
        match self.count(|held| held + n) {
            Some((total, false)) if total <= i.limit => return,
            Some(_) => return self.in_background(),
            None => {}
        }
        let usage = i.usage.fetch_add(n, Ordering::Relaxed) + n;
        if usage <= i.limit && i.scanned.swap(true, Ordering::Relaxed) {
            return;
        }
        self.in_background();
    }

    /// Changes the shared count under its lock: `f` gets what it holds
    /// (0 before anyone counted) and returns the new value, given back
    /// with whether the count was new (`in_background` then lists the
    /// store to start it). `None`: there is no shared count file.
    fn count(&self, f: impl FnOnce(u64) -> u64) -> Option<(u64, bool)> {
        use rustix::fs::{flock, FlockOperation};
        let c = self.inner.counter.as_ref()?;
        flock(c, FlockOperation::LockExclusive).ok()?;
        let mut b = [0u8; 8];
        let fresh = c.read_exact_at(&mut b, 0).is_err();
        let new = f(if fresh { 0 } else { u64::from_le_bytes(b) });
        let _ = c.write_all_at(&new.to_le_bytes(), 0);
        let _ = flock(c, FlockOperation::Unlock);
        Some((new, fresh))
    }

    /// Sets the shared count to what a listing found: exactly after an
    /// eviction, else at least (fills counted while it listed stay).
    fn set_count(&self, v: u64, exact: bool) {
        self.inner.usage.store(v, Ordering::Relaxed);
        let _ = self.count(|held| if exact { v } else { held.max(v) });
    }

    /// Lists the store, brings it under its limit and sets the count, on
    /// a thread of its own (one per process at a time; best effort: a
    /// failure leaves the store over its limit until the next fill tries
    /// again). Its signals are blocked: it may run inside any program
    /// (`ferry run`).
    fn in_background(&self) {
        let me = std::process::id();
        let held = self.inner.busy.load(Ordering::SeqCst);
        if held == me || self.inner.busy.compare_exchange(held, me, Ordering::SeqCst, Ordering::SeqCst).is_err() {
            return;
        }
        let store = self.clone();
        let _blocked = crate::leases::SignalsBlocked::new();
        let spawned = std::thread::Builder::new().name("ferry-cache-evict".into()).spawn(move || {
            if let Ok(Some((u, evicted))) = store.evict() {
                store.set_count(u, evicted);
            }
            store.inner.busy.store(0, Ordering::SeqCst);
        });
        if spawned.is_err() {
            self.inner.busy.store(0, Ordering::SeqCst);
        }
    }

    /// Whether a listing of the store is under way (`in_background`).
    #[doc(hidden)]
    pub fn is_busy(&self) -> bool {
        self.inner.busy.load(Ordering::SeqCst) == std::process::id()
    }

    /// Brings the store under its limit; what it holds then, and whether
    /// anything went. `None`: another process is at it.
    fn evict(&self) -> io::Result<Option<(u64, bool)>> {
        let lock = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(self.inner.dir.join("lock"))?;
        // Someone else evicting: they will bring it down.
        if rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            return Ok(None);
        }
        let mut held = self.scan()?;
        let mut usage: u64 = held.iter().map(|e| e.bytes).sum();
        if usage <= self.inner.limit {
            return Ok(Some((usage, false)));
        }
        held.sort_by_key(|e| e.used);
        // A store of many entries goes down to a tenth below the limit:
        // listing it costs in proportion to what it holds, so one kept at
        // its limit is listed once per tenth of the limit filled, not at
        // every fill.
        let low = match held.len() > 1024 {
            true => self.inner.limit - self.inner.limit / 10,
            false => self.inner.limit,
        };
        for e in held {
            if usage <= low {
                break;
            }
            // The metadata file first: no one trusts the data after that.
            for f in &e.files {
                let _ = fs::remove_file(f);
            }
            usage -= e.bytes;
        }
        Ok(Some((usage, true)))
    }
}

struct Held {
    used: SystemTime,
    bytes: u64,
    /// The metadata file first, if any.
    files: Vec<PathBuf>,
}

fn open_rw(p: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).open(p)
}

/// The version a metadata file's header names (see `Store::header`).
fn version_in(meta: &[u8]) -> Option<&[u8]> {
    let mut rest = meta.strip_prefix(MAGIC)?;
    let mut part = || {
        let (len, tail) = rest.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        let (p, tail) = (tail.get(..len)?, tail.get(len..)?);
        rest = tail;
        Some(p)
    };
    let (_boot, _key) = (part()?, part()?);
    part()
}

fn read_header(f: &File, len: usize) -> Option<Vec<u8>> {
    let mut h = vec![0u8; len];
    f.read_exact_at(&mut h, 0).ok()?;
    Some(h)
}

/// 128 bits of a stable hash, as 32 hex digits: names from arbitrary key
/// bytes (the key itself is checked in the header, so a collision costs
/// a refetch, never wrong data).
fn hex(b: &[u8]) -> String {
    let h = |seed: u64| {
        let mut x = seed;
        for &c in b {
            x = (x ^ u64::from(c)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        mix(x ^ b.len() as u64)
    };
    format!("{:016x}{:016x}", h(0xcbf2_9ce4_8422_2325), h(0x9e37_79b9_7f4a_7c15))
}

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Entry {
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Names the file and the version of it this entry holds: equal tags,
    /// equal data.
    pub fn tag(&self) -> &[u8] {
        &self.tag
    }

    fn chunks(&self) -> u64 {
        self.known.len() as u64
    }

    /// Whether chunk `i` is marked, asking the metadata file (for chunks
    /// from `i` to `to`, at once) when not known yet.
    fn present(&self, i: u64, to: u64) -> bool {
        if self.known[i as usize].load(Ordering::Relaxed) {
            return true;
        }
        let n = (to.min(self.chunks()) - i).clamp(1, 4096) as usize;
        let mut marks = vec![0u8; n];
        let got = self.meta.read_at(&mut marks, self.marks_at + i).unwrap_or(0);
        for (j, &m) in marks[..got].iter().enumerate() {
            if m == 1 {
                self.known[i as usize + j].store(true, Ordering::Relaxed);
            }
        }
        self.known[i as usize].load(Ordering::Relaxed)
    }

    fn touch(&self) {
        let mut t = self.touched.lock().unwrap_or_else(|e| e.into_inner());
        if t.elapsed() >= TOUCH_EVERY {
            *t = Instant::now();
            let _ = self.meta.set_modified(SystemTime::now());
        }
    }

    /// Copies bytes at `off` from chunks known present into `buf`, up to
    /// the first missing chunk or the end; how many.
    pub fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        if off >= self.size || buf.is_empty() {
            return Ok(0);
        }
        let end = (off + buf.len() as u64).min(self.size);
        let last = (end - 1) / CHUNK;
        let mut upto = off;
        for i in off / CHUNK..=last {
            if !self.present(i, last + 1) {
                break;
            }
            upto = ((i + 1) * CHUNK).min(end);
        }
        let n = (upto - off) as usize;
        if n > 0 {
            self.data.read_exact_at(&mut buf[..n], off)?;
            self.touch();
        }
        Ok(n)
    }

    /// The first run of missing chunks that meets `[off, off + len)`, as
    /// (start, length), clipped to that range's chunks and the file's end.
    pub fn missing(&self, off: u64, len: u64) -> Option<(u64, u64)> {
        if off >= self.size || len == 0 {
            return None;
        }
        let end = off.saturating_add(len).min(self.size);
        let last = (end - 1) / CHUNK;
        let first = (off / CHUNK..=last).find(|&i| !self.present(i, last + 1))?;
        let stop = (first..=last).find(|&i| self.present(i, last + 1)).unwrap_or(last + 1);
        let start = first * CHUNK;
        Some((start, (stop * CHUNK).min(self.size) - start))
    }

    /// Stores `data` at chunk-aligned `off` (whole chunks, the last may end
    /// at the file's end), then marks its chunks.
    pub fn fill(&self, off: u64, data: &[u8]) -> io::Result<()> {
        let end = off + data.len() as u64;
        if !off.is_multiple_of(CHUNK) || end > self.size || (!end.is_multiple_of(CHUNK) && end != self.size) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a cache fill must cover whole chunks"));
        }
        if data.is_empty() {
            return Ok(());
        }
        self.data.write_all_at(data, off)?;
        let (first, n) = (off / CHUNK, data.len().div_ceil(CHUNK as usize));
        self.meta.write_all_at(&vec![1u8; n], self.marks_at + first)?;
        for i in first..first + n as u64 {
            self.known[i as usize].store(true, Ordering::Relaxed);
        }
        self.touch();
        // Counted as the blocks it takes (4 KiB on the usual file
        // systems), as eviction counts the store: a small file's 100 bytes
        // take a block, and counted as 100 a store of small files would
        // grow to 40 times its limit before anyone looked.
        self.store.filled((data.len() as u64).next_multiple_of(4096));
        Ok(())
    }

    pub fn is_complete(&self) -> bool {
        self.missing(0, self.size).is_none()
    }

    /// A read-only descriptor of the data file (a new open of it, so the
    /// holder cannot write the cache through it).
    pub fn data_file(&self) -> io::Result<File> {
        use std::os::fd::AsRawFd;
        File::open(format!("/proc/self/fd/{}", self.data.as_raw_fd()))
    }

    /// Where the entry's metadata lives (for tests and diagnostics).
    pub fn meta_path(&self) -> &Path {
        &self.meta_path
    }
}
