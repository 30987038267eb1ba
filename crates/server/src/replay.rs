//! A session's reply cache (`caps::REPLAY`), as NFSv4.1 sessions keep one:
//! the encoded replies of its latest requests that must not run twice
//! (`Request::once_only`). A client whose connection broke before the reply
//! arrived sends such a request again, with the same id, on the session it
//! rejoined; it gets the kept reply and the request does not run again.
//!
//! Requests that must not run twice run one at a time under the session's
//! `once` lock (other requests run beside them), so a request still running
//! on the broken connection has finished, and kept its reply, before the
//! one sent again is looked up.

use std::collections::VecDeque;

use ferry_proto::{Request, Target};

/// Replies kept per session: far more than a client keeps in flight (its
/// window), so a reply is never gone before the client can ask again.
pub const KEPT: usize = 256;

struct Kept {
    id: u64,
    op: u16,
    /// Of the request's body: an id that came back with another request
    /// (ids of a client's connections never meet, but a buggy or hostile
    /// client could reuse one) is a new request, run as such.
    digest: u64,
    frame: Vec<u8>,
    /// Kept by a previous server process (read back from the journal):
    /// handles it names are gone.
    old: bool,
}

#[derive(Default)]
pub struct Replies {
    kept: VecDeque<Kept>,
    /// Requests a previous server process started and never answered (it
    /// died), with what their intent noted: sent again, their outcome is
    /// found out (see `conn`).
    unknown: Vec<(u64, u16, u64, Vec<u8>)>,
}

/// The digest a request is kept under: of its body, but for a `Write`
/// (an append) of its data only: sent again after a restart, it names the
/// handle the client opened again, not the dead one.
pub fn digest_of(req: &Request<'_>, body: &[u8]) -> u64 {
    match req {
        Request::Write { data, .. } => digest(data),
        _ => digest(body),
    }
}

/// FNV-1a of a request body.
pub fn digest(body: &[u8]) -> u64 {
    body.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

impl Replies {
    /// What a previous server process left of a session's cache.
    pub fn restored(replies: Vec<(u64, u16, u64, Vec<u8>)>, unknown: Vec<(u64, u16, u64, Vec<u8>)>) -> Replies {
        let skip = replies.len().saturating_sub(KEPT);
        let kept = replies
            .into_iter()
            .skip(skip)
            .map(|(id, op, digest, frame)| Kept { id, op, digest, frame, old: true })
            .collect();
        Replies { kept, unknown }
    }

    /// The reply frame (header included) kept for this request, if any,
    /// and whether a previous server process kept it.
    pub fn get(&self, id: u64, op: u16, digest: u64) -> Option<(&[u8], bool)> {
        self.kept
            .iter()
            .rev()
            .find(|k| k.id == id && k.op == op && k.digest == digest)
            .map(|k| (k.frame.as_slice(), k.old))
    }

    /// If this request was started by a previous server process that died
    /// before answering, what its intent noted; asked once.
    pub fn take_unknown(&mut self, id: u64, op: u16, digest: u64) -> Option<Vec<u8>> {
        let at = self.unknown.iter().position(|u| (u.0, u.1, u.2) == (id, op, digest))?;
        Some(self.unknown.swap_remove(at).3)
    }

    /// Everything kept, oldest first (for rewriting the journal).
    pub fn iter(&self) -> impl Iterator<Item = (u64, u16, u64, &[u8])> {
        self.kept.iter().map(|k| (k.id, k.op, k.digest, k.frame.as_slice()))
    }

    pub fn keep(&mut self, id: u64, op: u16, digest: u64, frame: Vec<u8>) {
        if self.kept.len() == KEPT {
            self.kept.pop_front();
        }
        self.kept.push_back(Kept { id, op, digest, frame, old: false });
    }
}

/// An exclusive open made an open of the file it created: for a reply
/// kept by a previous server process (its handle died with it), and for
/// an exclusive create sent again whose first run created the file.
pub fn without_create<'a>(req: &Request<'a>) -> Option<Request<'a>> {
    let strip = |f: u32| f & !((libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC) as u32);
    match *req {
        Request::Open { path, flags, mode } => Some(Request::Open { path, flags: strip(flags), mode }),
        Request::OpenId { path, flags, mode } => Some(Request::OpenId { path, flags: strip(flags), mode }),
        Request::OpenCached { path, flags, mode, max } => {
            Some(Request::OpenCached { path, flags: strip(flags), mode, max })
        }
        Request::OpenRead { path, flags, mode, max } => {
            Some(Request::OpenRead { path, flags: strip(flags), mode, max })
        }
        _ => None,
    }
}

