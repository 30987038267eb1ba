//! Each node's kernel I/O mode, and which version of a cached file its
//! page cache holds.
//!
//! With `--passthrough`, cached files are handed to the kernel with FUSE
//! passthrough (Linux ≥ 6.9): reads go from the application to the local
//! cache file inside the kernel, with no daemon in the path. The kernel
//! keeps one mode per node and refuses with `EIO` (`fuse_file_io_open`) any
//! open that does not fit it: while a passthrough open lasts, every other
//! open of the node must be passthrough on that same backing file — direct
//! I/O included — and while an open using the page cache lasts, no
//! passthrough open may start. Every open asks here which mode it may take:
//! a reader of a backed node joins its backing (it reads the version the
//! open ones hold); a writer cannot (its writes would land in the cache file,
//! never on the server) and is told `ETXTBSY`, as Linux tells a writer of a
//! running program.
//!
//! On the server's own host any file may be backed by the server's own
//! descriptor of it (`FileFd`): reads and writes are then the local
//! kernel's, on the very file the server serves. Such a backing is
//! *shared*: a writer joins it too (the kernel opens the backing's path
//! again with the writer's flags), since its writes land where the server
//! would have put them. See `same_host` for when one starts.
//!
//! Without passthrough (the default) a cached file uses the page cache, and
//! an open keeps the pages (`FOPEN_KEEP_CACHE`) when it finds the version
//! they were read from: warm reads never reach the daemon, and nothing
//! constrains the other opens.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};

use fuser::BackingId;

/// The mode an open took, kept with it until its release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `FOPEN_DIRECT_IO`: outside the kernel's modes.
    Direct,
    /// The kernel's page cache.
    Cached,
    /// Passthrough to the node's backing file.
    Passthrough,
}

/// What an open holds of its node until its release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    pub mode: Mode,
    /// It may write: no passthrough may start meanwhile (its writes go to
    /// the server, never to a backing file the others would read).
    pub writes: bool,
}

impl Taken {
    pub const NOTHING: Taken = Taken { mode: Mode::Direct, writes: false };

    pub fn to_u8(self) -> u8 {
        let m = match self.mode {
            Mode::Direct => 0,
            Mode::Cached => 1,
            Mode::Passthrough => 2,
        };
        m | (self.writes as u8) << 2
    }

    pub fn from_u8(v: u8) -> Taken {
        let mode = match v & 3 {
            1 => Mode::Cached,
            2 => Mode::Passthrough,
            _ => Mode::Direct,
        };
        Taken { mode, writes: v & 4 != 0 }
    }
}

#[derive(Default)]
pub struct IoModes {
    nodes: Mutex<HashMap<u64, Node>>,
    /// The cache tag of the version each node's page cache was last filled
    /// from.
    pages: Mutex<HashMap<u64, Vec<u8>>>,
}

/// Bound on `pages`: past it, the map starts again (an open that misses
/// only drops pages that were still good).
const PAGES_MAX: usize = 1 << 16;

/// How an open may proceed.
pub enum Open {
    /// With the flags it asked for.
    As(Taken),
    /// As a passthrough open on the node's backing.
    Join(Arc<BackingId>),
}

#[derive(Default)]
struct Node {
    /// Opens using the page cache.
    cached: usize,
    /// Direct-I/O opens: a backing starts only without them, since what
    /// they read through the daemon (the bytes an open brings along) would
    /// not see the writes of a passthrough writer.
    direct: usize,
    /// Opens that may write.
    writers: usize,
    /// Of those, opens with direct I/O.
    direct_writers: usize,
    backing: Option<Backing>,
}

struct Backing {
    id: Arc<BackingId>,
    /// The server's own file (same host), not a local cache copy: writers
    /// may join it.
    shared: bool,
    /// A descriptor of the server's file (shared backings only), for what
    /// the kernel asks before every passthrough write (`capability`).
    own: Option<std::os::fd::OwnedFd>,
    /// `(dev, ino)` of the local cache file behind it.
    file: (u64, u64),
    opens: usize,
}

