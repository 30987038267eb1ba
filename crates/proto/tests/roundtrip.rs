//! Property tests: every message round-trips through its encoding, and no
//! input, however hostile, makes a decoder panic.

use std::collections::BTreeSet;

use ferry_proto::{
    op, Attr, DirEntry, ErrorReply, Header, Reply, Request, StatFs, Target, Time, Welcome, FLAG_ERROR, HEADER_LEN,
    MAX_PATH,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;

/// Every operation code this crate knows.
const ALL_OPS: [u16; 49] = [
    op::SESSION_FENCE,
    op::CALLER,
    op::LOCAL_ADDR,
    op::FILE_FD,
    op::OPEN_CACHED,
    op::CACHE_SET,
    op::CACHE_GET,
    op::LEASE_ON,
    op::LEASE_RETURN,
    op::SESSION_NEW_VOLATILE,
    op::OPEN_ID,
    op::REOPEN,
    op::OPEN_READ,
    op::LIST_DIR,
    op::MKNOD,
    op::LOCK,
    op::GETLOCK,
    op::SESSION_NEW,
    op::SESSION_ATTACH,
    op::HELLO,
    op::AUTH,
    op::PING,
    op::OPEN,
    op::CLOSE,
    op::READ,
    op::PREAD,
    op::WRITE,
    op::PWRITE,
    op::SEEK,
    op::STAT,
    op::FSYNC,
    op::TRUNCATE,
    op::MKDIR,
    op::RMDIR,
    op::UNLINK,
    op::RENAME,
    op::LINK,
    op::SYMLINK,
    op::READLINK,
    op::CHMOD,
    op::CHOWN,
    op::UTIMENS,
    op::STATFS,
    op::ACCESS,
    op::GETXATTR,
    op::SETXATTR,
    op::LISTXATTR,
    op::REMOVEXATTR,
    op::READDIR,
];

// ---------------------------------------------------------------------------
// Requests. Strategies produce owned values; `build_request` borrows them.

const REQUEST_VARIANTS: usize = 49;

/// Index of a request's variant. No wildcard arm: a new variant fails to
/// compile here until the tests below cover it.
fn request_index(r: &Request) -> usize {
    match r {
        Request::Hello { .. } => 0,
        Request::Auth { .. } => 1,
        Request::Ping => 2,
        Request::Open { .. } => 3,
        Request::Close { .. } => 4,
        Request::Read { .. } => 5,
        Request::Pread { .. } => 6,
        Request::Write { .. } => 7,
        Request::Pwrite { .. } => 8,
        Request::Seek { .. } => 9,
        Request::Stat { .. } => 10,
        Request::Fsync { .. } => 11,
        Request::Truncate { .. } => 12,
        Request::Mkdir { .. } => 13,
        Request::Rmdir { .. } => 14,
        Request::Unlink { .. } => 15,
        Request::Rename { .. } => 16,
        Request::Link { .. } => 17,
        Request::Symlink { .. } => 18,
        Request::Readlink { .. } => 19,
        Request::Chmod { .. } => 20,
        Request::Chown { .. } => 21,
        Request::Utimens { .. } => 22,
        Request::Statfs { .. } => 23,
        Request::Access { .. } => 24,
        Request::GetXattr { .. } => 25,
        Request::SetXattr { .. } => 26,
        Request::ListXattr { .. } => 27,
        Request::RemoveXattr { .. } => 28,
        Request::ReadDir { .. } => 29,
        Request::Mknod { .. } => 30,
        Request::Lock { .. } => 31,
        Request::GetLock { .. } => 32,
        Request::SessionNew => 33,
        Request::SessionAttach { .. } => 34,
        Request::OpenId { .. } => 35,
        Request::Reopen { .. } => 36,
        Request::OpenRead { .. } => 37,
        Request::ListDir { .. } => 38,
        Request::SessionNewVolatile => 39,
        Request::OpenCached { .. } => 40,
        Request::CacheSet { .. } => 41,
        Request::CacheGet { .. } => 42,
        Request::LocalAddr => 43,
        Request::FileFd { .. } => 44,
        Request::Caller { .. } => 45,
        Request::LeaseOn => 46,
        Request::LeaseReturn { .. } => 47,
        Request::SessionFence { .. } => 48,
    }
}

#[derive(Debug, Clone)]
enum OwnedTarget {
    Handle(u64),
    Path(Vec<u8>),
    NoFollow(Vec<u8>),
}

impl OwnedTarget {
    fn get(&self) -> Target<'_> {
        match self {
            OwnedTarget::Handle(h) => Target::Handle(*h),
            OwnedTarget::Path(p) => Target::Path(p),
            OwnedTarget::NoFollow(p) => Target::PathNoFollow(p),
        }
    }
}

