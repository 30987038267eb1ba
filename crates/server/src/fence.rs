//! Fencing a session its client left: a gateway that was stopped (or hung)
//! while its client moved to another gateway must not, once it wakes,
//! apply the requests it still holds of that client.
//!
//! Each client that moves draws a secret, its owner, and counts its
//! sessions: the `epoch`-th session it makes on any gateway is named so
//! with `SessionFence`. The gateway then raises the owner's fence record,
//! a file on the shared volume named by a hash of the owner, to the epoch
//! (written beside it and renamed over it, so that it is read whole, and
//! as a new inode, which no gateway has cached). Every gateway reads the
//! record of a fenced session before running its requests — again when
//! its last read (by any thread) began `RECHECK` ago or more, which a
//! gateway that was stopped or stuck always did — and a session whose
//! record has gone past its epoch is fenced: its request is refused, its
//! connection ended and the session dropped.
//!
//! The record's name is a hash of a secret only the client and the
//! gateways it used know: a client cannot fence another's sessions. The
//! directory is the server's own (mode 0700), inside or beside the export.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::backend::Errno;

/// How long a session trusts the last read of its record. A client moves
/// only after its gateway was silent for its bound (seconds), so a gateway
/// stopped or stuck that long reads the record again before anything else.
pub const RECHECK: Duration = Duration::from_millis(100);

/// The name of the fence directory inside an export of a shared volume
/// (the default place; `--fence-dir` sets another).
pub const DIR_NAME: &str = ".ferry-fence";

/// The directory of fence records.
#[derive(Debug)]
pub struct Fences {
    dir: PathBuf,
}

/// A session's fence: the record it is under and the epoch it holds.
#[derive(Debug)]
pub struct Fence {
    name: String,
    epoch: u64,
    fenced: AtomicBool,
    /// When the record was last read (`since_start`), by any thread.
    read_at: AtomicU64,
}

/// Nanoseconds since the first call: a clock an atomic holds.
fn since_start() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    u64::try_from(START.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl Fences {
    /// Records in `dir` (made, mode 0700, when the first is written).
    pub fn new(dir: impl Into<PathBuf>) -> Fences {
        Fences { dir: dir.into() }
    }

    /// The record's name for `owner`: a hash, never the secret itself.
    fn name_of(owner: &[u8; 32]) -> String {
        let mut h = Sha256::new();
        h.update(b"ferry fence v1\0");
        h.update(owner);
        h.finalize()[..16].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The epoch in record `name` (0: none).
    fn read(&self, name: &str) -> io::Result<u64> {
        match fs::read_to_string(self.dir.join(name)) {
            Ok(s) => s
                .trim()
                .parse()
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("fence record {name}: {s:?}"))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// `SessionFence`: raises `owner`'s record to `epoch` and returns the
    /// session's fence. `ESTALE` if the record is past `epoch` already (the
    /// client has a later session elsewhere).
    pub fn raise(&self, owner: &[u8; 32], epoch: u64) -> Result<Fence, Errno> {
        let name = Fences::name_of(owner);
        let now = self.read(&name).map_err(|e| io_errno(&e))?;
        if now > epoch {
            return Err(Errno(libc::ESTALE));
        }
        if now < epoch {
            self.write(&name, epoch).map_err(|e| {
                tracing::warn!("fence record {}: {e}", self.dir.join(&name).display());
                io_errno(&e)
            })?;
        }
        Ok(Fence { name, epoch, fenced: AtomicBool::new(false), read_at: AtomicU64::new(since_start()) })
    }

    fn write(&self, name: &str, epoch: u64) -> io::Result<()> {
        match fs::DirBuilder::new().mode(0o700).create(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let mut r = [0u8; 8];
        let _ = getrandom::getrandom(&mut r);
        let tmp = self.dir.join(format!(".{name}.{}.tmp", u64::from_le_bytes(r)));
        let written = (|| {
            let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
            f.write_all(format!("{epoch}\n").as_bytes())?;
            // Stable before it is in sight: a record read empty after a
            // crash would fence nothing.
            f.sync_all()?;
            fs::rename(&tmp, self.dir.join(name))
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written
    }

    /// Whether `f`'s session is fenced: known so, or its record read now
    /// is past its epoch. A record that cannot be read is an error: the
    /// request is refused (`EIO`), the session kept.
    pub fn is_fenced(&self, f: &Fence) -> Result<bool, Errno> {
        if f.fenced.load(Relaxed) {
            return Ok(true);
        }
        let started = since_start();
        let now = self.read(&f.name).map_err(|e| {
            tracing::warn!("fence record {}: {e}", self.dir.join(&f.name).display());
            Errno(libc::EIO)
        })?;
        if now > f.epoch {
            f.fenced.store(true, Relaxed);
        }
        // After the verdict: a thread that finds this read recent finds a
        // fence it saw set too.
        f.read_at.fetch_max(started, Release);
        Ok(now > f.epoch)
    }
}

impl Fence {
    /// Fenced already (no look at the record).
    pub fn known_fenced(&self) -> bool {
        self.fenced.load(Relaxed)
    }

    /// Whether the session is fenced as of the record's last read, if
    /// that read (by any thread) began less than `RECHECK` ago; `None`:
    /// the record is to be read again first.
    pub fn recent(&self) -> Option<bool> {
        let last = self.read_at.load(Acquire);
        let fresh = since_start().saturating_sub(last) < RECHECK.as_nanos() as u64;
        // Loaded after `read_at`: what the read that stored it found.
        fresh.then(|| self.fenced.load(Relaxed))
    }

    #[cfg(test)]
    fn epoch(&self) -> u64 {
        self.epoch
    }
}

fn io_errno(e: &io::Error) -> Errno {
    Errno(e.raw_os_error().unwrap_or(libc::EIO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ferry-fence-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_later_epoch_fences_the_earlier_sessions_of_its_owner_only() {
        let d = dir("epochs");
        let (a, b) = (Fences::new(&d), Fences::new(&d));
        let (me, other) = ([1u8; 32], [2u8; 32]);
        let first = a.raise(&me, 1).unwrap();
        let theirs = a.raise(&other, 1).unwrap();
        assert_eq!(a.is_fenced(&first), Ok(false));
        let second = b.raise(&me, 2).unwrap();
        assert_eq!(a.is_fenced(&first), Ok(true), "the gateway left reads the fence");
        assert!(first.known_fenced());
        assert_eq!(b.is_fenced(&second), Ok(false));
        assert_eq!(a.is_fenced(&theirs), Ok(false), "another owner's session is not fenced");
        // A session named with an epoch already passed is refused.
        assert_eq!(a.raise(&me, 1).map(|_| ()), Err(Errno(libc::ESTALE)));
        // The same epoch again (a session joined again) is its own.
        assert_eq!(b.raise(&me, 2).map(|f| f.epoch()), Ok(2));
        // The secret is not in sight: names are hashes.
        for e in fs::read_dir(&d).unwrap() {
            let n = e.unwrap().file_name().into_string().unwrap();
            assert!(!n.contains("0101") && n.len() == 32, "{n}");
        }
        let mode = std::os::unix::fs::PermissionsExt::mode(&fs::metadata(&d).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o700);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_record_that_cannot_be_read_refuses_not_fences() {
        let d = dir("bad");
        let f = Fences::new(&d);
        let s = f.raise(&[3; 32], 1).unwrap();
        fs::write(d.join(Fences::name_of(&[3; 32])), "garbage").unwrap();
        assert_eq!(f.is_fenced(&s), Err(Errno(libc::EIO)));
        assert!(!s.known_fenced());
        fs::remove_dir_all(&d).unwrap();
    }
}
