//! Several exports behind one server (`ferry serve --config FILE`): each a
//! directory under a name, seen by clients as the first component of their
//! paths (`ferry://host/NAME/…`), with its own rights: read-only or not,
//! which clients (tokens) may use it, from which networks. The top of the
//! name space is a directory of its own, listing the exports a client may
//! use.
//!
//! [`Exports`] is a [`Backend`] that routes each call to the export its path
//! names. Who is asking is the connection's business: before it runs a
//! request it tells this thread the exports that request may use
//! ([`set_grants`], from the client's token and address); a thread that
//! was told nothing (the fsync thread, closing files) runs unchecked.
//! Reloading (`SIGHUP`) swaps the table: handles stay open on exports that
//! remain, and rights are looked up again for every request, so a client
//! removed from the file is refused from its next request on.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use ferry_proto::{Attr, DirEntry, StatFs, Time};
use serde::Deserialize;

use crate::backend::{Backend, Errno, Node, ReadData, Result};

// ---------------------------------------------------------------------------
// The file

/// The configuration file, as written.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    export: Vec<ExportSpec>,
    #[serde(default)]
    client: HashMap<String, ClientSpec>,
    /// Serve without any token (every client may use every export its
    /// network allows). Must be said: a file without clients is refused.
    #[serde(default)]
    no_auth: bool,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct ExportSpec {
    name: String,
    path: PathBuf,
    #[serde(default)]
    read_only: bool,
    /// Names of `[client.NAME]` entries that may use it; all when absent.
    clients: Option<Vec<String>>,
    /// Networks (`10.0.0.0/8`, `::1/128`, `192.0.2.7`) it may be used
    /// from; any when absent.
    networks: Option<Vec<String>>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct ClientSpec {
    token: Option<String>,
    token_file: Option<PathBuf>,
}

/// An address prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Net {
    addr: IpAddr,
    bits: u8,
}

impl Net {
    pub fn parse(s: &str) -> std::result::Result<Net, String> {
        let (a, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let addr: IpAddr = a.trim().parse().map_err(|_| format!("'{s}': not an address or network"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            Some(b) => b.trim().parse::<u8>().ok().filter(|&b| b <= max).ok_or_else(|| format!("'{s}': bad prefix"))?,
            None => max,
        };
        Ok(Net { addr, bits })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        // An IPv4 client on a dual-stack socket arrives as ::ffff:a.b.c.d.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let (a, b) = match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(i)) => (u128::from(u32::from(n)) << 96, u128::from(u32::from(i)) << 96),
            (IpAddr::V6(n), IpAddr::V6(i)) => (u128::from(n), u128::from(i)),
            _ => return false,
        };
        let mask = if self.bits == 0 { 0 } else { u128::MAX << (128 - u32::from(self.bits)) };
        a & mask == b & mask
    }
}

// ---------------------------------------------------------------------------
// The table

/// An exported directory. Immutable: a reload that keeps the name and path
/// keeps the `Arc`, and with it every handle open on it.
pub struct Dir<B> {
    id: u64,
    name: Vec<u8>,
    path: PathBuf,
    backend: B,
}

/// An export in force: the directory and who may use it how.
struct Export<B> {
    dir: Arc<Dir<B>>,
    read_only: bool,
    /// Tokens that may use it; `None`: any client.
    tokens: Option<Vec<Vec<u8>>>,
    networks: Option<Vec<Net>>,
}

struct Table<B> {
    exports: Vec<Export<B>>,
    /// Every client's token; empty: no authentication.
    tokens: Vec<Vec<u8>>,
    generation: u64,
}

/// The exports, and what the connections ask of them.
pub struct Exports<B> {
    table: RwLock<Arc<Table<B>>>,
    next_id: AtomicU64,
    started: Time,
}

/// What the requests a thread runs may use: export ids, each with whether
/// it is only to be read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants {
    ids: Vec<(u64, bool)>,
}

