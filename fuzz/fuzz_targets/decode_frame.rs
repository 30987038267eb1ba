//! Feeds arbitrary bytes to every decoder as a frame: the first 16 bytes are
//! the header, the rest the body. No input may make a decoder panic, and
//! whatever a decoder accepts must re-encode to exactly the same bytes.
#![no_main]

use ferry_proto::{ErrorReply, Header, Reply, Request, HEADER_LEN, MIN_MAX_FRAME};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((head, rest)) = data.split_first_chunk::<HEADER_LEN>() else {
        return;
    };
    let h = Header::decode(head);
    assert_eq!(h.encode(), *head);
    if h.check_len(MIN_MAX_FRAME).is_err() {
        return;
    }
    // Decode the body the header announces when the input holds it, and the
    // whole rest otherwise, so that both consistent and lying headers are tried.
    let body = rest.get(..h.len as usize).unwrap_or(rest);

    if let Ok(req) = Request::decode(h.op, body) {
        let mut out = Vec::new();
        req.encode(h.id, &mut out);
        out.extend_from_slice(req.bulk());
        assert_eq!(&out[HEADER_LEN..], body, "request {req:?} is not canonical");
    }
    if let Ok(reply) = Reply::decode(h.op, body) {
        let mut out = Vec::new();
        reply.encode(h.op, h.id, &mut out);
        if let Reply::Data(d) = &reply {
            out.extend_from_slice(d);
        }
        assert_eq!(&out[HEADER_LEN..], body, "reply {reply:?} is not canonical");
    }
    if let Ok(e) = ErrorReply::decode(body) {
        if e.message.len() <= 1024 {
            let mut out = Vec::new();
            e.encode(h.op, h.id, &mut out);
            assert_eq!(&out[HEADER_LEN..], body, "error {e:?} is not canonical");
        }
    }
});
