//! What a request touches, for leases (`leases.rs`): the objects whose
//! leases a change breaks, and those a reply grants. Looked up only while
//! some session holds leases; a change by path costs an `lstat` or two
//! more then (the objects are known by `(dev, ino)`, requests by path).

use ferry_proto::{Attr, Request, Target};

use crate::backend::Backend;
use crate::leases::Touched;
use crate::locks::FileKey;
use crate::session::{Answer, Session};

/// Parent directory and last name of a request's path.
fn split(path: &[u8]) -> (&[u8], &[u8]) {
    let p = &path[..path.iter().rposition(|&b| b != b'/').map_or(0, |i| i + 1)];
    match p.iter().rposition(|&b| b == b'/') {
        Some(0) => (b"/", &p[1..]),
        Some(i) => (&p[..i], &p[i + 1..]),
        None => (b"/", p),
    }
}

/// A name's entry in its directory, if the directory is there.
fn entry<B: Backend>(s: &Session<B>, path: &[u8], out: &mut Vec<Touched>) {
    let (parent, name) = split(path);
    if let Some((key, _)) = s.lstat_key(parent) {
        out.push(Touched::Entry(key, name.to_vec()));
    }
}

/// A name that goes away or is replaced: its object, its entry, and — for
/// a directory or a symlink — everything kept by path (paths through it
/// now lead elsewhere).
fn leaving<B: Backend>(s: &Session<B>, path: &[u8], dirs_too: bool, out: &mut Vec<Touched>) {
    if let Some((key, fmt)) = s.lstat_key(path) {
        out.push(Touched::Object(key));
        if fmt == libc::S_IFLNK || (dirs_too && fmt == libc::S_IFDIR) {
            out.push(Touched::All);
        }
    }
    entry(s, path, out);
}

/// What `req` will change, looked up before it runs (by path, what is
/// there now). Changes whose reply carries the changed object's attributes
/// are found from the reply as well (`changed_in`): a path may name
/// another object by the time the change runs.
pub fn before<B: Backend>(s: &Session<B>, req: &Request<'_>) -> Vec<Touched> {
    let mut out = Vec::new();
    match *req {
        Request::Write { handle, .. } | Request::Pwrite { handle, .. } => {
            out.extend(s.handle_key(handle).map(Touched::Object));
        }
        // Written past the server through a descriptor it lent.
        Request::Close { handle } => out.extend(s.lent_key(handle).map(Touched::Object)),
        Request::SetXattr { target, .. } | Request::RemoveXattr { target, .. } => {
            out.extend(s.target_key(&target).map(Touched::Object));
        }
        Request::CacheSet { path, .. } => out.extend(s.lstat_key(path).map(|(k, _)| Touched::Object(k))),
        // Their reply names the object too (`changed_in`); looked up here
        // as well, so its holders' breaks go out before the change runs.
        Request::Truncate { target, .. }
        | Request::Chmod { target, .. }
        | Request::Chown { target, .. }
        | Request::Utimens { target, .. } => out.extend(s.target_key(&target).map(Touched::Object)),
        Request::Mkdir { path, .. } | Request::Mknod { path, .. } | Request::Symlink { path, .. } => {
            entry(s, path, &mut out);
        }
        Request::Open { path, flags, .. }
        | Request::OpenId { path, flags, .. }
        | Request::OpenRead { path, flags, .. }
        | Request::OpenCached { path, flags, .. }
            if flags & libc::O_CREAT as u32 != 0 && s.lstat_key(path).is_none() =>
        {
            entry(s, path, &mut out);
        }
        Request::Unlink { path } => leaving(s, path, false, &mut out),
        Request::Rmdir { path } => leaving(s, path, false, &mut out),
        Request::Rename { from, to, .. } => {
            leaving(s, from, true, &mut out);
            leaving(s, to, true, &mut out);
        }
        Request::Link { from, to } => {
            out.extend(s.lstat_key(from).map(|(k, _)| Touched::Object(k)));
            entry(s, to, &mut out);
        }
        _ => {}
    }
    out
}

