//! Attributes the server returned a moment ago (by a listing or a lookup),
//! by path, each good for *one* answer. With zero timeouts the kernel
//! follows each `LOOKUP` with a `GETATTR` of the same node, and a directory
//! listing (`ls -l`, `find`) with a `LOOKUP` per name: answered from the
//! reply just before, they cost no round trip, and a reply that young is
//! not a coherence question (another client's change in those microseconds
//! could as well have landed just after the request). Used once, an entry
//! is gone, so the next `stat` asks the server as zero timeouts promise.
//! Any change through this mount empties it, and nothing is answered or
//! kept while one is under way (its reply reaches the kernel before the
//! handler ends); an answer fetched before a change is not stored after it
//! (a generation number).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferry_client::Attr;

/// How long a reply answers for.
pub const FRESH: Duration = Duration::from_millis(10);
/// Bound on what is kept (a listing of a huge directory keeps its first).
const MAX: usize = 65_536;

#[derive(Default)]
pub struct Recent {
    st: Mutex<State>,
}

#[derive(Default)]
struct State {
    gen: u64,
    /// Changes under way.
    busy: u32,
    map: HashMap<OsString, (Attr, Instant)>,
}

impl Recent {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Taken before asking the server for what `put` will keep.
    pub fn generation(&self) -> u64 {
        self.lock().gen
    }

    /// The attributes kept for `path`, if young enough; used up.
    pub fn take(&self, path: &OsStr) -> Option<Attr> {
        let mut st = self.lock();
        if st.busy > 0 {
            return None;
        }
        st.map.remove(path).filter(|(_, at)| at.elapsed() < FRESH).map(|(a, _)| a)
    }

    /// Keeps attributes fetched since `gen`, if nothing changed meanwhile.
    pub fn put<'a>(&self, gen: u64, items: impl IntoIterator<Item = (OsString, &'a Attr)>) {
        let mut st = self.lock();
        if st.gen != gen || st.busy > 0 {
            return;
        }
        let now = Instant::now();
        if st.map.len() >= MAX {
            st.map.retain(|_, (_, at)| at.elapsed() < FRESH);
        }
        for (p, a) in items {
            if st.map.len() >= MAX {
                break;
            }
            st.map.insert(p, (*a, now));
        }
    }

    /// For an operation that may change something: when the returned guard
    /// goes (the operation done, however it ended), what is kept goes too.
    pub fn changing(&self) -> Changing<'_> {
        let mut st = self.lock();
        st.busy += 1;
        st.gen += 1;
        st.map.clear();
        Changing(self)
    }
}

pub struct Changing<'a>(&'a Recent);

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.busy -= 1;
        st.gen += 1;
        st.map.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_briefly_and_forgets_on_change() {
        let r = Recent::default();
        let a = Attr { size: 7, ..Attr::default() };
        let g = r.generation();
        r.put(g, [(OsString::from("/a"), &a)]);
        assert_eq!(r.take(OsStr::new("/a")).map(|a| a.size), Some(7));
        assert!(r.take(OsStr::new("/a")).is_none(), "one answer each");
        r.put(g, [(OsString::from("/a"), &a)]);
        let c = r.changing();
        assert!(r.take(OsStr::new("/a")).is_none());
        let g2 = r.generation();
        r.put(g2, [(OsString::from("/a"), &a)]);
        assert!(r.take(OsStr::new("/a")).is_none(), "nothing kept while a change is under way");
        drop(c);
        // Fetched before a change: not kept.
        r.put(g, [(OsString::from("/a"), &a)]);
        assert!(r.take(OsStr::new("/a")).is_none());
        let g = r.generation();
        r.put(g, [(OsString::from("/b"), &a)]);
        std::thread::sleep(FRESH + Duration::from_millis(5));
        assert!(r.take(OsStr::new("/b")).is_none(), "too old");
    }
}