/// The material for one request of any variant.
#[derive(Debug, Clone)]
struct RawRequest {
    which: usize,
    a: u64,
    b: u64,
    c: u32,
    d: u32,
    flag: bool,
    s1: Vec<u8>,
    s2: Vec<u8>,
    data: Vec<u8>,
    target: OwnedTarget,
    nonce: [u8; 32],
    t1: Time,
    t2: Time,
}

fn build_request(r: &RawRequest) -> Request<'_> {
    let target = r.target.get();
    match r.which {
        0 => Request::Hello {
            min_version: r.c as u16,
            max_version: r.d as u16,
            caps: r.a,
            max_frame: r.c,
            nonce: r.nonce,
        },
        1 => Request::Auth { proof: r.nonce },
        2 => Request::Ping,
        3 => Request::Open { path: &r.s1, flags: r.c, mode: r.d },
        4 => Request::Close { handle: r.a },
        5 => Request::Read { handle: r.a, count: r.c },
        6 => Request::Pread { handle: r.a, offset: r.b, count: r.c },
        7 => Request::Write { handle: r.a, data: &r.data },
        8 => Request::Pwrite { handle: r.a, offset: r.b, data: &r.data },
        9 => Request::Seek { handle: r.a, offset: r.b as i64, whence: r.c },
        10 => Request::Stat { target },
        11 => Request::Fsync { handle: r.a, datasync: r.flag },
        12 => Request::Truncate { target, size: r.b },
        13 => Request::Mkdir { path: &r.s1, mode: r.c },
        14 => Request::Rmdir { path: &r.s1 },
        15 => Request::Unlink { path: &r.s1 },
        16 => Request::Rename { from: &r.s1, to: &r.s2, flags: r.c },
        17 => Request::Link { from: &r.s1, to: &r.s2 },
        18 => Request::Symlink { target: &r.s1, path: &r.s2 },
        19 => Request::Readlink { path: &r.s1 },
        20 => Request::Chmod { target, mode: r.c },
        21 => Request::Chown { target, uid: r.c, gid: r.d },
        22 => Request::Utimens { target, atime: r.t1, mtime: r.t2 },
        23 => Request::Statfs { path: &r.s1 },
        24 => Request::Access { path: &r.s1, mode: r.c },
        25 => Request::GetXattr { target, name: &r.s2, size: r.c },
        26 => Request::SetXattr { target, name: &r.s2, value: &r.data, flags: r.c },
        27 => Request::ListXattr { target, size: r.c },
        28 => Request::RemoveXattr { target, name: &r.s2 },
        29 => Request::ReadDir { handle: r.a, cookie: r.b, max_entries: r.c, plus: r.flag },
        30 => Request::Mknod { path: &r.s1, mode: r.c, rdev: r.b },
        31 => Request::Lock {
            handle: r.a,
            owner: r.b,
            start: r.b.rotate_left(7),
            len: r.a.rotate_left(3),
            pid: r.d,
            kind: (r.c % 3) as u8,
            typ: (r.d % 3) as u8,
        },
        32 => Request::GetLock {
            handle: r.a,
            owner: r.b,
            start: r.a.rotate_left(5),
            len: r.b.rotate_left(9),
            pid: r.c,
            kind: (r.d % 3) as u8,
            typ: (r.c % 2) as u8,
        },
        33 => Request::SessionNew,
        34 => Request::SessionAttach { id: r.a, proof: [r.c as u8; 32] },
        35 => Request::OpenId { path: &r.s1, flags: r.c, mode: r.d },
        36 => Request::Reopen { flags: r.c, dev: r.a, ino: r.b, id: &r.data, path: &r.s1 },
        37 => Request::OpenRead { path: &r.s1, flags: r.c, mode: r.d, max: r.a as u32 },
        38 => Request::ListDir { path: &r.s1, max_entries: r.c, plus: r.flag },
        39 => Request::SessionNewVolatile,
        40 => Request::OpenCached { path: &r.s1, flags: r.c, mode: r.d, max: r.a as u32 },
        41 => Request::CacheSet { path: &r.s1, policy: (r.c % 3) as u8 },
        42 => Request::CacheGet { path: &r.s1 },
        43 => Request::LocalAddr,
        44 => Request::FileFd { handle: r.a },
        45 => Request::Caller {
            slot: (r.c as u16).max(1),
            uid: r.c,
            gid: r.d,
            groups: &r.data[..(r.data.len() / 4 * 4).min(4 * ferry_proto::MAX_GROUPS)],
        },
        46 => Request::LeaseOn,
        47 => Request::LeaseReturn { seq: r.a },
        48 => Request::SessionFence { owner: [r.d as u8; 32], epoch: r.b },
        n => unreachable!("request variant {n}"),
    }
}

