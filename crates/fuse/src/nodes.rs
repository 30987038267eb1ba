//! The mount's node table: FUSE names files by node id, the protocol by
//! path. One node id per directory path and per server `(dev, ino)` for
//! everything else, so the hard links of a file are one node with several
//! names and one `st_ino` (given back to the same file after the kernel
//! forgot it, never to another while it holds it); lookups counted so
//! `forget` can drop a node; renames and removals followed so a node keeps
//! pointing at its file.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use ferry_client::Attr;
use fuser::Errno;

use crate::R;

/// A non-directory's identity on the server; its hard links share it.
pub(crate) type Key = (u64, u64);

/// Directories cannot be hard-linked, so they are known by path alone; any
/// other node by the server's `(dev, ino)`, so that every link of a file is
/// one FUSE node and reports one `st_ino`.
pub(crate) fn key_of(a: &Attr) -> Option<Key> {
    if a.mode & libc::S_IFMT == libc::S_IFDIR {
        None
    } else {
        Some((a.dev, a.ino))
    }
}

pub(crate) struct Node {
    /// The names it is known by: one for a directory, one per hard link the
    /// kernel has looked up for a file. Empty once removed or replaced: the
    /// kernel may still hold the node (an open file), but it has no name.
    paths: Vec<OsString>,
    key: Option<Key>,
    /// `S_IFMT` bits: a name that now holds another kind of file is a new
    /// node (the kernel refuses a node id whose type changes).
    pub(crate) fmt: u32,
    lookups: u64,
    /// The name it had when it lost its last one (a file renamed over it,
    /// or removed): see `FerryFs::open`.
    pub(crate) former: Option<OsString>,
}

/// Node id ↔ paths, and `(dev, ino)` → node id for non-directories.
///
/// Invariant: `by_path[p] == id` exactly when `p` is in `by_ino[id].paths`.
/// A node keeps its key until the kernel forgets it, so that looking up
/// another link of a file whose known name was removed finds it again.
pub(crate) struct Nodes {
    pub(crate) by_ino: HashMap<u64, Node>,
    pub(crate) by_path: HashMap<OsString, u64>,
    by_key: HashMap<Key, u64>,
    /// Every node of each key, the nameless ones the kernel still holds
    /// included: what a lease break names (found without a scan).
    keyed: HashMap<Key, Vec<u64>>,
    /// Directories by the server's `(dev, ino)`, as last seen: what a lease
    /// break names them by.
    dirs: HashMap<Key, u64>,
    /// Names the kernel was told are missing, by directory node, for longer
    /// than the plain timeout (`keep_miss`).
    misses: HashMap<u64, std::collections::HashSet<OsString>>,
    miss_count: usize,
    /// Directories whose listing the kernel keeps (`FOPEN_CACHE_DIR`)
    /// under a lease nothing broke since.
    listed: std::collections::HashSet<u64>,
    /// Node ids the kernel forgot, by the server's `(dev, ino)`: a file
    /// looked up again gets its old number back (`st_ino` is the node id),
    /// so an invalidation or the kernel's own reclaim never changes the
    /// inode number a program sees (`find -inum`, tar's and rsync's hard
    /// link detection). Bounded; emptied when full.
    gone: HashMap<Key, u64>,
    /// Nodes known to have no `security.capability`, under a lease nothing
    /// broke since: the kernel asks for it before the first write and the
    /// chown of every file (tar, cp, git: a round trip per file).
    absent: HashMap<u64, u8>,
    /// Directories this mount made under a lease nothing broke since, with
    /// every name in them: each was made by this mount too, since another
    /// client's change of an entry breaks the directory's lease (and takes
    /// it out of here first). A lookup of any other name is a miss the
    /// mount answers itself (`tar x`, `git clone`, `cp -r`: a round trip
    /// per file made).
    made: HashMap<u64, std::collections::HashSet<OsString>>,
    made_count: usize,
    next: u64,
}

/// Forgotten node ids kept at most.
const MAX_GONE: usize = 1 << 18;

