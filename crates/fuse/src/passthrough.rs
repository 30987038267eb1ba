//! Cached files handed to the kernel (FUSE passthrough, Linux ≥ 6.9): reads
//! of a cached file go from the application to the local cache file inside
//! the kernel, with no daemon in the path.
//!
//! The kernel wants one backing file per node while any passthrough open of
//! it lasts; an open that finds the node backed by another file (a newer
//! version of the data, cached meanwhile) goes without passthrough.

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
    /// `(dev, ino)` of the local cache file behind it.
    file: (u64, u64),
    opens: usize,
}

impl Backings {
    /// The backing of node `ino` for an open whose cache file is `file`:
    /// the node's own if it has one on the same file, else a new one from
    /// `register` if the node has none. `None`: no passthrough for this open.
    pub fn acquire(
        &self,
        ino: u64,
        file: &std::fs::File,
        register: impl FnOnce(&std::fs::File) -> std::io::Result<BackingId>,
    ) -> Option<Arc<BackingId>> {
        let meta = file.metadata().ok()?;
        let key = (meta.dev(), meta.ino());
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = nodes.get_mut(&ino) {
            if b.file != key {
                return None;
            }
            b.opens += 1;
            return Some(Arc::clone(&b.id));
        }
        let id = Arc::new(register(file).ok()?);
        nodes.insert(ino, Backing { id: Arc::clone(&id), file: key, opens: 1 });
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