/// Whether a change's breaks may go out before it runs (`Leases::
/// begin_change`), beside it, rather than after it succeeded. Only where
/// the change is surely its caller's to make: sent early, the breaks of a
/// change the caller is then refused would let anyone who can name an
/// object have its holders' leases broken at will (and time who holds
/// what) by asking for changes it may not make. So: a write through a
/// handle opened for writing; root, or the server acting as itself
/// (`uid` `None`); and a change to what the caller owns (a name: the
/// directory it is in). Anything else breaks after it succeeded, as every
/// change did before (a group's or a shared directory's writers: correct,
/// one break's round trip slower).
pub fn may_break_early<B: Backend>(s: &Session<B>, req: &Request<'_>, uid: Option<u32>) -> bool {
    if let Request::Write { handle, .. } | Request::Pwrite { handle, .. } = *req {
        return s.handle_writable(handle);
    }
    let Some(uid) = uid.filter(|&u| u != 0) else { return true };
    let owns = |t: Target<'_>| s.owner_of(&t) == Some(uid);
    let owns_dir = |path: &[u8]| owns(Target::Path(split(path).0));
    match *req {
        Request::Truncate { target: Target::Handle(h), .. } => s.handle_writable(h),
        Request::Truncate { target, .. }
        | Request::Chmod { target, .. }
        | Request::Chown { target, .. }
        | Request::Utimens { target, .. }
        | Request::SetXattr { target, .. }
        | Request::RemoveXattr { target, .. } => owns(target),
        Request::CacheSet { path, .. } => owns(Target::PathNoFollow(path)),
        Request::Mkdir { path, .. }
        | Request::Mknod { path, .. }
        | Request::Symlink { path, .. }
        | Request::Open { path, .. }
        | Request::OpenId { path, .. }
        | Request::OpenRead { path, .. }
        | Request::OpenCached { path, .. }
        | Request::Unlink { path }
        | Request::Rmdir { path } => owns_dir(path),
        Request::Link { to, .. } => owns_dir(to),
        Request::Rename { from, to, .. } => owns_dir(from) && owns_dir(to),
        // Written through a descriptor lent for writing to this session.
        _ => true,
    }
}

fn key(a: &Attr) -> FileKey {
    (a.dev, a.ino)
}

/// What a change's reply says it changed (its attributes came back).
pub fn changed_in<F>(req: &Request<'_>, answer: &Answer<F>) -> Option<FileKey> {
    let truncates = |flags: u32| flags & libc::O_TRUNC as u32 != 0;
    match (req, answer) {
        (
            Request::Truncate { .. } | Request::Chmod { .. } | Request::Chown { .. } | Request::Utimens { .. },
            Answer::Attr(a),
        ) => Some(key(a)),
        (
            Request::Open { flags, .. }
            | Request::OpenId { flags, .. }
            | Request::OpenRead { flags, .. }
            | Request::OpenCached { flags, .. }
            | Request::Reopen { flags, .. },
            Answer::Opened { attr, .. }
            | Answer::OpenedId { attr, .. }
            | Answer::OpenedData { attr, .. }
            | Answer::OpenedCached { attr, .. },
        ) if truncates(*flags) => Some(key(attr)),
        _ => None,
    }
}

/// The objects whose attributes a reply carries: what it grants leases on.
pub fn granted<F>(answer: &Answer<F>) -> Vec<FileKey> {
    match answer {
        Answer::Attr(a)
        | Answer::Opened { attr: a, .. }
        | Answer::OpenedId { attr: a, .. }
        | Answer::OpenedData { attr: a, .. }
        | Answer::OpenedCached { attr: a, .. } => vec![key(a)],
        Answer::Dir { entries, .. } => entries.iter().filter_map(|e| e.attr.as_ref().map(key)).collect(),
        _ => Vec::new(),
    }
}

/// A `Stat` by path that found nothing grants a lease on the directory the
/// name would be in: a client that keeps the miss (the mount's negative
/// entry) hears of the name's creation.
pub fn granted_on_miss<B: Backend>(s: &Session<B>, req: &Request<'_>) -> Option<FileKey> {
    match *req {
        Request::Stat { target: ferry_proto::Target::Path(p) | ferry_proto::Target::PathNoFollow(p) } => {
            s.lstat_key(split(p).0).map(|(k, _)| k)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn paths_split_into_their_directory_and_name() {
        assert_eq!(split(b"a"), (&b"/"[..], &b"a"[..]));
        assert_eq!(split(b"/a"), (&b"/"[..], &b"a"[..]));
        assert_eq!(split(b"/a/b/"), (&b"/a"[..], &b"b"[..]));
        assert_eq!(split(b"a/b/c"), (&b"a/b"[..], &b"c"[..]));
    }
}