/// Misses remembered at most: past it a miss gets the plain timeout.
const MAX_MISSES: usize = 1 << 16;

pub(crate) const ROOT: u64 = 1;

/// Extended attributes programs ask every file for (`ls -l` the first
/// two, the kernel the capability before a write), whose absence the
/// mount keeps under a lease. Only names any caller reads alike: the
/// kernel checks no rights to read `security.*` or `system.*` (it does for
/// `user.*`, and answers `trusted.*` missing to the unprivileged), so an
/// absence one caller was told holds for every other.
pub(crate) const ABSENT_NAMES: [&str; 4] =
    ["security.capability", "security.selinux", "system.posix_acl_access", "system.posix_acl_default"];
/// `security.capability`'s place in `ABSENT_NAMES`.
pub(crate) const CAPABILITY: usize = 0;

/// Paths are bytes, as Linux names are (not always UTF-8).
pub(crate) fn in_subtree(p: &OsStr, top: &OsStr) -> bool {
    let (p, top) = (p.as_bytes(), top.as_bytes());
    p == top || (p.len() > top.len() && p.starts_with(top) && p[top.len()] == b'/')
}

/// `a` followed by `b`, byte for byte.
pub(crate) fn concat(a: &OsStr, b: &[u8]) -> OsString {
    OsString::from_vec([a.as_bytes(), b].concat())
}

impl Nodes {
    /// `root` is the exported path the mount shows, e.g. `/` or `/sub`.
    pub(crate) fn new(root: &OsStr) -> Nodes {
        let mut n = Nodes {
            by_ino: HashMap::new(),
            by_path: HashMap::new(),
            by_key: HashMap::new(),
            keyed: HashMap::new(),
            dirs: HashMap::new(),
            misses: HashMap::new(),
            miss_count: 0,
            listed: std::collections::HashSet::new(),
            gone: HashMap::new(),
            absent: HashMap::new(),
            made: HashMap::new(),
            made_count: 0,
            next: ROOT + 1,
        };
        let node = Node { paths: vec![root.into()], key: None, fmt: libc::S_IFDIR, lookups: 1, former: None };
        n.by_ino.insert(ROOT, node);
        n.by_path.insert(root.into(), ROOT);
        n
    }

    /// A name of the node (any: all links name the same file).
    ///
    /// A node without a name was replaced or removed after the kernel
    /// looked it up: `ESTALE` makes the kernel look the name up again and
    /// retry the call (`open`, `stat`, ... do, once), so a program opening
    /// a file that another renames a new version over finds the new one,
    /// never `ENOENT`.
    pub(crate) fn path(&self, ino: u64) -> R<OsString> {
        let node = self.by_ino.get(&ino).ok_or(Errno::ESTALE)?;
        node.paths.first().cloned().ok_or(Errno::ESTALE)
    }

    /// The node for `path`, whose attributes the server just returned:
    /// the node already known by that name if it is still the same file,
    /// else the node of the same `(dev, ino)` (another hard link), else a
    /// new one. Counts one more kernel lookup.
    /// A node for a listed name whose attributes could not be had (a
    /// directory readable but not searchable): the node already known by
    /// that name and type, or a new one under a placeholder identity that
    /// matches no file's (`dev` all ones). Its attributes are never given
    /// a lifetime: every use asks the server, which refuses as it should.
    pub(crate) fn remember_name(&mut self, path: &OsStr, fmt: u32, ino: u64) -> u64 {
        if let Some(&known) = self.by_path.get(path) {
            if let Some(n) = self.by_ino.get_mut(&known) {
                if n.fmt == fmt {
                    n.lookups += 1;
                    return known;
                }
            }
        }
        self.remember(path, &Attr { dev: u64::MAX, ino, mode: fmt, nlink: 1, ..Attr::default() })
    }

    pub(crate) fn remember(&mut self, path: &OsStr, attr: &Attr) -> u64 {
        let ino = self.remember_node(path, attr);
        self.seen(ino, attr);
        ino
    }

