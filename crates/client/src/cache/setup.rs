//! A client's cache: the store on its disk and the rules that choose what
//! goes in it, as the user configured them.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use super::policy::{self, Decision, Rules};
use super::store::Store;

/// Data kept at most when neither `FERRY_CACHE_SIZE` nor the configuration
/// file says.
pub const DEFAULT_LIMIT: u64 = 4 << 30;

/// The store and the rules; shared by every `Client` given it.
pub struct Cache {
    pub store: Store,
    pub rules: Rules,
    pub dir: PathBuf,
}

impl fmt::Debug for Cache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl Cache {
    /// What the mount, `ferry run` and the CLI use: `FERRY_CACHE=off` turns
    /// the cache off (`None`); the rules come from [`Rules::default_path`];
    /// the directory from `FERRY_CACHE_DIR`, the file's `dir`, or
    /// `$XDG_CACHE_HOME/ferry` (one that cannot be made: no cache, said on
    /// stderr if the user chose it); the size limit from `FERRY_CACHE_SIZE`, the
    /// file's `size`, or [`DEFAULT_LIMIT`].
    pub fn from_env() -> Result<Option<Arc<Cache>>, String> {
        if std::env::var_os("FERRY_CACHE").is_some_and(|v| v == "off" || v == "0") {
            return Ok(None);
        }
        let rules = match Rules::default_path() {
            Some(p) => Rules::load(&p)?,
            None => Rules::default(),
        };
        let (dir, explicit) = match std::env::var_os("FERRY_CACHE_DIR") {
            Some(d) if !d.is_empty() => (PathBuf::from(d), true),
            _ => match (&rules.dir, Store::default_dir()) {
                (Some(d), _) => (d.clone(), true),
                (None, Some(d)) => (d, false),
                (None, None) => return Ok(None),
            },
        };
        let limit = match std::env::var("FERRY_CACHE_SIZE") {
            Ok(s) => {
                policy::parse_size(s.as_bytes()).ok_or(format!("FERRY_CACHE_SIZE={s}: expected bytes, e.g. 10G"))?
            }
            Err(_) => rules.size.unwrap_or(DEFAULT_LIMIT),
        };
        match Cache::open(dir, limit, rules) {
            Ok(c) => Ok(Some(Arc::new(c))),
            // A cache that cannot be made is a slower client, not a
            // broken one: say so once and go on without.
            Err(e) => {
                // Said only for a directory the user chose: a user with no
                // writable home (a service, `nobody`) gets no cache
                // quietly rather than a line on every program's stderr.
                if explicit {
                    eprintln!("ferry: {e}; going on without a local cache");
                }
                Ok(None)
            }
        }
    }

    pub fn open(dir: PathBuf, limit: u64, rules: Rules) -> Result<Cache, String> {
        let store = Store::open(&dir, limit).map_err(|e| format!("cache directory {}: {e}", dir.display()))?;
        Ok(Cache { store, rules, dir })
    }

    /// The decision for `path` given the server's stored policy.
    pub fn decide(&self, path: &[u8], server: u8, from: &[u8]) -> Decision {
        policy::decide(&self.rules, path, server, from)
    }
}
