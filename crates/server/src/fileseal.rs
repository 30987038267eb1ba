//! Sealed file ids: the server's proof, carried by the client, that a
//! session was given a file.
//!
//! `Reopen` (PROTOCOL.md 8.3) opens a file again by its lasting id — a
//! kernel file handle, which only a privileged server can open, and which
//! reaches the file without walking its path. Handed to anyone who asks,
//! that would open any file whose handle can be guessed (a file in a
//! directory the caller may not search, say). So the id a client gets is
//! the handle followed by a tag: a MAC, under a key only the server knows,
//! of the handle and the file's `(dev, ino)`, keyed per session. A `Reopen`
//! whose tag this session's key does not verify is not refused: the file is
//! then looked up by its path, as the caller, as a fresh open would.
//!
//! A session registered with a server that keeps state (`--state-dir`)
//! has its key derived from the server's own secret kept there and the
//! session's id, so the session a restarted server resumes verifies the
//! ids it had; a session of no id has a random key of its own.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type Key = Hmac<Sha256>;

/// Bytes of the tag after the handle.
const TAG: usize = 16;

/// A session's keys: the newest seals, any of them opens.
pub struct Seals {
    keys: Vec<Key>,
}

impl Default for Seals {
    fn default() -> Self {
        Self::new()
    }
}

impl Seals {
    /// A random key, for a session with no id yet.
    pub fn new() -> Seals {
        let mut k = [0u8; 32];
        // A failed entropy read would leave a key a client could forge
        // tags under: then nothing seals, and every `Reopen` of the session
        // goes by path.
        if getrandom::getrandom(&mut k).is_err() {
            return Seals { keys: Vec::new() };
        }
        Seals { keys: vec![key(&k)] }
    }

    /// From now on seals with the key of session `id` of the server whose
    /// secret is `server`; what was sealed before still opens.
    pub fn registered(&mut self, server: &[u8; 32], id: u64) {
        let mut m = key(server);
        m.update(b"ferry v1 file ids");
        m.update(&id.to_le_bytes());
        let derived: [u8; 32] = m.finalize().into_bytes().into();
        self.keys.push(key(&derived));
    }

    /// The id the client gets for a file of handle bytes `fh` at `file`.
    pub fn seal(&self, fh: &[u8], file: (u64, u64)) -> Vec<u8> {
        let mut id = Vec::with_capacity(fh.len() + TAG);
        id.extend_from_slice(fh);
        match self.keys.last() {
            Some(k) => id.extend_from_slice(&tag(k, fh, file)),
            None => id.extend_from_slice(&[0; TAG]),
        }
        id
    }

    /// The handle bytes of `id` if this session sealed it for `file`.
    pub fn open<'i>(&self, id: &'i [u8], file: (u64, u64)) -> Option<&'i [u8]> {
        let (fh, t) = id.split_at_checked(id.len().checked_sub(TAG)?)?;
        // In constant time: a client must learn nothing of a tag from how
        // long a wrong one took.
        self.keys.iter().any(|k| mac(k, fh, file).verify_truncated_left(t).is_ok()).then_some(fh)
    }
}

fn key(bytes: &[u8]) -> Key {
    Key::new_from_slice(bytes).expect("HMAC takes a key of any length")
}

fn mac(k: &Key, fh: &[u8], (dev, ino): (u64, u64)) -> Key {
    let mut m = k.clone();
    m.update(&(fh.len() as u32).to_le_bytes());
    m.update(fh);
    m.update(&dev.to_le_bytes());
    m.update(&ino.to_le_bytes());
    m
}

fn tag(k: &Key, fh: &[u8], file: (u64, u64)) -> [u8; TAG] {
    let full = mac(k, fh, file).finalize().into_bytes();
    let mut t = [0u8; TAG];
    t.copy_from_slice(&full[..TAG]);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seal_opens_only_for_its_file_and_its_session() {
        let mut s = Seals::new();
        let early = s.seal(b"handle", (1, 2));
        s.registered(&[7; 32], 42);
        let id = s.seal(b"handle", (1, 2));
        assert_eq!(s.open(&id, (1, 2)), Some(&b"handle"[..]));
        assert_eq!(s.open(&early, (1, 2)), Some(&b"handle"[..]), "sealed before the session had an id");
        assert_eq!(s.open(&id, (1, 3)), None, "another inode");
        let mut forged = id.clone();
        forged[0] ^= 1;
        assert_eq!(s.open(&forged, (1, 2)), None, "another handle under the old tag");
        assert_eq!(s.open(b"short", (1, 2)), None);
        assert_eq!(Seals::new().open(&id, (1, 2)), None, "another session");
        // A restarted server derives the same key for the same session.
        let mut again = Seals::new();
        again.registered(&[7; 32], 42);
        assert_eq!(again.open(&id, (1, 2)), Some(&b"handle"[..]));
        let mut other = Seals::new();
        other.registered(&[7; 32], 43);
        assert_eq!(other.open(&id, (1, 2)), None, "another session of the same server");
        let empty = s.seal(b"", (1, 2));
        assert_eq!(s.open(&empty, (1, 2)), Some(&b""[..]));
    }
}
