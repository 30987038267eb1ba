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
    /// Opens that may write.
    writers: usize,
    /// Of those, opens with direct I/O.
    direct_writers: usize,
    backing: Option<Backing>,
}

struct Backing {
    id: Arc<BackingId>,
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
                let backing = Some(Backing { id: Arc::clone(&id), file: key, opens: 1 });
                nodes.insert(ino, Node { backing, ..Node::default() });
                Some(id)
            }
        }
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
        if node.writers + node.cached == 0 {
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
            Mode::Direct => {}
        }
        if node.cached == 0 && node.writers == 0 && node.backing.is_none() {
            nodes.remove(&ino);
        }
    }
}
