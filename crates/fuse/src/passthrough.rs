//! Files handed to the kernel (FUSE passthrough, Linux ≥ 6.9): reads of a
//! cached file go from the application to the local cache file inside the
//! kernel, and reads and writes of a file of a server on this host to the
//! server's own descriptor of it, with no daemon in the path.
//!
//! The kernel wants one backing file per node while any passthrough open of
//! it lasts, and refuses (`EIO`) any open of such a node that is not a
//! passthrough open too; an open that finds the node backed by another file
//! (a newer version of the data, cached meanwhile), or by a read-only one
//! when it writes, goes without passthrough — and meets that refusal.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};

use fuser::BackingId;

#[derive(Default)]
pub struct Backings {
    nodes: Mutex<HashMap<u64, Backing>>,
}

struct Backing {
    id: Arc<BackingId>,
    /// `(dev, ino)` of the file behind it.
    file: (u64, u64),
    /// Opened for reading and writing (else for reading only).
    writable: bool,
    opens: usize,
}

impl Backings {
    /// The backing of node `ino` for an open whose data is in the file
    /// `key` (`dev`, `ino`), and that writes if `writes`: the node's own if
    /// it has one on that file (writable, for a writer), else one made of
    /// the file `make` opens (and whether it may be written), registered by
    /// `register`, if the node has none. `None`: no passthrough.
    pub fn acquire(
        &self,
        ino: u64,
        key: (u64, u64),
        writes: bool,
        make: impl FnOnce() -> Option<(std::fs::File, bool)>,
        register: impl FnOnce(&std::fs::File) -> std::io::Result<BackingId>,
    ) -> Option<Arc<BackingId>> {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = nodes.get_mut(&ino) {
            if b.file != key || (writes && !b.writable) {
                return None;
            }
            b.opens += 1;
            return Some(Arc::clone(&b.id));
        }
        let (file, writable) = make()?;
        let meta = file.metadata().ok()?;
        if (meta.dev(), meta.ino()) != key || (writes && !writable) {
            return None;
        }
        let id = Arc::new(register(&file).ok()?);
        nodes.insert(ino, Backing { id: Arc::clone(&id), file: key, writable, opens: 1 });
        Some(id)
    }

    /// The end of a passthrough open of node `ino`.
    pub fn release(&self, ino: u64) {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = nodes.get_mut(&ino) {
            b.opens -= 1;
            if b.opens == 0 {
                nodes.remove(&ino);
            }
        }
    }
}
