//! Who a request is made for (capability `IDENTITY`, PROTOCOL.md 8.8): by
//! default the calling thread's own ids, read at each request (a program
//! that changes its ids is seen as it is now); a FUSE mount serving several
//! users names each request's caller with [`as_caller`].
//!
//! A client names each caller once per session in a slot (`Caller`), and
//! its requests carry the slot in their header: the slot of the request a
//! thread is sending is kept in a thread-local for the engine to stamp.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Mutex;

/// A user as the server should see it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Caller {
    /// The calling thread's effective ids and supplementary groups.
    pub fn of_thread() -> Caller {
        Caller {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            groups: rustix::process::getgroups().unwrap_or_default().iter().map(|g| g.as_raw()).collect(),
        }
    }
}

thread_local! {
    static NAMED: RefCell<Option<Caller>> = const { RefCell::new(None) };
    static SLOT: Cell<u16> = const { Cell::new(0) };
}

/// Runs `f` with every request this thread makes (through any client)
/// made for `caller` instead of the thread's own ids.
pub fn as_caller<R>(caller: Caller, f: impl FnOnce() -> R) -> R {
    let _acting = acting_as(caller);
    f()
}

/// Until the guard is dropped, this thread's requests are made for
/// `caller` (as [`as_caller`], for code that cannot wrap a closure).
pub fn acting_as(caller: Caller) -> Acting {
    Acting(NAMED.try_with(|n| n.borrow_mut().replace(caller)).ok().flatten())
}

/// See [`acting_as`]; restores whom the thread acted for before.
pub struct Acting(Option<Caller>);

impl Drop for Acting {
    fn drop(&mut self) {
        let prev = self.0.take();
        let _ = NAMED.try_with(|n| *n.borrow_mut() = prev);
    }
}

/// Whom this thread's requests are for now. (At a process's exit the
/// thread-local may be gone already while stdio still flushes into files
/// of `ferry run`: then the thread's own ids.)
pub(crate) fn current() -> Caller {
    NAMED.try_with(|n| n.borrow().clone()).ok().flatten().unwrap_or_else(Caller::of_thread)
}

/// The slot to stamp on the request this thread is sending (0: none).
pub(crate) fn slot() -> u16 {
    SLOT.try_with(Cell::get).unwrap_or(0)
}

/// Stamps `slot` on this thread's requests until dropped.
pub(crate) struct Stamp(u16);

impl Stamp {
    pub(crate) fn new(slot: u16) -> Stamp {
        Stamp(SLOT.try_with(|s| s.replace(slot)).unwrap_or(0))
    }
}

impl Drop for Stamp {
    fn drop(&mut self) {
        let _ = SLOT.try_with(|s| s.set(self.0));
    }
}

/// The slots a client has given its callers. Slot numbers outlive
/// connections and sessions: each is named again in a new session (the
/// client counts the sessions it lost), and a server that does not know
/// one anyway says `ENOKEY`, and the client names it again.
#[derive(Default)]
pub(crate) struct Slots {
    /// Caller → (slot, the session generation it was last named in).
    by_caller: Mutex<HashMap<Caller, (u16, u64)>>,
}

impl Slots {
    /// `caller`'s slot, and whether it must be named (new, or named in an
    /// earlier session than `generation`); `None` past the server's 1024
    /// slots (PROTOCOL.md 8.8). A slot is never given to a second caller:
    /// a request in flight for the first would run as the second.
    pub(crate) fn of(&self, caller: &Caller, generation: u64) -> Option<(u16, bool)> {
        let mut m = self.by_caller.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((s, g)) = m.get_mut(caller) {
            let stale = *g != generation;
            *g = generation;
            return Some((*s, stale));
        }
        if m.len() >= 1024 {
            return None;
        }
        let s = m.len() as u16 + 1;
        m.insert(caller.clone(), (s, generation));
        Some((s, true))
    }
}
