//! What the hooks do with a remote file or path, in safe Rust: each
//! function answers a value or an errno.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use ferry_client::{Attr, Client, OpenOptions, Target};

use crate::mounts::Remote;
use crate::open::Open;
use crate::placeholder::{self, Described};
use crate::state;

pub type R<T> = Result<T, i32>;

/// The connection for a call that may change something (the attribute
/// cache is emptied).
pub fn client(r: &Remote) -> R<Client> {
    crate::attrs::changed();
    state::client(r.mount)
}

pub fn err(r: &Remote, e: ferry_client::Error) -> i32 {
    state::errno_of(r.mount, &e)
}

pub fn umask() -> u32 {
    state::UMASK.load(Relaxed)
}

/// `open(2)` of a remote path: the server's handle, and a placeholder fd.
pub fn open(r: &Remote, flags: i32, mode: u32) -> R<i32> {
    if flags & libc::O_TMPFILE == libc::O_TMPFILE {
        return Err(libc::EOPNOTSUPP);
    }
    crate::open::send_pending(r.mount, &r.path);
    let changes = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & (libc::O_CREAT | libc::O_TRUNC) != 0;
    let c = if changes { client(r)? } else { state::client(r.mount)? };
    let reader = !changes && flags & (libc::O_DIRECTORY | libc::O_PATH | libc::O_NOFOLLOW) == 0;
    if reader {
        // A cached file this process opened under a lease nothing broke
        // since: its copy, without a round trip (the lease is the check).
        if let Some(local) = crate::attrs::copy(r.mount, &r.path).and_then(|t| c.reopen_cached(&t)) {
            return Ok(program_fd(local, flags & libc::O_CLOEXEC != 0));
        }
    }
    let gen = crate::attrs::generation();
    let mut pass = flags & !(libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_LARGEFILE | libc::O_NONBLOCK | libc::O_ASYNC);
    let mode = mode & 0o7777 & !umask();
    // On the server's host a writer's open goes to the Unix socket, whose
    // handle lends the descriptor (one round trip fewer than an open here
    // and another there: small files written under `ferry run` cost half).
    match crate::samehost::writer(r, pass, mode)? {
        crate::samehost::Writer::Lent(fd, lent) => {
            let n = program_fd(fd.into(), flags & libc::O_CLOEXEC != 0);
            crate::lent::add(n, *lent);
            return Ok(n);
        }
        // Opened (created, truncated) there, not lent: opened again here.
        crate::samehost::Writer::Opened => pass &= !(libc::O_EXCL | libc::O_TRUNC),
        crate::samehost::Writer::No => {}
    }
    let file = c
        .open(crate::mounts::as_path(&r.path), OpenOptions::new().custom_flags(pass as u32).mode(mode))
        .map_err(|e| err(r, e))?;
    if file.is_cached() {
        // A cached file opened for reading: the program gets a real fd of
        // the local cache file, so mmap, sendfile and splice work natively.
        // Any failure of the local copy leaves it a remote file.
        if let Ok(Some(local)) = file.cache_file() {
            if let Some(t) = file.cache_ticket().filter(|_| reader) {
                crate::attrs::put_copy(gen, r.mount, &r.path, t);
            }
            return Ok(program_fd(local, flags & libc::O_CLOEXEC != 0));
        }
    }
    // On the server's host a reader gets the server's own descriptor.
    if let Some(fd) = crate::samehost::descriptor(r, &file, flags) {
        return Ok(program_fd(fd.into(), flags & libc::O_CLOEXEC != 0));
    }
    let dir = file.attr().mode & libc::S_IFMT == libc::S_IFDIR;
    let keep = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_CLOEXEC);
    install(r, keep, dir, Some(file), flags & libc::O_CLOEXEC != 0)
}

/// A local file's descriptor, handed to the program as its own: std opens
/// close-on-exec, the program's `open` may not have asked for that.
fn program_fd(f: std::fs::File, cloexec: bool) -> i32 {
    use std::os::fd::IntoRawFd;
    if !cloexec {
        let _ = rustix::io::fcntl_setfd(&f, rustix::io::FdFlags::empty());
    }
    f.into_raw_fd()
}

