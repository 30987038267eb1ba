//! `ferry mount`: a FUSE file system over a ferry `Client`.
//!
//! The protocol names files by path, FUSE by node id. `Nodes` hands out one
//! node id (never reused) per directory path and per server `(dev, ino)`
//! for everything else, so the hard links of a file are one node with
//! several names and one `st_ino` (the node id). It counts the kernel's
//! lookups so `forget` can drop a node, and follows renames and removals so
//! a node keeps pointing at its file.
//!
//! Data is not cached by default (ORFA): an open replies `direct_io`, so
//! each `read`/`write` the application makes is one request of the same
//! size to the server (split by the kernel at `max_write`, 1 MiB) — except
//! a read-only open under a lease of a server that sees every change,
//! which uses the page cache and keeps it across opens (`pages`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io::{self, Seek, SeekFrom, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferry_client::{join, Attr, Client, File, OpenOptions, Target, Time};
use fuser::{
    AccessFlags, BackingId, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, SessionACL, TimeOrNow, WriteFlags,
};

mod callers;
mod fusermount;
mod invalidate;
mod locks;

pub use fuser::{BackgroundSession, RingState, Transport, TransportHandle};
pub use fusermount::find as fusermount3;
pub use invalidate::Invalidator;
pub use null::{spawn_null, NullFs, NULL_FILE};

mod nodes;
mod null;
mod pages;
mod passthrough;
mod samehost;
use nodes::{Nodes, ROOT};
use passthrough::{Mode, Taken};
mod recent;
mod transport;
pub use transport::{ring_wanted, EnableUring, ENABLE_URING};

/// Largest read or write the kernel sends in one request.
const MAX_IO: u32 = 1024 * 1024;

/// Largest file a lease keeps in the page cache (`pages`). A larger one is
/// read direct, through the client's own read-ahead: the kernel's
/// page-cache read-ahead, its requests arriving out of order on several
/// reader threads, breaks the client's sequences (a 40 MiB file read once
/// sent 6 % more than its size, `tests/prefetch.rs`).
const PAGE_CACHE_MAX: u64 = 16 << 20;

/// How the mounted file system behaves.
#[derive(Clone, Debug)]
pub struct FsOptions {
    /// How long the kernel may trust attributes before asking again.
    pub attr_timeout: Duration,
    /// How long the kernel may trust a name → node mapping (and a negative
    /// lookup) before asking again.
    pub entry_timeout: Duration,
    /// Use the kernel page cache for file data instead of `direct_io`.
    pub cache: bool,
    /// Hand files the client cache holds to the kernel with FUSE
    /// passthrough where it offers it (else their pages are kept); see
    /// `passthrough` for what that costs other opens.
    pub passthrough: bool,
    /// How long the kernel may keep an answer the server promised (a lease
    /// from a server that sees every change, capability `WATCHED`): until
    /// a break drops it, and at most this. Zero: leases only shorten the
    /// timeouts above, never lengthen them.
    pub lease_timeout: Duration,
    /// On the server's host, back files with the server's descriptors
    /// (FUSE passthrough, `samehost`); off, the daemon reads and writes
    /// them (what `ferry bench --fuse` measures: the FUSE transport).
    pub same_host_passthrough: bool,
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            attr_timeout: Duration::from_secs(1),
            entry_timeout: Duration::from_secs(1),
            cache: false,
            passthrough: false,
            lease_timeout: Duration::from_secs(60),
            same_host_passthrough: true,
        }
    }
}

/// How to mount.
#[derive(Clone, Debug, Default)]
pub struct MountConfig {
    pub fs: FsOptions,
    pub read_only: bool,
    /// Let users other than the mounter in (`allow_other`).
    pub allow_other: bool,
    /// Have `fusermount3` unmount if the daemon dies (needs it installed).
    pub auto_unmount: bool,
    /// Name shown as the mount's source in `/proc/mounts` and `df`.
    pub fsname: String,
    /// Extra `-o` options, as `mount.fuse` spells them.
    pub options: Vec<String>,
    /// Threads reading requests from the kernel (0: a default).
    pub threads: usize,
    /// Serve `/dev/fuse` reads only, even where the kernel offers FUSE
    /// over io_uring (`transport`).
    pub dev_fuse_only: bool,
}

/// A mount served on background threads.
pub struct Mounted {
    session: BackgroundSession,
    // Declared after `session`: dropped last, it unmounts (see `fusermount`).
    helper: Option<fusermount::Helper>,
}

impl Mounted {
    pub(crate) fn new(session: BackgroundSession) -> Mounted {
        Mounted { session, helper: None }
    }

    /// The FUSE transport the mount serves, and what each carried.
    pub fn transport(&self) -> Transport {
        self.session.transport()
    }

    /// Reads [`Self::transport`] from anywhere, for as long as wanted.
    pub fn transport_handle(&self) -> TransportHandle {
        self.session.transport_handle()
    }

    /// Whether the session has ended (the mount went away).
    pub fn is_finished(&self) -> bool {
        self.session.guard.is_finished()
    }

    /// Waits for the session to end (once unmounted).
    pub fn join(self) -> io::Result<()> {
        let Mounted { session, helper } = self;
        let r = session.join();
        drop(helper);
        r
    }
}

/// Mounts `fs` on `mountpoint` and serves it on background threads until
/// the returned session is dropped (which unmounts) or the mount goes away.
pub fn spawn(fs: FerryFs, mountpoint: &Path, cfg: &MountConfig) -> io::Result<Mounted> {
    // Leases, where the server grants them: its breaks become the kernel's
    // invalidations (queued until the mount is up).
    let mut fs = fs;
    let handles = Arc::clone(&fs.handles);
    let untrust = Box::new(move |nodes: Option<&[u64]>| untrust(&handles, nodes));
    let inval = Invalidator::new(Arc::clone(&fs.nodes), Arc::clone(&fs.recent), Arc::clone(&fs.pages), untrust);
    let leases = ferry_client::Leases::new(inval.on_break());
    let leased = fs.client.leases_on(Arc::clone(&leases)).is_ok();
    // Long-kept answers need every change to reach the server's lease
    // table, and — where the mount serves several users by one kernel
    // cache — the kernel checking each user's rights itself: a name one
    // user looked up is otherwise walked through by another without the
    // server being asked.
    let kernel_checks = cfg.options.iter().any(|o| o == "default_permissions");
    if leased && (!cfg.allow_other || kernel_checks || !fs.callers.on()) && !fs.opts.lease_timeout.is_zero() {
        fs.leases = Some(leases);
        // Where listings are kept for long anyway, the kernel may keep them
        // without asking at each open: two requests less per directory a
        // program lists (`git status` lists every one). Without a lease
        // each listing is dropped once made. (The kernel then opens
        // directories without the daemon's check, as it does for a kept
        // listing: a private mount, or one whose kernel checks rights.)
        if !fs.opts.attr_timeout.is_zero() && !fs.opts.entry_timeout.is_zero() {
            fs.no_opendir = Some(Arc::clone(&inval));
        }
    }
    // Options travel comma-separated (to `fusermount3` too): a URL of
    // several gateways has its commas escaped as `mount.fuse` reads them.
    let mut opts = vec![MountOption::FSName(cfg.fsname.replace(',', "\\,")), MountOption::Subtype("ferry".into())];
    if cfg.read_only {
        opts.push(MountOption::RO);
    }
    for o in &cfg.options {
        opts.push(parse_option(o));
    }
    // A server that does not act as each caller (not root, or without
    // IDENTITY) acts for every request with its own rights: a mount open to
    // other users must then have the kernel check their permissions, or
    // any local user could read and change what only the mount's owner
    // may. One that does checks them itself, with the caller's ids.
    if cfg.allow_other && !fs.callers.on() && !opts.contains(&MountOption::DefaultPermissions) {
        opts.push(MountOption::DefaultPermissions);
    }
    let auto_unmount = cfg.auto_unmount || opts.contains(&MountOption::AutoUnmount);
    opts.retain(|o| *o != MountOption::AutoUnmount);
    let mut config = Config::default();
    // Several readers of /dev/fuse, so a slow request (a big read) does not
    // hold up a `stat`; the client engine pipelines them on one connection.
    config.n_threads = Some(if cfg.threads == 0 { 4 } else { cfg.threads });
    config.clone_fd = true;
    config.uring = ring_wanted(cfg.dev_fuse_only);
    if auto_unmount && !cfg.allow_other {
        // A private mount: fusermount3 mounts it for us, without the
        // allow_other fuser would add (which it refuses to users).
        let text: Vec<String> = opts.iter().map(option_text).collect();
        let (fd, helper) = fusermount::mount(mountpoint, &text, true)?;
        config.mount_options = opts;
        let session = fuser::Session::from_fd(fs, fd, SessionACL::Owner, config)?.spawn()?;
        if leased {
            inval.start(session.notifier())?;
        }
        return Ok(Mounted { session, helper: Some(helper) });
    }
    if auto_unmount {
        opts.push(MountOption::AutoUnmount);
    }
    config.mount_options = opts;
    config.acl = if cfg.allow_other { SessionACL::All } else { SessionACL::Owner };
    let session = fuser::spawn_mount(fs, mountpoint, &config)?;
    if leased {
        inval.start(session.notifier())?;
    }
    Ok(Mounted::new(session))
}

/// A mount option as `mount.fuse` and `fusermount3` spell it.
fn option_text(o: &MountOption) -> String {
    match o {
        MountOption::FSName(n) => format!("fsname={n}"),
        MountOption::Subtype(t) => format!("subtype={t}"),
        MountOption::CUSTOM(v) => v.clone(),
        MountOption::AutoUnmount => "auto_unmount".into(),
        MountOption::DefaultPermissions => "default_permissions".into(),
        MountOption::Dev => "dev".into(),
        MountOption::NoDev => "nodev".into(),
        MountOption::Suid => "suid".into(),
        MountOption::NoSuid => "nosuid".into(),
        MountOption::RO => "ro".into(),
        MountOption::RW => "rw".into(),
        MountOption::Exec => "exec".into(),
        MountOption::NoExec => "noexec".into(),
        MountOption::Atime => "atime".into(),
        MountOption::NoAtime => "noatime".into(),
        MountOption::DirSync => "dirsync".into(),
        MountOption::Sync => "sync".into(),
        MountOption::Async => "async".into(),
    }
}

