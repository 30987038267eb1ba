//! Typed requests and replies, and their encoding into frame bodies.

use crate::frame::{Header, FLAG_ERROR, HEADER_LEN};
use crate::types::{Attr, DirEntry, StatFs, Target, Time};
use crate::wire::{Reader, Writer};
use crate::{DecodeError, Nonce, MAGIC};

/// Operation codes (the `op` field of a header). Replies echo the request's op.
pub mod op {
    pub const HELLO: u16 = 1;
    pub const AUTH: u16 = 2;
    pub const PING: u16 = 3;
    pub const OPEN: u16 = 10;
    pub const CLOSE: u16 = 11;
    pub const READ: u16 = 12;
    pub const PREAD: u16 = 13;
    pub const WRITE: u16 = 14;
    pub const PWRITE: u16 = 15;
    pub const SEEK: u16 = 16;
    pub const STAT: u16 = 17;
    pub const FSYNC: u16 = 18;
    pub const TRUNCATE: u16 = 19;
    pub const MKDIR: u16 = 20;
    pub const RMDIR: u16 = 21;
    pub const UNLINK: u16 = 22;
    pub const RENAME: u16 = 23;
    pub const LINK: u16 = 24;
    pub const SYMLINK: u16 = 25;
    pub const READLINK: u16 = 26;
    pub const CHMOD: u16 = 27;
    pub const CHOWN: u16 = 28;
    pub const UTIMENS: u16 = 29;
    pub const STATFS: u16 = 30;
    pub const ACCESS: u16 = 31;
    pub const GETXATTR: u16 = 32;
    pub const SETXATTR: u16 = 33;
    pub const LISTXATTR: u16 = 34;
    pub const REMOVEXATTR: u16 = 35;
    pub const READDIR: u16 = 36;
    pub const MKNOD: u16 = 37;
    pub const LOCK: u16 = 38;
    pub const GETLOCK: u16 = 39;
    pub const SESSION_NEW: u16 = 40;
    pub const SESSION_ATTACH: u16 = 41;
    /// `Open` answered with the file's persistent identity (capability
    /// `FILE_IDS`).
    pub const OPEN_ID: u16 = 42;
    pub const REOPEN: u16 = 43;
    pub const OPEN_READ: u16 = 44;
    pub const LIST_DIR: u16 = 45;
    pub const SESSION_NEW_VOLATILE: u16 = 46;
    /// `OpenId` answered with what a caching client needs (capability
    /// `CACHING`).
    pub const OPEN_CACHED: u16 = 47;
    pub const CACHE_SET: u16 = 48;
    pub const CACHE_GET: u16 = 49;
    /// Where the server listens on its own host (capability `SAME_HOST`).
    pub const LOCAL_ADDR: u16 = 50;
    /// An open file's descriptor, passed over a Unix socket.
    pub const FILE_FD: u16 = 51;
    /// Names a caller (user, group, groups) for the requests that carry
    /// its slot in their header (capability `IDENTITY`).
    pub const CALLER: u16 = 52;
    /// Turns on leases for the session and names this connection the one
    /// its lease breaks come on (capability `LEASES`).
    pub const LEASE_ON: u16 = 53;
    /// The server's message that leases are broken (a notice: flags
    /// `FLAG_NOTIFY`, id 0, no request answered).
    pub const LEASE_BREAK: u16 = 54;
    /// The client's answer to a `LeaseBreak` (no reply comes back).
    pub const LEASE_RETURN: u16 = 55;
    /// Fences the client's earlier sessions on other gateways (capability
    /// `FENCE`).
    pub const SESSION_FENCE: u16 = 56;

    /// The operation's name (lower case, as in `PROTOCOL.md`), or
    /// `"unknown"`: for logs and metrics.
    pub fn name(op: u16) -> &'static str {
        match op {
            HELLO => "hello",
            AUTH => "auth",
            PING => "ping",
            OPEN => "open",
            CLOSE => "close",
            READ => "read",
            PREAD => "pread",
            WRITE => "write",
            PWRITE => "pwrite",
            SEEK => "seek",
            STAT => "stat",
            FSYNC => "fsync",
            TRUNCATE => "truncate",
            MKDIR => "mkdir",
            RMDIR => "rmdir",
            UNLINK => "unlink",
            RENAME => "rename",
            LINK => "link",
            SYMLINK => "symlink",
            READLINK => "readlink",
            CHMOD => "chmod",
            CHOWN => "chown",
            UTIMENS => "utimens",
            STATFS => "statfs",
            ACCESS => "access",
            GETXATTR => "getxattr",
            SETXATTR => "setxattr",
            LISTXATTR => "listxattr",
            REMOVEXATTR => "removexattr",
            READDIR => "readdir",
            MKNOD => "mknod",
            LOCK => "lock",
            GETLOCK => "getlock",
            SESSION_NEW => "session_new",
            SESSION_ATTACH => "session_attach",
            OPEN_ID => "open_id",
            REOPEN => "reopen",
            OPEN_READ => "open_read",
            LIST_DIR => "list_dir",
            SESSION_NEW_VOLATILE => "session_new_volatile",
            OPEN_CACHED => "open_cached",
            CACHE_SET => "cache_set",
            CACHE_GET => "cache_get",
            LOCAL_ADDR => "local_addr",
            FILE_FD => "file_fd",
            CALLER => "caller",
            LEASE_ON => "lease_on",
            LEASE_BREAK => "lease_break",
            LEASE_RETURN => "lease_return",
            SESSION_FENCE => "session_fence",
            _ => "unknown",
        }
    }
}

/// Cache policies stored on the server (capability `CACHING`).
pub mod cache {
    /// No setting (`CacheSet`: remove the setting).
    pub const NONE: u8 = 0;
    /// Clients may keep the file's data on their disk.
    pub const CACHE: u8 = 1;
    /// Clients read and write the file on the server only.
    pub const BYPASS: u8 = 2;
}

/// Record-lock constants of `Lock` and `GetLock` (capability `LOCKS`).
/// Types are the Linux `F_RDLCK`/`F_WRLCK`/`F_UNLCK` values.
pub mod lock {
    /// A POSIX (`fcntl` `F_SETLK`) lock, owned by the client-chosen `owner`
    /// (a process): not released by closing a handle.
    pub const POSIX: u8 = 0;
    /// An open-file-description lock, owned by the handle.
    pub const OFD: u8 = 1;
    /// A `flock` lock: a whole-file lock owned by the handle.
    pub const FLOCK: u8 = 2;
    pub const RDLCK: u8 = 0;
    pub const WRLCK: u8 = 1;
    pub const UNLCK: u8 = 2;
}

