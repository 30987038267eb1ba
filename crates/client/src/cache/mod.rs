//! The client's selective data cache (the AFS paper's caching half): what
//! is cached (`policy`), where (`store`: chunks on the local disk, shared
//! by the processes of one user), and the two put together (`setup`).
//! `File` uses it for files the policy caches, validating the copy against
//! the server's change attribute at every open (close-to-open).

mod policy;
mod setup;
mod store;

pub use policy::{decide, glob_match, parse_size, Decision, Rules, Source};
pub use setup::{Cache, DEFAULT_LIMIT};
pub use store::{Entry, Store, CHUNK};
