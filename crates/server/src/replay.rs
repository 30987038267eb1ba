//! A session's reply cache (`caps::REPLAY`), as NFSv4.1 sessions keep one:
//! the encoded replies of its latest requests that must not run twice
//! (`Request::once_only`). A client whose connection broke before the reply
//! arrived sends such a request again, with the same id, on the session it
//! rejoined; it gets the kept reply and the request does not run again.
//!
//! Requests of a session run one at a time under the session's lock, so a
//! request still running on the broken connection has finished, and kept
//! its reply, before the one sent again is looked up.

use std::collections::VecDeque;

/// Replies kept per session: far more than a client keeps in flight (its
/// window), so a reply is never gone before the client can ask again.
const KEPT: usize = 256;

struct Kept {
    id: u64,
    op: u16,
    /// Of the request's body: an id that came back with another request
    /// (ids of a client's connections never meet, but a buggy or hostile
    /// client could reuse one) is a new request, run as such.
    digest: u64,
    frame: Vec<u8>,
}

#[derive(Default)]
pub struct Replies {
    kept: VecDeque<Kept>,
}

/// FNV-1a of a request body.
pub fn digest(body: &[u8]) -> u64 {
    body.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

impl Replies {
    /// The reply frame (header included) kept for this request, if any.
    pub fn get(&self, id: u64, op: u16, digest: u64) -> Option<&[u8]> {
        self.kept.iter().rev().find(|k| k.id == id && k.op == op && k.digest == digest).map(|k| k.frame.as_slice())
    }

    pub fn keep(&mut self, id: u64, op: u16, digest: u64, frame: Vec<u8>) {
        if self.kept.len() == KEPT {
            self.kept.pop_front();
        }
        self.kept.push_back(Kept { id, op, digest, frame });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_latest_and_matches_the_request() {
        let mut r = Replies::default();
        for id in 0..(KEPT as u64 + 10) {
            r.keep(id, 9, digest(&id.to_le_bytes()), vec![id as u8]);
        }
        assert!(r.get(0, 9, digest(&0u64.to_le_bytes())).is_none(), "the oldest went");
        let last = KEPT as u64 + 9;
        assert_eq!(r.get(last, 9, digest(&last.to_le_bytes())), Some(&[last as u8][..]));
        assert!(r.get(last, 10, digest(&last.to_le_bytes())).is_none(), "another op");
        assert!(r.get(last, 9, digest(b"other body")).is_none(), "another body");
    }
}
