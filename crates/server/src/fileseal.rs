//! Sealed file ids: the server's proof, carried by the client, that it
//! gave out a file's id.
//!
//! `Reopen` (PROTOCOL.md 8.3) opens a file again by its lasting id — a
//! kernel file handle, which only a privileged server can open, and which
//! reaches the file without walking its path. Handed to anyone who asks,
//! that would open any file whose handle can be guessed (a file in a
//! directory the caller may not search, say). So the id a client gets is
//! the handle followed by a tag: a MAC, under a key only the server knows,
//! of the handle and the file's `(dev, ino)`. A `Reopen` whose tag does not
//! verify is not refused: the file is then looked up by its path, as the
//! caller, as a fresh open would.
//!
//! The key is the server's, not a session's: the client's disk cache keys
//! its copies by id, shared by all of a machine's processes (each its own
//! session), and a token holder who was given an id could act as the user
//! it was given to anyway. A server that keeps state (`--state-dir`) keeps
//! the key there, so its ids outlive a restart; another gateway has its
//! own, and a client moving there reopens by path.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type Key = Hmac<Sha256>;

/// Bytes of the tag after the handle.
const TAG: usize = 16;

/// The key file ids are sealed with.
pub struct Seals {
    key: Option<Key>,
}

impl std::fmt::Debug for Seals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Seals")
    }
}

impl Default for Seals {
    /// A random key, for a server that keeps no state.
    fn default() -> Self {
        let mut k = [0u8; 32];
        // A failed entropy read would leave a key a client could forge
        // tags under: then nothing verifies, and every `Reopen` goes by path.
        if getrandom::getrandom(&mut k).is_err() {
            return Seals { key: None };
        }
        Seals::with_key(&k)
    }
}

impl Seals {
    /// Seals with the server's secret `k`.
    pub fn with_key(k: &[u8; 32]) -> Seals {
        let mut m = key(k);
        m.update(b"ferry v1 file ids");
        let derived: [u8; 32] = m.finalize().into_bytes().into();
        Seals { key: Some(key(&derived)) }
    }

    /// The id the client gets for a file of handle bytes `fh` at `file`.
    pub fn seal(&self, fh: &[u8], file: (u64, u64)) -> Vec<u8> {
        let mut id = Vec::with_capacity(fh.len() + TAG);
        id.extend_from_slice(fh);
        match &self.key {
            Some(k) => id.extend_from_slice(&tag(k, fh, file)),
            None => id.extend_from_slice(&[0; TAG]),
        }
        id
    }

    /// The handle bytes of `id` if this server sealed it for `file`.
    pub fn open<'i>(&self, id: &'i [u8], file: (u64, u64)) -> Option<&'i [u8]> {
        let (fh, t) = id.split_at_checked(id.len().checked_sub(TAG)?)?;
        // In constant time: a client must learn nothing of a tag from how
        // long a wrong one took.
        let k = self.key.as_ref()?;
        mac(k, fh, file).verify_truncated_left(t).is_ok().then_some(fh)
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
    fn a_seal_opens_only_for_its_file_and_its_server() {
        let s = Seals::with_key(&[7; 32]);
        let id = s.seal(b"handle", (1, 2));
        assert_eq!(s.open(&id, (1, 2)), Some(&b"handle"[..]));
        assert_eq!(s.open(&id, (1, 3)), None, "another inode");
        let mut forged = id.clone();
        forged[0] ^= 1;
        assert_eq!(s.open(&forged, (1, 2)), None, "another handle under the old tag");
        assert_eq!(s.open(b"short", (1, 2)), None);
        assert_eq!(Seals::default().open(&id, (1, 2)), None, "another server");
        assert_eq!(Seals::with_key(&[8; 32]).open(&id, (1, 2)), None, "another server's secret");
        // A restarted server with the same secret knows its ids.
        assert_eq!(Seals::with_key(&[7; 32]).open(&id, (1, 2)), Some(&b"handle"[..]));
        let empty = s.seal(b"", (1, 2));
        assert_eq!(s.open(&empty, (1, 2)), Some(&b""[..]));
    }
}