impl Grants {
    fn of(&self, id: u64) -> Option<bool> {
        self.ids.iter().find(|(i, _)| *i == id).map(|(_, ro)| *ro)
    }
}

thread_local! {
    static GRANTS: RefCell<Option<Grants>> = const { RefCell::new(None) };
}

/// Tells this thread what its next requests may use (the connection does,
/// before each request).
pub fn set_grants(g: Grants) {
    let _ = GRANTS.try_with(|c| *c.borrow_mut() = Some(g));
}

/// `Some(read_only)` if this thread may use export `id` (always, and
/// writable, on a thread no connection told anything: the server's own
/// work, which writes only what a client's request already had checked).
fn granted(id: u64) -> Option<bool> {
    GRANTS.try_with(|c| c.borrow().as_ref().map_or(Some(false), |g| g.of(id))).unwrap_or(Some(false))
}

/// Whether this thread was told what it may use (a client's request).
fn told() -> Option<Grants> {
    GRANTS.try_with(|c| c.borrow().clone()).ok().flatten()
}

/// What a connection needs of a table of exports (`Config::access`).
pub trait Access: Send + Sync + std::fmt::Debug {
    /// Tokens of every client (empty: no authentication).
    fn tokens(&self) -> Vec<Vec<u8>>;
    /// What a client with `token` (empty without authentication) at `peer`
    /// may use now.
    fn grants(&self, token: &[u8], peer: Option<IpAddr>) -> Grants;
    /// Changes at every reload.
    fn generation(&self) -> u64;
}

/// Reads the file at `path`.
fn read_file(path: &Path) -> std::result::Result<File, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let f: File = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if f.export.is_empty() {
        return Err(format!("{}: no [[export]]", path.display()));
    }
    if f.client.is_empty() && !f.no_auth {
        return Err(format!(
            "{}: no [client.NAME] with a token; add one, or say `no_auth = true` to let anyone who can connect in",
            path.display()
        ));
    }
    Ok(f)
}

fn tokens_of(f: &File) -> std::result::Result<HashMap<String, Vec<u8>>, String> {
    let mut out = HashMap::new();
    for (name, c) in &f.client {
        let token = match (&c.token, &c.token_file) {
            (Some(t), None) => t.trim().as_bytes().to_vec(),
            (None, Some(p)) => std::fs::read_to_string(p)
                .map_err(|e| format!("client {name}: {}: {e}", p.display()))?
                .trim()
                .as_bytes()
                .to_vec(),
            _ => return Err(format!("client {name}: give exactly one of token, token_file")),
        };
        if token.len() < 16 {
            return Err(format!("client {name}: the token must have at least 16 characters"));
        }
        out.insert(name.clone(), token);
    }
    Ok(out)
}

impl<B: Backend> Exports<B> {
    /// The exports of the file at `path`, each directory opened with `open`.
    pub fn load(path: &Path, open: impl Fn(&Path) -> std::io::Result<B>) -> std::result::Result<Exports<B>, String> {
        let x = Exports {
            table: RwLock::new(Arc::new(Table { exports: Vec::new(), tokens: Vec::new(), generation: 0 })),
            next_id: AtomicU64::new(1),
            started: now(),
        };
        x.reload(path, open)?;
        Ok(x)
    }

