//! Cache policies of directories, remembered for a second: an open asks
//! for the policy of every directory above its file, and resolving each
//! again on every open cost about a sixth of a small file's open.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferry_proto::cache;

/// How long a directory's policy is trusted. Settings made through ferry
/// forget everything at once; one made on the server's disk by hand is
/// seen within this.
const TTL: Duration = Duration::from_secs(1);
const MAX_DIRS: usize = 16 * 1024;

/// A directory's policy, where it is set, and when that was looked up.
type Known = (u8, Vec<u8>, Instant);

#[derive(Debug, Default)]
pub struct DirPolicies {
    dirs: Mutex<HashMap<Vec<u8>, Known>>,
}

/// The parent of `p` ("/a/b" → "/a", "/a" → "/", "a" → "/").
pub fn parent(p: &[u8]) -> &[u8] {
    let trimmed = p.iter().rposition(|&c| c != b'/').map_or(&p[..0], |i| &p[..=i]);
    match trimmed.iter().rposition(|&c| c == b'/') {
        Some(0) | None => b"/",
        Some(i) => &trimmed[..i],
    }
}

pub fn is_root(p: &[u8]) -> bool {
    p.iter().all(|&c| c == b'/')
}

impl DirPolicies {
    /// The policy in force in directory `dir` and where it is set, given
    /// `own`, which reads a directory's own setting.
    pub fn get(&self, dir: &[u8], own: impl Fn(&[u8]) -> Option<u8>) -> (u8, Vec<u8>) {
        let now = Instant::now();
        let mut walked: Vec<&[u8]> = Vec::new();
        let mut at = dir;
        let found = loop {
            if let Some((p, from, t)) = self.lock().get(at) {
                if now.duration_since(*t) < TTL {
                    break (*p, from.clone());
                }
            }
            walked.push(at);
            if let Some(p) = own(at) {
                break (p, if is_root(at) { b"/".to_vec() } else { at.to_vec() });
            }
            if is_root(at) {
                break (cache::NONE, Vec::new());
            }
            at = parent(at);
        };
        let mut dirs = self.lock();
        if dirs.len() + walked.len() > MAX_DIRS {
            dirs.clear();
        }
        for d in walked {
            dirs.insert(d.to_vec(), (found.0, found.1.clone(), now));
        }
        found
    }

    /// After a setting changed through this server.
    pub fn forget(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Known>> {
        self.dirs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn parents() {
        assert_eq!(parent(b"/a/b"), b"/a");
        assert_eq!(parent(b"/a/b/"), b"/a");
        assert_eq!(parent(b"/a"), b"/");
        assert_eq!(parent(b"a"), b"/");
        assert_eq!(parent(b"/"), b"/");
    }

    #[test]
    fn nearest_setting_wins_and_is_remembered() {
        let d = DirPolicies::default();
        let asked = Cell::new(0);
        let own = |p: &[u8]| {
            asked.set(asked.get() + 1);
            (p == b"/a").then_some(cache::CACHE)
        };
        assert_eq!(d.get(b"/a/b/c", own), (cache::CACHE, b"/a".to_vec()));
        assert_eq!(asked.get(), 3);
        assert_eq!(d.get(b"/a/b/c", own), (cache::CACHE, b"/a".to_vec()));
        assert_eq!(asked.get(), 3, "remembered");
        assert_eq!(d.get(b"/x", |_| None), (cache::NONE, Vec::new()));
        d.forget();
        assert_eq!(d.get(b"/a/b/c", |_| None), (cache::NONE, Vec::new()));
    }
}