/// Paths and names: short plain ones, arbitrary Unicode, arbitrary bytes
/// (names are bytes on Linux, not always UTF-8), and long ones up to
/// `MAX_PATH`.
fn string() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => "[a-z0-9/._-]{0,24}".prop_map(String::into_bytes),
        3 => any::<String>().prop_map(String::into_bytes),
        1 => vec(any::<char>(), 0..64).prop_map(|c| String::from_iter(c).into_bytes()),
        2 => vec(any::<u8>(), 0..64),
        1 => (0..=MAX_PATH).prop_map(|n| vec![b'x'; n]),
    ]
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => vec(any::<u8>(), 0..64),
        // Large tails (beyond u16 lengths) as a cheap pattern.
        1 => (0..70_000usize, any::<u8>())
            .prop_map(|(n, b)| (0..n).map(|i| b.wrapping_add(i as u8)).collect()),
    ]
}

fn time() -> impl Strategy<Value = Time> {
    prop_oneof![
        4 => (any::<i64>(), any::<u32>()).prop_map(|(sec, nsec)| Time { sec, nsec }),
        1 => Just(Time::NOW),
        1 => Just(Time::OMIT),
    ]
}

fn target() -> impl Strategy<Value = OwnedTarget> {
    prop_oneof![
        any::<u64>().prop_map(OwnedTarget::Handle),
        string().prop_map(OwnedTarget::Path),
        string().prop_map(OwnedTarget::NoFollow),
    ]
}

/// Interesting integers more often than uniform ones would give.
fn u64s() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => any::<u64>(),
        1 => select(vec![0, 1, u32::MAX as u64, i64::MAX as u64, u64::MAX]),
    ]
}

fn u32s() -> impl Strategy<Value = u32> {
    prop_oneof![3 => any::<u32>(), 1 => select(vec![0, 1, u16::MAX as u32, u32::MAX])]
}

prop_compose! {
    fn raw_request()(
        which in 0..REQUEST_VARIANTS,
        (a, b, c, d) in (u64s(), u64s(), u32s(), u32s()),
        flag in any::<bool>(),
        (s1, s2) in (string(), string()),
        data in bytes(),
        target in target(),
        nonce in any::<[u8; 32]>(),
        (t1, t2) in (time(), time()),
    ) -> RawRequest {
        RawRequest { which, a, b, c, d, flag, s1, s2, data, target, nonce, t1, t2 }
    }
}