    /// Reads the file again and puts it in force, all of it or nothing (an
    /// error leaves the table as it was). An export of the same name and
    /// path stays the same directory: its open files go on.
    pub fn reload(&self, path: &Path, open: impl Fn(&Path) -> std::io::Result<B>) -> std::result::Result<(), String> {
        let f = read_file(path)?;
        let tokens = tokens_of(&f)?;
        let old = self.table();
        let mut exports: Vec<Export<B>> = Vec::new();
        for e in &f.export {
            if e.name.is_empty() || e.name.contains('/') || e.name == "." || e.name == ".." {
                return Err(format!("export '{}': a name is one path component", e.name));
            }
            if exports.iter().any(|x| x.dir.name == e.name.as_bytes()) {
                return Err(format!("export '{}' is named twice", e.name));
            }
            let clients = match &e.clients {
                None => None,
                Some(names) => Some(
                    names
                        .iter()
                        .map(|n| tokens.get(n).cloned().ok_or_else(|| format!("export '{}': no [client.{n}]", e.name)))
                        .collect::<std::result::Result<Vec<_>, _>>()?,
                ),
            };
            let networks = match &e.networks {
                None => None,
                Some(n) => Some(
                    n.iter()
                        .map(|s| Net::parse(s))
                        .collect::<std::result::Result<Vec<_>, _>>()
                        .map_err(|m| format!("export '{}': {m}", e.name))?,
                ),
            };
            let kept = old.exports.iter().find(|x| x.dir.name == e.name.as_bytes() && x.dir.path == e.path);
            let dir = match kept {
                Some(k) => Arc::clone(&k.dir),
                None => Arc::new(Dir {
                    id: self.next_id.fetch_add(1, Ordering::Relaxed),
                    name: e.name.as_bytes().to_vec(),
                    path: e.path.clone(),
                    backend: open(&e.path)
                        .map_err(|err| format!("export '{}': {}: {err}", e.name, e.path.display()))?,
                }),
            };
            exports.push(Export { dir, read_only: e.read_only, tokens: clients, networks });
        }
        let mut all: Vec<Vec<u8>> = tokens.into_values().collect();
        all.sort();
        let generation = old.generation + 1;
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Table { exports, tokens: all, generation });
        Ok(())
    }

    fn table(&self) -> Arc<Table<B>> {
        Arc::clone(&self.table.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The names in force, for the log.
    pub fn names(&self) -> Vec<String> {
        self.table().exports.iter().map(|e| String::from_utf8_lossy(&e.dir.name).into_owned()).collect()
    }
}

impl<B> std::fmt::Debug for Exports<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.table.read().unwrap_or_else(|e| e.into_inner());
        let names: Vec<_> = t.exports.iter().map(|e| String::from_utf8_lossy(&e.dir.name).into_owned()).collect();
        write!(f, "Exports {{ {names:?}, generation {} }}", t.generation)
    }
}

impl<B: Backend> Access for Exports<B> {
    fn tokens(&self) -> Vec<Vec<u8>> {
        self.table().tokens.clone()
    }

    fn grants(&self, token: &[u8], peer: Option<IpAddr>) -> Grants {
        let t = self.table();
        if !t.tokens.is_empty() && !t.tokens.iter().any(|x| x == token) {
            // A client taken out of the file: nothing, from now on.
            return Grants::default();
        }
        let ids = t
            .exports
            .iter()
            .filter(|e| e.tokens.as_ref().is_none_or(|ts| ts.iter().any(|x| x == token)))
            .filter(|e| match (&e.networks, peer) {
                (None, _) => true,
                (Some(ns), Some(ip)) => ns.iter().any(|n| n.contains(ip)),
                // A Unix socket: the server's own host.
                (Some(ns), None) => ns.iter().any(|n| n.addr.is_loopback()),
            })
            .map(|e| (e.dir.id, e.read_only))
            .collect();
        Grants { ids }
    }

    fn generation(&self) -> u64 {
        self.table().generation
    }
}

// ---------------------------------------------------------------------------
// Routing

/// An open file: the top of the name space, or a file of one export.
pub enum XFile<B: Backend> {
    Top,
    In(Arc<Dir<B>>, B::File),
}

/// Splits `path` into the export name and the path inside it (`/` for
/// the export's own top); `None` for the top of the name space. `.` and
/// `..` at the top stay at the top, as at the root of a file system.
fn split(path: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut p = path;
    loop {
        while let [b'/', rest @ ..] = p {
            p = rest;
        }
        let end = p.iter().position(|&b| b == b'/').unwrap_or(p.len());
        match &p[..end] {
            b"" => return None,
            b"." | b".." => p = &p[end..],
            name => {
                let rest = &p[end..];
                return Some((name, if rest.is_empty() { b"/" } else { rest }));
            }
        }
    }
}