/// A request a dead server process started and never answered, sent
/// again: the errno its second run gives if the first one finished, and
/// the request whose answer then stands for the first run's (NFS clients
/// treat a retransmitted REMOVE's `ENOENT` the same way). Only such
/// requests get this; a new one's `EEXIST` is an `EEXIST`.
pub fn settled<'a>(req: &Request<'a>) -> Option<(i32, Request<'a>)> {
    let made = |path| Some((libc::EEXIST, Request::Stat { target: Target::PathNoFollow(path) }));
    match *req {
        Request::Mkdir { path, .. } | Request::Mknod { path, .. } | Request::Symlink { path, .. } => made(path),
        Request::Link { to, .. } => made(to),
        Request::Unlink { .. } | Request::Rmdir { .. } | Request::Rename { .. } => Some((libc::ENOENT, Request::Ping)),
        _ => without_create(req).map(|r| (libc::EEXIST, r)),
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
        assert_eq!(r.get(last, 9, digest(&last.to_le_bytes())), Some((&[last as u8][..], false)));
        assert!(r.get(last, 10, digest(&last.to_le_bytes())).is_none(), "another op");
        assert!(r.get(last, 9, digest(b"other body")).is_none(), "another body");
    }

    #[test]
    fn an_append_is_known_by_its_data_whatever_handle_it_names() {
        let (a, b) = (Request::Write { handle: 1, data: b"line\n" }, Request::Write { handle: 9, data: b"line\n" });
        let (mut ea, mut eb) = (Vec::new(), Vec::new());
        a.encode(1, &mut ea);
        b.encode(1, &mut eb);
        assert_ne!(ea, eb);
        assert_eq!(digest_of(&a, &ea), digest_of(&b, &eb));
        assert_ne!(digest_of(&a, &ea), digest_of(&Request::Write { handle: 1, data: b"other\n" }, &ea[..4]));
    }

    #[test]
    fn a_request_of_unknown_outcome_is_settled_by_what_its_first_run_leaves() {
        let (errno, instead) = settled(&Request::Mkdir { path: b"/d", mode: 0o755 }).unwrap();
        assert_eq!(errno, libc::EEXIST);
        assert!(matches!(instead, Request::Stat { target: Target::PathNoFollow(b"/d") }));
        assert_eq!(settled(&Request::Unlink { path: b"/f" }).map(|s| s.0), Some(libc::ENOENT));
        assert_eq!(settled(&Request::Rename { from: b"/a", to: b"/b", flags: 0 }).map(|s| s.0), Some(libc::ENOENT));
        let excl = (libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY) as u32;
        let (errno, instead) = settled(&Request::OpenId { path: b"/x", flags: excl, mode: 0o644 }).unwrap();
        assert_eq!(errno, libc::EEXIST);
        assert!(matches!(instead, Request::OpenId { flags, .. } if flags == libc::O_WRONLY as u32));
        assert!(settled(&Request::Ping).is_none());
    }

    #[test]
    fn replies_read_back_are_marked_old_and_unknown_requests_asked_once() {
        let mut r = Replies::restored(vec![(1, 9, 5, vec![1])], vec![(2, 9, 6, vec![7])]);
        assert_eq!(r.get(1, 9, 5), Some((&[1u8][..], true)));
        assert_eq!(r.take_unknown(2, 9, 6), Some(vec![7]));
        assert!(r.take_unknown(2, 9, 6).is_none(), "asked once");
        r.keep(3, 9, 7, vec![3]);
        assert_eq!(r.get(3, 9, 7), Some((&[3u8][..], false)));
    }
}