fn parse_option(s: &str) -> MountOption {
    match s {
        "auto_unmount" => MountOption::AutoUnmount,
        "default_permissions" => MountOption::DefaultPermissions,
        "dev" => MountOption::Dev,
        "nodev" => MountOption::NoDev,
        "suid" => MountOption::Suid,
        "nosuid" => MountOption::NoSuid,
        "ro" => MountOption::RO,
        "rw" => MountOption::RW,
        "exec" => MountOption::Exec,
        "noexec" => MountOption::NoExec,
        "atime" => MountOption::Atime,
        "noatime" => MountOption::NoAtime,
        "dirsync" => MountOption::DirSync,
        "sync" => MountOption::Sync,
        "async" => MountOption::Async,
        x if x.starts_with("fsname=") => MountOption::FSName(x[7..].into()),
        x if x.starts_with("subtype=") => MountOption::Subtype(x[8..].into()),
        x => MountOption::CUSTOM(x.into()),
    }
}

type R<T> = Result<T, Errno>;

fn errno(e: ferry_client::Error) -> Errno {
    Errno::from_i32(e.errno())
}

fn io_errno(e: io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

/// For tests only: a pause between the check for breaks and the record
/// of a miss (`lookup`), where no break may slip in; set by
/// `FERRY_TEST_MISS_PAUSE_US` in the mount's environment, none otherwise.
/// A break in that window was a rare race (issue 30); the pause makes the
/// test of it certain.
fn test_pause() {
    static PAUSE: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    pause_by("FERRY_TEST_MISS_PAUSE_US", &PAUSE);
}

/// For tests only, the same between the check for breaks of a listing the
/// kernel keeps and its reply (`unopened_listing`):
/// `FERRY_TEST_LIST_PAUSE_US`.
fn test_list_pause() {
    static PAUSE: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    pause_by("FERRY_TEST_LIST_PAUSE_US", &PAUSE);
}

fn pause_by(var: &str, cell: &std::sync::OnceLock<Duration>) {
    let pause = *cell.get_or_init(|| {
        let us = std::env::var(var).ok().and_then(|v| v.parse().ok());
        Duration::from_micros(us.unwrap_or(0))
    });
    if !pause.is_zero() {
        std::thread::sleep(pause);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The tables stay consistent between statements; a panicking request
    // must not take the whole mount down with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn to_system_time(t: Time) -> SystemTime {
    let base = if t.sec >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(t.sec as u64))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(t.sec.unsigned_abs()))
    };
    base.and_then(|b| b.checked_add(Duration::from_nanos(u64::from(t.nsec.min(999_999_999))))).unwrap_or(UNIX_EPOCH)
}

fn from_system_time(t: SystemTime) -> Time {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Time { sec: d.as_secs() as i64, nsec: d.subsec_nanos() },
        Err(e) => {
            let d = e.duration();
            let (mut sec, mut nsec) = (-(d.as_secs() as i64), d.subsec_nanos());
            if nsec > 0 {
                sec -= 1;
                nsec = 1_000_000_000 - nsec;
            }
            Time { sec, nsec }
        }
    }
}

fn time_arg(t: Option<TimeOrNow>) -> Time {
    match t {
        None => Time::OMIT,
        Some(TimeOrNow::Now) => Time::NOW,
        Some(TimeOrNow::SpecificTime(t)) => from_system_time(t),
    }
}

