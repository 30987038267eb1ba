//! The change attribute (capability `CACHING`): a value that differs after
//! any change of a file's data, so a client can trust its cached copy when
//! the value it saw at the last open is the value now.
//!
//! The attribute mixes the file's ctime and size with a generation this
//! server counts per file for every write and truncate it performs. The
//! ctime catches changes made on the server's disk by other programs
//! (Linux ≥ 6.13 gives ext4, xfs, btrfs and tmpfs fine-grained ctimes once a
//! file's ctime has been looked at, so a change after our `stat` never
//! reuses it); the generation catches our own changes even where the
//! timestamp is coarse (a FUSE-backed export with whole-second times, or an
//! older kernel). Generations live in memory: after a restart they are 0
//! again, so a file written through the previous server instance changes
//! attribute once (one needless refetch), and a file changed by another
//! program within one timestamp tick of an observation on a coarse file
//! system can be missed — the residue a server without a persistent
//! per-inode counter from the kernel cannot close.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ferry_proto::Attr;

use crate::locks::FileKey;

/// Files whose generation is kept at most; beyond it, generations of files
/// no handle holds are forgotten (see the module text for the cost).
const MAX_FILES: usize = 1 << 20;

#[derive(Debug, Default)]
pub struct Changes {
    gens: Mutex<HashMap<FileKey, Arc<AtomicU64>>>,
}

impl Changes {
    /// The generation counter of `key`, for a handle that may write: its
    /// writes then bump it without a lock.
    pub fn counter(&self, key: FileKey) -> Arc<AtomicU64> {
        let mut gens = self.gens.lock().unwrap_or_else(|p| p.into_inner());
        if gens.len() >= MAX_FILES && !gens.contains_key(&key) {
            gens.retain(|_, g| Arc::strong_count(g) > 1);
        }
        Arc::clone(gens.entry(key).or_default())
    }

    /// Counts a change made without a writable handle (a truncate by path).
    pub fn bump(&self, key: FileKey) {
        self.counter(key).fetch_add(1, Ordering::Relaxed);
    }

    /// The change attribute of a file whose attributes are `attr`.
    pub fn attribute(&self, attr: &Attr) -> u64 {
        let key = (attr.dev, attr.ino);
        let gen = {
            let gens = self.gens.lock().unwrap_or_else(|p| p.into_inner());
            gens.get(&key).map_or(0, |g| g.load(Ordering::Relaxed))
        };
        let words = [attr.ctime.sec as u64, u64::from(attr.ctime.nsec), attr.size, attr.ino, gen];
        words.iter().fold(0x9e37_79b9_7f4a_7c15, |h, &w| mix(h ^ w))
    }
}

/// splitmix64's finaliser: every input bit reaches every output bit, so
/// nearby ctimes or generations never give equal attributes by cancelling.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