/// A path routed: its export, and the path inside it.
type Routed<'p, B> = (Arc<Dir<B>>, &'p [u8]);
/// A node routed: its export, and the node inside it.
type RoutedNode<'n, B> = (Arc<Dir<B>>, Node<'n, <B as Backend>::File>);

fn now() -> Time {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Time { sec: d.as_secs() as i64, nsec: d.subsec_nanos() }
}

fn is_top_of_export(rest: &[u8]) -> bool {
    rest.iter().all(|&b| b == b'/')
}

impl<B: Backend> Exports<B> {
    /// The export `path` names, if this thread may use it, and the path
    /// inside; `Ok(None)` for the top.
    fn route<'p>(&self, path: &'p [u8], write: bool) -> Result<Option<Routed<'p, B>>> {
        let Some((name, rest)) = split(path) else { return Ok(None) };
        let t = self.table();
        let e = t.exports.iter().find(|e| e.dir.name == name).ok_or(Errno::NOENT)?;
        let Some(ro) = granted(e.dir.id) else {
            tracing::info!(export = %String::from_utf8_lossy(name), "refused: not an export for this client");
            return Err(Errno::ACCES);
        };
        let read_only = ro || e.read_only;
        if write && read_only {
            return Err(Errno::ROFS);
        }
        Ok(Some((Arc::clone(&e.dir), rest)))
    }

    /// The directory of an open file, if this thread may use it.
    fn dir_of<'f>(&self, f: &'f XFile<B>, write: bool) -> Result<(&'f Dir<B>, &'f B::File)> {
        match f {
            XFile::Top => Err(if write { Errno::ROFS } else { Errno::ISDIR }),
            XFile::In(d, file) => {
                // The grants carry each export's read-only flag: no look at
                // the table on a read's or a write's path.
                let read_only = granted(d.id).ok_or(Errno::ACCES)?;
                if write && read_only {
                    return Err(Errno::ROFS);
                }
                Ok((d, file))
            }
        }
    }

    /// A node routed: its directory and the node inside; `None` for the top.
    fn node<'n>(&self, n: Node<'n, XFile<B>>, write: bool) -> Result<Option<RoutedNode<'n, B>>> {
        Ok(match n {
            Node::File(XFile::Top) => None,
            Node::File(f @ XFile::In(d, _)) => {
                let (_, file) = self.dir_of(f, write)?;
                Some((Arc::clone(d), Node::File(file)))
            }
            Node::Path(p) => self.route(p, write)?.map(|(d, r)| (d, Node::Path(r))),
            Node::PathNoFollow(p) => self.route(p, write)?.map(|(d, r)| (d, Node::PathNoFollow(r))),
        })
    }

    /// The top's attributes: a read-only directory of the exports.
    fn top_attr(&self) -> Attr {
        let n = self.table().exports.len() as u64;
        Attr {
            dev: 0,
            ino: 1,
            mode: libc::S_IFDIR | 0o555,
            nlink: 2 + n,
            uid: 0,
            gid: 0,
            rdev: 0,
            size: 0,
            blksize: 4096,
            blocks: 0,
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
        }
    }

    /// What a call that would make `path` a name of the top finds there
    /// (section 8.9 of PROTOCOL.md), as a read-only directory of mount
    /// points answers: `EEXIST` for the top itself and for an export's
    /// name, `EACCES` for an export this client may not use (as looking
    /// it up says), `EROFS` for any other name. `None`: `path` is inside an
    /// export.
    fn at_top(&self, path: &[u8]) -> Option<Errno> {
        match split(path) {
            None => Some(Errno::EXIST),
            Some((_, rest)) if is_top_of_export(rest) => Some(match self.route(path, false) {
                Ok(_) => Errno::EXIST,
                Err(Errno::NOENT) => Errno::ROFS,
                Err(e) => e,
            }),
            Some(_) => None,
        }
    }

    /// The export a new name `path` goes in, and the path inside it; a
    /// name of the top is refused as `at_top` says.
    fn route_new<'p>(&self, path: &'p [u8]) -> Result<Routed<'p, B>> {
        if let Some(e) = self.at_top(path) {
            return Err(e);
        }
        self.route(path, true)?.ok_or(Errno::EXIST)
    }

    /// Two paths of one export (rename, link); `EXDEV` across exports.
    /// Moving an export or the top is `EBUSY` (a mount point), and so is
    /// renaming onto either; a link onto an export's name is `EEXIST`.
    fn pair<'a, 'b>(&self, from: &'a [u8], to: &'b [u8], rename: bool) -> Result<(Routed<'a, B>, &'b [u8])> {
        let (a, ra) = self.route(from, true)?.ok_or(Errno::BUSY)?;
        if is_top_of_export(ra) {
            return Err(Errno::BUSY);
        }
        let (b, rb) = match self.at_top(to) {
            Some(Errno::EXIST) if rename => return Err(Errno::BUSY),
            Some(e) => return Err(e),
            None => self.route(to, true)?.ok_or(Errno::BUSY)?,
        };
        if a.id != b.id {
            return Err(Errno::XDEV);
        }
        Ok(((a, ra), rb))
    }
}

