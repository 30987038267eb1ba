//! The ferry wire protocol, without I/O.
//!
//! Every frame is a 16-byte [`Header`] followed by `len` body bytes. Requests
//! and replies are typed messages ([`Request`], [`Reply`]); bulk data (file
//! contents of a write request or a read reply) is the raw tail of the body,
//! so drivers can send it from, and receive it into, the caller's buffer.
//! `PROTOCOL.md` at the repository root is the normative description.
#![forbid(unsafe_code)]

mod auth;
mod frame;
pub mod handshake;
mod limits;
mod msg;
mod types;
mod wire;

pub use auth::{attach_proof, client_proof, proofs_equal, server_proof, session_secret, Nonce};
pub use frame::{set_caller_slot, Header, FLAG_ERROR, FLAG_NOTIFY, HEADER_LEN};
pub use limits::{Limit, NAME_MAX, PATH_MAX, XATTR_NAME_MAX, XATTR_SIZE_MAX};
pub use msg::*;
pub use types::{Attr, DirEntry, StatFs, Target, Time, UTIME_NOW, UTIME_OMIT};

use std::fmt;

/// Why bytes from a peer could not be decoded. Distinguishes a short frame,
/// an out-of-range value, leftover bytes, an unknown operation and a frame
/// over the limit; each names the field.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    Short(&'static str),
    Invalid(&'static str),
    Trailing(&'static str),
    UnknownOp(u16),
    TooLarge { len: u32, max: u32 },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Short(w) => write!(f, "frame too short for {w}"),
            DecodeError::Invalid(w) => write!(f, "invalid value for {w}"),
            DecodeError::Trailing(w) => write!(f, "trailing bytes after {w}"),
            DecodeError::UnknownOp(op) => write!(f, "unknown operation {op}"),
            DecodeError::TooLarge { len, max } => {
                write!(f, "frame body of {len} bytes exceeds the limit of {max}")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// Protocol versions this implementation speaks.
pub const VERSION_MIN: u16 = 1;
pub const VERSION_MAX: u16 = 1;

/// Magic carried in `Hello` so a stray connection is recognised at once.
pub const MAGIC: u32 = u32::from_le_bytes(*b"FRRY");

/// Capability bits exchanged in the handshake; the session uses the
/// intersection. A missing bit degrades a feature, it never breaks one.
pub mod caps {
    /// `ReadDir` with `plus = true` returns attributes with each entry.
    pub const READDIRPLUS: u64 = 1 << 0;
    /// Extended attribute operations.
    pub const XATTR: u64 = 1 << 1;
    /// `Rename` flags (`RENAME_NOREPLACE`, `RENAME_EXCHANGE`).
    pub const RENAME_FLAGS: u64 = 1 << 2;
    /// Record locks (`Lock`, `GetLock`). Without it clients fail lock calls
    /// locally with `ENOLCK`.
    pub const LOCKS: u64 = 1 << 3;
    /// Sessions that outlive their connection (`SessionNew`,
    /// `SessionAttach`).
    pub const SESSIONS: u64 = 1 << 4;
    /// `OpenId` and `Reopen`: files opened again after a server restart.
    pub const FILE_IDS: u64 = 1 << 5;
    /// A session keeps the replies of its recent requests that must not run
    /// twice (`Request::once_only`); such a request sent again with the
    /// same id (after a lost connection, on the session rejoined) gets the
    /// kept reply instead of running again. Needs `SESSIONS`.
    pub const REPLAY: u64 = 1 << 6;
    /// `OpenRead`: open and read a small file in one round trip.
    pub const OPEN_READ: u64 = 1 << 7;
    /// `ListDir`: a directory listed by path in one round trip.
    pub const LIST_DIR: u64 = 1 << 8;
    /// `OpenCached`, `CacheSet`, `CacheGet`: the change attribute and cache
    /// policies stored on the server. Needs `FILE_IDS`.
    pub const CACHING: u64 = 1 << 9;
    /// Further connections attached to a session may carry its bulk
    /// `Pread`/`Pwrite`, which run beside the session's other requests.
    /// Needs `SESSIONS`.
    pub const DATA_CHANNELS: u64 = 1 << 10;
    /// `LocalAddr` and `FileFd`: a client on the server's host moves file
    /// data without the network (PROTOCOL.md 8.7). Needs `SESSIONS`.
    pub const SAME_HOST: u64 = 1 << 11;
    /// Requests name their caller: `Caller` binds a slot to a user, group
    /// and groups, and a request's header `flags` carry the slot (0: none
    /// named, taken as root). A server running as root acts for each
    /// request as its caller (PROTOCOL.md 8.8). Offered only by servers
    /// that do.
    pub const IDENTITY: u64 = 1 << 12;
    /// `LeaseOn`, `LeaseBreak`, `LeaseReturn`: replies that carry
    /// attributes or entries are promised until the server breaks them
    /// (PROTOCOL.md 8.9). Needs `SESSIONS`.
    pub const LEASES: u64 = 1 << 13;
    /// `SessionFence`: the server keeps fence records on a shared volume,
    /// so that a gateway a client left refuses that client's old requests
    /// (PROTOCOL.md 8.3). Offered only by servers of a shared volume.
    pub const FENCE: u64 = 1 << 14;
    /// Every change to the export reaches the server's lease table: its
    /// clients' through it, and those of programs on its host through the
    /// kernel's notices (`fanotify`), so a lease may stand for long — the
    /// mount keeps leased answers in the kernel until a break. Offered,
    /// with `LEASES`, only by servers that see every change (PROTOCOL.md
    /// 8.10). Without it a lease still breaks for clients' changes, but
    /// clients keep answers no longer than their timeouts.
    pub const WATCHED: u64 = 1 << 15;
    /// Everything this implementation offers.
    pub const ALL: u64 = READDIRPLUS
        | XATTR
        | RENAME_FLAGS
        | LOCKS
        | SESSIONS
        | FILE_IDS
        | REPLAY
        | OPEN_READ
        | LIST_DIR
        | CACHING
        | DATA_CHANNELS
        | SAME_HOST
        | IDENTITY
        | LEASES
        | FENCE
        | WATCHED;
}

/// The smallest frame-body limit a peer may announce (16 MiB of data plus room
/// for the fixed fields of a write).
pub const MIN_MAX_FRAME: u32 = 16 * 1024 * 1024 + 4096;

/// Longest path accepted in a message (the u16 length field). Paths from
/// the export root may exceed `PATH_MAX`: a tree can be deeper than that
/// though every path a program uses is within it (each name at most
/// `NAME_MAX`); the server walks such a path in steps.
pub const MAX_PATH: usize = u16::MAX as usize;
