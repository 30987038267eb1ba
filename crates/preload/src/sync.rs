//! Locks that survive `fork`: a mutex and a reader-writer lock on one futex
//! word each, with nothing outside that word.
//!
//! The `fork` handlers take every lock the child may need and release it in
//! both processes. `parking_lot` cannot be released in a child: when a
//! thread was parked on the lock at `fork`, its unlock looks in a global
//! table of parked threads (copied from the parent, possibly locked) and may
//! hand the lock to a thread the child does not have. Here an unlock is a
//! store and a `FUTEX_WAKE`, which in the child wakes no one.

use std::sync::atomic::{AtomicU32, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

use parking_lot::lock_api::{self, GuardSend};

pub type Mutex<T> = lock_api::Mutex<RawMutex, T>;
pub type RwLock<T> = lock_api::RwLock<RawRwLock, T>;

fn wait(word: &AtomicU32, expected: u32) {
    // SAFETY: FUTEX_WAIT on a live atomic word; it returns at once if the
    // word changed, and spurious returns are retried by the callers.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            std::ptr::null::<libc::timespec>(),
        )
    };
}

fn wake(word: &AtomicU32, n: i32) {
    // SAFETY: FUTEX_WAKE on a live atomic word.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, n) };
}

/// 0 free, 1 locked, 2 locked with (possible) waiters (Drepper's mutex).
pub struct RawMutex(AtomicU32);

// SAFETY: a lock owned by one holder at a time, acquired with Acquire and
// released with Release ordering.
unsafe impl lock_api::RawMutex for RawMutex {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: RawMutex = RawMutex(AtomicU32::new(0));
    type GuardMarker = GuardSend;

    fn lock(&self) {
        if self.try_lock() {
            return;
        }
        while self.0.swap(2, Acquire) != 0 {
            wait(&self.0, 2);
        }
    }

    fn try_lock(&self) -> bool {
        self.0.compare_exchange(0, 1, Acquire, Relaxed).is_ok()
    }

    unsafe fn unlock(&self) {
        if self.0.swap(0, Release) == 2 {
            wake(&self.0, 1);
        }
    }
}

const WRITER: u32 = 1 << 31;
const WAITERS: u32 = 1 << 30;
const READERS: u32 = WAITERS - 1;

/// Reader count, a writer bit and a waiters bit. Readers enter whenever no
/// writer holds the lock, so a read lock taken again in the same thread
/// (a hook reached from inside another) never waits for a writer.
pub struct RawRwLock(AtomicU32);

impl RawRwLock {
    /// Marks that someone sleeps on `s`, then sleeps until it changes.
    fn sleep(&self, s: u32) {
        if s & WAITERS == 0 && self.0.compare_exchange(s, s | WAITERS, Relaxed, Relaxed).is_err() {
            return;
        }
        wait(&self.0, s | WAITERS);
    }
}

// SAFETY: shared holders only while no exclusive one, and the other way
// round; Acquire on entry, Release on exit.
unsafe impl lock_api::RawRwLock for RawRwLock {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: RawRwLock = RawRwLock(AtomicU32::new(0));
    type GuardMarker = GuardSend;

    fn lock_shared(&self) {
        loop {
            let s = self.0.load(Relaxed);
            if s & WRITER == 0 {
                if s & READERS != READERS && self.0.compare_exchange_weak(s, s + 1, Acquire, Relaxed).is_ok() {
                    return;
                }
                continue;
            }
            self.sleep(s);
        }
    }

    fn try_lock_shared(&self) -> bool {
        let s = self.0.load(Relaxed);
        s & WRITER == 0 && s & READERS != READERS && self.0.compare_exchange(s, s + 1, Acquire, Relaxed).is_ok()
    }

    unsafe fn unlock_shared(&self) {
        let s = self.0.fetch_sub(1, Release) - 1;
        if s == WAITERS && self.0.compare_exchange(WAITERS, 0, Relaxed, Relaxed).is_ok() {
            wake(&self.0, i32::MAX);
        }
    }

    fn lock_exclusive(&self) {
        loop {
            let s = self.0.load(Relaxed);
            if s & !WAITERS == 0 {
                if self.0.compare_exchange_weak(s, s | WRITER, Acquire, Relaxed).is_ok() {
                    return;
                }
                continue;
            }
            self.sleep(s);
        }
    }

    fn try_lock_exclusive(&self) -> bool {
        let s = self.0.load(Relaxed);
        s & !WAITERS == 0 && self.0.compare_exchange(s, s | WRITER, Acquire, Relaxed).is_ok()
    }

    unsafe fn unlock_exclusive(&self) {
        if self.0.swap(0, Release) & WAITERS != 0 {
            wake(&self.0, i32::MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn mutex_counts_under_contention() {
        let m = Arc::new(Mutex::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        *m.lock() += 1;
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(*m.lock(), 80_000);
    }

    #[test]
    fn rwlock_excludes_writers() {
        let l = Arc::new(RwLock::new((0u64, 0u64)));
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        if i % 2 == 0 {
                            let mut g = l.write();
                            g.0 += 1;
                            g.1 += 1;
                        } else {
                            let g = l.read();
                            assert_eq!(g.0, g.1);
                            let again = l.read();
                            assert_eq!(again.0, g.0);
                        }
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(*l.read(), (40_000, 40_000));
    }

    #[test]
    fn force_unlock_frees_for_others() {
        let m = Mutex::new(1);
        std::mem::forget(m.lock());
        // SAFETY: locked just above, in this thread.
        unsafe { m.force_unlock() };
        assert_eq!(*m.lock(), 1);
        let l = RwLock::new(2);
        std::mem::forget(l.write());
        // SAFETY: as above.
        unsafe { l.force_unlock_write() };
        assert_eq!(*l.read(), 2);
    }
}