impl IoModes {
    /// The backing of node `ino` for a read-only open whose cache file is
    /// `file`: the node's own if it has one on the same file, else a new
    /// one from `register` if the node has no other open (a node is kept
    /// here only while it has one). `None`: no passthrough for this open.
    pub fn passthrough(
        &self,
        ino: u64,
        file: &std::fs::File,
        register: impl FnOnce(&std::fs::File) -> std::io::Result<BackingId>,
    ) -> Option<Arc<BackingId>> {
        let meta = file.metadata().ok()?;
        let key = (meta.dev(), meta.ino());
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        match nodes.get_mut(&ino) {
            Some(Node { backing: Some(b), .. }) if b.file == key => {
                b.opens += 1;
                Some(Arc::clone(&b.id))
            }
            Some(_) => None,
            None => {
                let id = Arc::new(register(file).ok()?);
                let backing = Some(Backing { id: Arc::clone(&id), shared: false, own: None, file: key, opens: 1 });
                nodes.insert(ino, Node { backing, ..Node::default() });
                Some(id)
            }
        }
    }

    /// Same host: the backing of node `ino` for an open whose server
    /// descriptor is `fd` (`lent_writable`: lent for writing). An open
    /// joins the node's shared backing of the same file — a writer only
    /// with a descriptor lent for writing, so the server marks the file
    /// written past it (`LentMark`) — and starts one (from `register`)
    /// only if the node has no other open the kernel would then refuse or
    /// that could write behind the backing's readers (a direct-I/O writer,
    /// a page-cache open) and `may_start` (not an executable). `None`: this
    /// open goes the usual way (`open`).
    pub fn same_host(
        &self,
        ino: u64,
        (fd, lent_writable): (std::os::fd::BorrowedFd<'_>, bool),
        writes: bool,
        may_start: bool,
        register: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> std::io::Result<BackingId>,
    ) -> Option<Arc<BackingId>> {
        if writes && !lent_writable {
            return None;
        }
        let meta = rustix::fs::fstat(fd).ok()?;
        let key = (meta.st_dev, meta.st_ino);
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        match nodes.get_mut(&ino) {
            Some(Node { backing: Some(b), .. }) if b.shared && b.file == key => {
                b.opens += 1;
                Some(Arc::clone(&b.id))
            }
            Some(_) => None,
            None if !may_start => None,
            None => {
                let own = fd.try_clone_to_owned().ok()?;
                let id = Arc::new(register(fd).ok()?);
                let backing = Some(Backing { id: Arc::clone(&id), shared: true, own: Some(own), file: key, opens: 1 });
                nodes.insert(ino, Node { backing, ..Node::default() });
                Some(id)
            }
        }
    }

    /// The file capability (`security.capability`) of node `ino`'s shared
    /// backing, read from the server's file itself: the kernel asks for it
    /// before every passthrough write (`file_remove_privs`; FUSE never
    /// marks an inode as having none), and a round trip to the server per
    /// 1 MiB write cost a third of a local write's rate. `None`: the node
    /// has no such backing (ask the server). `Err`: the errno (`ENODATA`:
    /// it has none).
    pub fn capability(&self, ino: u64) -> Option<Result<Vec<u8>, i32>> {
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let fd = nodes.get(&ino)?.backing.as_ref()?.own.as_ref()?;
        let mut buf = vec![0u8; 256];
        Some(match rustix::fs::fgetxattr(fd, "security.capability", &mut buf) {
            Ok(n) => {
                buf.truncate(n);
                Ok(buf)
            }
            Err(e) => Err(e.raw_os_error()),
        })
    }

    /// The attributes of node `ino`'s file, from the server's own
    /// descriptor where it backs the node: what the server's `Stat` would
    /// answer (an `fstat` of the same file), without the round trip. The
    /// kernel asks before every `chown` of a file (to clear its set-id
    /// bits itself: the mount does not take `FUSE_HANDLE_KILLPRIV`), which
    /// is a `GETATTR` per file `tar x`, `cp -p` and `rsync` make. `None`:
    /// no such backing (ask the server).
    pub fn stat(&self, ino: u64) -> Option<Result<ferry_client::Attr, i32>> {
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let fd = nodes.get(&ino)?.backing.as_ref()?.own.as_ref()?;
        Some(match rustix::fs::fstat(fd) {
            Ok(st) => Ok(ferry_client::Attr {
                dev: st.st_dev,
                ino: st.st_ino,
                mode: st.st_mode,
                nlink: st.st_nlink,
                uid: st.st_uid,
                gid: st.st_gid,
                rdev: st.st_rdev,
                size: st.st_size as u64,
                blksize: st.st_blksize as u32,
                blocks: st.st_blocks as u64,
                atime: ferry_client::Time { sec: st.st_atime, nsec: st.st_atime_nsec as u32 },
                mtime: ferry_client::Time { sec: st.st_mtime, nsec: st.st_mtime_nsec as u32 },
                ctime: ferry_client::Time { sec: st.st_ctime, nsec: st.st_ctime_nsec as u32 },
            }),
            Err(e) => Err(e.raw_os_error()),
        })
    }

    /// How a non-passthrough open of node `ino` proceeds (`direct`: it
    /// asks for `FOPEN_DIRECT_IO`; `writes`: it may write). `Err`: the
    /// errno to fail the open with.
    ///
    /// `flexible`: the mount chose the mode, so it may follow the node's
    /// other opens here. A writer beside opens using the page cache writes
    /// through it (FUSE without a writeback cache writes through: the
    /// kernel keeps its pages and the server's data alike, where a direct
    /// write racing a read could leave an old page behind); a reader
    /// beside a direct-I/O writer reads direct.
    pub fn open(&self, ino: u64, direct: bool, writes: bool, flexible: bool) -> Result<Open, i32> {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let node = nodes.entry(ino).or_default();
        if let Some(b) = &mut node.backing {
            if writes {
                return Err(libc::ETXTBSY);
            }
            b.opens += 1;
            return Ok(Open::Join(Arc::clone(&b.id)));
        }
        let direct = match (flexible, writes) {
            (true, true) => direct && node.cached == 0,
            (true, false) => direct || node.direct_writers > 0,
            (false, _) => direct,
        };
        node.writers += writes as usize;
        node.direct_writers += (writes && direct) as usize;
        let mode = if direct { Mode::Direct } else { Mode::Cached };
        node.cached += (mode == Mode::Cached) as usize;
        node.direct += (mode == Mode::Direct) as usize;
        if node.writers + node.cached + node.direct == 0 {
            nodes.remove(&ino);
        }
        Ok(Open::As(Taken { mode, writes }))
    }

    /// Whether node `ino`'s page cache may be kept by an open of the
    /// version `tag` names (it was filled from that version), remembering
    /// `tag` as the one the pages now come from.
    pub fn keep_pages(&self, ino: u64, tag: &[u8]) -> bool {
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        if pages.get(&ino).is_some_and(|t| t == tag) {
            return true;
        }
        if pages.len() >= PAGES_MAX {
            pages.clear();
        }
        pages.insert(ino, tag.to_vec());
        false
    }

    /// The end of an open of node `ino` that took `t`.
    pub fn release(&self, ino: u64, t: Taken) {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let Some(node) = nodes.get_mut(&ino) else { return };
        node.writers -= (t.writes && node.writers > 0) as usize;
        node.direct_writers -= (t.writes && t.mode == Mode::Direct && node.direct_writers > 0) as usize;
        match t.mode {
            Mode::Cached => node.cached = node.cached.saturating_sub(1),
            Mode::Passthrough => {
                if let Some(b) = &mut node.backing {
                    b.opens -= 1;
                    if b.opens == 0 {
                        node.backing = None;
                    }
                }
            }
            Mode::Direct => node.direct = node.direct.saturating_sub(1),
        }
        if node.cached == 0 && node.writers == 0 && node.direct == 0 && node.backing.is_none() {
            nodes.remove(&ino);
        }
    }
}