/// A complete request frame: header, fixed fields and bulk tail.
fn request_frame(req: &Request, id: u64) -> Vec<u8> {
    let mut out = Vec::new();
    req.encode(id, &mut out);
    out.extend_from_slice(req.bulk());
    out
}

/// Splits a frame, checking that the header's `len` is the body's length.
fn split(frame: &[u8]) -> (Header, &[u8]) {
    let (head, body) = frame.split_first_chunk::<HEADER_LEN>().expect("a whole header");
    let h = Header::decode(head);
    assert_eq!(h.len as usize, body.len(), "header len vs body");
    (h, body)
}

// ---------------------------------------------------------------------------
// Replies.

const REPLY_VARIANTS: usize = 21;

/// Index of a reply's variant; no wildcard, as for `request_index`.
fn reply_index(r: &Reply) -> usize {
    match r {
        Reply::Welcome(_) => 0,
        Reply::AuthOk { .. } => 1,
        Reply::Empty => 2,
        Reply::Opened { .. } => 3,
        Reply::Data(_) => 4,
        Reply::Written { .. } => 5,
        Reply::Offset { .. } => 6,
        Reply::Attr(_) => 7,
        Reply::Name(_) => 8,
        Reply::StatFs(_) => 9,
        Reply::Xattr { .. } => 10,
        Reply::Dir { .. } => 11,
        Reply::Lock { .. } => 12,
        Reply::Session { .. } => 13,
        Reply::OpenedId { .. } => 14,
        Reply::OpenedData { .. } => 15,
        Reply::OpenedCached { .. } => 16,
        Reply::CachePolicy { .. } => 17,
        Reply::LocalAddr { .. } => 18,
        Reply::FileFd { .. } => 19,
        Reply::LeaseTime { .. } => 20,
    }
}

/// The operations whose success reply is each variant (by `reply_index`).
fn reply_ops(variant: usize) -> &'static [u16] {
    match variant {
        0 => &[op::HELLO],
        1 => &[op::AUTH],
        2 => &[
            op::PING,
            op::CLOSE,
            op::FSYNC,
            op::RMDIR,
            op::UNLINK,
            op::RENAME,
            op::ACCESS,
            op::SETXATTR,
            op::REMOVEXATTR,
            op::CACHE_SET,
            op::LOCK,
            op::CALLER,
            op::SESSION_FENCE,
        ],
        3 => &[op::OPEN],
        4 => &[op::READ, op::PREAD],
        5 => &[op::WRITE, op::PWRITE],
        6 => &[op::SEEK],
        7 => &[op::STAT, op::TRUNCATE, op::MKDIR, op::LINK, op::SYMLINK, op::CHMOD, op::CHOWN, op::UTIMENS, op::MKNOD],
        8 => &[op::READLINK],
        9 => &[op::STATFS],
        10 => &[op::GETXATTR, op::LISTXATTR],
        11 => &[op::READDIR, op::LIST_DIR],
        12 => &[op::GETLOCK],
        13 => &[op::SESSION_NEW, op::SESSION_ATTACH, op::SESSION_NEW_VOLATILE],
        14 => &[op::OPEN_ID, op::REOPEN],
        15 => &[op::OPEN_READ],
        16 => &[op::OPEN_CACHED],
        17 => &[op::CACHE_GET],
        18 => &[op::LOCAL_ADDR],
        19 => &[op::FILE_FD],
        20 => &[op::LEASE_ON],
        n => unreachable!("reply variant {n}"),
    }
}

#[derive(Debug, Clone)]
struct RawReply {
    which: usize,
    pick: usize,
    welcome: Welcome,
    proof: [u8; 32],
    a: u64,
    c: u32,
    attr: Attr,
    data: Vec<u8>,
    name: Vec<u8>,
    statfs: StatFs,
    flag: bool,
    entries: Vec<DirEntry>,
}