fn kind_of_mode(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

/// The file type bits of a `d_type` (a regular file when unknown).
fn mode_of_dt(dt: u8) -> u32 {
    match dt {
        libc::DT_DIR => libc::S_IFDIR,
        libc::DT_LNK => libc::S_IFLNK,
        libc::DT_FIFO => libc::S_IFIFO,
        libc::DT_CHR => libc::S_IFCHR,
        libc::DT_BLK => libc::S_IFBLK,
        libc::DT_SOCK => libc::S_IFSOCK,
        _ => libc::S_IFREG,
    }
}

fn kind_of_dt(dt: u8) -> FileType {
    match dt {
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_FIFO => FileType::NamedPipe,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_BLK => FileType::BlockDevice,
        libc::DT_SOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn file_attr(ino: u64, a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: a.size,
        blocks: a.blocks,
        atime: to_system_time(a.atime),
        mtime: to_system_time(a.mtime),
        ctime: to_system_time(a.ctime),
        crtime: UNIX_EPOCH,
        kind: kind_of_mode(a.mode),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink.min(u64::from(u32::MAX)) as u32,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: if a.blksize == 0 { 4096 } else { a.blksize },
        flags: 0,
    }
}

struct OpenFile {
    /// `None` after `release`. Reads and positional writes share the file
    /// (`read_at`/`write_at` take `&self`); appends and syncs take it alone.
    file: RwLock<Option<File>>,
    append: bool,
    /// The node it was opened on: a node whose name is gone (removed while
    /// open) is reached through this handle.
    ino: AtomicU64,
    /// The file's mode and group as of open, kept up to date by
    /// `kill_setid` and `setattr`: set-id bits a write by an unprivileged
    /// caller must clear.
    mode: std::sync::atomic::AtomicU32,
    gid: std::sync::atomic::AtomicU32,
    /// What it took of its node's kernel I/O mode (`passthrough::Taken`),
    /// given back at its release.
    io_mode: std::sync::atomic::AtomicU8,
    /// It holds a whole-file lock as a flock (`locks::take`).
    flock_kind: std::sync::atomic::AtomicBool,
    /// Opened under a lease not broken since: a page it reads is one the
    /// kernel may keep for the next open (`pages`).
    trusted: std::sync::atomic::AtomicBool,
    /// Opened without asking the server (`pages`): the `open(2)` flags to
    /// open it there with once something needs it (`live`).
    lazy: Mutex<Option<i32>>,
}

/// The open files of `nodes` (of every node for `None`) lost the mount's
/// lease: what they hold from before is dropped, and what they read from
/// now on may not be kept past them. A handle busy with a write or a sync
/// (which may wait on the server, which may wait on this very break) keeps
/// its read-ahead; its reads still mark the node's pages unclean.
fn untrust(handles: &Mutex<HashMap<u64, Handle>>, nodes: Option<&[u64]>) {
    let files: Vec<Arc<OpenFile>> = lock(handles)
        .values()
        .filter_map(|h| match h {
            Handle::File(f) if nodes.is_none_or(|n| n.binary_search(&f.ino.load(Ordering::Relaxed)).is_ok()) => {
                Some(Arc::clone(f))
            }
            _ => None,
        })
        .collect();
    for f in files {
        f.trusted.store(false, Ordering::SeqCst);
        if let Ok(g) = f.file.try_read() {
            if let Some(file) = g.as_ref() {
                file.discard_read_ahead();
            }
        }
    }
}

/// The mode a write by a caller without `CAP_FSETID` leaves, as Linux's
/// `setattr_should_drop_suidgid`: set-user-ID always goes; set-group-ID
/// with group execute, or without it when the caller is not in the file's
/// group (`in_group` is asked only then).
fn killed(mode: u32, in_group: impl FnOnce() -> bool) -> u32 {
    let mut m = mode & !libc::S_ISUID;
    if mode & libc::S_ISGID != 0 && (mode & libc::S_IXGRP != 0 || !in_group()) {
        m &= !libc::S_ISGID;
    }
    m
}

/// Whether process `pid` (primary group `gid`) is in group `group`: its
/// supplementary groups are in `/proc/PID/status`.
fn in_group(pid: u32, gid: u32, group: u32) -> bool {
    if gid == group {
        return true;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return false };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .is_some_and(|g| g.split_whitespace().any(|x| x.parse() == Ok(group)))
}

/// How an open is answered.
enum OpenedAs {
    Flags(FopenFlags),
    Backing(Arc<BackingId>),
}

/// What a node-level call acts on: its path, or an open handle once the
/// node has no name.
enum Obj {
    Path(OsString),
    Handle(u64),
}

impl Obj {
    fn target(&self) -> Target<'_> {
        match self {
            // The kernel acts on the node itself, never through a symlink.
            Obj::Path(p) => Target::PathNoFollow(p.as_bytes()),
            Obj::Handle(h) => Target::Handle(*h),
        }
    }
}

/// A directory listing taken at `opendir`, so offsets stay stable while the
/// kernel reads it in pieces.
struct DirItem {
    name: OsString,
    kind: FileType,
    /// The entry's `d_type` and number, for a name listed without
    /// attributes.
    dt: u8,
    ino: u64,
    attr: Option<Attr>,
    /// `recent`'s generation when the listing was fetched (`ttls_since`).
    gen: u64,
}

enum Handle {
    File(Arc<OpenFile>),
    Dir(Arc<Vec<DirItem>>),
    /// A directory opened with the kernel's listing cache kept: listed
    /// only if the kernel asks after all (its cache was evicted).
    LazyDir(u64),
}

/// What a `setattr` changes.
#[derive(Clone, Copy)]
struct SetAttrs {
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
}

pub struct FerryFs {
    client: Client,
    opts: FsOptions,
    nodes: Arc<Mutex<Nodes>>,
    handles: Arc<Mutex<HashMap<u64, Handle>>>,
    next_fh: AtomicU64,
    locks: locks::MountLocks,
    recent: Arc<recent::Recent>,
    /// Whether the kernel took FUSE passthrough (cached files only).
    passthrough: bool,
    modes: passthrough::IoModes,
    /// On the server's host: files backed by the server's descriptors.
    same_host: samehost::SameHost,
    /// Whose pages an open may keep (under a lease).
    pages: Arc<pages::Pages>,
    /// Who made each request, for a server that acts as each caller.
    callers: callers::Callers,
    /// The mount's leases, where answers may be kept for long under them
    /// (`long_ttl`).
    leases: Option<Arc<ferry_client::Leases>>,
    /// Under leases: `OPENDIR` is answered `ENOSYS`, so the kernel opens
    /// directories without asking and keeps every listing until it is
    /// invalidated (`unopened_listing`).
    no_opendir: Option<Arc<Invalidator>>,
    /// Listings being read by directories opened so, by node: a listing
    /// spans several `READDIR`s, which carry no handle.
    lists: Mutex<HashMap<u64, Arc<Vec<DirItem>>>>,
}

/// Bound on `FerryFs::lists` (listings left half read).
const MAX_LISTS: usize = 256;

/// A read of `buf.len()` bytes at `offset` into `buf`: bytes read, short
/// only at the end of the file.
fn read_into(file: &File, buf: &mut [u8], offset: u64) -> ferry_client::Result<usize> {
    // A small file came whole with its open (`OpenRead`).
    if let Some(n) = file.read_from_open(offset, buf) {
        return Ok(n);
    }
    file.read_at(buf, offset)
}

thread_local! {
    /// Read buffer reused per worker thread: a fresh 1 MiB buffer per read
    /// costs page faults on every request.
    static READ_BUF: RefCell<ferry_client::PageBuf> = RefCell::default();
}

impl FerryFs {
    /// Serves the server's directory `root` (a path inside the export).
    pub fn new(client: Client, root: &str, opts: FsOptions) -> FerryFs {
        let root = root.trim_end_matches('/');
        let root = if root.is_empty() { "/" } else { root };
        let callers = callers::Callers::new(client.engine().has_cap(ferry_client::caps::IDENTITY));
        FerryFs {
            client,
            opts,
            callers,
            nodes: Arc::new(Mutex::new(Nodes::new(OsStr::new(root)))),
            handles: Arc::default(),
            next_fh: AtomicU64::new(1),
            locks: locks::MountLocks::default(),
            recent: Arc::default(),
            passthrough: false,
            modes: passthrough::IoModes::default(),
            same_host: samehost::SameHost::default(),
            pages: Arc::default(),
            leases: None,
            no_opendir: None,
            lists: Mutex::default(),
        }
    }

    fn path(&self, ino: INodeNo) -> R<OsString> {
        lock(&self.nodes).path(ino.0)
    }

    /// What a listing or lookup of the node's path returned a moment ago.
    fn recent_of(&self, o: &Obj) -> Option<Attr> {
        match o {
            Obj::Path(p) => self.recent.take(p),
            Obj::Handle(_) => None,
        }
    }

    /// The node's path, or for a removed node still open, one of its handles.
    fn obj(&self, ino: INodeNo) -> R<Obj> {
        let stale = match self.path(ino) {
            Ok(p) => return Ok(Obj::Path(p)),
            Err(e) => e,
        };
        let handles = lock(&self.handles);
        for h in handles.values() {
            if let Handle::File(f) = h {
                if f.ino.load(Ordering::Relaxed) == ino.0 {
                    if let Some(file) = f.file.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
                        return Ok(Obj::Handle(file.handle()));
                    }
                }
            }
        }
        Err(stale)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> R<OsString> {
        if name.as_bytes().contains(&b'/') {
            return Err(Errno::EINVAL);
        }
        Ok(join(self.path(parent)?, name).into_os_string())
    }

    fn add_handle(&self, h: Handle) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.handles).insert(fh, h);
        FileHandle(fh)
    }

    /// `file`, opened on the server first if it was opened without it.
    fn live_file(&self, fh: FileHandle) -> R<Arc<OpenFile>> {
        let f = self.file(fh)?;
        self.live(&f)?;
        Ok(f)
    }

    /// Opens on the server a file opened without it (`open_lazy`), by the
    /// name its node has now.
    fn live(&self, f: &OpenFile) -> R<()> {
        let mut lazy = lock(&f.lazy);
        let Some(flags) = *lazy else { return Ok(()) };
        let ino = f.ino.load(Ordering::Relaxed);
        let (path, key) = {
            let nodes = lock(&self.nodes);
            (nodes.path(ino)?, nodes.key(ino))
        };
        let breaks = self.pages.breaks();
        let file = self.client.open(&path, &Self::open_options(flags)).map_err(errno)?;
        // Another client renamed another file over the name meanwhile (a
        // break, on which the kernel looks the name up again).
        if nodes::key_of(file.attr()) != key {
            let _ = file.close();
            return Err(Errno::ESTALE);
        }
        if self.pages.breaks() != breaks {
            f.trusted.store(false, Ordering::SeqCst);
        }
        *f.file.write().unwrap_or_else(|e| e.into_inner()) = Some(file);
        *lazy = None;
        Ok(())
    }

    /// Before this mount removes the name `path` (an unlink, a rename over
    /// it): its file's handles opened without the server open there now,
    /// while the name still leads to it — a file removed while open stays
    /// readable, as locally. (One removed by another client before a read
    /// reached the daemon is not: `ESTALE`, as on NFS.)
    fn wake(&self, path: &OsStr) {
        let Some(ino) = lock(&self.nodes).by_path.get(path).copied() else { return };
        for f in self.files_of(ino) {
            let _ = self.live(&f);
        }
    }

    /// A read-only open that asks the server nothing: the mount holds a
    /// lease on the file, from an open by the same caller, and the
    /// kernel's pages of it are clean (`pages`), so the kernel serves the
    /// reads. `None`: open it the ordinary way.
    fn open_lazy(&self, req: &Request, ino: u64, flags: i32, breaks: u64) -> Option<R<(FileHandle, OpenedAs)>> {
        let key = {
            let nodes = lock(&self.nodes);
            nodes.path(ino).ok()?;
            nodes.key(ino)?
        };
        if !self.pages.leased(key, (req.uid(), req.gid())) || !self.pages.is_clean(ino) {
            return None;
        }
        let f = Arc::new(OpenFile {
            file: RwLock::new(None),
            append: false,
            ino: AtomicU64::new(ino),
            mode: 0.into(),
            gid: 0.into(),
            io_mode: Taken::NOTHING.to_u8().into(),
            flock_kind: false.into(),
            trusted: true.into(),
            lazy: Mutex::new(Some(flags)),
        });
        let fh = self.add_handle(Handle::File(Arc::clone(&f)));
        // A break since the checks above may have missed this handle.
        if self.pages.breaks() != breaks {
            lock(&self.handles).remove(&fh.0);
            return None;
        }
        Some(self.io_mode(&f, fh, ino, FopenFlags::empty(), false).map(|(id, flags)| match id {
            Some(id) => (fh, OpenedAs::Backing(id)),
            None if flags.contains(FopenFlags::FOPEN_DIRECT_IO) => (fh, OpenedAs::Flags(flags)),
            None => (fh, OpenedAs::Flags(flags | FopenFlags::FOPEN_KEEP_CACHE)),
        }))
    }

    fn file(&self, fh: FileHandle) -> R<Arc<OpenFile>> {
        match lock(&self.handles).get(&fh.0) {
            Some(Handle::File(f)) => Ok(Arc::clone(f)),
            _ => Err(Errno::EBADF),
        }
    }

    /// The listing a `READDIR` at `offset` reads from.
    fn dir(&self, ino: INodeNo, fh: FileHandle, offset: u64) -> R<Arc<Vec<DirItem>>> {
        if fh.0 == 0 {
            if let Some(inval) = &self.no_opendir {
                return self.unopened_listing(ino.0, offset, inval);
            }
        }
        let ino = match lock(&self.handles).get(&fh.0) {
            Some(Handle::Dir(d)) => return Ok(Arc::clone(d)),
            Some(Handle::LazyDir(ino)) => *ino,
            _ => return Err(Errno::EBADF),
        };
        let path = self.path(INodeNo(ino))?;
        let (items, _) = self.list(&path)?;
        let items = Arc::new(items);
        if let Some(h) = lock(&self.handles).get_mut(&fh.0) {
            *h = Handle::Dir(Arc::clone(&items));
        }
        Ok(items)
    }

    /// The listing of a directory the kernel opened without asking: a new
    /// one from the start (a `rewinddir` sees changes), the one being read
    /// after. The kernel keeps what it is given: one fetched under a lease
    /// nothing broke since is kept until a break drops it (as `opendir`
    /// keeps one), any other only until it is made (`drop_listing`).
    fn unopened_listing(&self, ino: u64, offset: u64, inval: &Invalidator) -> R<Arc<Vec<DirItem>>> {
        let mut lists = lock(&self.lists);
        if offset > 0 {
            if let Some(l) = lists.get(&ino) {
                let l = Arc::clone(l);
                // Read to its end: the kernel asks once more, past it.
                if offset >= 2 + l.len() as u64 {
                    lists.remove(&ino);
                }
                return Ok(l);
            }
        }
        drop(lists);
        let path = self.path(INodeNo(ino))?;
        // Not fetched again when a change ran meanwhile: while a program
        // writes through the mount, every listing would be.
        let (items, gen) = self.list(&path)?;
        let items = Arc::new(items);
        {
            let mut lists = lock(&self.lists);
            if lists.len() >= MAX_LISTS {
                lists.clear();
            }
            lists.insert(ino, Arc::clone(&items));
        }
        // A break counted after this check drops what the kernel makes of
        // it (`Invalidator::apply` waits for the listing to be done).
        let kept = self.long_ttl().is_some() && self.recent.generation() == gen;
        if !kept {
            inval.drop_listing(ino);
        }
        test_list_pause();
        Ok(items)
    }

    /// The listing of `path`, from the server, and `recent`'s generation
    /// before it was fetched (`ttls_since`).
    fn list(&self, path: &OsStr) -> R<(Vec<DirItem>, u64)> {
        let gen = self.recent.generation();
        let entries = self.client.read_dir(path).map_err(errno)?;
        self.recent.put(
            gen,
            entries
                .iter()
                .filter_map(|e| Some((join(path, OsStr::from_bytes(&e.name)).into_os_string(), e.attr.as_ref()?))),
        );
        let items = entries
            .into_iter()
            .map(|e| DirItem {
                kind: e.attr.as_ref().map_or_else(|| kind_of_dt(e.kind), |a| kind_of_mode(a.mode)),
                dt: e.kind,
                ino: e.ino,
                name: OsString::from_vec(e.name),
                attr: e.attr,
                gen,
            })
            .collect();
        Ok((items, gen))
    }

    /// `op` with the server's handle behind a FUSE file handle (opened
    /// again first if the server restarted since), and again if another
    /// thread reconnected to a restarted server under it: the new server
    /// does not know the old handle, and the program must not hear so.
    fn by_handle<T>(&self, fh: FileHandle, mut op: impl FnMut(u64) -> R<T>) -> R<T> {
        let f = self.live_file(fh)?;
        let mut tries = 0;
        loop {
            let (h, epoch) = {
                let g = f.file.read().unwrap_or_else(|e| e.into_inner());
                g.as_ref().ok_or(Errno::EBADF)?.current_handle_in().map_err(errno)?
            };
            tries += 1;
            match op(h) {
                Err(e) if tries < 8 && (e == Errno::EBADF || e == Errno::ESTALE) && self.client.epoch() != epoch => {}
                r => return r,
            }
        }
    }

    fn entry(&self, path: &OsStr, attr: &Attr, reply: ReplyEntry) {
        let ino = lock(&self.nodes).remember(path, attr);
        reply.entry_with_ttls(&self.opts.attr_timeout, &self.opts.entry_timeout, &file_attr(ino, attr), Generation(0));
    }

    /// The attribute and entry timeouts for an answer fetched since `gen`
    /// of `recent`: none if a lease broke (or this mount changed something)
    /// meanwhile — the answer may be from before that change, and the
    /// kernel must not keep it.
    fn ttls_since(&self, gen: u64) -> (Duration, Duration) {
        if self.recent.generation() != gen {
            return (Duration::ZERO, Duration::ZERO);
        }
        match self.long_ttl() {
            Some(t) => (self.opts.attr_timeout.max(t), self.opts.entry_timeout.max(t)),
            None => (self.opts.attr_timeout, self.opts.entry_timeout),
        }
    }

    /// How long the kernel may keep what the server answers now: the lease
    /// timeout while a lease the server keeps for long holds (a lapse, a
    /// lost connection or any break then empties the kernel's caches, and
    /// moves `recent`'s generation so an answer fetched across it is not
    /// kept at all).
    fn long_ttl(&self) -> Option<Duration> {
        let l = self.leases.as_ref()?;
        // Zero timeouts ask the server every time, as they say.
        if self.opts.attr_timeout.is_zero() || self.opts.entry_timeout.is_zero() {
            return None;
        }
        (l.held() && self.client.engine().has_cap(ferry_client::caps::WATCHED)).then_some(self.opts.lease_timeout)
    }

    /// How long the kernel may keep the name and the attributes a `create`
    /// or `mkdir` of this mount just made, `breaks` being `pages.breaks()`
    /// before it asked: the lease timeout under a lease kept long with no
    /// break since (as a lookup's answer is kept; the server grants its
    /// changer the reply of a change), else the plain timeouts. Before,
    /// the kernel asked again a second later for each file and directory
    /// a program made and came back to (`git clone` reads back every
    /// object it wrote: a `LOOKUP` or `GETATTR` each, and a `Stat` to the
    /// server). A break that comes before the kernel made the inode from
    /// this reply still reaches it: the break drops the node's names
    /// first (`invalidate.rs`), which waits for the directory's lock the
    /// kernel holds until the create is done, and then its attributes.
    /// (Attributes, entry.)
    fn made_ttls(&self, breaks: u64) -> (Duration, Duration) {
        let (a, e) = (self.opts.attr_timeout, self.opts.entry_timeout);
        match self.long_ttl() {
            Some(t) if self.pages.breaks() == breaks => (a.max(t), e.max(t)),
            _ => (a, e),
        }
    }

    /// `entry` for an answer fetched since `gen` (`ttls_since`).
    fn entry_since(&self, path: &OsStr, attr: &Attr, gen: u64, reply: ReplyEntry) {
        let ino = lock(&self.nodes).remember(path, attr);
        let (a, e) = self.ttls_since(gen);
        reply.entry_with_ttls(&a, &e, &file_attr(ino, attr), Generation(0));
    }

    /// The kernel I/O mode of open `fh` of node `ino`, made with `flags`
    /// (kept with the open for its release): `Some` to open it as
    /// passthrough on the node's backing instead. An open the kernel would
    /// refuse is dropped here, with the errno to say.
    ///
    /// The mode may differ from what `flags` asked (`IoModes::open`): the
    /// flags returned are those to answer with.
    fn io_mode(
        &self,
        f: &OpenFile,
        fh: FileHandle,
        ino: u64,
        flags: FopenFlags,
        writes: bool,
    ) -> R<(Option<Arc<BackingId>>, FopenFlags)> {
        let direct = flags.contains(FopenFlags::FOPEN_DIRECT_IO);
        // The mount's own choice of direct I/O (not `--cache` without a
        // lease, a file not in the disk cache) may follow the node's other
        // opens.
        let flexible = !self.opts.cache || self.long_ttl().is_some();
        let (mode, id) = match self.modes.open(ino, direct, writes, flexible) {
            Ok(passthrough::Open::As(taken)) => (taken, None),
            Ok(passthrough::Open::Join(id)) => (Taken { mode: Mode::Passthrough, writes: false }, Some(id)),
            Err(e) => {
                if let Some(Handle::File(f)) = lock(&self.handles).remove(&fh.0) {
                    if let Some(file) = f.file.write().unwrap_or_else(|e| e.into_inner()).take() {
                        let _ = file.close();
                    }
                }
                return Err(Errno::from_i32(e));
            }
        };
        f.io_mode.store(mode.to_u8(), Ordering::Relaxed);
        let flags = match (mode.mode, direct) {
            (Mode::Direct, false) => FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
            (Mode::Cached, true) => FopenFlags::empty(),
            _ => flags,
        };
        Ok((id, flags))
    }

    /// The kernel I/O mode an open of the mount's own choice asks for.
    /// Under a lease of a server that sees every change, `--cache` changes
    /// only readers: a writer writes as on the default mount (direct,
    /// write-behind, through the pages only beside a page-cache reader),
    /// since writing through the page cache costs a synchronous request
    /// per write and a `security.capability` lookup per file, and keeps
    /// nothing the lease does not already keep.
    fn open_flags(&self, writes: bool) -> FopenFlags {
        if self.opts.cache && !(writes && self.long_ttl().is_some()) {
            FopenFlags::empty()
        } else {
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
        }
    }

    /// Open options for `open(2)` flags as the kernel passes them.
    fn open_options(flags: i32) -> OpenOptions {
        let mut o = OpenOptions::new();
        match flags & libc::O_ACCMODE {
            libc::O_WRONLY => o.write(true),
            libc::O_RDWR => o.read(true).write(true),
            _ => o.read(true),
        };
        if flags & libc::O_ACCMODE != libc::O_RDONLY {
            o.append(flags & libc::O_APPEND != 0);
        }
        o.truncate(flags & libc::O_TRUNC != 0);
        // The kernel resolved the path already: a symlink found at our
        // path now means the file changed under us, and must not be
        // followed somewhere else. O_DIRECT is dropped: its alignment rules
        // are the kernel's business on this side, not the server's.
        o.nofollow(true);
        o.custom_flags((flags & (libc::O_SYNC | libc::O_DSYNC | libc::O_NOATIME)) as u32);
        o
    }

    /// Opens `path`; `trusted`: under a lease, if no break comes before the
    /// handle can be found by one (checked by the caller).
    fn open_file(
        &self,
        path: &OsStr,
        o: &OpenOptions,
        flags: i32,
        ino: u64,
        trusted: bool,
    ) -> R<(Arc<OpenFile>, FileHandle, Attr)> {
        let file = self.client.open(path, o).map_err(errno)?;
        let attr = *file.attr();
        let append = flags & libc::O_APPEND != 0 && flags & libc::O_ACCMODE != libc::O_RDONLY;
        let (mode, gid) = (attr.mode.into(), attr.gid.into());
        let io_mode = Taken::NOTHING.to_u8().into();
        let f = Arc::new(OpenFile {
            file: RwLock::new(Some(file)),
            append,
            ino: AtomicU64::new(ino),
            mode,
            gid,
            io_mode,
            flock_kind: false.into(),
            trusted: trusted.into(),
            lazy: Mutex::new(None),
        });
        let fh = self.add_handle(Handle::File(Arc::clone(&f)));
        Ok((f, fh, attr))
    }

    // The arguments are FUSE's setattr fields, one for one.
    fn do_setattr(&self, ino: INodeNo, set: &SetAttrs, fh: Option<FileHandle>) -> R<Attr> {
        match fh {
            Some(fh) => self.by_handle(fh, |h| self.setattr_on(ino, set, Some(h))),
            None => self.setattr_on(ino, set, None),
        }
    }

    fn setattr_on(&self, ino: INodeNo, set: &SetAttrs, handle: Option<u64>) -> R<Attr> {
        let (obj, borrowed) = match (self.obj(ino), handle) {
            (Ok(o), _) => {
                let borrowed = matches!(o, Obj::Handle(_));
                (o, borrowed)
            }
            (Err(_), Some(h)) => (Obj::Handle(h), false),
            (Err(e), None) => return Err(e),
        };
        match self.set_attrs(&obj, handle, set) {
            // A handle borrowed from another open of a nameless node went
            // with that open's release meanwhile: the kernel looks again.
            Err(e) if borrowed && e == Errno::EBADF => Err(Errno::ESTALE),
            r => r,
        }
    }

    fn set_attrs(&self, obj: &Obj, handle: Option<u64>, set: &SetAttrs) -> R<Attr> {
        let SetAttrs { mode, uid, gid, size, atime, mtime } = *set;
        let by_path = || obj.target();
        let mut attr = None;
        if let Some(m) = mode {
            attr = Some(match self.client.set_permissions(by_path(), m & 0o7777).map_err(errno) {
                Ok(a) => a,
                // A mode with a size is the kernel's own clearing of set-id
                // bits before a truncate (`ATTR_KILL_SUID` turned into a
                // mode; a program's chmod never comes with a size), from
                // its copy of the mode. Refused to a caller who does not
                // own the file when this mount's write cleared the bits a
                // moment ago and the kernel's copy is older: then nothing
                // is left to change (fuse_users failed 1 run in 25 so).
                Err(Errno::EPERM) if size.is_some() => {
                    let a = self.client.stat(by_path()).map_err(errno)?;
                    if a.mode & 0o7777 != m & 0o7777 {
                        return Err(Errno::EPERM);
                    }
                    a
                }
                Err(e) => return Err(e),
            });
        }
        if uid.is_some() || gid.is_some() {
            let (u, g) = (uid.unwrap_or(u32::MAX), gid.unwrap_or(u32::MAX));
            attr = Some(self.client.chown(by_path(), u, g).map_err(errno)?);
        }
        if let Some(s) = size {
            let t = handle.map_or_else(by_path, Target::Handle);
            attr = Some(self.client.truncate(t, s).map_err(errno)?);
        }
        if atime.is_some() || mtime.is_some() {
            attr = Some(self.client.set_times(by_path(), time_arg(atime), time_arg(mtime)).map_err(errno)?);
        }
        match attr {
            Some(a) => Ok(a),
            None => self.client.stat(by_path()).map_err(errno),
        }
    }

    /// The open files of node `ino` (taken out of the table's lock, which
    /// their calls to the server must not hold).
    fn files_of(&self, ino: u64) -> Vec<Arc<OpenFile>> {
        lock(&self.handles)
            .values()
            .filter_map(|h| match h {
                Handle::File(f) if f.ino.load(Ordering::Relaxed) == ino => Some(Arc::clone(f)),
                _ => None,
            })
            .collect()
    }

    /// After a change of the node's data through the mount: what other
    /// handles of it read ahead, or got with their open, is stale.
    fn changed(&self, ino: u64) {
        self.pages.taint(ino);
        for f in self.files_of(ino) {
            if let Some(file) = f.file.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
                file.discard_read_ahead();
            }
        }
    }

    /// `getattr` of a node renamed over while the kernel held it (see
    /// `open`): the attributes of what its name holds now, if of the same
    /// type (the kernel refuses a node whose type changes); else `stale`.
    fn former_attr(&self, ino: INodeNo, stale: Errno) -> R<Attr> {
        let (former, fmt) = {
            let nodes = lock(&self.nodes);
            let n = nodes.by_ino.get(&ino.0).ok_or(stale)?;
            (n.former.clone().ok_or(stale)?, n.fmt)
        };
        match self.client.symlink_metadata(&former) {
            Ok(a) if a.mode & libc::S_IFMT == fmt => Ok(a),
            _ => Err(stale),
        }
    }

    /// Clears the set-id bits a write by an unprivileged caller must
    /// clear; costs a request only when the file has them.
    fn kill_setid(&self, req: &Request, fh: FileHandle) -> R<()> {
        let f = self.file(fh)?;
        let mode = f.mode.load(Ordering::Relaxed);
        let group = f.gid.load(Ordering::Relaxed);
        let new = killed(mode, || in_group(req.pid(), req.gid(), group));
        if new == mode {
            return Ok(());
        }
        let a = self.by_handle(fh, |h| self.client.set_permissions(Target::Handle(h), new & 0o7777).map_err(errno))?;
        f.mode.store(a.mode, Ordering::Relaxed);
        Ok(())
    }

    fn do_write(&self, fh: FileHandle, offset: u64, data: &[u8]) -> R<u32> {
        let f = self.file(fh)?;
        if f.append {
            // The server's O_APPEND puts the data at the end it sees, which
            // the kernel's idea of the size (the offset it sends) may miss.
            let mut g = f.file.write().unwrap_or_else(|e| e.into_inner());
            let file = g.as_mut().ok_or(Errno::EBADF)?;
            file.write_all(data).map_err(io_errno)?;
            file.flush_writes().map_err(errno)?;
        } else {
            // Write-behind: the request is on the wire when this returns,
            // and the kernel is answered without waiting for the server.
            // The server runs one connection's requests in order, so any
            // later read, stat or truncate of ours sees this write (reads
            // leave for a data channel only once no write is behind); a
            // failure is reported by the next write, `flush` (close),
            // `fsync` or `release` of this handle, as NFS does.
            let mut g = f.file.write().unwrap_or_else(|e| e.into_inner());
            let file = g.as_mut().ok_or(Errno::EBADF)?;
            file.seek(SeekFrom::Start(offset)).map_err(io_errno)?;
            file.write_all(data).map_err(io_errno)?;
        }
        Ok(data.len() as u32)
    }

    /// Creates and opens; the new node holds one kernel lookup.
    fn do_create(&self, parent: INodeNo, name: &OsStr, mode: u32, flags: i32) -> R<(u64, FileHandle, Attr)> {
        let path = self.child(parent, name)?;
        let mut o = Self::open_options(flags);
        o.create(true).create_new(flags & libc::O_EXCL != 0).mode(mode & 0o7777);
        // The kernel already applied the caller's umask to `mode` (we do
        // not ask for FUSE_DONT_MASK), and the server applies none.
        let (f, fh, attr) = self.open_file(&path, &o, flags, 0, false)?;
        let ino = lock(&self.nodes).remember(&path, &attr);
        f.ino.store(ino, Ordering::Relaxed);
        Ok((ino, fh, attr))
    }

    /// Gives a node the server just created (as its own user) to the caller,
    /// as a local file system would: owner is the caller, group the caller's
    /// unless the parent directory is set-group-ID (then the server already
    /// gave it the parent's group).
    fn own(&self, req: &Request, path: &OsStr, attr: Attr) -> R<Attr> {
        if self.callers.on() {
            // The server created it as the caller already.
            return Ok(attr);
        }
        let mut gid = req.gid();
        if attr.gid != gid {
            let b = path.as_bytes();
            let parent = match b.iter().rposition(|&c| c == b'/') {
                Some(0) | None => OsStr::new("/"),
                Some(i) => OsStr::from_bytes(&b[..i]),
            };
            let p = self.client.metadata(parent).map_err(errno)?;
            if p.mode & libc::S_ISGID != 0 {
                gid = attr.gid;
            }
        }
        if attr.uid == req.uid() && attr.gid == gid {
            return Ok(attr);
        }
        let target = ferry_client::Target::PathNoFollow(path.as_bytes());
        let mut a = match self.client.chown(target, req.uid(), gid) {
            Ok(a) => a,
            // A server that is not root cannot give files away: the node
            // stays its user's, as files on an NFS export with root squash
            // stay the squashed user's. The create itself succeeded.
            Err(e) if e.errno() == libc::EPERM => return Ok(attr),
            Err(e) => return Err(errno(e)),
        };
        // chown clears set-user/group-ID bits; a new node keeps what it asked.
        if a.mode & 0o7777 != attr.mode & 0o7777 && !attr.is_symlink() {
            a = self.client.set_permissions(target, attr.mode & 0o7777).map_err(errno)?;
        }
        Ok(a)
    }

    /// Removes a node just created whose creation then failed (best effort:
    /// the error the caller gets is the one that made us undo).
    fn undo_create(&self, path: &OsStr, is_dir: bool) {
        let _ = if is_dir { self.client.remove_dir(path) } else { self.client.remove_file(path) };
        lock(&self.nodes).detach(path);
    }

    /// `getattr`, asked of the server.
    fn getattr_remote(&self, ino: INodeNo, fh: Option<FileHandle>) -> R<Attr> {
        // By the handle if it can be had; else by the node.
        let by_handle = fh.and_then(|fh| {
            let mut asked = false;
            let r = self.by_handle(fh, |h| {
                asked = true;
                self.client.stat(Target::Handle(h)).map_err(errno)
            });
            asked.then_some(r)
        });
        match by_handle {
            Some(r) => r,
            None => match self.obj(ino) {
                Ok(o) => match (&o, self.recent_of(&o)) {
                    (_, Some(a)) => Ok(a),
                    (Obj::Handle(_), None) => match self.client.stat(o.target()).map_err(errno) {
                        // A handle borrowed from another open of a nameless
                        // node went with that open's release meanwhile.
                        Err(e) if e == Errno::EBADF => self.former_attr(ino, Errno::ESTALE),
                        r => r,
                    },
                    (Obj::Path(_), None) => self.client.stat(o.target()).map_err(errno),
                },
                Err(stale) => self.former_attr(ino, stale),
            },
        }
    }

    /// A negative entry the kernel keeps for `ttl` (node id 0 is FUSE's
    /// "no such entry, cache that").
    fn miss(ttl: &Duration, reply: ReplyEntry) {
        let mut a = file_attr(0, &Attr::default());
        a.ino = INodeNo(0);
        reply.entry_with_ttls(&Duration::ZERO, ttl, &a, Generation(0));
    }

    /// After a change of `name` in directory `dir` through the mount:
    /// `made` says whether it is there now (`None`: the change failed, and
    /// the mount no longer claims to know the directory's names whole).
    fn made(&self, dir: INodeNo, name: &OsStr, made: Option<bool>) {
        let mut nodes = lock(&self.nodes);
        match made {
            Some(true) => nodes.made_add(dir.0, name),
            Some(false) => nodes.made_remove(dir.0, name),
            None => nodes.unmake(dir.0),
        }
    }

    fn xattr_reply(value: &[u8], size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(value.len() as u32);
        } else if value.len() > size as usize {
            reply.error(Errno::ERANGE);
        } else {
            reply.data(value);
        }
    }
}