/// A request. Borrowed fields point into the frame body (server side) or the
/// caller's memory (client side); `Write`/`Pwrite` data is the frame's tail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    Hello {
        min_version: u16,
        max_version: u16,
        caps: u64,
        max_frame: u32,
        nonce: Nonce,
    },
    Auth {
        proof: [u8; 32],
    },
    Ping,
    /// `flags` and `mode` are Linux `open(2)` values.
    Open {
        path: &'a [u8],
        flags: u32,
        mode: u32,
    },
    /// `Open`, answered with `OpenedId`: the handle and the file's
    /// identity, which `Reopen` takes (capability `FILE_IDS`).
    OpenId {
        path: &'a [u8],
        flags: u32,
        mode: u32,
    },
    /// `OpenId` that also reads the first `max` bytes of a regular file,
    /// answered with `OpenedData` (capability `OPEN_READ`): a small file
    /// is opened and read in one round trip.
    OpenRead {
        path: &'a [u8],
        flags: u32,
        mode: u32,
        max: u32,
    },
    /// Opens again a file opened before, by the `id` an `OpenedId` gave
    /// and, where the server cannot use the id, by `path` if it still
    /// names the file (`dev`, `ino`). Another file or none: `ESTALE`.
    /// `flags` are the first open's, less `O_CREAT`, `O_EXCL`, `O_TRUNC`.
    Reopen {
        flags: u32,
        dev: u64,
        ino: u64,
        id: &'a [u8],
        path: &'a [u8],
    },
    /// `OpenRead` answered with `OpenedCached`: also the file's change
    /// attribute and the cache policy stored on the server for it
    /// (capability `CACHING`).
    OpenCached {
        path: &'a [u8],
        flags: u32,
        mode: u32,
        max: u32,
    },
    /// Stores a [`cache`] policy on `path` (a file, or a directory for
    /// everything below it); `cache::NONE` removes it.
    CacheSet {
        path: &'a [u8],
        policy: u8,
    },
    /// The policy in force for `path`, answered with `CachePolicy`.
    CacheGet {
        path: &'a [u8],
    },
    /// The server's Unix socket, answered with `LocalAddr`.
    LocalAddr,
    /// The descriptor of `handle`'s open file, passed with the `FileFd`
    /// reply (`SCM_RIGHTS`): only on a Unix connection, to a peer process
    /// of the server's user or root, for a regular file.
    FileFd {
        handle: u64,
    },
    Close {
        handle: u64,
    },
    /// Read at the handle's own offset (shared by everyone using the handle).
    Read {
        handle: u64,
        count: u32,
    },
    Pread {
        handle: u64,
        offset: u64,
        count: u32,
    },
    Write {
        handle: u64,
        data: &'a [u8],
    },
    Pwrite {
        handle: u64,
        offset: u64,
        data: &'a [u8],
    },
    /// `whence` is `SEEK_SET`/`SEEK_CUR`/`SEEK_END` (0/1/2), or `SEEK_DATA`/`SEEK_HOLE`.
    Seek {
        handle: u64,
        offset: i64,
        whence: u32,
    },
    Stat {
        target: Target<'a>,
    },
    Fsync {
        handle: u64,
        datasync: bool,
    },
    Truncate {
        target: Target<'a>,
        size: u64,
    },
    Mkdir {
        path: &'a [u8],
        mode: u32,
    },
    Rmdir {
        path: &'a [u8],
    },
    Unlink {
        path: &'a [u8],
    },
    /// `flags`: `RENAME_NOREPLACE` (1), `RENAME_EXCHANGE` (2).
    Rename {
        from: &'a [u8],
        to: &'a [u8],
        flags: u32,
    },
    Link {
        from: &'a [u8],
        to: &'a [u8],
    },
    /// `mknod(2)`: `mode` carries the file type (`S_IFIFO`, `S_IFSOCK`,
    /// `S_IFCHR`, `S_IFBLK`, `S_IFREG`) and permission bits.
    Mknod {
        path: &'a [u8],
        mode: u32,
        rdev: u64,
    },
    Symlink {
        target: &'a [u8],
        path: &'a [u8],
    },
    Readlink {
        path: &'a [u8],
    },
    Chmod {
        target: Target<'a>,
        mode: u32,
    },
    /// `u32::MAX` leaves the id unchanged, as `-1` does for `chown(2)`.
    Chown {
        target: Target<'a>,
        uid: u32,
        gid: u32,
    },
    Utimens {
        target: Target<'a>,
        atime: Time,
        mtime: Time,
    },
    Statfs {
        path: &'a [u8],
    },
    /// `mode` is `F_OK` or a mask of `R_OK`/`W_OK`/`X_OK`.
    Access {
        path: &'a [u8],
        mode: u32,
    },
    /// `size` 0 asks only for the value's length, as `getxattr(2)` does.
    GetXattr {
        target: Target<'a>,
        name: &'a [u8],
        size: u32,
    },
    /// `flags`: `XATTR_CREATE` (1), `XATTR_REPLACE` (2).
    SetXattr {
        target: Target<'a>,
        name: &'a [u8],
        value: &'a [u8],
        flags: u32,
    },
    ListXattr {
        target: Target<'a>,
        size: u32,
    },
    RemoveXattr {
        target: Target<'a>,
        name: &'a [u8],
    },
    /// Batched directory read from `cookie` (0 = start) on a handle opened with
    /// `O_DIRECTORY`; `plus` asks for attributes with each entry.
    ReadDir {
        handle: u64,
        cookie: u64,
        max_entries: u32,
        plus: bool,
    },
    /// A directory's entries by path, from the start, without a handle
    /// (capability `LIST_DIR`): a directory that fits in `max_entries` is
    /// listed in one round trip (`eof` set); a longer one is read with
    /// `Open` and `ReadDir`.
    ListDir {
        path: &'a [u8],
        max_entries: u32,
        plus: bool,
    },
    /// Takes, changes or releases a record lock without waiting: a conflict
    /// is `EAGAIN`. `len` 0 means "to the end of the file, however long";
    /// `kind` and `typ` are [`lock`] constants; `pid` is what `GetLock`
    /// reports to others as the holder.
    Lock {
        handle: u64,
        owner: u64,
        start: u64,
        len: u64,
        pid: u32,
        kind: u8,
        typ: u8,
    },
    /// `F_GETLK`: the first lock that would conflict with this one.
    GetLock {
        handle: u64,
        owner: u64,
        start: u64,
        len: u64,
        pid: u32,
        kind: u8,
        typ: u8,
    },
    /// Makes the connection's state a session that outlives it for the
    /// lease (capability `SESSIONS`); answered with `Session`.
    SessionNew,
    /// `SessionNew` for a session whose handles, offsets and locks end
    /// with its last connection, as without a session; only its reply
    /// cache outlives it, for the lease (capabilities `SESSIONS` and
    /// `REPLAY`): for a client whose locks must not outlive a killed
    /// process (`ferry run`), which opens its files again after any
    /// reconnect anyway.
    SessionNewVolatile,
    /// Names the caller of the session's requests whose header `flags` are
    /// `slot` (1 or more; capability `IDENTITY`): the server acts for them
    /// as this user, mapped and squashed by its policy. `groups` are the
    /// supplementary group ids, each a little-endian u32 (see
    /// [`caller_groups`]). Naming a slot again replaces it.
    Caller {
        slot: u16,
        uid: u32,
        gid: u32,
        groups: &'a [u8],
    },
    /// Turns leases on for the session (capability `LEASES`): from now on
    /// the replies that carry attributes or entries promise them until a
    /// `LeaseBreak`, which comes on this connection. Answered with
    /// `Reply::LeaseTime`.
    LeaseOn,
    /// The client dropped what a `LeaseBreak` numbered `seq` named. Never
    /// answered (its header `id` is 0).
    LeaseReturn {
        seq: u64,
    },
    /// Joins this connection to an existing session: its handles, offsets
    /// and locks become this connection's too. `proof` is
    /// [`attach_proof`](crate::attach_proof) of the session's secret.
    SessionAttach {
        id: u64,
        proof: [u8; 32],
    },
    /// Names this connection's session the client's `epoch`-th (capability
    /// `FENCE`): the gateway raises the fence record of `owner` (a secret
    /// the client drew; the record is named by its hash) on the shared
    /// volume to `epoch`, and every gateway refuses requests of a session
    /// of `owner` with a lower epoch from then on. `ESTALE` if the record is
    /// past `epoch` already.
    SessionFence {
        owner: [u8; 32],
        epoch: u64,
    },
}