/// A directory stream's open directory (`opendir`): the listing is read by
/// path, so the server opens the directory only if the program uses an fd
/// of it (`ls` and `find` save two round trips per directory), and the
/// placeholder fd is made only when the program asks for one (`dirfd`):
/// most walks never do, and a memfd with its description costs several
/// system calls.
pub fn open_dir_stream(r: &Remote) -> Arc<Open> {
    Arc::new(Open::new(r.mount, r.path.clone(), r.local.clone(), libc::O_RDONLY | libc::O_DIRECTORY, true, None))
}

fn install(r: &Remote, flags: i32, dir: bool, file: Option<ferry_client::File>, cloexec: bool) -> R<i32> {
    number(&Arc::new(Open::new(r.mount, r.path.clone(), r.local.clone(), flags, dir, file)), cloexec)
}

/// A placeholder fd for `open`, from now on in the fd table.
pub fn number(open: &Arc<Open>, cloexec: bool) -> R<i32> {
    let (prefix, url) = {
        let m = state::MOUNTS.read();
        let m = m.get(open.mount).ok_or(libc::EIO)?;
        (m.prefix.clone(), format!("ferry://{}{}", m.url.addr, m.url.path))
    };
    let flags = open.flags.load(std::sync::atomic::Ordering::Relaxed);
    let d = Described { prefix, url, path: open.path.clone(), local: open.local.clone(), flags, dir: open.dir };
    let fd = placeholder::create(&d, cloexec)?;
    state::insert(fd, open.clone());
    Ok(fd)
}

/// Takes over a placeholder inherited across `exec`.
pub fn adopt(fd: i32) {
    let Some(d) = placeholder::describe(fd) else { return };
    let Some(mount) = state::mount_index(&d.prefix, &d.url) else { return };
    let open = Arc::new(Open::new(mount, d.path, d.local, d.flags, d.dir, None));
    open.make_shared();
    state::insert(fd, open);
}

/// `close(2)`: the fd goes in any case; an error reports a write that
/// failed on the server.
pub fn close(fd: i32) -> R<()> {
    let mut mapped = Ok(());
    if let Some(o) = state::get(fd) {
        crate::locks::closing(&o);
        mapped = crate::maps::write_back(Some((o.mount, &o.path)), false);
    }
    let open = state::remove(fd);
    // SAFETY: closing the placeholder, which the program owns.
    let r = unsafe { crate::real::close(fd) };
    let e = crate::guard::errno();
    if let Some(o) = open {
        if let Ok(o) = Arc::try_unwrap(o) {
            o.close()?;
        }
    }
    if r < 0 {
        Err(e)
    } else {
        mapped
    }
}

/// After a real `dup*` made `new` from a remote `old`: same open file.
pub fn duped(old: i32, new: i32) {
    if let Some(o) = state::get(old) {
        let replaced = state::insert(new, o);
        drop(replaced);
    }
}

/// The file offset: kept in the `Open` while no other process can share
/// it (saves two system calls per call), in the placeholder's kernel
/// offset once one can.
pub(crate) fn offset(fd: i32, o: &Open) -> R<u64> {
    match o.private_pos() {
        Some(p) => Ok(p),
        None => placeholder::offset(fd),
    }
}

fn set_offset(fd: i32, o: &Open, pos: u64) -> R<()> {
    if o.set_private_pos(pos) {
        Ok(())
    } else {
        placeholder::set_offset(fd, pos)
    }
}

/// Before another process can see our fds (`fork`, `exec`, spawn): every
/// offset kept in-process goes to its placeholder, and stays there.
pub fn share_offsets() {
    for (fd, o) in state::all_opens() {
        o.share(fd);
    }
}

pub fn read(fd: i32, o: &Open, buf: &mut [u8]) -> R<usize> {
    check_read(o)?;
    let pos = offset(fd, o)?;
    let n = o.read(pos, buf)?;
    set_offset(fd, o, pos + n as u64)?;
    Ok(n)
}

pub fn pread(o: &Open, buf: &mut [u8], pos: i64) -> R<usize> {
    check_read(o)?;
    let pos = u64::try_from(pos).map_err(|_| libc::EINVAL)?;
    o.read(pos, buf)
}

fn check_read(o: &Open) -> R<()> {
    if o.dir {
        return Err(libc::EISDIR);
    }
    if o.access_mode() == libc::O_WRONLY {
        return Err(libc::EBADF);
    }
    Ok(())
}

