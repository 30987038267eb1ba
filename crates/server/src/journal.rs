//! The part of sessions that outlives the server process (`ferry serve
//! --state-dir`): each registered session's id, secret and capabilities,
//! and its reply cache, one file per session, appended to under the
//! session's lock. A restarted server reads them back, so a client whose
//! request that must not run twice was in flight when the server died
//! rejoins its session and gets the reply kept, not a second run (or, for a
//! request the dead server had started but not answered, the outcome it
//! finds: see `replay::Replies::unknown`).
//!
//! Nothing is fsynced: a killed process leaves its writes in the kernel's
//! page cache, which is what this guards against. A crash of the machine
//! may lose records, and with them exactly-once (as NFS's reply cache,
//! which lives in memory only). A record torn by the kill is ignored.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"FERRYSJ1";
const INTENT: u8 = 1;
const REPLY: u8 = 2;
/// A reply frame bigger than this is not a reply the cache keeps.
const FRAME_MAX: usize = 1 << 20;

/// The state directory, locked by one server at a time.
pub struct Journal {
    dir: PathBuf,
    _lock: File,
    /// The server's own secret, which the keys of sessions' file ids are
    /// derived from (`fileseal`): kept here so that a restarted server
    /// still knows the ids it gave.
    key: [u8; 32],
}

/// A session as a previous server process left it.
pub struct Restored {
    pub id: u64,
    pub secret: [u8; 32],
    pub caps: u64,
    /// Replies, oldest first: `(request id, op, digest, frame)`.
    pub replies: Vec<(u64, u16, u64, Vec<u8>)>,
    /// Requests it started and never answered: `(request id, op, digest,
    /// note)`; the note is what the intent recorded (an append: the end
    /// of the file before it).
    pub unknown: Vec<(u64, u16, u64, Vec<u8>)>,
}

/// One session's file, open for appending.
pub struct SessionLog {
    file: File,
    path: PathBuf,
    records: usize,
    header: Vec<u8>,
}

/// The secret in `path`, made there (mode 0600) if missing or not one.
fn server_key(path: &Path) -> io::Result<[u8; 32]> {
    if let Ok(b) = fs::read(path) {
        if let Ok(k) = <[u8; 32]>::try_from(b.as_slice()) {
            return Ok(k);
        }
    }
    let mut k = [0u8; 32];
    getrandom::getrandom(&mut k).map_err(|e| io::Error::other(e.to_string()))?;
    let tmp = path.with_extension("new");
    let mut f = OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(&tmp)?;
    f.write_all(&k)?;
    fs::rename(&tmp, path)?;
    Ok(k)
}

/// A session file starts with this: magic, id, secret, capabilities.
fn header(id: u64, secret: &[u8; 32], caps: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(56);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&id.to_le_bytes());
    h.extend_from_slice(secret);
    h.extend_from_slice(&caps.to_le_bytes());
    h
}

fn name(id: u64) -> String {
    format!("s-{id:016x}")
}

impl Journal {
    /// Opens (creating, mode 0700) and locks `dir`, and reads back the
    /// sessions a previous process left there.
    pub fn open(dir: &Path) -> io::Result<(Journal, Vec<Restored>)> {
        fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        private_dir(dir)?;
        let lock = OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(dir.join("lock"))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(|_| {
            io::Error::new(io::ErrorKind::WouldBlock, format!("{}: in use by another ferry serve", dir.display()))
        })?;
        let mut restored = Vec::new();
        for e in fs::read_dir(dir)? {
            let e = e?;
            let Some(id) =
                e.file_name().to_str().and_then(|n| n.strip_prefix("s-")).and_then(|h| u64::from_str_radix(h, 16).ok())
            else {
                continue;
            };
            let mut bytes = Vec::new();
            File::open(e.path())?.read_to_end(&mut bytes)?;
            match parse(id, &bytes) {
                Some(r) => restored.push(r),
                // Not ours or unreadable: nothing a client could rejoin.
                None => fs::remove_file(e.path())?,
            }
        }
        let key = server_key(&dir.join("key"))?;
        Ok((Journal { dir: dir.to_path_buf(), _lock: lock, key }, restored))
    }

    /// The server's secret kept with its sessions.
    pub fn key(&self) -> [u8; 32] {
        self.key
    }

    /// Starts the file of session `id` (replacing any left from before).
    pub fn session(&self, id: u64, secret: &[u8; 32], caps: u64) -> io::Result<SessionLog> {
        let header = header(id, secret, caps);
        let path = self.dir.join(name(id));
        let mut file = OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(&path)?;
        file.write_all(&header)?;
        Ok(SessionLog { file, path, records: 0, header })
    }

    /// Appends to the file of a session read back at start.
    pub fn resume(&self, r: &Restored) -> io::Result<SessionLog> {
        let path = self.dir.join(name(r.id));
        let file = OpenOptions::new().append(true).open(&path)?;
        let header = header(r.id, &r.secret, r.caps);
        Ok(SessionLog { file, path, records: r.replies.len() + r.unknown.len(), header })
    }

    /// The session ended (its lease ran out): its file goes.
    pub fn forget(&self, id: u64) {
        let _ = fs::remove_file(self.dir.join(name(id)));
    }
}

/// Refuses a state directory that another user owns or may write to:
/// they could plant, swap or remove session files, which hold sessions'
/// secrets (the files themselves are made 0600).
fn private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(dir)?;
    if m.uid() != rustix::process::geteuid().as_raw() || m.mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{}: another user owns it or may write to it (chmod go-w, or use another)", dir.display()),
        ));
    }
    Ok(())
}