/// Most supplementary groups a `Caller` names (Linux's `NGROUPS_MAX`).
pub const MAX_GROUPS: usize = 65536;

/// The group ids of a `Caller` request's `groups` field.
pub fn caller_groups(raw: &[u8]) -> impl Iterator<Item = u32> + '_ {
    raw.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// Group ids as a `Caller` request carries them.
pub fn encode_groups(groups: &[u32]) -> Vec<u8> {
    groups.iter().flat_map(|g| g.to_le_bytes()).collect()
}

/// Linux's `O_EXCL` (the protocol carries Linux open flags).
const EXCL: u32 = 0o200;

impl<'a> Request<'a> {
    /// The open handle the request names, if any.
    pub fn handle(&self) -> Option<u64> {
        match *self {
            Request::Close { handle }
            | Request::Read { handle, .. }
            | Request::Write { handle, .. }
            | Request::Pread { handle, .. }
            | Request::Pwrite { handle, .. }
            | Request::Seek { handle, .. }
            | Request::Fsync { handle, .. }
            | Request::ReadDir { handle, .. }
            | Request::Lock { handle, .. }
            | Request::GetLock { handle, .. }
            | Request::FileFd { handle } => Some(handle),
            Request::Stat { target }
            | Request::Truncate { target, .. }
            | Request::Chmod { target, .. }
            | Request::Chown { target, .. }
            | Request::Utimens { target, .. }
            | Request::GetXattr { target, .. }
            | Request::SetXattr { target, .. }
            | Request::ListXattr { target, .. }
            | Request::RemoveXattr { target, .. } => match target {
                Target::Handle(h) => Some(h),
                Target::Path(_) | Target::PathNoFollow(_) => None,
            },
            _ => None,
        }
    }

    /// Requests that change the name space and must therefore run at most
    /// once: the ones a `REPLAY` server answers from its reply cache when a
    /// client sends them again with the same id (see `caps::REPLAY`).
    /// (`Read`, `Write` and `Seek` at a handle's offset must not run twice
    /// either, but their data is not kept: a client retries them only if
    /// they never left.)
    pub fn once_only(&self) -> bool {
        match self {
            Request::Mkdir { .. }
            | Request::Rmdir { .. }
            | Request::Unlink { .. }
            | Request::Rename { .. }
            | Request::Link { .. }
            | Request::Symlink { .. }
            | Request::Mknod { .. } => true,
            Request::Open { flags, .. }
            | Request::OpenId { flags, .. }
            | Request::OpenRead { flags, .. }
            | Request::OpenCached { flags, .. } => flags & EXCL != 0,
            _ => false,
        }
    }