impl<B: Backend> Backend for Exports<B> {
    type File = XFile<B>;

    fn open(&self, path: &[u8], flags: u32, mode: u32) -> Result<(XFile<B>, Attr)> {
        let write = flags & (libc::O_ACCMODE as u32) != libc::O_RDONLY as u32
            || flags & ((libc::O_CREAT | libc::O_TRUNC) as u32) != 0;
        if flags & libc::O_CREAT as u32 != 0 {
            match self.at_top(path) {
                // An export's name (or the top) exists: only an exclusive
                // create fails for that; the open goes on as any other.
                Some(Errno::EXIST) if flags & libc::O_EXCL as u32 == 0 => {}
                Some(e) => return Err(e),
                None => {}
            }
        }
        match self.route(path, write)? {
            None if write => Err(Errno::ISDIR),
            None => Ok((XFile::Top, self.top_attr())),
            Some((d, rest)) => {
                let (f, a) = d.backend.open(rest, flags, mode)?;
                Ok((XFile::In(d, f), a))
            }
        }
    }

    fn read<'f>(&self, file: &'f XFile<B>, offset: u64, len: usize) -> Result<ReadData<'f>> {
        let (d, f) = self.dir_of(file, false)?;
        d.backend.read(f, offset, len)
    }

    fn write(&self, file: &XFile<B>, offset: u64, data: &[u8]) -> Result<u64> {
        let (d, f) = self.dir_of(file, true)?;
        d.backend.write(f, offset, data)
    }

    fn fsync(&self, file: &XFile<B>, datasync: bool) -> Result<()> {
        match file {
            XFile::Top => Ok(()),
            XFile::In(d, f) => d.backend.fsync(f, datasync),
        }
    }

    fn readdir(&self, dir: &XFile<B>, cookie: u64, max: usize, plus: bool) -> Result<(Vec<DirEntry>, bool)> {
        let XFile::Top = dir else {
            let (d, f) = self.dir_of(dir, false)?;
            return d.backend.readdir(f, cookie, max, plus);
        };
        // The top: `.`, `..`, and the exports this client may use.
        let t = self.table();
        let top = self.top_attr();
        let mut all = vec![(b".".to_vec(), 1, Some(top)), (b"..".to_vec(), 1, Some(top))];
        let mine = told();
        for e in &t.exports {
            if mine.as_ref().is_some_and(|g| g.of(e.dir.id).is_none()) {
                continue;
            }
            let attr = if plus { e.dir.backend.getattr(Node::Path(b"/")).ok() } else { None };
            all.push((e.dir.name.clone(), attr.map_or(e.dir.id + 1, |a| a.ino), attr));
        }
        let start = cookie as usize;
        let entries: Vec<DirEntry> = all
            .into_iter()
            .enumerate()
            .skip(start)
            .take(max.max(1))
            .map(|(i, (name, ino, attr))| DirEntry {
                name,
                ino,
                kind: 4,
                cookie: i as u64 + 1,
                attr: if plus { attr } else { None },
            })
            .collect();
        let eof = entries.last().is_none_or(|e| e.cookie as usize >= t.exports.len() + 2) || entries.len() < max.max(1);
        Ok((entries, eof))
    }

    fn getattr(&self, node: Node<'_, XFile<B>>) -> Result<Attr> {
        match self.node(node, false)? {
            None => Ok(self.top_attr()),
            Some((d, n)) => d.backend.getattr(n),
        }
    }

    fn truncate(&self, node: Node<'_, XFile<B>>, size: u64) -> Result<Attr> {
        let (d, n) = self.node(node, true)?.ok_or(Errno::ISDIR)?;
        d.backend.truncate(n, size)
    }

    fn chmod(&self, node: Node<'_, XFile<B>>, mode: u32) -> Result<Attr> {
        let (d, n) = self.node(node, true)?.ok_or(Errno::ROFS)?;
        d.backend.chmod(n, mode)
    }

    fn chown(&self, node: Node<'_, XFile<B>>, uid: u32, gid: u32) -> Result<Attr> {
        let (d, n) = self.node(node, true)?.ok_or(Errno::ROFS)?;
        d.backend.chown(n, uid, gid)
    }

    fn utimens(&self, node: Node<'_, XFile<B>>, atime: Time, mtime: Time) -> Result<Attr> {
        let (d, n) = self.node(node, true)?.ok_or(Errno::ROFS)?;
        d.backend.utimens(n, atime, mtime)
    }

    fn mkdir(&self, path: &[u8], mode: u32) -> Result<Attr> {
        let (d, r) = self.route_new(path)?;
        d.backend.mkdir(r, mode)
    }

    fn mknod(&self, path: &[u8], mode: u32, rdev: u64) -> Result<Attr> {
        let (d, r) = self.route_new(path)?;
        d.backend.mknod(r, mode, rdev)
    }

    fn rmdir(&self, path: &[u8]) -> Result<()> {
        match self.route(path, true)? {
            Some((d, r)) if !is_top_of_export(r) => d.backend.rmdir(r),
            _ => Err(Errno::BUSY),
        }
    }

    fn unlink(&self, path: &[u8]) -> Result<()> {
        match self.route(path, true)? {
            Some((d, r)) if !is_top_of_export(r) => d.backend.unlink(r),
            _ => Err(Errno::ISDIR),
        }
    }

    fn rename(&self, from: &[u8], to: &[u8], flags: u32) -> Result<()> {
        let ((d, a), b) = self.pair(from, to, true)?;
        d.backend.rename(a, b, flags)
    }

    fn link(&self, from: &[u8], to: &[u8]) -> Result<Attr> {
        let ((d, a), b) = self.pair(from, to, false)?;
        d.backend.link(a, b)
    }

    fn symlink(&self, target: &[u8], path: &[u8]) -> Result<Attr> {
        let (d, r) = self.route_new(path)?;
        d.backend.symlink(target, r)
    }

    fn readlink(&self, path: &[u8]) -> Result<Vec<u8>> {
        match self.route(path, false)? {
            Some((d, r)) => d.backend.readlink(r),
            None => Err(Errno::INVAL),
        }
    }

    fn statfs(&self, path: &[u8]) -> Result<StatFs> {
        match self.route(path, false)? {
            Some((d, r)) => d.backend.statfs(r),
            None => {
                let t = self.table();
                let first = t.exports.first().ok_or(Errno::NOENT)?;
                first.dir.backend.statfs(b"/")
            }
        }
    }

    fn access(&self, path: &[u8], mode: u32) -> Result<()> {
        match self.route(path, mode & 2 != 0)? {
            Some((d, r)) => d.backend.access(r, mode),
            None if mode & 2 != 0 => Err(Errno::ROFS),
            None => Ok(()),
        }
    }

    fn getxattr(&self, node: Node<'_, XFile<B>>, name: &[u8]) -> Result<Vec<u8>> {
        let (d, n) = self.node(node, false)?.ok_or(Errno::NODATA)?;
        d.backend.getxattr(n, name)
    }

    fn setxattr(&self, node: Node<'_, XFile<B>>, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        let (d, n) = self.node(node, true)?.ok_or(Errno::ROFS)?;
        d.backend.setxattr(n, name, value, flags)
    }

    fn listxattr(&self, node: Node<'_, XFile<B>>) -> Result<Vec<u8>> {
        match self.node(node, false)? {
            Some((d, n)) => d.backend.listxattr(n),
            None => Ok(Vec::new()),
        }
    }

    fn removexattr(&self, node: Node<'_, XFile<B>>, name: &[u8]) -> Result<()> {
        let (d, n) = self.node(node, true)?.ok_or(Errno::ROFS)?;
        d.backend.removexattr(n, name)
    }

    fn file_id(&self, file: &XFile<B>) -> Vec<u8> {
        match file {
            XFile::Top => Vec::new(),
            XFile::In(d, f) => d.backend.file_id(f),
        }
    }

    fn locate(&self, id: &[u8], path: &[u8], key: (u64, u64)) -> Result<XFile<B>> {
        match self.route(path, false)? {
            None => Err(Errno::STALE),
            Some((d, rest)) => {
                let f = d.backend.locate(id, rest, key)?;
                Ok(XFile::In(d, f))
            }
        }
    }

    fn reopen(
        &self,
        found: Option<XFile<B>>,
        id: &[u8],
        path: &[u8],
        flags: u32,
        key: (u64, u64),
    ) -> Result<(XFile<B>, Attr)> {
        let write = flags & (libc::O_ACCMODE as u32) != libc::O_RDONLY as u32;
        match self.route(path, write)? {
            None => Ok((XFile::Top, self.top_attr())),
            Some((d, rest)) => {
                // Found in the export the path names now, or not at all.
                let found = match found {
                    Some(XFile::In(e, f)) if Arc::ptr_eq(&e, &d) => Some(f),
                    _ => None,
                };
                let (f, a) = d.backend.reopen(found, id, rest, flags, key)?;
                Ok((XFile::In(d, f), a))
            }
        }
    }

    fn fd_of<'f>(&self, file: &'f XFile<B>) -> Option<std::os::fd::BorrowedFd<'f>> {
        // A descriptor outlives every check: only for a client that may
        // still use the export (and write it, as the descriptor would).
        let (d, f) = self.dir_of(file, true).ok()?;
        d.backend.fd_of(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_at_the_export_and_dots_stay_at_the_top() {
        assert_eq!(split(b""), None);
        assert_eq!(split(b"/"), None);
        assert_eq!(split(b"/./.."), None);
        assert_eq!(split(b"/data"), Some((&b"data"[..], &b"/"[..])));
        assert_eq!(split(b"data/a/b"), Some((&b"data"[..], &b"/a/b"[..])));
        assert_eq!(split(b"/../data/../x"), Some((&b"data"[..], &b"/../x"[..])));
    }

    #[test]
    fn networks_contain_what_they_should() {
        let n = Net::parse("10.1.0.0/16").unwrap();
        assert!(n.contains("10.1.200.3".parse().unwrap()));
        assert!(!n.contains("10.2.0.1".parse().unwrap()));
        assert!(n.contains("::ffff:10.1.0.9".parse().unwrap()), "an IPv4 client on a dual-stack socket");
        assert!(Net::parse("::1").unwrap().contains("::1".parse().unwrap()));
        assert!(Net::parse("0.0.0.0/0").unwrap().contains("192.0.2.1".parse().unwrap()));
        assert!(Net::parse("10.0.0.0/33").is_err() && Net::parse("host").is_err());
    }
}
