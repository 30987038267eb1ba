//! Path operations on one server, shaped like `std::fs`.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferry_proto::{caps, Attr, DirEntry, Reply, Request, StatFs, Target, Time};

use crate::engine::{Engine, Options};
use crate::error::{Error, Result};
use crate::file::{File, OpenOptions};

/// A connection to one server. Cheap to clone: clones share the connection
/// and its window.
#[derive(Clone)]
pub struct Client {
    engine: Arc<Engine>,
}

/// What it takes to rejoin a session from another connection: its id and
/// secret (derived at both ends, never sent). Keep it private.
#[derive(Clone)]
pub struct SessionTicket {
    pub id: u64,
    secret: [u8; 32],
    /// How long the server keeps the session after its last connection.
    pub lease: std::time::Duration,
}

impl std::fmt::Debug for SessionTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionTicket").field("id", &self.id).field("lease", &self.lease).finish_non_exhaustive()
    }
}

/// Directory batch size asked of the server.
const DIR_BATCH: u32 = 1024;

/// A path's bytes as the protocol carries them: names are bytes on Linux,
/// not always UTF-8.
fn bytes(p: &Path) -> &[u8] {
    p.as_os_str().as_bytes()
}

fn unexpected(r: Reply<'_>) -> Error {
    Error::Protocol(format!("unexpected reply {r:?}"))
}