    /// The server's attributes of node `ino` came back: a directory is
    /// known by its `(dev, ino)` from now on (for lease breaks).
    pub(crate) fn seen(&mut self, ino: u64, attr: &Attr) {
        if attr.mode & libc::S_IFMT == libc::S_IFDIR {
            self.dirs.insert((attr.dev, attr.ino), ino);
        }
    }

    /// The nodes a lease break's `(dev, ino)` names (a file's, or a
    /// directory's).
    /// Every node of the file counts, the nameless ones the kernel still
    /// holds included (a file renamed over, looked up again under a new
    /// node).
    /// The server's `(dev, ino)` of node `ino`, if known.
    pub(crate) fn key(&self, ino: u64) -> Option<Key> {
        self.by_ino.get(&ino)?.key
    }

    pub(crate) fn by_server_id(&self, key: Key) -> Vec<u64> {
        let mut out: Vec<u64> = self.keyed.get(&key).cloned().unwrap_or_default();
        out.extend(self.dirs.get(&key).copied().filter(|i| self.by_ino.contains_key(i)));
        out
    }

    /// Every node the kernel may hold.
    pub(crate) fn all(&self) -> Vec<u64> {
        self.by_ino.keys().copied().collect()
    }

    /// The kernel's entries of node `ino`: `(directory node, name)` for
    /// each name it is known by (none for the root).
    pub(crate) fn entries_of(&self, ino: u64) -> Vec<(u64, OsString)> {
        let Some(n) = self.by_ino.get(&ino) else { return Vec::new() };
        let mut out = Vec::new();
        for p in &n.paths {
            let b = p.as_bytes();
            let Some(i) = b.iter().rposition(|&c| c == b'/') else { continue };
            let parent = if i == 0 { OsStr::new("/") } else { OsStr::from_bytes(&b[..i]) };
            if let Some(&dir) = self.by_path.get(parent) {
                if dir != ino && i + 1 < b.len() {
                    out.push((dir, OsStr::from_bytes(&b[i + 1..]).to_owned()));
                }
            }
        }
        out
    }

    /// Remembers that the kernel keeps `name` in directory `dir` as missing
    /// for long; false (not kept) past the bound.
    pub(crate) fn keep_miss(&mut self, dir: u64, name: &OsStr) -> bool {
        if self.miss_count >= MAX_MISSES {
            return false;
        }
        if self.misses.entry(dir).or_default().insert(name.to_owned()) {
            self.miss_count += 1;
        }
        true
    }

    /// The misses kept in `dir`, forgotten: its lease broke, so a name may
    /// have come into it unheard of.
    pub(crate) fn take_misses(&mut self, dir: u64) -> Vec<(u64, OsString)> {
        let names = self.misses.remove(&dir).unwrap_or_default();
        self.miss_count -= names.len();
        names.into_iter().map(|n| (dir, n)).collect()
    }

    /// The kernel keeps directory `ino`'s listing from now on; false if
    /// the node is not known (any more).
    pub(crate) fn mark_listed(&mut self, ino: u64) -> bool {
        if !self.by_ino.contains_key(&ino) {
            return false;
        }
        self.listed.insert(ino);
        true
    }

    pub(crate) fn is_listed(&self, ino: u64) -> bool {
        self.listed.contains(&ino)
    }

    /// Directory `ino`'s listing may have changed: the kernel's copy is
    /// not kept past this open.
    /// Its lease broke: what was known of its extended attributes goes too.
    /// Its names are not known whole any more either (`made`).
    pub(crate) fn unlist(&mut self, ino: u64) {
        self.listed.remove(&ino);
        self.absent.remove(&ino);
        self.unmake(ino);
    }

    /// No listing is kept, nor anything known of extended attributes or
    /// of a directory's names.
    pub(crate) fn unlist_all(&mut self) {
        self.listed.clear();
        self.absent.clear();
        self.made.clear();
        self.made_count = 0;
    }