    pub fn op(&self) -> u16 {
        match self {
            Request::Hello { .. } => op::HELLO,
            Request::Auth { .. } => op::AUTH,
            Request::Ping => op::PING,
            Request::Open { .. } => op::OPEN,
            Request::OpenId { .. } => op::OPEN_ID,
            Request::OpenRead { .. } => op::OPEN_READ,
            Request::Reopen { .. } => op::REOPEN,
            Request::OpenCached { .. } => op::OPEN_CACHED,
            Request::CacheSet { .. } => op::CACHE_SET,
            Request::CacheGet { .. } => op::CACHE_GET,
            Request::LocalAddr => op::LOCAL_ADDR,
            Request::FileFd { .. } => op::FILE_FD,
            Request::Close { .. } => op::CLOSE,
            Request::Read { .. } => op::READ,
            Request::Pread { .. } => op::PREAD,
            Request::Write { .. } => op::WRITE,
            Request::Pwrite { .. } => op::PWRITE,
            Request::Seek { .. } => op::SEEK,
            Request::Stat { .. } => op::STAT,
            Request::Fsync { .. } => op::FSYNC,
            Request::Truncate { .. } => op::TRUNCATE,
            Request::Mkdir { .. } => op::MKDIR,
            Request::Rmdir { .. } => op::RMDIR,
            Request::Unlink { .. } => op::UNLINK,
            Request::Rename { .. } => op::RENAME,
            Request::Link { .. } => op::LINK,
            Request::Symlink { .. } => op::SYMLINK,
            Request::Mknod { .. } => op::MKNOD,
            Request::Readlink { .. } => op::READLINK,
            Request::Chmod { .. } => op::CHMOD,
            Request::Chown { .. } => op::CHOWN,
            Request::Utimens { .. } => op::UTIMENS,
            Request::Statfs { .. } => op::STATFS,
            Request::Access { .. } => op::ACCESS,
            Request::GetXattr { .. } => op::GETXATTR,
            Request::SetXattr { .. } => op::SETXATTR,
            Request::ListXattr { .. } => op::LISTXATTR,
            Request::RemoveXattr { .. } => op::REMOVEXATTR,
            Request::ReadDir { .. } => op::READDIR,
            Request::ListDir { .. } => op::LIST_DIR,
            Request::Lock { .. } => op::LOCK,
            Request::GetLock { .. } => op::GETLOCK,
            Request::SessionNew => op::SESSION_NEW,
            Request::SessionNewVolatile => op::SESSION_NEW_VOLATILE,
            Request::SessionAttach { .. } => op::SESSION_ATTACH,
            Request::SessionFence { .. } => op::SESSION_FENCE,
            Request::Caller { .. } => op::CALLER,
            Request::LeaseOn => op::LEASE_ON,
            Request::LeaseReturn { .. } => op::LEASE_RETURN,
        }
    }