/// The op the reply answers, and the reply.
fn build_reply(r: &RawReply) -> (u16, Reply<'_>) {
    let ops = reply_ops(r.which);
    let op = ops[r.pick % ops.len()];
    let reply = match r.which {
        0 => Reply::Welcome(r.welcome.clone()),
        1 => Reply::AuthOk { proof: r.proof },
        2 => Reply::Empty,
        3 => Reply::Opened { handle: r.a, attr: r.attr },
        4 => Reply::Data(&r.data),
        5 => Reply::Written { count: r.c },
        6 => Reply::Offset { offset: r.a },
        7 => Reply::Attr(r.attr),
        8 => Reply::Name(&r.name),
        9 => Reply::StatFs(r.statfs),
        10 => Reply::Xattr { size: r.c, value: &r.data },
        11 => Reply::Dir { eof: r.flag, entries: r.entries.clone() },
        12 => Reply::Lock { typ: (r.c % 3) as u8, start: r.a, len: r.a.rotate_left(11), pid: r.c },
        13 => Reply::Session { id: r.a, lease_ms: r.c },
        14 => Reply::OpenedId { handle: r.a, attr: r.attr, id: &r.data },
        15 => Reply::OpenedData { handle: r.a, attr: r.attr, id: &r.name, data: &r.data },
        16 => Reply::OpenedCached {
            handle: r.a,
            attr: r.attr,
            id: &r.data,
            change: r.a.rotate_left(7),
            policy: (r.c % 3) as u8,
            from: &r.name,
            data: &r.data,
        },
        17 => Reply::CachePolicy { policy: (r.c % 3) as u8, from: &r.name },
        18 => Reply::LocalAddr { pid: r.c, addr: &r.name },
        19 => Reply::FileFd { seq: r.a, writable: r.flag },
        20 => Reply::LeaseTime { ms: r.c },
        n => unreachable!("reply variant {n}"),
    };
    (op, reply)
}

prop_compose! {
    fn attr()(
        (dev, ino, mode, nlink, uid, gid) in
            (any::<u64>(), any::<u64>(), any::<u32>(), any::<u64>(), any::<u32>(), any::<u32>()),
        (rdev, size, blksize, blocks) in (any::<u64>(), any::<u64>(), any::<u32>(), any::<u64>()),
        (atime, mtime, ctime) in (time(), time(), time()),
    ) -> Attr {
        Attr { dev, ino, mode, nlink, uid, gid, rdev, size, blksize, blocks, atime, mtime, ctime }
    }
}

fn statfs() -> impl Strategy<Value = StatFs> {
    any::<[u64; 11]>().prop_map(|v| StatFs {
        bsize: v[0],
        frsize: v[1],
        blocks: v[2],
        bfree: v[3],
        bavail: v[4],
        files: v[5],
        ffree: v[6],
        favail: v[7],
        fsid: v[8],
        flags: v[9],
        namemax: v[10],
    })
}

prop_compose! {
    fn welcome()(
        (version, caps, max_frame, window_requests) in
            (any::<u16>(), u64s(), u32s(), u32s()),
        (window_bytes, boot_id, nonce, auth_required) in
            (u64s(), any::<u64>(), any::<[u8; 32]>(), any::<bool>()),
    ) -> Welcome {
        Welcome { version, caps, max_frame, window_requests, window_bytes, boot_id, nonce, auth_required }
    }
}

prop_compose! {
    fn dir_entry()(
        name in string(),
        (ino, kind, cookie) in (any::<u64>(), any::<u8>(), any::<u64>()),
        attr in proptest::option::of(attr()),
    ) -> DirEntry {
        DirEntry { name, ino, kind, cookie, attr }
    }
}

