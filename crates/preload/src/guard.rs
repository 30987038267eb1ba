//! Re-entry guard and errno: the two things every hook needs.
//!
//! While a hook runs ferry's own logic, the library's calls into libc
//! (the client's sockets, `std::fs` on `/proc`) reach our exported hooks
//! again; the guard sends those straight to libc.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// Is this thread inside ferry's logic already?
pub fn busy() -> bool {
    BUSY.with(Cell::get)
}

pub fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

pub fn errno() -> i32 {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() }
}

/// Runs `f` with the guard held; a panic becomes `EIO` (it must never
/// unwind into C, and printing it could recurse into a hooked `write`).
pub fn enter<T>(f: impl FnOnce() -> Result<T, i32>) -> Result<T, i32> {
    let was = BUSY.with(|b| b.replace(true));
    let saved = errno();
    let r = catch_unwind(AssertUnwindSafe(f)).unwrap_or(Err(libc::EIO));
    BUSY.with(|b| b.set(was));
    if r.is_ok() {
        // Success leaves errno as the caller had it, as libc does.
        set_errno(saved);
    }
    r
}

/// `-1` and errno on failure, as C calls report.
pub fn ret<T: From<i8>>(r: Result<T, i32>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => {
            set_errno(e);
            T::from(-1)
        }
    }
}

/// For calls that return an error number instead of setting errno.
pub fn ret_code(r: Result<(), i32>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => e,
    }
}
