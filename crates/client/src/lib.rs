//! The ferry client: a pipelined RPC engine and a blocking file API shaped
//! like `std::fs` on top of it. No runtime, no threads of its own.
//!
//! ```no_run
//! use ferry_client::{Client, OpenOptions, Options};
//! use std::io::Read;
//! let c = Client::connect("127.0.0.1:7070", &Options::default())?;
//! let mut f = c.open("/hello.txt", OpenOptions::new().read(true))?;
//! let mut s = String::new();
//! f.read_to_string(&mut s)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod ahead;
pub mod cache;
mod caller;
mod channels;
mod client;
mod engine;
mod error;
mod file;
mod gateways;
pub mod leases;
mod local;
mod lock;
mod pagebuf;
mod redial;
pub mod tls;
pub mod token;
mod unstable;
pub mod url;

/// The protocol underneath, for tests and tools that speak it directly
/// (`Client::engine`): requests and replies as frames, no file API. Not
/// what a program that uses files needs, and not held to the file API's
/// stability.
pub mod wire {
    pub use crate::engine::{Engine, Frame, PlaceFd};
}

pub use ahead::WINDOW_MAX as READ_AHEAD_MAX;
pub use caller::{acting_as, as_caller, Acting, Caller};
pub use client::{join, Client, SessionTicket};
pub use engine::{Options, DATA_CHANNELS, DATA_THRESHOLD};
pub use error::{Error, Result};
pub use ferry_proto::{cache as cache_policy, caps, Attr, DirEntry, StatFs, Target, Time};
pub use file::{CacheTicket, File, OpenOptions};
pub use leases::Leases;
pub use lock::{backoff, LockHolder, LockKind, LockSpec, LockType};
pub use pagebuf::PageBuf;
pub use url::Url;
