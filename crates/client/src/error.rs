//! The client's error: a remote errno, a broken connection, or a peer that
//! broke the protocol. Every kind maps to an errno for the preload library.

use std::fmt;
use std::io;

#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// The server answered with an errno and a message.
    Remote { errno: i32, message: String },
    /// The connection failed or is gone.
    Io { kind: io::ErrorKind, errno: Option<i32>, message: String },
    /// The peer sent something the protocol does not allow.
    Protocol(String),
    /// Authentication was refused or impossible.
    Auth(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn remote(errno: i32) -> Error {
        Error::Remote { errno, message: io::Error::from_raw_os_error(errno).to_string() }
    }

    /// The errno a libc call would report for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Remote { errno, .. } => *errno,
            Error::Io { errno: Some(e), .. } => *e,
            Error::Io { .. } => libc::EIO,
            Error::Protocol(_) => libc::EPROTO,
            Error::Auth(_) => libc::EACCES,
        }
    }

    pub(crate) fn from_io(e: io::Error) -> Error {
        Error::Io { kind: e.kind(), errno: e.raw_os_error(), message: e.to_string() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // The server's message is strerror text; show the local one so it
            // reads exactly like a local failure, with what the server adds
            // in parentheses after it (why: e.g. root squash).
            Error::Remote { errno, message } => {
                let text = strip_os_error(&io::Error::from_raw_os_error(*errno));
                let why =
                    message.strip_prefix(text.as_str()).filter(|r| r.starts_with(" (") && !r.starts_with(" (os error"));
                write!(f, "{text}{}", why.unwrap_or(""))
            }
            Error::Io { message, .. } => write!(f, "connection failed: {message}"),
            Error::Protocol(m) => write!(f, "protocol error: {m}"),
            Error::Auth(m) => write!(f, "{m}"),
        }
    }
}

/// `io::Error` prints "No such file or directory (os error 2)"; users want
/// the first part only.
fn strip_os_error(e: &io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

impl std::error::Error for Error {}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        match e {
            Error::Remote { errno, .. } => io::Error::from_raw_os_error(errno),
            Error::Io { kind, message, .. } => io::Error::new(kind, message),
            other => io::Error::other(other.to_string()),
        }
    }
}