fn check_write(o: &Open) -> R<()> {
    if o.dir {
        return Err(libc::EISDIR);
    }
    if o.access_mode() == libc::O_RDONLY {
        return Err(libc::EBADF);
    }
    Ok(())
}

pub fn write(fd: i32, o: &Open, data: &[u8]) -> R<usize> {
    check_write(o)?;
    let append = o.flags.load(Relaxed) & libc::O_APPEND != 0;
    let pos = offset(fd, o)?;
    let end = o.write(pos, data, append)?;
    set_offset(fd, o, end)?;
    crate::maps::written(o.mount, &o.path, end - data.len() as u64, data);
    Ok(data.len())
}

pub fn pwrite(o: &Open, data: &[u8], pos: i64) -> R<usize> {
    check_write(o)?;
    let pos = u64::try_from(pos).map_err(|_| libc::EINVAL)?;
    o.write(pos, data, false)?;
    crate::maps::written(o.mount, &o.path, pos, data);
    Ok(data.len())
}

pub fn lseek(fd: i32, o: &Open, off: i64, whence: i32) -> R<i64> {
    let cur = offset(fd, o)? as i64;
    let size = || -> R<i64> { Ok(o.stat()?.size as i64) };
    let to = match whence {
        libc::SEEK_SET => off,
        libc::SEEK_CUR => cur.checked_add(off).ok_or(libc::EOVERFLOW)?,
        libc::SEEK_END => size()?.checked_add(off).ok_or(libc::EOVERFLOW)?,
        // No holes are reported: data runs to the end of the file.
        libc::SEEK_DATA => {
            if off < 0 || off >= size()? {
                return Err(libc::ENXIO);
            }
            off
        }
        libc::SEEK_HOLE => {
            let s = size()?;
            if off < 0 || off >= s {
                return Err(libc::ENXIO);
            }
            s
        }
        _ => return Err(libc::EINVAL),
    };
    if to < 0 {
        return Err(libc::EINVAL);
    }
    if to != cur {
        o.seeked();
        set_offset(fd, o, to as u64)?;
    }
    Ok(to)
}

pub fn stat_path(r: &Remote, follow: bool) -> R<Attr> {
    if let Some(a) = crate::attrs::get(r.mount, &r.path, follow) {
        return Ok(a);
    }
    crate::open::send_pending(r.mount, &r.path);
    let gen = crate::attrs::generation();
    let c = state::client(r.mount)?;
    let t = if follow { Target::Path(&r.path) } else { Target::PathNoFollow(&r.path) };
    let a = c.stat(t).map_err(|e| err(r, e))?;
    crate::attrs::put(gen, r.mount, &r.path, follow, a);
    Ok(a)
}

pub fn stat_fd(o: &Open) -> R<Attr> {
    if o.dir {
        let r = o.remote();
        return stat_path(&r, true);
    }
    o.stat()
}

/// Runs a path call that may change something with the connection for `r`.
pub fn with<T>(r: &Remote, f: impl FnOnce(&Client, &std::path::Path) -> ferry_client::Result<T>) -> R<T> {
    crate::open::send_pending(r.mount, &r.path);
    let c = client(r)?;
    f(&c, crate::mounts::as_path(&r.path)).map_err(|e| err(r, e))
}

/// Runs a path call that changes nothing (a listing, `statfs`, `access`,
/// `readlink`): the attribute cache stays.
pub fn with_ro<T>(r: &Remote, f: impl FnOnce(&Client, &std::path::Path) -> ferry_client::Result<T>) -> R<T> {
    crate::open::send_pending(r.mount, &r.path);
    let c = state::client(r.mount)?;
    f(&c, crate::mounts::as_path(&r.path)).map_err(|e| err(r, e))
}

/// Two paths must be on the same server (and mount) for rename and link.
pub fn same_mount(a: &Remote, b: &Remote) -> R<()> {
    if a.mount == b.mount {
        Ok(())
    } else {
        Err(libc::EXDEV)
    }
}

/// Writes everything gathered, in every open file, through to the server:
/// before `exec`, `exit`, `fork`, `posix_spawn`.
pub fn sync_all() {
    share_offsets();
    let _ = crate::maps::write_back(None, false);
    for (_, o) in state::all_opens() {
        let _ = o.sync_writes();
    }
}