    /// Directory `ino` was just made by this mount, under a lease: empty,
    /// and every name that comes into it is told (`made_add`) until its
    /// lease breaks. Not kept past the bound.
    pub(crate) fn made_dir(&mut self, ino: u64) {
        if self.by_ino.contains_key(&ino) && self.made_count < MAX_MISSES {
            self.unmake(ino);
            self.made.insert(ino, std::collections::HashSet::new());
        }
    }

    /// Whether `name` is in directory `dir`, where the mount knows all of
    /// its names (`None`: it does not).
    pub(crate) fn made_has(&self, dir: u64, name: &OsStr) -> Option<bool> {
        self.made.get(&dir).map(|names| names.contains(name))
    }

    /// This mount made `name` in `dir` (a file, directory, link...).
    pub(crate) fn made_add(&mut self, dir: u64, name: &OsStr) {
        if self.made_count >= MAX_MISSES {
            // Past the bound: that directory is asked about again.
            self.unmake(dir);
            return;
        }
        if let Some(names) = self.made.get_mut(&dir) {
            if names.insert(name.to_owned()) {
                self.made_count += 1;
            }
        }
    }

    /// This mount removed `name` from `dir` (or renamed it away).
    pub(crate) fn made_remove(&mut self, dir: u64, name: &OsStr) {
        if let Some(names) = self.made.get_mut(&dir) {
            if names.remove(name) {
                self.made_count -= 1;
            }
        }
    }

    /// Directory `dir`'s names are no longer known whole.
    pub(crate) fn unmake(&mut self, dir: u64) {
        if let Some(names) = self.made.remove(&dir) {
            self.made_count -= names.len();
        }
    }

    /// Node `ino` has no extended attribute `ABSENT_NAMES[bit]` (the
    /// server said so, or this mount just made it), until its lease
    /// breaks or this mount sets or removes an attribute of it
    /// (`forget_xattrs`).
    pub(crate) fn set_absent(&mut self, ino: u64, bit: usize) {
        if !self.by_ino.contains_key(&ino) {
            return;
        }
        if let Some(known) = self.absent.get_mut(&ino) {
            *known |= 1 << bit;
        } else if self.absent.len() < MAX_GONE {
            self.absent.insert(ino, 1 << bit);
        }
    }

    pub(crate) fn is_absent(&self, ino: u64, bit: usize) -> bool {
        self.absent.get(&ino).is_some_and(|known| known & (1 << bit) != 0)
    }

    /// Nothing is known of node `ino`'s extended attributes any more.
    pub(crate) fn forget_xattrs(&mut self, ino: u64) {
        self.absent.remove(&ino);
    }

    /// Every miss kept, forgotten.
    pub(crate) fn take_all_misses(&mut self) -> Vec<(u64, OsString)> {
        self.miss_count = 0;
        self.misses.drain().flat_map(|(d, names)| names.into_iter().map(move |n| (d, n))).collect()
    }

    fn remember_node(&mut self, path: &OsStr, attr: &Attr) -> u64 {
        let key = key_of(attr);
        let fmt = attr.mode & libc::S_IFMT;
        if let Some(&ino) = self.by_path.get(path) {
            if let Some(n) = self.by_ino.get_mut(&ino) {
                if n.key == key && n.fmt == fmt {
                    n.lookups += 1;
                    return ino;
                }
            }
            // Another file took this name behind our back (another client).
            self.detach(path);
        }
        if let Some(k) = key {
            if let Some(&ino) = self.by_key.get(&k) {
                // Only a file with several links can be a node we know under
                // another name. With one link, the node that had this
                // (dev, ino) is another file that had the number before
                // (removed, its inode number reused: git's index replaced
                // by a rename, then a new file) or this file under a name
                // that is gone: either way not a node to reuse, or the
                // kernel would serve the old file's cached pages for it.
                if attr.nlink > 1 {
                    if let Some(n) = self.by_ino.get_mut(&ino) {
                        if n.fmt == fmt {
                            n.lookups += 1;
                            n.paths.push(path.to_owned());
                            self.by_path.insert(path.to_owned(), ino);
                            return ino;
                        }
                    }
                } else if let Some(n) = self.by_ino.get_mut(&ino) {
                    for p in std::mem::take(&mut n.paths) {
                        if self.by_path.get(&p) == Some(&ino) {
                            self.by_path.remove(&p);
                        }
                    }
                }
            }
        }
        let ino = match self.gone.remove(&(attr.dev, attr.ino)) {
            Some(old) if attr.dev != u64::MAX && !self.by_ino.contains_key(&old) => old,
            _ => {
                self.next += 1;
                self.next - 1
            }
        };
        self.by_ino.insert(ino, Node { paths: vec![path.to_owned()], key, fmt, lookups: 1, former: None });
        if let Some(k) = key {
            self.keyed.entry(k).or_default().push(ino);
        }
        self.by_path.insert(path.to_owned(), ino);
        if let Some(k) = key {
            // A reused inode number of another type replaces the old entry;
            // the old node lives on, nameless, until forgotten.
            self.by_key.insert(k, ino);
        }
        ino
    }