macro_rules! tri {
    ($reply:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return $reply.error(e),
        }
    };
}

impl Filesystem for FerryFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        if let Err(max) = config.set_max_write(MAX_IO) {
            let _ = config.set_max_write(max);
        }
        if let Err(max) = config.set_max_readahead(MAX_IO) {
            let _ = config.set_max_readahead(max);
        }
        // Each wanted separately: a kernel lacking one still mounts.
        let mut want = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
        if self.opts.cache {
            // Cached pages are dropped when the server's mtime or size is
            // seen to change: the page cache is as fresh as the attributes.
            want |= InitFlags::FUSE_AUTO_INVAL_DATA;
        }
        // Cached files are handed to the kernel, where it can take them;
        // on the server's host, every file (`samehost`) unless the mount
        // uses the page cache: its lazy opens met files renamed over with
        // ESTALE when backings were on beside them (ARCHITECTURE.md).
        let cached = self.client.caches() && self.opts.passthrough;
        // Registering a backing needs CAP_SYS_ADMIN: an ordinary user's
        // daemon does not ask for passthrough at all.
        let same_host = self.opts.same_host_passthrough
            && !self.opts.cache
            && rustix::process::geteuid().is_root()
            && self.client.on_server_host();
        if (cached || same_host)
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok()
        {
            self.passthrough = cached;
            self.same_host = samehost::SameHost::new(same_host);
        }
        if self.client.engine().has_cap(ferry_client::caps::LOCKS) {
            // Locks go to the server; without the capability the kernel
            // keeps them local to this machine, as before.
            want |= InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS;
        }
        for f in want.iter() {
            let _ = config.add_capabilities(f);
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _acting = self.callers.acting(req);
        let path = tri!(reply, self.child(parent, name));
        let gen = self.recent.generation();
        if let Some(ttl) = self.long_ttl() {
            // A directory this mount made, whose every name it knows: a
            // name it did not make is not there (another client's would
            // have broken the lease). Checked and kept as a miss under one
            // hold of the table, so a break that comes now drops the
            // kernel's entry after this answer (the kernel's invalidation
            // waits for the lookup).
            let mut nodes = lock(&self.nodes);
            if nodes.made_has(parent.0, name) == Some(false) {
                let ttl = match nodes.keep_miss(parent.0, name) {
                    true => ttl.max(self.opts.entry_timeout),
                    false => self.opts.entry_timeout,
                };
                drop(nodes);
                return Self::miss(&ttl, reply);
            }
        }
        if let Some(a) = self.recent.take(&path) {
            // From the listing just read; kept once more for the GETATTR
            // that follows.
            self.recent.put(gen, [(path.clone(), &a)]);
            return self.entry(&path, &a, reply);
        }
        match self.client.symlink_metadata(&path) {
            Ok(a) => {
                self.recent.put(gen, [(path.clone(), &a)]);
                self.entry_since(&path, &a, gen, reply)
            }
            // A negative entry with a TTL spares the server repeated misses
            // (a node id of 0 is FUSE's "no such entry, cache that").
            Err(e) if e.errno() == libc::ENOENT && !self.opts.entry_timeout.is_zero() => {
                // A miss kept past the plain timeout must be dropped when
                // the directory's lease breaks for any name: remembered,
                // within a bound. Whether a break came since the lookup
                // began (`ttls_since`) is read under the same hold of the
                // table as the miss is remembered: a break read after the
                // reply then either moved the generation first (the miss
                // is not kept long) or takes the miss with it, since its
                // handling takes the table after it moved the generation.
                // Read before the table was held, a break handled in
                // between took the directory's misses without this one,
                // which the kernel then kept with no lease on the
                // directory left to hear of the name's creation.
                let mut nodes = lock(&self.nodes);
                let mut ttl = self.ttls_since(gen).1;
                test_pause();
                if ttl > self.opts.entry_timeout && !nodes.keep_miss(parent.0, name) {
                    ttl = self.opts.entry_timeout;
                }
                drop(nodes);
                Self::miss(&ttl, reply)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        lock(&self.nodes).forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let _acting = self.callers.acting(req);
        let gen = self.recent.generation();
        let backed = self.modes.stat(ino.0).map(|r| r.map_err(Errno::from_i32));
        let (r, local) = match backed {
            // The server's own file, where it backs the node (`samehost`).
            Some(r) => (r, true),
            None => (self.getattr_remote(ino, fh), false),
        };
        let a = tri!(reply, r);
        lock(&self.nodes).seen(ino.0, &a);
        // An answer the server never saw is under no lease (and a file
        // lent for writing is under none at all: another client's `chmod`
        // of it breaks nothing here), so the kernel keeps it for no time:
        // the next `stat` is another `fstat` of the same file, still no
        // round trip.
        let ttl = if local { Duration::ZERO } else { self.ttls_since(gen).0 };
        reply.attr(&ttl, &file_attr(ino.0, &a));
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _acting = self.callers.acting(req);
        let _changes = self.recent.changing();
        let gen = self.recent.generation();
        let a = tri!(reply, self.do_setattr(ino, &SetAttrs { mode, uid, gid, size, atime, mtime }, fh));
        if size.is_some() {
            self.changed(ino.0);
        }
        if mode.is_some() || uid.is_some() || gid.is_some() {
            // Who may open it changed: the next open asks the server, and
            // a lookup in it too (the server says who may search it).
            self.pages.taint(ino.0);
            lock(&self.nodes).unmake(ino.0);
            // Open handles of the node learn its set-id bits (see `kill_setid`).
            for h in lock(&self.handles).values() {
                if let Handle::File(f) = h {
                    if f.ino.load(Ordering::Relaxed) == ino.0 {
                        f.mode.store(a.mode, Ordering::Relaxed);
                        f.gid.store(a.gid, Ordering::Relaxed);
                    }
                }
            }
        }
        // A break read while the change ran (a grant the server refused,
        // as for a file lent for writing, comes as one just before the
        // reply) may have dropped the kernel's attributes before this
        // reply reaches it: kept even for the plain timeout, they would
        // hide the next change of a client the server no longer breaks.
        let ttl = if self.recent.generation() == gen { self.opts.attr_timeout } else { Duration::ZERO };
        reply.attr(&ttl, &file_attr(ino.0, &a));
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let _acting = self.callers.acting(req);
        let path = tri!(reply, self.path(ino));
        let target = tri!(reply, self.client.read_link(&path).map_err(errno));
        reply.data(target.as_os_str().as_bytes());
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _acting = self.callers.acting(req);
        let _changes = self.recent.changing();
        let path = tri!(reply, self.child(parent, name));
        let undo = |_: &Errno| self.made(parent, name, None);
        let a = tri!(reply, self.client.mknod(&path, mode, u64::from(rdev)).map_err(errno).inspect_err(undo));
        let a = tri!(reply, self.own(req, &path, a).inspect_err(|_| self.undo_create(&path, false)).inspect_err(undo));
        self.made(parent, name, Some(true));
        self.entry(&path, &a, reply);
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        let _acting = self.callers.acting(req);
        let _changes = self.recent.changing();
        let path = tri!(reply, self.child(parent, name));
        let breaks = self.pages.breaks();
        let undo = |_: &Errno| self.made(parent, name, None);
        let a = tri!(reply, self.client.create_dir(&path, mode & 0o7777).map_err(errno).inspect_err(undo));
        let a = tri!(reply, self.own(req, &path, a).inspect_err(|_| self.undo_create(&path, true)).inspect_err(undo));
        let ino = {
            let mut nodes = lock(&self.nodes);
            let ino = nodes.remember(&path, &a);
            nodes.made_add(parent.0, name);
            // Empty, and leased by the reply that made it (a change by
            // another client since would have come as a break first): the
            // mount knows its every name until its lease breaks. Marked
            // under the table's lock, which the break's handling takes
            // after counting it.
            if self.long_ttl().is_some() && self.pages.breaks() == breaks {
                nodes.made_dir(ino);
            }
            ino
        };
        let (ttl, entry_ttl) = self.made_ttls(breaks);
        reply.entry_with_ttls(&ttl, &entry_ttl, &file_attr(ino, &a), Generation(0));
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _acting = self.callers.acting(req);
        let _changes = self.recent.changing();
        let path = tri!(reply, self.child(parent, name));
        self.wake(&path);
        tri!(reply, self.client.remove_file(&path).map_err(errno).inspect_err(|_| self.made(parent, name, None)));
        lock(&self.nodes).detach(&path);
        self.made(parent, name, Some(false));
        reply.ok();
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _acting = self.callers.acting(req);
        let _changes = self.recent.changing();
        let path = tri!(reply, self.child(parent, name));
        tri!(reply, self.client.remove_dir(&path).map_err(errno).inspect_err(|_| self.made(parent, name, None)));
        lock(&self.nodes).detach(&path);
        self.made(parent, name, Some(false));
        reply.ok();
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let _acting = self.callers.acting(req);
        let _changes = self.recent.changing();
        let path = tri!(reply, self.child(parent, link_name));
        let undo = |_: &Errno| self.made(parent, link_name, None);
        let a = tri!(reply, self.client.symlink(target, &path).map_err(errno).inspect_err(undo));
        let a = tri!(reply, self.own(req, &path, a).inspect_err(|_| self.undo_create(&path, false)).inspect_err(undo));
        self.made(parent, link_name, Some(true));
        self.entry(&path, &a, reply);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _acting = self.callers.acting(req);
        let _changes = self.recent.changing();
        let from = tri!(reply, self.child(parent, name));
        let to = tri!(reply, self.child(newparent, newname));
        if !flags.contains(RenameFlags::RENAME_EXCHANGE) {
            self.wake(&to);
        }
        // Holding the table across the call keeps a lookup of either name
        // from slipping in between the server's rename and ours.
        let mut nodes = lock(&self.nodes);
        if let Err(e) = self.client.rename_with_flags(&from, &to, flags.bits()) {
            nodes.unmake(parent.0);
            nodes.unmake(newparent.0);
            return reply.error(errno(e));
        }
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            nodes.exchange(&from, &to);
        } else {
            nodes.rename(&from, &to);
            nodes.made_remove(parent.0, name);
            nodes.made_add(newparent.0, newname);
            if flags.bits() & libc::RENAME_WHITEOUT != 0 {
                // A whiteout is left under the old name.
                nodes.unmake(parent.0);
            }
        }
        drop(nodes);
        reply.ok();
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let _acting = self.callers.acting(req);
        let _changes = self.recent.changing();
        let from = tri!(reply, self.path(ino));
        let to = tri!(reply, self.child(newparent, newname));
        let a = tri!(
            reply,
            self.client.hard_link(&from, &to).map_err(errno).inspect_err(|_| self.made(newparent, newname, None))
        );
        self.made(newparent, newname, Some(true));
        self.entry(&to, &a, reply);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _acting = self.callers.acting(req);
        // An open for writing may truncate, and its writes change the size.
        let writes = flags.0 & (libc::O_ACCMODE | libc::O_TRUNC) != libc::O_RDONLY;
        let _changes = writes.then(|| self.recent.changing());
        let o = Self::open_options(flags.0);
        // A reader under a lease of a server that sees every change may
        // keep the file's pages for the next open (`pages`), if no break
        // comes before its handle can be found by the next one.
        let may_keep = !writes && flags.0 & libc::O_DIRECT == 0 && self.long_ttl().is_some();
        let breaks = self.pages.breaks();
        if writes {
            self.pages.taint(ino.0);
        }
        if may_keep {
            match self.open_lazy(req, ino.0, flags.0, breaks) {
                Some(Ok((fh, OpenedAs::Flags(f)))) => return reply.opened(fh, f),
                Some(Ok((fh, OpenedAs::Backing(id)))) => return reply.opened_passthrough(fh, FopenFlags::empty(), &id),
                Some(Err(e)) => return reply.error(e),
                None => {}
            }
        }
        let (f, fh, attr) = match self.path(ino) {
            Ok(path) => tri!(reply, self.open_file(&path, &o, flags.0, ino.0, may_keep)),
            // The kernel looked the name up just before a rename put a new
            // version there (an editor's or git's save): a local open would
            // give the old file, which the server cannot reach by name any
            // more. A reader gets the new one, still old-or-new as on a
            // local file system; a writer gets ESTALE, so the kernel looks
            // the name up again and retries, and never writes into a file
            // it did not look up.
            Err(stale) if flags.0 & libc::O_ACCMODE == libc::O_RDONLY => {
                let former = lock(&self.nodes).by_ino.get(&ino.0).and_then(|n| n.former.clone());
                let path = tri!(reply, former.ok_or(stale));
                tri!(reply, self.open_file(&path, &o, flags.0, ino.0, may_keep).map_err(|_| stale))
            }
            Err(stale) => return reply.error(stale),
        };
        let mut leased = may_keep && self.pages.breaks() == breaks;
        if leased {
            // The next opens by this caller may ask nothing (`open_lazy`).
            leased = nodes::key_of(&attr).is_some_and(|k| self.pages.lease(k, (req.uid(), req.gid()), breaks));
        }
        if !leased {
            f.trusted.store(false, Ordering::SeqCst);
        }
        let g = f.file.read().unwrap_or_else(|e| e.into_inner());
        let backing = g.as_ref().and_then(|file| {
            self.same_host.backing(&self.modes, file, ino.0, flags.0, writes, |fd| reply.open_backing(fd))
        });
        if let Some(id) = backing {
            f.io_mode.store(Taken { mode: Mode::Passthrough, writes: false }.to_u8(), Ordering::Relaxed);
            return reply.opened_passthrough(fh, FopenFlags::empty(), &id);
        }
        let mut flags = self.open_flags(writes);
        let mut lease_keep = false;
        if let Some(file) = g.as_ref().filter(|f| f.is_cached()) {
            // A cached file: the kernel reads the local cache file itself
            // (passthrough), or keeps its pages while they hold the version
            // this open found (every read that reaches us is served from
            // the local cache anyway).
            if self.passthrough {
                let data = file.cache_file().ok().flatten();
                if let Some(id) = data.and_then(|d| self.modes.passthrough(ino.0, &d, |d| reply.open_backing(d))) {
                    f.io_mode.store(Taken { mode: Mode::Passthrough, writes: false }.to_u8(), Ordering::Relaxed);
                    return reply.opened_passthrough(fh, FopenFlags::empty(), &id);
                }
            }
            let mut keep = file.cache_tag().is_some_and(|t| self.modes.keep_pages(ino.0, t));
            if leased {
                // Under a lease the pages must be clean too; the change
                // attribute still says what changed on the server's disk
                // before its notice came.
                keep = self.pages.keep(ino.0) && keep;
            }
            flags = if keep { FopenFlags::FOPEN_KEEP_CACHE } else { FopenFlags::empty() };
        } else if leased && attr.size <= PAGE_CACHE_MAX {
            flags = FopenFlags::empty();
            lease_keep = true;
        }
        drop(g);
        match self.io_mode(&f, fh, ino.0, flags, writes) {
            Ok((None, mut flags)) => {
                // Asked last: the node is clean once this reply reached the
                // kernel, which drops its pages unless told to keep them.
                if lease_keep && !flags.contains(FopenFlags::FOPEN_DIRECT_IO) && self.pages.keep(ino.0) {
                    flags |= FopenFlags::FOPEN_KEEP_CACHE;
                }
                reply.opened(fh, flags)
            }
            Ok((Some(id), _)) => reply.opened_passthrough(fh, FopenFlags::empty(), &id),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        mut reply: ReplyData,
    ) {
        let f = tri!(reply, self.live_file(fh));
        if !f.trusted.load(Ordering::SeqCst) && Taken::from_u8(f.io_mode.load(Ordering::Relaxed)).mode == Mode::Cached {
            // A page the kernel keeps, that no lease covers.
            self.pages.taint(ino.0);
        }
        let g = f.file.read().unwrap_or_else(|e| e.into_inner());
        let file = tri!(reply, g.as_ref().ok_or(Errno::EBADF));
        let size = size as usize;
        // Over FUSE over io_uring the data lands in the ring entry's
        // payload, which the kernel copies to the reader from: received
        // from the socket (or read from the server's descriptor) straight
        // there, with no buffer of ours in between.
        if let Some(buf) = reply.buffer(size) {
            return match read_into(file, buf, offset) {
                Ok(n) => reply.commit(n),
                Err(e) => reply.error(errno(e)),
            };
        }
        // `/dev/fuse`: into our buffer, which the reply's `writev` copies.
        // It starts on a page: one off a cache line would be received
        // through another buffer of the library's first.
        READ_BUF.with_borrow_mut(|buf| {
            if buf.len() < size {
                buf.set_len(size);
            }
            match read_into(file, &mut buf[..size], offset) {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(errno(e)),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _acting = self.callers.acting(req);
        let _changes = self.recent.changing();
        self.pages.written(ino.0);
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            // The writer lacks CAP_FSETID (direct I/O asks us; the page
            // cache path clears the bits with a setattr of its own). The
            // server may well have it: clear them here, as a local file
            // system does on such a write.
            tri!(reply, self.kill_setid(req, fh));
        }
        let n = tri!(reply, self.do_write(fh, offset, data));
        self.changed(ino.0);
        reply.written(n);
    }

    fn flush(&self, _req: &Request, ino: INodeNo, fh: FileHandle, lock_owner: LockOwner, reply: ReplyEmpty) {
        let _changes = self.recent.changing();
        // close(2) returns once every write of this handle is acknowledged,
        // and reports the first one that failed.
        let f = tri!(reply, self.file(fh));
        if self.locks.in_use() {
            // The close rule's unlock goes through this handle.
            tri!(reply, self.live(&f));
        }
        self.locks.closing(&f, ino.0, lock_owner.0);
        let mut g = f.file.write().unwrap_or_else(|e| e.into_inner());
        if let Some(file) = g.as_mut() {
            tri!(reply, file.flush_writes().map_err(errno));
        }
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _changes = self.recent.changing();
        // The last close of the file; the owner is there if it held a flock.
        self.locks.released(self.file(fh).ok().as_deref(), fh.0, ino.0, lock_owner.map(|o| o.0));
        let h = lock(&self.handles).remove(&fh.0);
        if let Some(Handle::File(f)) = h {
            let taken = Taken::from_u8(f.io_mode.load(Ordering::Relaxed));
            if taken.writes {
                // Its descriptor lent by a server on this host closes now.
                self.pages.written(ino.0);
            }
            self.modes.release(ino.0, taken);
            if let Some(file) = f.file.write().unwrap_or_else(|e| e.into_inner()).take() {
                tri!(reply, file.close().map_err(errno));
            }
        }
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let _changes = self.recent.changing();
        let f = tri!(reply, self.file(fh));
        if lock(&f.lazy).is_some() {
            // Opened for reading only, and not even on the server yet.
            return reply.ok();
        }
        let mut g = f.file.write().unwrap_or_else(|e| e.into_inner());
        let file = tri!(reply, g.as_mut().ok_or(Errno::EBADF));
        let r = if datasync { file.sync_data() } else { file.sync_all() };
        tri!(reply, r.map_err(errno));
        reply.ok();
    }

    #[allow(clippy::too_many_arguments)]
    fn getlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let f = tri!(reply, self.live_file(fh));
        self.locks.getlk(&f, lock_owner.0, (start, end), typ, pid, reply);
    }

    #[allow(clippy::too_many_arguments)]
    fn setlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let f = tri!(reply, self.live_file(fh));
        self.locks.setlk(f, fh.0, ino.0, lock_owner.0, (start, end), typ, pid, sleep, reply);
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_opendir.is_some() {
            // For good: the kernel sends no `OPENDIR` (nor `RELEASEDIR`)
            // again, opens with `FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR` and
            // handle 0 (`unopened_listing`).
            return reply.error(Errno::ENOSYS);
        }
        let _acting = self.callers.acting(req);
        let path = tri!(reply, self.path(ino));
        // The kernel's own copy of the listing is still what the server
        // promised: keep it, ask nothing. A break of the directory (or of
        // everything) unmarks it before the kernel's copy is dropped.
        if self.long_ttl().is_some() && lock(&self.nodes).is_listed(ino.0) {
            let flags = FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE;
            return reply.opened(self.add_handle(Handle::LazyDir(ino.0)), flags);
        }
        let (items, gen) = tri!(reply, self.list(&path));
        // Kept for long only if fetched under a lease nothing broke since:
        // checked under the hold of the table that marks it, as a miss is
        // kept (`lookup`), so a break handled after it unmarks it.
        let mut nodes = lock(&self.nodes);
        let long = self.long_ttl().is_some() && self.recent.generation() == gen;
        let flags = match long && nodes.mark_listed(ino.0) {
            // The kernel keeps what this open lists, for the next opens.
            true => FopenFlags::FOPEN_CACHE_DIR,
            false => FopenFlags::empty(),
        };
        drop(nodes);
        reply.opened(self.add_handle(Handle::Dir(Arc::new(items))), flags);
    }

    fn readdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let _acting = self.callers.acting(req);
        let items = tri!(reply, self.dir(ino, fh, offset));
        // Offsets: 1 after ".", 2 after "..", then 3 + i after item i.
        if offset < 1 && reply.add(ino, 1, FileType::Directory, ".") {
            return reply.ok();
        }
        if offset < 2 && reply.add(ino, 2, FileType::Directory, "..") {
            return reply.ok();
        }
        let start = offset.saturating_sub(2) as usize;
        for (i, it) in items.iter().enumerate().skip(start) {
            let d_ino = it.attr.map_or(u64::MAX, |a| a.ino);
            if reply.add(INodeNo(d_ino), 3 + i as u64, it.kind, &it.name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let _acting = self.callers.acting(req);
        let items = tri!(reply, self.dir(ino, fh, offset));
        let dir_path = tri!(reply, self.path(ino));
        // Each listing's answers count from when it was fetched (`it.gen`).
        let plain = self.opts.attr_timeout.min(self.opts.entry_timeout);
        let ttl = self.long_ttl().map_or(plain, |t| t.max(plain));
        // The kernel takes no reference for "." and "..", only their names
        // and numbers.
        let parent = match dir_path.as_bytes().iter().rposition(|&c| c == b'/') {
            Some(i) if ino != INodeNo::ROOT => {
                let p = if i == 0 { OsStr::new("/") } else { OsStr::from_bytes(&dir_path.as_bytes()[..i]) };
                lock(&self.nodes).by_path.get(p).copied().unwrap_or(ROOT)
            }
            _ => ROOT,
        };
        let dir = Attr { mode: libc::S_IFDIR, ..Attr::default() };
        if offset < 1 && reply.add(ino, 1, ".", &Duration::ZERO, &file_attr(ino.0, &dir), Generation(0)) {
            return reply.ok();
        }
        if offset < 2 && reply.add(INodeNo(parent), 2, "..", &Duration::ZERO, &file_attr(parent, &dir), Generation(0)) {
            return reply.ok();
        }
        let start = offset.saturating_sub(2) as usize;
        let mut nodes = lock(&self.nodes);
        for (i, it) in items.iter().enumerate().skip(start) {
            let off = 3 + i as u64;
            let full = match &it.attr {
                Some(a) => {
                    let ino = nodes.remember(join(&dir_path, &it.name).as_os_str(), a);
                    let ttl = if self.recent.generation() == it.gen { ttl } else { Duration::ZERO };
                    let full = reply.add(INodeNo(ino), off, &it.name, &ttl, &file_attr(ino, a), Generation(0));
                    if full {
                        nodes.forget(ino, 1);
                    }
                    full
                }
                // No attributes (a directory readable but not searchable):
                // a node whose attributes expire at once, so every use asks
                // the server (and is refused, as locally). Not node id 0:
                // the kernel gives that to the entry as its inode number,
                // and glibc's `readdir` skips entries numbered 0.
                None => {
                    let fmt = mode_of_dt(it.dt);
                    let ino = nodes.remember_name(join(&dir_path, &it.name).as_os_str(), fmt, it.ino);
                    let mut a = file_attr(ino, &Attr { mode: fmt, nlink: 1, ..Attr::default() });
                    a.kind = it.kind;
                    let full = reply.add(INodeNo(ino), off, &it.name, &Duration::ZERO, &a, Generation(0));
                    if full {
                        nodes.forget(ino, 1);
                    }
                    full
                }
            };
            if full {
                break;
            }
        }
        drop(nodes);
        reply.ok();
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        lock(&self.handles).remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // The server applies directory changes synchronously; there is no
        // directory fsync in the protocol.
        reply.ok();
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let _acting = self.callers.acting(req);
        let path = self.path(ino).unwrap_or_else(|_| "/".into());
        let s = tri!(reply, self.client.statfs(&path).map_err(errno));
        reply.statfs(
            s.blocks,
            s.bfree,
            s.bavail,
            s.files,
            s.ffree,
            s.bsize as u32,
            s.namemax as u32,
            if s.frsize == 0 { s.bsize as u32 } else { s.frsize as u32 },
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _acting = self.callers.acting(req);
        let _changes = self.recent.changing();
        lock(&self.nodes).forget_xattrs(ino.0);
        // An ACL may change who may open it: the next open asks the server.
        self.pages.taint(ino.0);
        let path = tri!(reply, self.path(ino));
        tri!(
            reply,
            self.client.set_xattr(Target::PathNoFollow(path.as_bytes()), name, value, flags as u32).map_err(errno)
        );
        reply.ok();
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if name == "security.capability" {
            // Asked before every passthrough write: answered from the
            // server's own file where it backs the node (`samehost`).
            match self.modes.capability(ino.0) {
                Some(Ok(v)) => return Self::xattr_reply(&v, size, reply),
                Some(Err(e)) => return reply.error(Errno::from_i32(e)),
                None => {}
            }
        }
        let known = nodes::ABSENT_NAMES.iter().position(|n| name == *n);
        if let Some(bit) = known {
            if self.long_ttl().is_some() && lock(&self.nodes).is_absent(ino.0, bit) {
                return reply.error(Errno::ENODATA);
            }
        }
        let _acting = self.callers.acting(req);
        let path = tri!(reply, self.path(ino));
        let gen = self.recent.generation();
        match self.client.get_xattr(Target::PathNoFollow(path.as_bytes()), name).map_err(errno) {
            Ok(v) => Self::xattr_reply(&v, size, reply),
            Err(e) => {
                // Kept only if no break came while it was asked (the lease
                // vouches for it from then on).
                if let Some(bit) = known.filter(|_| e == Errno::ENODATA) {
                    if self.long_ttl().is_some() && self.recent.generation() == gen {
                        lock(&self.nodes).set_absent(ino.0, bit);
                    }
                }
                reply.error(e)
            }
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _acting = self.callers.acting(req);
        let path = tri!(reply, self.path(ino));
        let names = tri!(reply, self.client.list_xattr(Target::PathNoFollow(path.as_bytes())).map_err(errno));
        let mut v = Vec::new();
        for n in names {
            v.extend_from_slice(n.as_bytes());
            v.push(0);
        }
        Self::xattr_reply(&v, size, reply);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _acting = self.callers.acting(req);
        let _changes = self.recent.changing();
        lock(&self.nodes).forget_xattrs(ino.0);
        self.pages.taint(ino.0);
        let path = tri!(reply, self.path(ino));
        tri!(reply, self.client.remove_xattr(Target::PathNoFollow(path.as_bytes()), name).map_err(errno));
        reply.ok();
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _acting = self.callers.acting(req);
        let path = tri!(reply, self.path(ino));
        tri!(reply, self.client.access(&path, mask.bits() as u32).map_err(errno));
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _acting = self.callers.acting(req);
        let _changes = self.recent.changing();
        let breaks = self.pages.breaks();
        let undo = |_: &Errno| self.made(parent, name, None);
        let (ino, fh, attr) = tri!(reply, self.do_create(parent, name, mode, flags).inspect_err(undo));
        let attr = match self.child(parent, name).and_then(|p| {
            self.own(req, &p, attr).inspect_err(|_| {
                // A create either succeeds or leaves nothing: no file, no open
                // handle, no node the kernel never heard of.
                lock(&self.handles).remove(&fh.0);
                lock(&self.nodes).forget(ino, 1);
                self.undo_create(&p, false);
            })
        }) {
            Ok(a) => a,
            Err(e) => {
                undo(&e);
                return reply.error(e);
            }
        };
        self.made(parent, name, Some(true));
        if flags & libc::O_EXCL != 0 && self.long_ttl().is_some() {
            // Made just now, so it has no file capability (the kernel asks
            // before the first write and the chown of each file).
            lock(&self.nodes).set_absent(ino, nodes::CAPABILITY);
        }
        // A new file has no backing, but `create` also opens an existing
        // file (`O_CREAT` without `O_EXCL` of a name the kernel thought
        // absent): it joins the server file's backing as any writer does
        // (`samehost`), and a cache copy's backing it never joins.
        self.pages.taint(ino);
        let f = tri!(reply, self.file(fh));
        let g = f.file.read().unwrap_or_else(|e| e.into_inner());
        // A file made just now (`O_EXCL`) with an execute bit never starts
        // a backing (`samehost`), and has none to join: its descriptor
        // would be asked for nothing (a round trip per script `tar x` or
        // `git clone` makes).
        let fresh_exec = flags & libc::O_EXCL != 0 && attr.mode & 0o111 != 0;
        let backing = g
            .as_ref()
            .filter(|_| !fresh_exec)
            .and_then(|file| self.same_host.backing(&self.modes, file, ino, flags, true, |fd| reply.open_backing(fd)));
        drop(g);
        if let Some(id) = backing {
            f.io_mode.store(Taken { mode: Mode::Passthrough, writes: false }.to_u8(), Ordering::Relaxed);
            // Its attributes, of a file written past the server, keep the
            // plain timeout; its name is leased as any other.
            let (ttl, attr) = (&self.opts.attr_timeout, &file_attr(ino, &attr));
            let entry_ttl = self.made_ttls(breaks).1;
            return reply.created_passthrough(ttl, &entry_ttl, attr, Generation(0), fh, FopenFlags::empty(), &id);
        }
        let flags = match self.io_mode(&f, fh, ino, self.open_flags(true), true) {
            Ok((_, flags)) => flags,
            Err(e) => return reply.error(e),
        };
        let (ttl, entry_ttl) = self.made_ttls(breaks);
        reply.created_with_ttls(&ttl, &entry_ttl, &file_attr(ino, &attr), Generation(0), fh, flags);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip() {
        for t in [Time { sec: 0, nsec: 0 }, Time { sec: 1_700_000_000, nsec: 5 }, Time { sec: -2, nsec: 300 }] {
            assert_eq!(from_system_time(to_system_time(t)), t);
        }
    }
}