    /// The raw bulk tail, sent after the encoded fixed part.
    pub fn bulk(&self) -> &'a [u8] {
        match self {
            Request::Write { data, .. } | Request::Pwrite { data, .. } => data,
            _ => &[],
        }
    }

    /// Appends header and fixed fields to `out` (not the bulk tail, which the
    /// caller sends from its own buffer). The header's `len` counts both.
    pub fn encode(&self, id: u64, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0u8; HEADER_LEN]);
        let mut w = Writer { out };
        self.put_fields(&mut w);
        let body = out.len() - start - HEADER_LEN + self.bulk().len();
        let h = Header { len: u32::try_from(body).expect("frame over 4 GiB"), op: self.op(), flags: 0, id };
        out[start..start + HEADER_LEN].copy_from_slice(&h.encode());
    }

    fn put_fields(&self, w: &mut Writer) {
        match self {
            Request::Hello { min_version, max_version, caps, max_frame, nonce } => {
                w.u32(MAGIC);
                w.u16(*min_version);
                w.u16(*max_version);
                w.u64(*caps);
                w.u32(*max_frame);
                w.raw(nonce);
            }
            Request::Auth { proof } => w.raw(proof),
            Request::Ping
            | Request::SessionNew
            | Request::SessionNewVolatile
            | Request::LocalAddr
            | Request::LeaseOn => {}
            Request::LeaseReturn { seq } => w.u64(*seq),
            Request::FileFd { handle } => w.u64(*handle),
            Request::Caller { slot, uid, gid, groups } => {
                w.u16(*slot);
                w.u32(*uid);
                w.u32(*gid);
                w.bytes(groups);
            }
            Request::SessionAttach { id, proof } => {
                w.u64(*id);
                w.raw(proof);
            }
            Request::SessionFence { owner, epoch } => {
                w.raw(owner);
                w.u64(*epoch);
            }
            Request::Open { path, flags, mode } | Request::OpenId { path, flags, mode } => {
                w.u32(*flags);
                w.u32(*mode);
                w.name(path);
            }
            Request::OpenRead { path, flags, mode, max } | Request::OpenCached { path, flags, mode, max } => {
                w.u32(*flags);
                w.u32(*mode);
                w.u32(*max);
                w.name(path);
            }
            Request::Reopen { flags, dev, ino, id, path } => {
                w.u32(*flags);
                w.u64(*dev);
                w.u64(*ino);
                w.bytes(id);
                w.name(path);
            }
            Request::CacheSet { path, policy } => {
                w.u8(*policy);
                w.name(path);
            }
            Request::CacheGet { path } => w.name(path),
            Request::Close { handle } => w.u64(*handle),
            Request::Read { handle, count } => {
                w.u64(*handle);
                w.u32(*count);
            }
            Request::Pread { handle, offset, count } => {
                w.u64(*handle);
                w.u64(*offset);
                w.u32(*count);
            }
            Request::Write { handle, .. } => w.u64(*handle),
            Request::Pwrite { handle, offset, .. } => {
                w.u64(*handle);
                w.u64(*offset);
            }
            Request::Seek { handle, offset, whence } => {
                w.u64(*handle);
                w.i64(*offset);
                w.u32(*whence);
            }
            Request::Stat { target } => target.put(w),
            Request::Fsync { handle, datasync } => {
                w.u64(*handle);
                w.bool(*datasync);
            }
            Request::Truncate { target, size } => {
                w.u64(*size);
                target.put(w);
            }
            Request::Mkdir { path, mode } => {
                w.u32(*mode);
                w.name(path);
            }
            Request::Rmdir { path }
            | Request::Unlink { path }
            | Request::Readlink { path }
            | Request::Statfs { path } => w.name(path),
            Request::Rename { from, to, flags } => {
                w.u32(*flags);
                w.name(from);
                w.name(to);
            }
            Request::Link { from, to } => {
                w.name(from);
                w.name(to);
            }
            Request::Mknod { path, mode, rdev } => {
                w.u32(*mode);
                w.u64(*rdev);
                w.name(path);
            }
            Request::Symlink { target, path } => {
                w.name(target);
                w.name(path);
            }
            Request::Chmod { target, mode } => {
                w.u32(*mode);
                target.put(w);
            }
            Request::Chown { target, uid, gid } => {
                w.u32(*uid);
                w.u32(*gid);
                target.put(w);
            }
            Request::Utimens { target, atime, mtime } => {
                atime.put(w);
                mtime.put(w);
                target.put(w);
            }
            Request::Access { path, mode } => {
                w.u32(*mode);
                w.name(path);
            }
            Request::GetXattr { target, name, size } => {
                w.u32(*size);
                target.put(w);
                w.name(name);
            }
            Request::SetXattr { target, name, value, flags } => {
                w.u32(*flags);
                target.put(w);
                w.name(name);
                w.bytes(value);
            }
            Request::ListXattr { target, size } => {
                w.u32(*size);
                target.put(w);
            }
            Request::RemoveXattr { target, name } => {
                target.put(w);
                w.name(name);
            }
            Request::ReadDir { handle, cookie, max_entries, plus } => {
                w.u64(*handle);
                w.u64(*cookie);
                w.u32(*max_entries);
                w.bool(*plus);
            }
            Request::ListDir { path, max_entries, plus } => {
                w.u32(*max_entries);
                w.bool(*plus);
                w.name(path);
            }
            Request::Lock { handle, owner, start, len, pid, kind, typ }
            | Request::GetLock { handle, owner, start, len, pid, kind, typ } => {
                w.u64(*handle);
                w.u64(*owner);
                w.u64(*start);
                w.u64(*len);
                w.u32(*pid);
                w.u8(*kind);
                w.u8(*typ);
            }
        }
    }

    /// Decodes a request body for operation `op`. Never panics on any input.
    pub fn decode(op: u16, body: &'a [u8]) -> Result<Request<'a>, DecodeError> {
        let mut r = Reader::new(body);
        let req = match op {
            op::HELLO => {
                if r.u32("hello.magic")? != MAGIC {
                    return Err(DecodeError::Invalid("hello.magic"));
                }
                Request::Hello {
                    min_version: r.u16("hello.min_version")?,
                    max_version: r.u16("hello.max_version")?,
                    caps: r.u64("hello.caps")?,
                    max_frame: r.u32("hello.max_frame")?,
                    nonce: r.array32("hello.nonce")?,
                }
            }
            op::AUTH => Request::Auth { proof: r.array32("auth.proof")? },
            op::PING => Request::Ping,
            op::OPEN | op::OPEN_ID => {
                let flags = r.u32("open.flags")?;
                let mode = r.u32("open.mode")?;
                let path = r.name("open.path")?;
                if op == op::OPEN {
                    Request::Open { path, flags, mode }
                } else {
                    Request::OpenId { path, flags, mode }
                }
            }
            op::OPEN_CACHED => Request::OpenCached {
                flags: r.u32("open_cached.flags")?,
                mode: r.u32("open_cached.mode")?,
                max: r.u32("open_cached.max")?,
                path: r.name("open_cached.path")?,
            },
            op::CACHE_SET => {
                let policy = r.u8("cache_set.policy")?;
                if policy > cache::BYPASS {
                    return Err(DecodeError::Invalid("cache_set.policy"));
                }
                Request::CacheSet { policy, path: r.name("cache_set.path")? }
            }
            op::CACHE_GET => Request::CacheGet { path: r.name("cache_get.path")? },
            op::LOCAL_ADDR => Request::LocalAddr,
            op::LEASE_ON => Request::LeaseOn,
            op::LEASE_RETURN => Request::LeaseReturn { seq: r.u64("lease_return.seq")? },
            op::FILE_FD => Request::FileFd { handle: r.u64("file_fd.handle")? },
            op::CALLER => {
                let slot = r.u16("caller.slot")?;
                let uid = r.u32("caller.uid")?;
                let gid = r.u32("caller.gid")?;
                let groups = r.bytes("caller.groups")?;
                if slot == 0 || groups.len() % 4 != 0 || groups.len() > 4 * MAX_GROUPS {
                    return Err(DecodeError::Invalid("caller"));
                }
                Request::Caller { slot, uid, gid, groups }
            }
            op::OPEN_READ => Request::OpenRead {
                flags: r.u32("open_read.flags")?,
                mode: r.u32("open_read.mode")?,
                max: r.u32("open_read.max")?,
                path: r.name("open_read.path")?,
            },
            op::REOPEN => Request::Reopen {
                flags: r.u32("reopen.flags")?,
                dev: r.u64("reopen.dev")?,
                ino: r.u64("reopen.ino")?,
                id: r.bytes("reopen.id")?,
                path: r.name("reopen.path")?,
            },
            op::CLOSE => Request::Close { handle: r.u64("close.handle")? },
            op::READ => Request::Read { handle: r.u64("read.handle")?, count: r.u32("read.count")? },
            op::PREAD => Request::Pread {
                handle: r.u64("pread.handle")?,
                offset: r.u64("pread.offset")?,
                count: r.u32("pread.count")?,
            },
            op::WRITE => Request::Write { handle: r.u64("write.handle")?, data: r.rest() },
            op::PWRITE => {
                Request::Pwrite { handle: r.u64("pwrite.handle")?, offset: r.u64("pwrite.offset")?, data: r.rest() }
            }
            op::SEEK => Request::Seek {
                handle: r.u64("seek.handle")?,
                offset: r.i64("seek.offset")?,
                whence: r.u32("seek.whence")?,
            },
            op::STAT => Request::Stat { target: Target::get(&mut r)? },
            op::FSYNC => Request::Fsync { handle: r.u64("fsync.handle")?, datasync: r.bool("fsync.datasync")? },
            op::TRUNCATE => {
                let size = r.u64("truncate.size")?;
                Request::Truncate { target: Target::get(&mut r)?, size }
            }
            op::MKDIR => {
                let mode = r.u32("mkdir.mode")?;
                Request::Mkdir { path: r.name("mkdir.path")?, mode }
            }
            op::RMDIR => Request::Rmdir { path: r.name("rmdir.path")? },
            op::UNLINK => Request::Unlink { path: r.name("unlink.path")? },
            op::READLINK => Request::Readlink { path: r.name("readlink.path")? },
            op::STATFS => Request::Statfs { path: r.name("statfs.path")? },
            op::RENAME => {
                let flags = r.u32("rename.flags")?;
                Request::Rename { from: r.name("rename.from")?, to: r.name("rename.to")?, flags }
            }
            op::LINK => Request::Link { from: r.name("link.from")?, to: r.name("link.to")? },
            op::MKNOD => {
                let mode = r.u32("mknod.mode")?;
                let rdev = r.u64("mknod.rdev")?;
                Request::Mknod { path: r.name("mknod.path")?, mode, rdev }
            }
            op::SYMLINK => Request::Symlink { target: r.name("symlink.target")?, path: r.name("symlink.path")? },
            op::CHMOD => {
                let mode = r.u32("chmod.mode")?;
                Request::Chmod { target: Target::get(&mut r)?, mode }
            }
            op::CHOWN => {
                let uid = r.u32("chown.uid")?;
                let gid = r.u32("chown.gid")?;
                Request::Chown { target: Target::get(&mut r)?, uid, gid }
            }
            op::UTIMENS => {
                let atime = Time::get(&mut r)?;
                let mtime = Time::get(&mut r)?;
                Request::Utimens { target: Target::get(&mut r)?, atime, mtime }
            }
            op::ACCESS => {
                let mode = r.u32("access.mode")?;
                Request::Access { path: r.name("access.path")?, mode }
            }
            op::GETXATTR => {
                let size = r.u32("getxattr.size")?;
                let target = Target::get(&mut r)?;
                Request::GetXattr { target, name: r.name("getxattr.name")?, size }
            }
            op::SETXATTR => {
                let flags = r.u32("setxattr.flags")?;
                let target = Target::get(&mut r)?;
                let name = r.name("setxattr.name")?;
                Request::SetXattr { target, name, value: r.bytes("setxattr.value")?, flags }
            }
            op::LISTXATTR => {
                let size = r.u32("listxattr.size")?;
                Request::ListXattr { target: Target::get(&mut r)?, size }
            }
            op::REMOVEXATTR => {
                let target = Target::get(&mut r)?;
                Request::RemoveXattr { target, name: r.name("removexattr.name")? }
            }
            op::READDIR => Request::ReadDir {
                handle: r.u64("readdir.handle")?,
                cookie: r.u64("readdir.cookie")?,
                max_entries: r.u32("readdir.max_entries")?,
                plus: r.bool("readdir.plus")?,
            },
            op::LIST_DIR => Request::ListDir {
                max_entries: r.u32("list_dir.max_entries")?,
                plus: r.bool("list_dir.plus")?,
                path: r.name("list_dir.path")?,
            },
            op::SESSION_NEW => Request::SessionNew,
            op::SESSION_NEW_VOLATILE => Request::SessionNewVolatile,
            op::SESSION_ATTACH => {
                Request::SessionAttach { id: r.u64("session_attach.id")?, proof: r.array32("session_attach.proof")? }
            }
            op::SESSION_FENCE => {
                Request::SessionFence { owner: r.array32("session_fence.owner")?, epoch: r.u64("session_fence.epoch")? }
            }
            op::LOCK | op::GETLOCK => {
                let handle = r.u64("lock.handle")?;
                let owner = r.u64("lock.owner")?;
                let start = r.u64("lock.start")?;
                let len = r.u64("lock.len")?;
                let pid = r.u32("lock.pid")?;
                let kind = r.u8("lock.kind")?;
                if kind > lock::FLOCK {
                    return Err(DecodeError::Invalid("lock.kind"));
                }
                let typ = r.u8("lock.type")?;
                // GetLock asks about a read or write lock, never an unlock.
                if typ > lock::UNLCK || (op == op::GETLOCK && typ == lock::UNLCK) {
                    return Err(DecodeError::Invalid("lock.type"));
                }
                if op == op::LOCK {
                    Request::Lock { handle, owner, start, len, pid, kind, typ }
                } else {
                    Request::GetLock { handle, owner, start, len, pid, kind, typ }
                }
            }
            other => return Err(DecodeError::UnknownOp(other)),
        };
        r.finish("request")?;
        Ok(req)
    }
}

