//! The example frames in `PROTOCOL.md` are normative: every block marked
//! `<!-- golden: NAME -->` must be exactly what this crate encodes for the
//! message named here, and must decode back to it.

use std::collections::BTreeMap;

use ferry_proto::{
    caps, client_proof, op, server_proof, Attr, DirEntry, ErrorReply, Header, Reply, Request, StatFs, Target, Time,
    Welcome, FLAG_ERROR, HEADER_LEN, MIN_MAX_FRAME,
};

const DOC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../PROTOCOL.md");

fn doc() -> String {
    std::fs::read_to_string(DOC_PATH).unwrap_or_else(|e| panic!("reading {DOC_PATH}: {e}"))
}

/// A message as it travels: a request, a success reply or an error reply
/// (replies carry the op of the request they answer).
#[derive(Debug)]
enum Msg {
    Req(Request<'static>),
    Rep(u16, Reply<'static>),
    Err(u16, ErrorReply<'static>),
}

struct Golden {
    name: &'static str,
    id: u64,
    msg: Msg,
}

fn g(name: &'static str, id: u64, msg: Msg) -> Golden {
    Golden { name, id, msg }
}

const CLIENT_NONCE: [u8; 32] = {
    let mut n = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        n[i] = i as u8;
        i += 1;
    }
    n
};

const SERVER_NONCE: [u8; 32] = {
    let mut n = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        n[i] = 0x20 + i as u8;
        i += 1;
    }
    n
};

const TOKEN: &[u8] = b"secret";

fn opened_attr() -> Attr {
    Attr {
        dev: 0x803,
        ino: 131075,
        mode: 0o100644,
        nlink: 1,
        uid: 1000,
        gid: 1000,
        rdev: 0,
        size: 6,
        blksize: 4096,
        blocks: 8,
        atime: Time { sec: 1_700_000_000, nsec: 500_000_000 },
        mtime: Time { sec: 1_700_000_000, nsec: 500_000_000 },
        ctime: Time { sec: 1_700_000_001, nsec: 0 },
    }
}

/// Every golden frame `PROTOCOL.md` must contain, with the message it shows.
fn goldens() -> Vec<Golden> {
    use Msg::{Err, Rep, Req};
    vec![
        g(
            "hello",
            0,
            Req(Request::Hello {
                min_version: 1,
                max_version: 1,
                caps: caps::READDIRPLUS | caps::XATTR | caps::RENAME_FLAGS,
                max_frame: MIN_MAX_FRAME,
                nonce: CLIENT_NONCE,
            }),
        ),
        g(
            "welcome",
            0,
            Rep(
                op::HELLO,
                Reply::Welcome(Welcome {
                    version: 1,
                    caps: caps::READDIRPLUS | caps::XATTR | caps::RENAME_FLAGS,
                    max_frame: MIN_MAX_FRAME,
                    window_requests: 64,
                    window_bytes: 64 << 20,
                    boot_id: 0x1122_3344_5566_7788,
                    nonce: SERVER_NONCE,
                    auth_required: true,
                }),
            ),
        ),
        g("auth", 1, Req(Request::Auth { proof: client_proof(TOKEN, &SERVER_NONCE, &CLIENT_NONCE) })),
        g("auth_ok", 1, Rep(op::AUTH, Reply::AuthOk { proof: server_proof(TOKEN, &SERVER_NONCE, &CLIENT_NONCE) })),
        g("auth_failed", 1, Err(op::AUTH, ErrorReply { errno: 13, message: "authentication failed" })),
        g("ping", 2, Req(Request::Ping)),
        g("empty", 2, Rep(op::PING, Reply::Empty)),
        g("open", 3, Req(Request::Open { path: b"docs/a.txt", flags: 0x42, mode: 0o644 })),
        g("opened", 3, Rep(op::OPEN, Reply::Opened { handle: 1, attr: opened_attr() })),
        g("pread", 4, Req(Request::Pread { handle: 1, offset: 0, count: 65536 })),
        g("data", 4, Rep(op::PREAD, Reply::Data(b"hello\n"))),
        g("write", 5, Req(Request::Write { handle: 1, data: b"hello\n" })),
        g("written", 5, Rep(op::WRITE, Reply::Written { count: 6 })),
        g("pwrite", 6, Req(Request::Pwrite { handle: 1, offset: 4096, data: b"xyz" })),
        g("seek", 8, Req(Request::Seek { handle: 1, offset: -2, whence: 2 })),
        g("offset", 8, Rep(op::SEEK, Reply::Offset { offset: 4 })),
        g("stat_path", 7, Req(Request::Stat { target: Target::Path(b"a/b") })),
        g("stat_handle", 9, Req(Request::Stat { target: Target::Handle(1) })),
        g("error_enoent", 7, Err(op::STAT, ErrorReply { errno: 2, message: "no such file or directory" })),
        g(
            "chown_nofollow",
            10,
            Req(Request::Chown { target: Target::PathNoFollow(b"link"), uid: 1000, gid: u32::MAX }),
        ),
        g(
            "utimens",
            11,
            Req(Request::Utimens {
                target: Target::Path(b"f"),
                atime: Time::OMIT,
                mtime: Time { sec: 1_700_000_000, nsec: 250 },
            }),
        ),
        g("rename", 12, Req(Request::Rename { from: b"a", to: b"b", flags: 1 })),
        g("unlink_latin1", 18, Req(Request::Unlink { path: b"caf\xe9" })),
        g(
            "setxattr",
            13,
            Req(Request::SetXattr { target: Target::Handle(1), name: b"user.k", value: b"v1", flags: 1 }),
        ),
        g("xattr", 14, Rep(op::GETXATTR, Reply::Xattr { size: 2, value: b"v1" })),
        g("readdir", 15, Req(Request::ReadDir { handle: 2, cookie: 0, max_entries: 128, plus: false })),
        g(
            "dir",
            15,
            Rep(
                op::READDIR,
                Reply::Dir {
                    eof: true,
                    entries: vec![DirEntry { name: "a.txt".into(), ino: 131075, kind: 8, cookie: 1, attr: None }],
                },
            ),
        ),
        g(
            "statfs",
            16,
            Rep(
                op::STATFS,
                Reply::StatFs(StatFs {
                    bsize: 4096,
                    frsize: 4096,
                    blocks: 1_000_000,
                    bfree: 500_000,
                    bavail: 450_000,
                    files: 65536,
                    ffree: 60_000,
                    favail: 60_000,
                    fsid: 0x1234,
                    flags: 1,
                    namemax: 255,
                }),
            ),
        ),
        g("lock", 18, Req(Request::Lock { handle: 1, owner: 4242, start: 100, len: 0, pid: 4242, kind: 0, typ: 1 })),
        g("getlock_reply", 19, Rep(op::GETLOCK, Reply::Lock { typ: 0, start: 0, len: 10, pid: 77 })),
        g("session_reply", 20, Rep(op::SESSION_NEW, Reply::Session { id: 0x0102030405060708, lease_ms: 60_000 })),
        g(
            "reopen",
            21,
            Req(Request::Reopen {
                flags: 2,
                dev: 2049,
                ino: 12,
                id: &[1, 0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0],
                path: b"a.txt",
            }),
        ),
        g("caller", 22, Req(Request::Caller { slot: 1, uid: 1000, gid: 1000, groups: &[0xe8, 3, 0, 0, 27, 0, 0, 0] })),
        g("enosys", 17, Err(99, ErrorReply { errno: 38, message: "unknown operation 99" })),
    ]
}

/// Parses one row of hex bytes, ignoring a `#` comment.
fn parse_row(name: &str, line: &str) -> Vec<u8> {
    let code = line.split('#').next().unwrap_or("");
    code.split_whitespace()
        .map(|tok| {
            assert!(tok.len() == 2, "golden {name}: `{tok}` is not one hex byte in row `{line}`");
            u8::from_str_radix(tok, 16).unwrap_or_else(|_| panic!("golden {name}: bad hex `{tok}` in row `{line}`"))
        })
        .collect()
}

/// Every `frame` block of the document, by name. Panics on a `frame` block
/// without a name, a name without a block, a duplicate name or an unclosed block.
fn golden_blocks(doc: &str) -> BTreeMap<String, Vec<u8>> {
    let mut blocks = BTreeMap::new();
    let mut lines = doc.lines();
    let mut pending: Option<String> = None;
    while let Some(line) = lines.next() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("<!-- golden:") {
            let name = rest.strip_suffix("-->").expect("golden marker ends with -->").trim();
            assert!(!name.is_empty(), "empty golden name");
            assert!(pending.is_none(), "golden marker {pending:?} is not followed by a block");
            pending = Some(name.to_owned());
        } else if t == "```frame" {
            let name = pending.take().expect("a ```frame block without a golden marker before it");
            let mut bytes = Vec::new();
            let mut closed = false;
            for row in lines.by_ref() {
                if row.trim() == "```" {
                    closed = true;
                    break;
                }
                bytes.extend(parse_row(&name, row));
            }
            assert!(closed, "golden {name}: block is not closed");
            assert!(blocks.insert(name.clone(), bytes).is_none(), "golden {name} appears twice");
        } else if !t.is_empty() {
            assert!(pending.is_none(), "golden marker {pending:?} is not followed by a block");
        }
    }
    assert!(pending.is_none(), "golden marker {pending:?} at the end of the document");
    blocks
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(" ")
}