impl Client {
    pub fn connect(addr: &str, opts: &Options) -> Result<Client> {
        Ok(Client { engine: Arc::new(Engine::connect(addr, opts)?) })
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Makes this connection's state (open files, offsets, locks) a session
    /// that outlives the connection for the server's lease, and returns the
    /// ticket another connection joins it with. Needs the `SESSIONS`
    /// capability (`ENOSYS` without it).
    pub fn new_session(&self) -> Result<SessionTicket> {
        if !self.engine.has_cap(caps::SESSIONS) {
            return Err(Error::remote(libc::ENOSYS));
        }
        let f = self.engine.call(&Request::SessionNew)?;
        match f.reply()? {
            Reply::Session { id, lease_ms } => Ok(SessionTicket {
                id,
                secret: self.engine.session_secret(),
                lease: std::time::Duration::from_millis(lease_ms.into()),
            }),
            r => Err(unexpected(r)),
        }
    }

    /// Joins the session of `ticket`: from now on this connection shares its
    /// open files, offsets and locks (whatever it had of its own is
    /// closed). `ESTALE` if the session is gone (lease over, server
    /// restarted), `EACCES` for a ticket of another secret.
    pub fn attach(&self, ticket: &SessionTicket) -> Result<()> {
        if !self.engine.has_cap(caps::SESSIONS) {
            return Err(Error::remote(libc::ENOSYS));
        }
        let proof = self.engine.attach_proof(&ticket.secret, ticket.id);
        self.empty_or_session(&Request::SessionAttach { id: ticket.id, proof })
    }

    fn empty_or_session(&self, req: &Request<'_>) -> Result<()> {
        match self.engine.call(req)?.reply()? {
            Reply::Session { .. } => Ok(()),
            r => Err(unexpected(r)),
        }
    }

    fn attr_call(&self, req: &Request<'_>) -> Result<Attr> {
        let f = self.engine.call(req)?;
        match f.reply()? {
            Reply::Attr(a) => Ok(a),
            r => Err(unexpected(r)),
        }
    }

    fn empty_call(&self, req: &Request<'_>) -> Result<()> {
        self.engine.call(req)?;
        Ok(())
    }

    pub fn open(&self, path: impl AsRef<Path>, opts: &OpenOptions) -> Result<File> {
        File::open(self.clone(), bytes(path.as_ref()), opts)
    }

    /// `stat`: follows a final symlink.
    pub fn metadata(&self, path: impl AsRef<Path>) -> Result<Attr> {
        self.stat(Target::Path(bytes(path.as_ref())))
    }

    /// `lstat`.
    pub fn symlink_metadata(&self, path: impl AsRef<Path>) -> Result<Attr> {
        self.stat(Target::PathNoFollow(bytes(path.as_ref())))
    }

    pub fn stat(&self, target: Target<'_>) -> Result<Attr> {
        self.attr_call(&Request::Stat { target })
    }

    /// All entries of a directory except `.` and `..`, with attributes
    /// (readdirplus, or one `stat` each if the server lacks it).
    pub fn read_dir(&self, path: impl AsRef<Path>) -> Result<Vec<DirEntry>> {
        let path = path.as_ref();
        let dir = self.open(path, OpenOptions::new().read(true).directory(true))?;
        let plus = self.engine.has_cap(caps::READDIRPLUS);
        let mut out = Vec::new();
        let mut cookie = 0;
        loop {
            let f =
                self.engine.call(&Request::ReadDir { handle: dir.handle(), cookie, max_entries: DIR_BATCH, plus })?;
            let (eof, entries) = match f.reply()? {
                Reply::Dir { eof, entries } => (eof, entries),
                r => return Err(unexpected(r)),
            };
            if let Some(last) = entries.last() {
                cookie = last.cookie;
            }
            let n = entries.len();
            out.extend(entries.into_iter().filter(|e| e.name != b"." && e.name != b".."));
            if eof || n == 0 {
                break;
            }
        }
        dir.close()?;
        if !plus {
            for e in &mut out {
                let p = join(path, e.file_name());
                e.attr = self.symlink_metadata(&p).ok();
            }
        }
        Ok(out)
    }

    pub fn create_dir(&self, path: impl AsRef<Path>, mode: u32) -> Result<Attr> {
        self.attr_call(&Request::Mkdir { path: bytes(path.as_ref()), mode })
    }

    /// `mknod(2)`: `mode` holds the type (`S_IFIFO`, `S_IFSOCK`, `S_IFCHR`,
    /// `S_IFBLK`, `S_IFREG`) and the permission bits.
    pub fn mknod(&self, path: impl AsRef<Path>, mode: u32, rdev: u64) -> Result<Attr> {
        self.attr_call(&Request::Mknod { path: bytes(path.as_ref()), mode, rdev })
    }

    /// `mkdir -p`.
    pub fn create_dir_all(&self, path: impl AsRef<Path>, mode: u32) -> Result<()> {
        let mut cur = Vec::new();
        for comp in bytes(path.as_ref()).split(|&b| b == b'/').filter(|c| !c.is_empty()) {
            cur.push(b'/');
            cur.extend_from_slice(comp);
            let cur = OsStr::from_bytes(&cur);
            match self.create_dir(cur, mode) {
                Ok(_) => {}
                Err(e) if e.errno() == libc::EEXIST => {
                    if !self.metadata(cur)?.is_dir() {
                        return Err(Error::remote(libc::ENOTDIR));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub fn remove_file(&self, path: impl AsRef<Path>) -> Result<()> {
        self.empty_call(&Request::Unlink { path: bytes(path.as_ref()) })
    }

    pub fn remove_dir(&self, path: impl AsRef<Path>) -> Result<()> {
        self.empty_call(&Request::Rmdir { path: bytes(path.as_ref()) })
    }

    /// `rm -r`: depth first, symlinks removed, never followed.
    pub fn remove_dir_all(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        for e in self.read_dir(path)? {
            let p = join(path, e.file_name());
            if e.kind == libc::DT_DIR {
                self.remove_dir_all(&p)?;
            } else {
                self.remove_file(&p)?;
            }
        }
        self.remove_dir(path)
    }

    pub fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<()> {
        self.rename_with_flags(from, to, 0)
    }

    /// `renameat2` flags: `RENAME_NOREPLACE` (1), `RENAME_EXCHANGE` (2).
    pub fn rename_with_flags(&self, from: impl AsRef<Path>, to: impl AsRef<Path>, flags: u32) -> Result<()> {
        if flags != 0 && !self.engine.has_cap(caps::RENAME_FLAGS) {
            return Err(Error::remote(libc::EINVAL));
        }
        self.empty_call(&Request::Rename { from: bytes(from.as_ref()), to: bytes(to.as_ref()), flags })
    }

    pub fn hard_link(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> Result<Attr> {
        self.attr_call(&Request::Link { from: bytes(from.as_ref()), to: bytes(to.as_ref()) })
    }

    /// Creates `path` as a symlink to `target`.
    pub fn symlink(&self, target: impl AsRef<Path>, path: impl AsRef<Path>) -> Result<Attr> {
        self.attr_call(&Request::Symlink { target: bytes(target.as_ref()), path: bytes(path.as_ref()) })
    }

    pub fn read_link(&self, path: impl AsRef<Path>) -> Result<PathBuf> {
        match self.engine.call(&Request::Readlink { path: bytes(path.as_ref()) })?.reply()? {
            Reply::Name(n) => Ok(PathBuf::from(OsStr::from_bytes(n))),
            r => Err(unexpected(r)),
        }
    }

    pub fn set_permissions(&self, target: Target<'_>, mode: u32) -> Result<Attr> {
        self.attr_call(&Request::Chmod { target, mode })
    }

    /// `u32::MAX` leaves an id unchanged.
    pub fn chown(&self, target: Target<'_>, uid: u32, gid: u32) -> Result<Attr> {
        self.attr_call(&Request::Chown { target, uid, gid })
    }

    pub fn set_times(&self, target: Target<'_>, atime: Time, mtime: Time) -> Result<Attr> {
        self.attr_call(&Request::Utimens { target, atime, mtime })
    }

    pub fn truncate(&self, target: Target<'_>, size: u64) -> Result<Attr> {
        self.attr_call(&Request::Truncate { target, size })
    }

    pub fn statfs(&self, path: impl AsRef<Path>) -> Result<StatFs> {
        match self.engine.call(&Request::Statfs { path: bytes(path.as_ref()) })?.reply()? {
            Reply::StatFs(s) => Ok(s),
            r => Err(unexpected(r)),
        }
    }

    pub fn access(&self, path: impl AsRef<Path>, mode: u32) -> Result<()> {
        self.empty_call(&Request::Access { path: bytes(path.as_ref()), mode })
    }

    fn xattr_cap(&self) -> Result<()> {
        if self.engine.has_cap(caps::XATTR) {
            Ok(())
        } else {
            Err(Error::remote(libc::EOPNOTSUPP))
        }
    }

    fn xattr_value(&self, req: &Request<'_>) -> Result<Vec<u8>> {
        self.xattr_cap()?;
        match self.engine.call(req)?.reply()? {
            Reply::Xattr { value, .. } => Ok(value.to_vec()),
            r => Err(unexpected(r)),
        }
    }

    /// The whole value of an extended attribute.
    pub fn get_xattr(&self, target: Target<'_>, name: impl AsRef<OsStr>) -> Result<Vec<u8>> {
        self.xattr_value(&Request::GetXattr { target, name: name.as_ref().as_bytes(), size: u32::MAX })
    }

    pub fn set_xattr(&self, target: Target<'_>, name: impl AsRef<OsStr>, value: &[u8], flags: u32) -> Result<()> {
        self.xattr_cap()?;
        self.empty_call(&Request::SetXattr { target, name: name.as_ref().as_bytes(), value, flags })
    }

    /// Attribute names.
    pub fn list_xattr(&self, target: Target<'_>) -> Result<Vec<OsString>> {
        let raw = self.xattr_value(&Request::ListXattr { target, size: u32::MAX })?;
        Ok(raw.split(|b| *b == 0).filter(|s| !s.is_empty()).map(|s| OsString::from_vec(s.to_vec())).collect())
    }

    pub fn remove_xattr(&self, target: Target<'_>, name: impl AsRef<OsStr>) -> Result<()> {
        self.xattr_cap()?;
        self.empty_call(&Request::RemoveXattr { target, name: name.as_ref().as_bytes() })
    }

    /// Round trip with no work on the server (latency measurement).
    pub fn ping(&self) -> Result<()> {
        self.empty_call(&Request::Ping)
    }

    /// Reads a whole file.
    pub fn read(&self, path: impl AsRef<Path>) -> Result<Vec<u8>> {
        let f = self.open(path, OpenOptions::new().read(true))?;
        let mut buf = vec![0u8; (f.attr().size as usize).max(64 * 1024)];
        let mut len = 0;
        loop {
            let n = f.read_at(&mut buf[len..], len as u64)?;
            len += n;
            if n == 0 || len < buf.len() {
                break;
            }
            // The file grew since open: keep going.
            buf.resize(buf.len() * 2, 0);
        }
        buf.truncate(len);
        f.close()?;
        Ok(buf)
    }

    /// Creates or truncates a file and writes `data` to it.
    pub fn write(&self, path: impl AsRef<Path>, data: &[u8]) -> Result<()> {
        let f = self.open(path, OpenOptions::new().write(true).create(true).truncate(true))?;
        f.write_at(data, 0)?;
        f.close()
    }
}

/// `dir/name` for a path inside the export, byte for byte (`name` is one
/// component, as a directory entry gives it).
pub fn join(dir: impl AsRef<Path>, name: impl AsRef<OsStr>) -> PathBuf {
    let (dir, name) = (bytes(dir.as_ref()), name.as_ref().as_bytes());
    let mut out = Vec::with_capacity(dir.len() + 1 + name.len());
    out.extend_from_slice(dir);
    if !dir.is_empty() && !dir.ends_with(b"/") {
        out.push(b'/');
    }
    out.extend_from_slice(name);
    PathBuf::from(OsString::from_vec(out))
}