/// The server's answer to `Hello`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    pub version: u16,
    /// Intersection of both sides' capabilities.
    pub caps: u64,
    /// Largest frame body the server accepts.
    pub max_frame: u32,
    /// Credit window: requests a client may have outstanding.
    pub window_requests: u32,
    /// Credit window: request plus reply bytes a client may have outstanding.
    pub window_bytes: u64,
    /// Random per server start; a change tells a reconnecting client that
    /// unstable writes must be resent (as the NFSv3 write verifier).
    pub boot_id: u64,
    pub nonce: Nonce,
    pub auth_required: bool,
}

/// A successful reply. `Data` is the raw body of a read reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply<'a> {
    Welcome(Welcome),
    AuthOk {
        proof: [u8; 32],
    },
    Empty,
    Opened {
        handle: u64,
        attr: Attr,
    },
    /// Answer to `OpenId` and `Reopen`. `id` is opaque to the client and
    /// may be empty (the server has no lasting identity for the file).
    OpenedId {
        handle: u64,
        attr: Attr,
        id: &'a [u8],
    },
    /// Answer to `OpenRead`: `OpenedId` plus the file's first bytes (all of
    /// it when `data` is shorter than the `max` asked; none for a file
    /// that is not regular).
    OpenedData {
        handle: u64,
        attr: Attr,
        id: &'a [u8],
        data: &'a [u8],
    },
    /// Answer to `OpenCached`: `OpenedData` plus the file's change attribute
    /// (equal values mean equal data: a different value after any change
    /// made through the server or on its disk) and the policy stored on the
    /// server for it or a directory above it (`from`: where; empty with
    /// `cache::NONE`).
    OpenedCached {
        handle: u64,
        attr: Attr,
        id: &'a [u8],
        change: u64,
        policy: u8,
        from: &'a [u8],
        data: &'a [u8],
    },
    /// Answer to `LocalAddr`: the server's Unix socket address (`unix:PATH`
    /// or `unix:@NAME`) and its process id, which a client connected to it
    /// finds in the socket's peer credentials: the proof that both ends of
    /// the two connections are one server on one host.
    LocalAddr {
        pid: u32,
        addr: &'a [u8],
    },
    /// Answer to `FileFd`: the descriptor came with this reply's first
    /// byte, the `seq`-th (from 0) passed on this connection; `writable`:
    /// opened for writing.
    FileFd {
        seq: u64,
        writable: bool,
    },
    /// Answer to `CacheGet`.
    CachePolicy {
        policy: u8,
        from: &'a [u8],
    },
    Data(&'a [u8]),
    Written {
        count: u32,
    },
    Offset {
        offset: u64,
    },
    Attr(Attr),
    Name(&'a [u8]),
    StatFs(StatFs),
    /// `size` is the value's full length; `value` is empty when only the
    /// length was asked for.
    Xattr {
        size: u32,
        value: &'a [u8],
    },
    Dir {
        eof: bool,
        entries: Vec<DirEntry>,
    },
    /// Answer to `SessionNew` and `SessionAttach`: the session's id and how
    /// long it outlives its last connection.
    Session {
        id: u64,
        lease_ms: u32,
    },
    /// Answer to `LeaseOn`: how long a lease holds after the request that
    /// renewed it was sent, unless broken sooner. A client that has not
    /// heard from the server for this long drops what it holds.
    LeaseTime {
        ms: u32,
    },
    /// Answer to `GetLock`: the conflicting lock, or `typ` = `UNLCK` (and
    /// zeros) when there is none. `len` 0 reaches the end of the file.
    Lock {
        typ: u8,
        start: u64,
        len: u64,
        pid: u32,
    },
}

/// An error reply: a Linux errno and a short message for humans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorReply<'a> {
    pub errno: u32,
    pub message: &'a str,
}