fn encode(id: u64, msg: &Msg) -> Vec<u8> {
    let mut out = Vec::new();
    match msg {
        Msg::Req(r) => {
            r.encode(id, &mut out);
            out.extend_from_slice(r.bulk());
        }
        Msg::Rep(op, r) => {
            r.encode(*op, id, &mut out);
            if let Reply::Data(d) = r {
                out.extend_from_slice(d);
            }
        }
        Msg::Err(op, e) => e.encode(*op, id, &mut out),
    }
    out
}

/// Decodes a whole frame as the kind of message `want` is and compares.
fn check_decode(name: &str, id: u64, want: &Msg, bytes: &[u8]) -> Result<(), String> {
    let (head, body) =
        bytes.split_first_chunk::<HEADER_LEN>().ok_or_else(|| format!("golden {name}: shorter than a header"))?;
    let h = Header::decode(head);
    let fail = |what: String| Err(format!("golden {name}: {what}"));
    if h.len as usize != body.len() {
        return fail(format!("header len {} but the body has {} bytes", h.len, body.len()));
    }
    if h.id != id {
        return fail(format!("id {} instead of {id}", h.id));
    }
    match want {
        Msg::Req(r) => {
            if h.op != r.op() || h.flags != 0 {
                return fail(format!("op {} flags {} for a request of op {}", h.op, h.flags, r.op()));
            }
            match Request::decode(h.op, body) {
                Ok(got) if got == *r => Ok(()),
                got => fail(format!("decodes to {got:?}, want {r:?}")),
            }
        }
        Msg::Rep(op, r) => {
            if h.op != *op || h.flags != 0 {
                return fail(format!("op {} flags {} for a reply of op {op}", h.op, h.flags));
            }
            match Reply::decode(h.op, body) {
                Ok(got) if got == *r => Ok(()),
                got => fail(format!("decodes to {got:?}, want {r:?}")),
            }
        }
        Msg::Err(op, e) => {
            if h.op != *op || h.flags != FLAG_ERROR || !h.is_error() {
                return fail(format!("op {} flags {} for an error reply of op {op}", h.op, h.flags));
            }
            match ErrorReply::decode(body) {
                Ok(got) if got == *e => Ok(()),
                got => fail(format!("decodes to {got:?}, want {e:?}")),
            }
        }
    }
}