fn record(kind: u8, id: u64, op: u16, digest: u64, frame: &[u8], out: &mut Vec<u8>) {
    out.push(kind);
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&op.to_le_bytes());
    out.extend_from_slice(&digest.to_le_bytes());
    out.extend_from_slice(&(frame.len() as u32).to_le_bytes());
    out.extend_from_slice(frame);
}

impl SessionLog {
    fn append(&mut self, buf: &[u8]) {
        // A failed write only loses exactly-once across a restart for this
        // request; the request itself goes on.
        if self.file.write_all(buf).is_ok() {
            self.records += 1;
        }
    }

    /// A request that must not run twice is about to run; `note` is what
    /// finding out its outcome after a restart needs (an append: where the
    /// file ended before it).
    pub fn intent(&mut self, id: u64, op: u16, digest: u64, note: &[u8]) {
        let mut b = Vec::with_capacity(23 + note.len());
        record(INTENT, id, op, digest, note, &mut b);
        self.append(&b);
    }

    /// Its reply. Past a few times what the cache keeps, the file is
    /// rewritten with `kept` (the cache as it is now) only.
    pub fn reply<'a>(
        &mut self,
        id: u64,
        op: u16,
        digest: u64,
        frame: &[u8],
        kept: impl Iterator<Item = (u64, u16, u64, &'a [u8])>,
        limit: usize,
    ) {
        if frame.len() > FRAME_MAX {
            return;
        }
        let mut b = Vec::with_capacity(23 + frame.len());
        record(REPLY, id, op, digest, frame, &mut b);
        self.append(&b);
        if self.records > 4 * limit {
            let _ = self.rewrite(kept);
        }
    }

    fn rewrite<'a>(&mut self, kept: impl Iterator<Item = (u64, u16, u64, &'a [u8])>) -> io::Result<()> {
        let mut b = self.header.clone();
        let mut n = 0;
        for (id, op, digest, frame) in kept {
            record(REPLY, id, op, digest, frame, &mut b);
            n += 1;
        }
        let tmp = self.path.with_extension("new");
        let mut f = OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(&tmp)?;
        f.write_all(&b)?;
        fs::rename(&tmp, &self.path)?;
        self.file = OpenOptions::new().append(true).open(&self.path)?;
        self.records = n;
        Ok(())
    }
}

fn parse(id: u64, b: &[u8]) -> Option<Restored> {
    if b.len() < 56 || &b[..8] != MAGIC || b[8..16] != id.to_le_bytes() {
        return None;
    }
    let secret: [u8; 32] = b[16..48].try_into().ok()?;
    let caps = u64::from_le_bytes(b[48..56].try_into().ok()?);
    let mut replies = Vec::new();
    let mut open: HashMap<(u64, u16, u64), Vec<u8>> = HashMap::new();
    let mut at = 56;
    while b.len() - at >= 23 {
        let kind = b[at];
        let rid = u64::from_le_bytes(b[at + 1..at + 9].try_into().ok()?);
        let op = u16::from_le_bytes(b[at + 9..at + 11].try_into().ok()?);
        let digest = u64::from_le_bytes(b[at + 11..at + 19].try_into().ok()?);
        let len = u32::from_le_bytes(b[at + 19..at + 23].try_into().ok()?) as usize;
        if len > FRAME_MAX || b.len() - at - 23 < len {
            // Torn by the kill: the rest never happened as far as we know.
            break;
        }
        let frame = &b[at + 23..at + 23 + len];
        match kind {
            INTENT => {
                open.insert((rid, op, digest), frame.to_vec());
            }
            REPLY => {
                open.remove(&(rid, op, digest));
                replies.push((rid, op, digest, frame.to_vec()));
            }
            _ => break,
        }
        at += 23 + len;
    }
    let unknown = open.into_iter().map(|((rid, op, digest), note)| (rid, op, digest, note)).collect();
    Some(Restored { id, secret, caps, replies, unknown })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ferry-journal-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_session_comes_back_with_its_replies_and_unanswered_requests() {
        let dir = tmp("back");
        {
            let (j, restored) = Journal::open(&dir).unwrap();
            assert!(restored.is_empty());
            let mut log = j.session(42, &[7; 32], 3).unwrap();
            log.intent(1, 9, 100, &[]);
            log.reply(1, 9, 100, b"reply one", std::iter::empty(), 256);
            log.intent(2, 10, 200, b"note");
            let _other = j.session(43, &[8; 32], 3).unwrap();
            j.forget(43);
        }
        // A record torn by a kill is ignored.
        let mut f = OpenOptions::new().append(true).open(dir.join(name(42))).unwrap();
        f.write_all(&[REPLY, 1, 2, 3]).unwrap();
        let (_j, restored) = Journal::open(&dir).unwrap();
        assert_eq!(restored.len(), 1);
        let r = &restored[0];
        assert_eq!((r.id, r.secret, r.caps), (42, [7; 32], 3));
        assert_eq!(r.replies, vec![(1, 9, 100, b"reply one".to_vec())]);
        assert_eq!(r.unknown, vec![(2, 10, 200, b"note".to_vec())]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn one_server_at_a_time_and_the_file_is_rewritten_when_it_grows() {
        let dir = tmp("grow");
        let (j, _) = Journal::open(&dir).unwrap();
        assert!(Journal::open(&dir).is_err(), "locked by the first");
        let mut log = j.session(5, &[1; 32], 0).unwrap();
        let kept = [(99u64, 9u16, 1u64, b"last".to_vec())];
        for i in 0..50 {
            log.reply(i, 9, 1, b"x", kept.iter().map(|(a, b, c, d)| (*a, *b, *c, d.as_slice())), 4);
        }
        drop(j);
        let (_j, restored) = Journal::open(&dir).unwrap();
        assert!(restored[0].replies.len() <= 17, "rewritten: {}", restored[0].replies.len());
        fs::remove_dir_all(&dir).unwrap();
    }
}