prop_compose! {
    fn raw_reply()(
        which in 0..REPLY_VARIANTS,
        pick in any::<usize>(),
        welcome in welcome(),
        proof in any::<[u8; 32]>(),
        (a, c, flag) in (u64s(), u32s(), any::<bool>()),
        attr in attr(),
        data in bytes(),
        name in string(),
        statfs in statfs(),
        entries in vec(dir_entry(), 0..6),
    ) -> RawReply {
        RawReply { which, pick, welcome, proof, a, c, attr, data, name, statfs, flag, entries }
    }
}

/// A complete reply frame; `Data` gets its bulk appended.
fn reply_frame(op: u16, reply: &Reply, id: u64) -> Vec<u8> {
    let mut out = Vec::new();
    reply.encode(op, id, &mut out);
    if let Reply::Data(d) = reply {
        out.extend_from_slice(d);
    }
    out
}

// ---------------------------------------------------------------------------
// Decoders on hostile input.

/// Valid ops most of the time, any u16 otherwise.
fn any_op() -> impl Strategy<Value = u16> {
    prop_oneof![4 => select(ALL_OPS.to_vec()), 1 => any::<u16>()]
}

/// Random bodies, some drawn from small byte values so that bools, target
/// kinds and short lengths come out valid and decoding gets further.
fn any_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![vec(any::<u8>(), 0..300), vec(0u8..3, 0..300), vec(select(vec![0u8, 1, 2, 0xff]), 0..300),]
}

/// Feeds `body` to every decoder as operation `op`. Whatever a decoder
/// accepts must re-encode to exactly the same bytes: the encoding is canonical.
fn decode_all(op: u16, body: &[u8]) {
    if let Ok(req) = Request::decode(op, body) {
        assert_eq!(req.op(), op);
        let frame = request_frame(&req, 0);
        assert_eq!(&frame[HEADER_LEN..], body, "request {req:?} is not canonical");
    }
    if let Ok(reply) = Reply::decode(op, body) {
        let frame = reply_frame(op, &reply, 0);
        assert_eq!(&frame[HEADER_LEN..], body, "reply {reply:?} is not canonical");
    }
    if let Ok(e) = ErrorReply::decode(body) {
        if e.message.len() <= 1024 {
            let mut frame = Vec::new();
            e.encode(op, 0, &mut frame);
            assert_eq!(&frame[HEADER_LEN..], body, "error {e:?} is not canonical");
        }
    }
}

