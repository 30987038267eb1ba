//! Path operations on one server, shaped like `std::fs`.

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

/// Directory batch size asked of the server.
const DIR_BATCH: u32 = 1024;

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

    pub fn open(&self, path: &str, opts: &OpenOptions) -> Result<File> {
        File::open(self.clone(), path, opts)
    }

    /// `stat`: follows a final symlink.
    pub fn metadata(&self, path: &str) -> Result<Attr> {
        self.stat(Target::Path(path))
    }

    /// `lstat`.
    pub fn symlink_metadata(&self, path: &str) -> Result<Attr> {
        self.stat(Target::PathNoFollow(path))
    }

    pub fn stat(&self, target: Target<'_>) -> Result<Attr> {
        self.attr_call(&Request::Stat { target })
    }

    /// All entries of a directory except `.` and `..`, with attributes
    /// (readdirplus, or one `stat` each if the server lacks it).
    pub fn read_dir(&self, path: &str) -> Result<Vec<DirEntry>> {
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
            out.extend(entries.into_iter().filter(|e| e.name != "." && e.name != ".."));
            if eof || n == 0 {
                break;
            }
        }
        dir.close()?;
        if !plus {
            for e in &mut out {
                let p = join(path, &e.name);
                e.attr = self.symlink_metadata(&p).ok();
            }
        }
        Ok(out)
    }

    pub fn create_dir(&self, path: &str, mode: u32) -> Result<Attr> {
        self.attr_call(&Request::Mkdir { path, mode })
    }

    /// `mknod(2)`: `mode` holds the type (`S_IFIFO`, `S_IFSOCK`, `S_IFCHR`,
    /// `S_IFBLK`, `S_IFREG`) and the permission bits.
    pub fn mknod(&self, path: &str, mode: u32, rdev: u64) -> Result<Attr> {
        self.attr_call(&Request::Mknod { path, mode, rdev })
    }

    /// `mkdir -p`.
    pub fn create_dir_all(&self, path: &str, mode: u32) -> Result<()> {
        let mut cur = String::new();
        for comp in path.split('/').filter(|c| !c.is_empty()) {
            cur.push('/');
            cur.push_str(comp);
            match self.create_dir(&cur, mode) {
                Ok(_) => {}
                Err(e) if e.errno() == libc::EEXIST => {
                    if !self.metadata(&cur)?.is_dir() {
                        return Err(Error::remote(libc::ENOTDIR));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub fn remove_file(&self, path: &str) -> Result<()> {
        self.empty_call(&Request::Unlink { path })
    }

    pub fn remove_dir(&self, path: &str) -> Result<()> {
        self.empty_call(&Request::Rmdir { path })
    }

    /// `rm -r`: depth first, symlinks removed, never followed.
    pub fn remove_dir_all(&self, path: &str) -> Result<()> {
        for e in self.read_dir(path)? {
            let p = join(path, &e.name);
            if e.kind == libc::DT_DIR {
                self.remove_dir_all(&p)?;
            } else {
                self.remove_file(&p)?;
            }
        }
        self.remove_dir(path)
    }

    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.rename_with_flags(from, to, 0)
    }

    /// `renameat2` flags: `RENAME_NOREPLACE` (1), `RENAME_EXCHANGE` (2).
    pub fn rename_with_flags(&self, from: &str, to: &str, flags: u32) -> Result<()> {
        if flags != 0 && !self.engine.has_cap(caps::RENAME_FLAGS) {
            return Err(Error::remote(libc::EINVAL));
        }
        self.empty_call(&Request::Rename { from, to, flags })
    }

    pub fn hard_link(&self, from: &str, to: &str) -> Result<Attr> {
        self.attr_call(&Request::Link { from, to })
    }

    /// Creates `path` as a symlink to `target`.
    pub fn symlink(&self, target: &str, path: &str) -> Result<Attr> {
        self.attr_call(&Request::Symlink { target, path })
    }

    pub fn read_link(&self, path: &str) -> Result<String> {
        match self.engine.call(&Request::Readlink { path })?.reply()? {
            Reply::Name(n) => Ok(n.to_string()),
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

    pub fn statfs(&self, path: &str) -> Result<StatFs> {
        match self.engine.call(&Request::Statfs { path })?.reply()? {
            Reply::StatFs(s) => Ok(s),
            r => Err(unexpected(r)),
        }
    }

    pub fn access(&self, path: &str, mode: u32) -> Result<()> {
        self.empty_call(&Request::Access { path, mode })
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
    pub fn get_xattr(&self, target: Target<'_>, name: &str) -> Result<Vec<u8>> {
        self.xattr_value(&Request::GetXattr { target, name, size: u32::MAX })
    }

    pub fn set_xattr(&self, target: Target<'_>, name: &str, value: &[u8], flags: u32) -> Result<()> {
        self.xattr_cap()?;
        self.empty_call(&Request::SetXattr { target, name, value, flags })
    }

    /// Attribute names.
    pub fn list_xattr(&self, target: Target<'_>) -> Result<Vec<String>> {
        let raw = self.xattr_value(&Request::ListXattr { target, size: u32::MAX })?;
        Ok(raw.split(|b| *b == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect())
    }

    pub fn remove_xattr(&self, target: Target<'_>, name: &str) -> Result<()> {
        self.xattr_cap()?;
        self.empty_call(&Request::RemoveXattr { target, name })
    }

    /// Round trip with no work on the server (latency measurement).
    pub fn ping(&self) -> Result<()> {
        self.empty_call(&Request::Ping)
    }

    /// Reads a whole file.
    pub fn read(&self, path: &str) -> Result<Vec<u8>> {
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
    pub fn write(&self, path: &str, data: &[u8]) -> Result<()> {
        let f = self.open(path, OpenOptions::new().write(true).create(true).truncate(true))?;
        f.write_at(data, 0)?;
        f.close()
    }
}

/// `dir/name` for a path inside the export.
pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() || dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}