impl<'a> Reply<'a> {
    /// Appends a complete reply frame to `out` for request `id` of operation
    /// `op`. For `Data`, only the header is written: the caller sends the
    /// data (or `sendfile`s it) right after.
    pub fn encode(&self, op: u16, id: u64, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0u8; HEADER_LEN]);
        let mut w = Writer { out };
        let bulk = self.put_fields(&mut w);
        let body = out.len() - start - HEADER_LEN + bulk;
        let h = Header { len: u32::try_from(body).expect("frame over 4 GiB"), op, flags: 0, id };
        out[start..start + HEADER_LEN].copy_from_slice(&h.encode());
    }

    /// Writes fields; returns the length of a bulk tail the caller sends.
    fn put_fields(&self, w: &mut Writer) -> usize {
        match self {
            Reply::Welcome(x) => {
                w.u16(x.version);
                w.u64(x.caps);
                w.u32(x.max_frame);
                w.u32(x.window_requests);
                w.u64(x.window_bytes);
                w.u64(x.boot_id);
                w.raw(&x.nonce);
                w.bool(x.auth_required);
            }
            Reply::AuthOk { proof } => w.raw(proof),
            Reply::Empty => {}
            Reply::Opened { handle, attr } => {
                w.u64(*handle);
                attr.put(w);
            }
            Reply::OpenedId { handle, attr, id } => {
                w.u64(*handle);
                attr.put(w);
                w.bytes(id);
            }
            Reply::OpenedData { handle, attr, id, data } => {
                w.u64(*handle);
                attr.put(w);
                w.bytes(id);
                w.raw(data);
            }
            Reply::OpenedCached { handle, attr, id, change, policy, from, data } => {
                w.u64(*handle);
                attr.put(w);
                w.bytes(id);
                w.u64(*change);
                w.u8(*policy);
                w.name(from);
                w.raw(data);
            }
            Reply::CachePolicy { policy, from } => {
                w.u8(*policy);
                w.name(from);
            }
            Reply::LocalAddr { pid, addr } => {
                w.u32(*pid);
                w.name(addr);
            }
            Reply::FileFd { seq, writable } => {
                w.u64(*seq);
                w.bool(*writable);
            }
            Reply::Data(d) => return d.len(),
            Reply::Written { count } => w.u32(*count),
            Reply::Offset { offset } => w.u64(*offset),
            Reply::Attr(a) => a.put(w),
            Reply::Name(n) => w.name(n),
            Reply::StatFs(s) => s.put(w),
            Reply::Xattr { size, value } => {
                w.u32(*size);
                w.bytes(value);
            }
            Reply::Dir { eof, entries } => {
                w.bool(*eof);
                w.u32(u32::try_from(entries.len()).expect("entry count"));
                for e in entries {
                    e.put(w);
                }
            }
            Reply::Session { id, lease_ms } => {
                w.u64(*id);
                w.u32(*lease_ms);
            }
            Reply::LeaseTime { ms } => w.u32(*ms),
            Reply::Lock { typ, start, len, pid } => {
                w.u8(*typ);
                w.u64(*start);
                w.u64(*len);
                w.u32(*pid);
            }
        }
        0
    }

    /// Decodes a successful reply body to a request of operation `op`.
    pub fn decode(op: u16, body: &'a [u8]) -> Result<Reply<'a>, DecodeError> {
        let mut r = Reader::new(body);
        let reply = match op {
            op::HELLO => Reply::Welcome(Welcome {
                version: r.u16("welcome.version")?,
                caps: r.u64("welcome.caps")?,
                max_frame: r.u32("welcome.max_frame")?,
                window_requests: r.u32("welcome.window_requests")?,
                window_bytes: r.u64("welcome.window_bytes")?,
                boot_id: r.u64("welcome.boot_id")?,
                nonce: r.array32("welcome.nonce")?,
                auth_required: r.bool("welcome.auth_required")?,
            }),
            op::AUTH => Reply::AuthOk { proof: r.array32("auth_ok.proof")? },
            op::OPEN => Reply::Opened { handle: r.u64("opened.handle")?, attr: Attr::get(&mut r)? },
            op::OPEN_ID | op::REOPEN => {
                Reply::OpenedId { handle: r.u64("opened.handle")?, attr: Attr::get(&mut r)?, id: r.bytes("opened.id")? }
            }
            op::OPEN_READ => Reply::OpenedData {
                handle: r.u64("opened.handle")?,
                attr: Attr::get(&mut r)?,
                id: r.bytes("opened.id")?,
                data: r.rest(),
            },
            op::OPEN_CACHED => Reply::OpenedCached {
                handle: r.u64("opened.handle")?,
                attr: Attr::get(&mut r)?,
                id: r.bytes("opened.id")?,
                change: r.u64("opened.change")?,
                policy: cache_policy(&mut r)?,
                from: r.name("opened.from")?,
                data: r.rest(),
            },
            op::CACHE_GET => Reply::CachePolicy { policy: cache_policy(&mut r)?, from: r.name("cache.from")? },
            op::LOCAL_ADDR => Reply::LocalAddr { pid: r.u32("local_addr.pid")?, addr: r.name("local_addr.addr")? },
            op::FILE_FD => Reply::FileFd { seq: r.u64("file_fd.seq")?, writable: r.bool("file_fd.writable")? },
            op::READ | op::PREAD => Reply::Data(r.rest()),
            op::WRITE | op::PWRITE => Reply::Written { count: r.u32("written.count")? },
            op::SEEK => Reply::Offset { offset: r.u64("offset")? },
            op::STAT
            | op::TRUNCATE
            | op::MKDIR
            | op::LINK
            | op::SYMLINK
            | op::CHMOD
            | op::CHOWN
            | op::UTIMENS
            | op::MKNOD => Reply::Attr(Attr::get(&mut r)?),
            op::READLINK => Reply::Name(r.name("readlink.target")?),
            op::STATFS => Reply::StatFs(StatFs::get(&mut r)?),
            op::GETXATTR | op::LISTXATTR => Reply::Xattr { size: r.u32("xattr.size")?, value: r.bytes("xattr.value")? },
            op::READDIR | op::LIST_DIR => {
                let eof = r.bool("dir.eof")?;
                let n = r.u32("dir.count")?;
                // Each entry is at least 20 bytes: bound the allocation by the body.
                let mut entries = Vec::with_capacity((n as usize).min(body.len() / 20));
                for _ in 0..n {
                    entries.push(DirEntry::get(&mut r)?);
                }
                Reply::Dir { eof, entries }
            }
            op::PING
            | op::CLOSE
            | op::FSYNC
            | op::RMDIR
            | op::UNLINK
            | op::RENAME
            | op::ACCESS
            | op::SETXATTR
            | op::REMOVEXATTR
            | op::CACHE_SET
            | op::LOCK
            | op::CALLER
            | op::SESSION_FENCE => Reply::Empty,
            op::LEASE_ON => Reply::LeaseTime { ms: r.u32("lease_time.ms")? },
            op::SESSION_NEW | op::SESSION_NEW_VOLATILE | op::SESSION_ATTACH => {
                Reply::Session { id: r.u64("session.id")?, lease_ms: r.u32("session.lease_ms")? }
            }
            op::GETLOCK => {
                let typ = r.u8("lock.type")?;
                if typ > lock::UNLCK {
                    return Err(DecodeError::Invalid("lock.type"));
                }
                Reply::Lock { typ, start: r.u64("lock.start")?, len: r.u64("lock.len")?, pid: r.u32("lock.pid")? }
            }
            other => return Err(DecodeError::UnknownOp(other)),
        };
        r.finish("reply")?;
        Ok(reply)
    }
}