/// Flips bytes, then optionally cuts the body short or extends it.
fn mutate(body: &mut Vec<u8>, flips: &[(usize, u8)], cut: Option<usize>, extra: &[u8]) {
    if !body.is_empty() {
        for &(at, x) in flips {
            let n = body.len();
            body[at % n] ^= x;
        }
    }
    if let Some(cut) = cut {
        body.truncate(cut % (body.len() + 1));
    }
    body.extend_from_slice(extra);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn request_round_trips(raw in raw_request(), id in any::<u64>()) {
        let req = build_request(&raw);
        let frame = request_frame(&req, id);
        let (h, body) = split(&frame);
        prop_assert_eq!(h, Header { len: body.len() as u32, op: req.op(), flags: 0, id });
        prop_assert!(!h.is_error());
        prop_assert!(body.ends_with(req.bulk()));
        let back = Request::decode(h.op, body);
        prop_assert_eq!(back, Ok(req));
    }

    #[test]
    fn reply_round_trips(raw in raw_reply(), id in any::<u64>()) {
        let (op, reply) = build_reply(&raw);
        let frame = reply_frame(op, &reply, id);
        let (h, body) = split(&frame);
        prop_assert_eq!(h, Header { len: body.len() as u32, op, flags: 0, id });
        let back = Reply::decode(op, body);
        prop_assert_eq!(back, Ok(reply));
    }

    #[test]
    fn error_reply_round_trips(
        errno in any::<u32>(),
        message in prop_oneof![3 => any::<String>(), 1 => vec(any::<char>(), 200..700).prop_map(String::from_iter)],
        op in any::<u16>(),
        id in any::<u64>(),
    ) {
        let mut frame = Vec::new();
        ErrorReply { errno, message: &message }.encode(op, id, &mut frame);
        let (h, body) = split(&frame);
        prop_assert_eq!(h, Header { len: body.len() as u32, op, flags: FLAG_ERROR, id });
        prop_assert!(h.is_error());
        let back = ErrorReply::decode(body).expect("decodes");
        prop_assert_eq!(back.errno, errno);
        // Messages are cut to 1024 bytes at a character boundary.
        prop_assert!(back.message.len() <= 1024);
        prop_assert!(message.starts_with(back.message));
        if message.len() <= 1024 {
            prop_assert_eq!(back.message, message.as_str());
        } else {
            prop_assert!(back.message.len() > 1024 - 4);
        }
    }

    #[test]
    fn header_round_trips(len in any::<u32>(), op in any::<u16>(), flags in any::<u16>(), id in any::<u64>(), max in any::<u32>()) {
        let h = Header { len, op, flags, id };
        let b = h.encode();
        prop_assert_eq!(&b[0..4], &len.to_le_bytes()[..]);
        prop_assert_eq!(&b[4..6], &op.to_le_bytes()[..]);
        prop_assert_eq!(&b[6..8], &flags.to_le_bytes()[..]);
        prop_assert_eq!(&b[8..16], &id.to_le_bytes()[..]);
        prop_assert_eq!(Header::decode(&b), h);
        prop_assert_eq!(h.is_error(), flags & FLAG_ERROR != 0);
        prop_assert_eq!(h.check_len(max).is_ok(), len <= max);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn decoders_never_panic_on_random_bodies(op in any_op(), body in any_body()) {
        decode_all(op, &body);
    }

    #[test]
    fn decoders_never_panic_on_mutated_requests(
        raw in raw_request(),
        other_op in any_op(),
        use_other in proptest::bool::weighted(0.2),
        flips in vec((any::<usize>(), 1u8..), 0..4),
        cut in proptest::option::of(any::<usize>()),
        extra in vec(any::<u8>(), 0..4),
    ) {
        let req = build_request(&raw);
        let frame = request_frame(&req, 1);
        let mut body = frame[HEADER_LEN..].to_vec();
        mutate(&mut body, &flips, cut, &extra);
        decode_all(if use_other { other_op } else { req.op() }, &body);
    }

    #[test]
    fn decoders_never_panic_on_mutated_replies(
        raw in raw_reply(),
        other_op in any_op(),
        use_other in proptest::bool::weighted(0.2),
        flips in vec((any::<usize>(), 1u8..), 0..4),
        cut in proptest::option::of(any::<usize>()),
        extra in vec(any::<u8>(), 0..4),
    ) {
        let (op, reply) = build_reply(&raw);
        let frame = reply_frame(op, &reply, 1);
        let mut body = frame[HEADER_LEN..].to_vec();
        mutate(&mut body, &flips, cut, &extra);
        decode_all(if use_other { other_op } else { op }, &body);
    }
}

// ---------------------------------------------------------------------------
// Deterministic checks.

fn sample_request(which: usize) -> RawRequest {
    RawRequest {
        which,
        a: 1,
        b: 2,
        c: 3,
        d: 4,
        flag: true,
        s1: "a".into(),
        s2: "b".into(),
        data: vec![9; 5],
        target: OwnedTarget::Path("p".into()),
        nonce: [7; 32],
        t1: Time::NOW,
        t2: Time { sec: -1, nsec: 5 },
    }
}

#[test]
fn the_strategies_cover_every_variant_and_op() {
    let mut ops = BTreeSet::new();
    for which in 0..REQUEST_VARIANTS {
        let raw = sample_request(which);
        let req = build_request(&raw);
        assert_eq!(request_index(&req), which);
        ops.insert(req.op());
    }
    assert_eq!(ops, ALL_OPS.iter().copied().collect::<BTreeSet<_>>());

    let mut reply_ops_seen = BTreeSet::new();
    for which in 0..REPLY_VARIANTS {
        for (pick, &op) in reply_ops(which).iter().enumerate() {
            let raw = RawReply {
                which,
                pick,
                welcome: Welcome {
                    version: 1,
                    caps: 0,
                    max_frame: 0,
                    window_requests: 0,
                    window_bytes: 0,
                    boot_id: 0,
                    nonce: [0; 32],
                    auth_required: false,
                },
                proof: [1; 32],
                a: 1,
                c: 2,
                attr: Attr::default(),
                data: vec![3; 3],
                name: "n".into(),
                statfs: StatFs::default(),
                flag: false,
                entries: Vec::new(),
            };
            let (got_op, reply) = build_reply(&raw);
            assert_eq!(got_op, op);
            assert_eq!(reply_index(&reply), which);
            // Each op has exactly one reply variant.
            assert!(reply_ops_seen.insert(op), "op {op} listed twice");
            let frame = reply_frame(op, &reply, 5);
            let (_, body) = split(&frame);
            assert_eq!(Reply::decode(op, body), Ok(reply));
        }
    }
    // `LeaseReturn` is never answered.
    let answered: BTreeSet<u16> = ALL_OPS.iter().copied().filter(|&o| o != op::LEASE_RETURN).collect();
    assert_eq!(reply_ops_seen, answered);
}

#[test]
fn longest_string_round_trips() {
    let path = "é".repeat(32767) + "x"; // 65535 bytes
    let req = Request::Stat { target: Target::Path(path.as_bytes()) };
    let frame = request_frame(&req, 3);
    let (h, body) = split(&frame);
    assert_eq!(body.len(), 1 + 2 + 65535);
    assert_eq!(Request::decode(h.op, body), Ok(req));
}

#[test]
fn unknown_ops_are_errors() {
    for op in [0u16, 4, 9, 37, 42, 99, u16::MAX] {
        assert!(Request::decode(op, &[]).is_err());
        assert!(Reply::decode(op, &[]).is_err());
    }
}

#[test]
fn huge_directory_count_does_not_allocate_or_panic() {
    // eof, count = u32::MAX, then nothing: must fail fast, not reserve 4G entries.
    let body = [1u8, 0xff, 0xff, 0xff, 0xff];
    assert!(Reply::decode(op::READDIR, &body).is_err());
}

#[test]
fn lock_kind_and_type_are_checked() {
    let lock = |kind: u8, typ: u8| Request::Lock { handle: 1, owner: 2, start: 0, len: 0, pid: 3, kind, typ };
    let body = |req: &Request| request_frame(req, 1)[HEADER_LEN..].to_vec();
    let good = body(&lock(2, 2));
    assert_eq!(Request::decode(op::LOCK, &good), Ok(lock(2, 2)));
    // Kind 3 and type 3 do not exist; GetLock never asks about an unlock.
    assert!(Request::decode(op::LOCK, &body(&lock(3, 0))).is_err());
    assert!(Request::decode(op::LOCK, &body(&lock(0, 3))).is_err());
    assert!(Request::decode(op::GETLOCK, &good).is_err());
    assert!(Reply::decode(op::GETLOCK, &[3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
}

proptest! {
    /// A lease break decodes to what was encoded, whatever the names.
    #[test]
    fn lease_breaks_round_trip(seq in any::<u64>(), objs in prop::collection::vec((any::<u64>(), any::<u64>(), prop::collection::vec(any::<u8>(), 0..64)), 0..20)) {
        let b = ferry_proto::LeaseBreak {
            seq,
            objects: objs.iter().map(|(d, i, n)| ferry_proto::Broken { dev: *d, ino: *i, name: n }).collect(),
        };
        let mut out = Vec::new();
        b.encode(&mut out);
        let (h, body) = split(&out);
        prop_assert!(h.is_notice());
        prop_assert_eq!(h.op, op::LEASE_BREAK);
        prop_assert_eq!(h.id, 0);
        prop_assert_eq!(ferry_proto::LeaseBreak::decode(body).unwrap(), b);
    }
}