    pub(crate) fn forget(&mut self, ino: u64, n: u64) {
        if ino == ROOT {
            return;
        }
        let Some(node) = self.by_ino.get_mut(&ino) else { return };
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups == 0 {
            let Some(node) = self.by_ino.remove(&ino) else { return };
            self.absent.remove(&ino);
            for p in node.paths {
                if self.by_path.get(&p) == Some(&ino) {
                    self.by_path.remove(&p);
                }
            }
            if let Some(k) = node.key {
                if self.by_key.get(&k) == Some(&ino) {
                    self.by_key.remove(&k);
                }
                if let Some(v) = self.keyed.get_mut(&k) {
                    v.retain(|&i| i != ino);
                    if v.is_empty() {
                        self.keyed.remove(&k);
                    }
                }
            }
            let server = node.key.or_else(|| self.dirs.iter().find(|(_, i)| **i == ino).map(|(k, _)| *k));
            if let Some(k) = server.filter(|k| k.0 != u64::MAX) {
                if self.gone.len() >= MAX_GONE {
                    self.gone.clear();
                }
                self.gone.insert(k, ino);
            }
            if node.fmt == libc::S_IFDIR {
                self.dirs.retain(|_, i| *i != ino);
                // The kernel drops a directory's entries before the
                // directory itself.
                if let Some(names) = self.misses.remove(&ino) {
                    self.miss_count -= names.len();
                }
                self.listed.remove(&ino);
                self.unmake(ino);
            }
        }
    }

    /// `path` and everything under it no longer exist under those names
    /// (the file itself may, under another link).
    pub(crate) fn detach(&mut self, path: &OsStr) {
        let gone: Vec<OsString> = self.by_path.keys().filter(|p| in_subtree(p, path)).cloned().collect();
        for p in gone {
            if let Some(ino) = self.by_path.remove(&p) {
                // A directory of that path made again is a new one.
                self.unmake(ino);
                if let Some(n) = self.by_ino.get_mut(&ino) {
                    n.paths.retain(|q| *q != p);
                    if n.paths.is_empty() {
                        n.former = Some(p);
                    }
                }
            }
        }
    }

    /// Moves the subtree at `from` to `to` (whatever was at `to` is gone).
    pub(crate) fn rename(&mut self, from: &OsStr, to: &OsStr) {
        self.detach(to);
        let moved = self.move_subtree(from, to);
        self.reinsert(moved);
    }

    /// Renames every known name under `from`; the caller puts them back
    /// into `by_path`.
    pub(crate) fn move_subtree(&mut self, from: &OsStr, to: &OsStr) -> Vec<(u64, OsString)> {
        let moved: Vec<OsString> = self.by_path.keys().filter(|p| in_subtree(p, from)).cloned().collect();
        let mut out = Vec::new();
        for p in moved {
            if let Some(ino) = self.by_path.remove(&p) {
                let np = concat(to, &p.as_bytes()[from.len()..]);
                self.rename_path(ino, &p, &np);
                out.push((ino, np));
            }
        }
        out
    }