impl<'a> ErrorReply<'a> {
    pub fn encode(&self, op: u16, id: u64, out: &mut Vec<u8>) {
        let msg = truncate_utf8(self.message, 1024);
        let body = 4 + 2 + msg.len();
        let h = Header { len: body as u32, op, flags: FLAG_ERROR, id };
        out.extend_from_slice(&h.encode());
        let mut w = Writer { out };
        w.u32(self.errno);
        w.str(msg);
    }

    pub fn decode(body: &'a [u8]) -> Result<ErrorReply<'a>, DecodeError> {
        let mut r = Reader::new(body);
        let e = ErrorReply { errno: r.u32("error.errno")?, message: r.str("error.message")? };
        r.finish("error")?;
        Ok(e)
    }
}

fn cache_policy(r: &mut Reader<'_>) -> Result<u8, DecodeError> {
    match r.u8("cache.policy")? {
        p @ 0..=cache::BYPASS => Ok(p),
        _ => Err(DecodeError::Invalid("cache.policy")),
    }
}

fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// One object a `LeaseBreak` takes back: a file's attributes and data, or
/// a directory's entries and their attributes; with `name`, only the entry
/// of that name in directory `(dev, ino)` (and what the client knows of
/// the directory itself). `(0, 0)` is every object: what the client keeps
/// by path is wrong (a directory or a symlink was renamed or removed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken<'a> {
    pub dev: u64,
    pub ino: u64,
    pub name: &'a [u8],
}

impl Broken<'_> {
    /// The break of everything a client holds.
    pub const ALL: Broken<'static> = Broken { dev: 0, ino: 0, name: b"" };

    pub fn is_all(&self) -> bool {
        self.dev == 0 && self.ino == 0
    }
}

/// The server's notice that leases are broken (capability `LEASES`): sent
/// on the connection that turned them on, header op `LEASE_BREAK`, flags
/// `FLAG_NOTIFY`, id 0. The client drops what it holds of each object, then
/// answers `LeaseReturn { seq }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseBreak<'a> {
    pub seq: u64,
    pub objects: Vec<Broken<'a>>,
}

impl<'a> LeaseBreak<'a> {
    /// Objects one notice carries at most (a change breaks a handful; a
    /// longer list goes as several notices).
    pub const MAX_OBJECTS: usize = 1024;

    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; HEADER_LEN]);
        let mut w = Writer { out };
        w.u64(self.seq);
        w.u32(u32::try_from(self.objects.len()).expect("object count"));
        for b in &self.objects {
            w.u64(b.dev);
            w.u64(b.ino);
            w.name(b.name);
        }
        let len = (out.len() - start - HEADER_LEN) as u32;
        let h = Header { len, op: op::LEASE_BREAK, flags: crate::frame::FLAG_NOTIFY, id: 0 };
        out[start..start + HEADER_LEN].copy_from_slice(&h.encode());
    }

    pub fn decode(body: &'a [u8]) -> Result<LeaseBreak<'a>, DecodeError> {
        let mut r = Reader::new(body);
        let seq = r.u64("lease_break.seq")?;
        let n = r.u32("lease_break.count")? as usize;
        if n > Self::MAX_OBJECTS {
            return Err(DecodeError::Invalid("lease_break.count"));
        }
        let mut objects = Vec::with_capacity(n);
        for _ in 0..n {
            let dev = r.u64("lease_break.dev")?;
            let ino = r.u64("lease_break.ino")?;
            let name = r.name("lease_break.name")?;
            objects.push(Broken { dev, ino, name });
        }
        r.finish("lease_break")?;
        Ok(LeaseBreak { seq, objects })
    }
}