#[test]
fn protocol_md_frames_match_the_implementation() {
    let mut blocks = golden_blocks(&doc());
    let mut failures = Vec::new();
    for gd in goldens() {
        let Some(bytes) = blocks.remove(gd.name) else {
            failures.push(format!("golden {}: no `<!-- golden: {} -->` block in PROTOCOL.md", gd.name, gd.name));
            continue;
        };
        let encoded = encode(gd.id, &gd.msg);
        if encoded != bytes {
            failures.push(format!(
                "golden {}: {:?} encodes to\n    {}\n  but PROTOCOL.md shows\n    {}",
                gd.name,
                gd.msg,
                hex(&encoded),
                hex(&bytes)
            ));
        }
        if let Err(e) = check_decode(gd.name, gd.id, &gd.msg, &bytes) {
            failures.push(e);
        }
    }
    for name in blocks.keys() {
        failures.push(format!("golden {name}: block in PROTOCOL.md has no message in golden.rs"));
    }
    assert!(failures.is_empty(), "{} problem(s):\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn protocol_md_has_enough_examples() {
    let blocks = golden_blocks(&doc());
    assert!(blocks.len() >= 8, "only {} golden frames", blocks.len());
    assert_eq!(blocks.len(), goldens().len());
}

#[test]
fn parser_ignores_comments_and_requires_names() {
    let doc = "text\n<!-- golden: x -->\n```frame\n# comment\n01 02  # two\n\n0a # ten\n```\n";
    let b = golden_blocks(doc);
    assert_eq!(b["x"], vec![1, 2, 10]);
    let unnamed = std::panic::catch_unwind(|| golden_blocks("```frame\n01\n```\n"));
    assert!(unnamed.is_err());
}