    /// One of the node's names changes (its other links stay).
    pub(crate) fn rename_path(&mut self, ino: u64, old: &OsStr, new: &OsStr) {
        if let Some(n) = self.by_ino.get_mut(&ino) {
            if let Some(q) = n.paths.iter_mut().find(|q| *q == old) {
                *q = new.to_owned();
            }
        }
    }

    /// `RENAME_EXCHANGE`: the two subtrees trade places.
    pub(crate) fn exchange(&mut self, a: &OsStr, b: &OsStr) {
        let from_a = self.move_subtree(a, OsStr::new("\0a"));
        let from_b = self.move_subtree(b, a);
        self.reinsert(from_b);
        for (ino, p) in from_a {
            let np = concat(b, &p.as_bytes()[2..]);
            self.rename_path(ino, &p, &np);
            self.by_path.insert(np, ino);
        }
    }

    pub(crate) fn reinsert(&mut self, moved: Vec<(u64, OsString)>) {
        for (ino, p) in moved {
            self.by_path.insert(p, ino);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> Attr {
        Attr { mode: libc::S_IFDIR | 0o755, dev: 1, ino: 2, ..Attr::default() }
    }

    fn file(ino: u64) -> Attr {
        Attr { mode: libc::S_IFREG | 0o644, dev: 1, ino, ..Attr::default() }
    }

    fn with_links(mut a: Attr, nlink: u64) -> Attr {
        a.nlink = nlink;
        a
    }

    #[test]
    fn a_reused_inode_number_is_a_new_node() {
        // git replaces .git/index by a rename; the old file's inode number
        // then comes back for a new file. Reusing the old node would let the
        // kernel serve the old file's cached pages for the new one.
        let mut n = Nodes::new(OsStr::new("/"));
        let old = n.remember(OsStr::new("/index"), &with_links(file(7), 1));
        let lock = n.remember(OsStr::new("/index.lock"), &with_links(file(8), 1));
        n.rename(OsStr::new("/index.lock"), OsStr::new("/index"));
        assert_eq!(n.by_path.get(OsStr::new("/index")), Some(&lock));
        let new = n.remember(OsStr::new("/util.h"), &with_links(file(7), 1));
        assert_ne!(new, old, "inode 7 with one link is a new file");
        // A stale name of the number is forgotten too.
        let other = n.remember(OsStr::new("/a"), &with_links(file(9), 1));
        let moved = n.remember(OsStr::new("/b"), &with_links(file(9), 1));
        assert_ne!(other, moved);
        assert_eq!(n.by_path.get(OsStr::new("/a")), None, "one link: /a is no longer its name");
        // Hard links (more than one link) are one node.
        let x = n.remember(OsStr::new("/x"), &with_links(file(10), 2));
        let y = n.remember(OsStr::new("/y"), &with_links(file(10), 2));
        assert_eq!(x, y);
    }

    #[test]
    fn rename_moves_subtree_and_detaches_target() {
        let mut n = Nodes::new(OsStr::new("/"));
        let d = n.remember(OsStr::new("/d"), &dir());
        let f = n.remember(OsStr::new("/d/f"), &file(10));
        let other = n.remember(OsStr::new("/dd"), &dir());
        let victim = n.remember(OsStr::new("/e"), &file(11));
        n.rename(OsStr::new("/d"), OsStr::new("/e"));
        assert_eq!(n.path(d).unwrap(), "/e");
        assert_eq!(n.path(f).unwrap(), "/e/f");
        assert_eq!(n.path(other).unwrap(), "/dd");
        assert!(n.path(victim).is_err());
        assert_eq!(n.by_path.get(OsStr::new("/e/f")), Some(&f));
        assert!(!n.by_path.contains_key(OsStr::new("/d")));
    }

    #[test]
    fn exchange_swaps_subtrees() {
        let mut n = Nodes::new(OsStr::new("/"));
        let a = n.remember(OsStr::new("/a"), &dir());
        let af = n.remember(OsStr::new("/a/f"), &file(10));
        let b = n.remember(OsStr::new("/b"), &dir());
        n.exchange(OsStr::new("/a"), OsStr::new("/b"));
        assert_eq!(n.path(a).unwrap(), "/b");
        assert_eq!(n.path(af).unwrap(), "/b/f");
        assert_eq!(n.path(b).unwrap(), "/a");
        assert_eq!(n.by_path.get(OsStr::new("/a")), Some(&b));
        assert_eq!(n.by_path.get(OsStr::new("/b/f")), Some(&af));
    }

    #[test]
    fn forget_drops_node_at_zero() {
        let mut n = Nodes::new(OsStr::new("/"));
        let x = n.remember(OsStr::new("/x"), &file(10));
        assert_eq!(n.remember(OsStr::new("/x"), &file(10)), x);
        n.forget(x, 1);
        assert!(n.path(x).is_ok());
        n.forget(x, 1);
        assert!(n.path(x).is_err());
        // The same file looked up again keeps its number (`st_ino`).
        assert_eq!(n.remember(OsStr::new("/x"), &file(10)), x);
        assert_ne!(n.remember(OsStr::new("/y"), &file(12)), x);
        n.forget(ROOT, 100);
        assert_eq!(n.path(ROOT).unwrap(), "/");
    }

    #[test]
    fn hard_links_share_one_node() {
        let mut n = Nodes::new(OsStr::new("/"));
        let d = n.remember(OsStr::new("/d"), &dir());
        let a = n.remember(OsStr::new("/a"), &with_links(file(10), 2));
        assert_eq!(n.remember(OsStr::new("/d/b"), &with_links(file(10), 2)), a);
        assert_eq!(n.by_server_id((1, 10)), vec![a], "a break of the file finds its one node");
        assert_ne!(n.remember(OsStr::new("/c"), &file(11)), a);
        // Removing one name leaves the other.
        n.detach(OsStr::new("/a"));
        assert_eq!(n.path(a).unwrap(), "/d/b");
        assert!(!n.by_path.contains_key(OsStr::new("/a")));
        // Renaming the directory holding a link renames that link only.
        n.rename(OsStr::new("/d"), OsStr::new("/e"));
        assert_eq!(n.path(d).unwrap(), "/e");
        assert_eq!(n.path(a).unwrap(), "/e/b");
        // With no name left, another link looked up finds the node again.
        n.detach(OsStr::new("/e/b"));
        assert!(n.path(a).is_err());
        assert_eq!(n.remember(OsStr::new("/f"), &with_links(file(10), 2)), a);
        assert_eq!(n.path(a).unwrap(), "/f");
        // Three lookups counted (/a, /d/b, /f); all forgotten, all gone.
        n.forget(a, 3);
        assert!(n.path(a).is_err() && !n.by_key.contains_key(&(1, 10)) && !n.by_path.contains_key(OsStr::new("/f")));
        // Looked up again, the file is the node it was (its `st_ino` kept).
        assert_eq!(n.remember(OsStr::new("/f"), &with_links(file(10), 2)), a);
    }

    #[test]
    fn a_name_holding_another_file_is_a_new_node() {
        let mut n = Nodes::new(OsStr::new("/"));
        let x = n.remember(OsStr::new("/x"), &file(10));
        let y = n.remember(OsStr::new("/x"), &file(11));
        assert_ne!(x, y);
        assert!(n.path(x).is_err());
        assert_eq!(n.path(y).unwrap(), "/x");
        // Same inode number, now a directory: a new node too.
        let z = n.remember(OsStr::new("/x"), &Attr { mode: libc::S_IFDIR, dev: 1, ino: 11, ..Attr::default() });
        assert_ne!(z, y);
        let fifo = Attr { mode: libc::S_IFIFO | 0o644, dev: 1, ino: 10, ..Attr::default() };
        let w = n.remember(OsStr::new("/w"), &fifo);
        assert_ne!(w, x);
        assert_eq!(n.by_key.get(&(1, 10)), Some(&w));
        n.forget(x, 1);
        assert_eq!(n.by_key.get(&(1, 10)), Some(&w));
    }
}
