//! Entry points of the fuzz targets (`fuzz/`), and of the test that replays
//! every input they ever failed on (`tests/fuzz_regressions.rs`). Each takes
//! arbitrary bytes and must not panic; hidden from the documentation.

use std::sync::Arc;

use ferry_proto::handshake::{ServerHandshake, ServerOffer};
use ferry_proto::{caps, ErrorReply, Header, Reply, Request, HEADER_LEN, MIN_MAX_FRAME};

use crate::backend::Backend;
use crate::memory::MemoryBackend;
use crate::session::{HandleBudget, Policy, Session};

/// The operation (two bytes, little-endian) and the body that follow.
fn op_and_body(data: &[u8]) -> Option<(u16, &[u8])> {
    let (op, body) = data.split_first_chunk::<2>()?;
    Some((u16::from_le_bytes(*op), body))
}

/// Every decoder fed a frame: the first 16 bytes are the header, the rest
/// the body. No input may make a decoder panic, and whatever a decoder
/// accepts must encode again to exactly the same bytes (one encoding per
/// message: nothing a client sends is read two ways).
pub fn frame(data: &[u8]) {
    let Some((head, rest)) = data.split_first_chunk::<HEADER_LEN>() else {
        return;
    };
    let h = Header::decode(head);
    assert_eq!(h.encode(), *head);
    if h.check_len(MIN_MAX_FRAME).is_err() {
        return;
    }
    // The body the header announces when the input holds it, else the whole
    // rest, so that both consistent and lying headers are tried.
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
}

/// The server's handshake fed frames (a header, then as much body as it
/// announces, from what is left): never accepted without the token.
pub fn handshake(data: &[u8]) {
    let offer = ServerOffer {
        caps: caps::ALL,
        max_frame: 1 << 20,
        window_requests: 16,
        window_bytes: 1 << 24,
        boot_id: 1,
        tokens: vec![b"the token".to_vec()],
        binding: None,
    };
    let mut hs = ServerHandshake::new(offer, [7; 32]);
    let mut rest = data;
    let mut out = Vec::new();
    while let Some((head, tail)) = rest.split_first_chunk::<HEADER_LEN>() {
        let h = Header::decode(head);
        let n = (h.len as usize).min(tail.len());
        out.clear();
        match hs.receive(&h, &tail[..n], &mut out) {
            Ok(None) => {}
            Ok(Some(_)) => panic!("a handshake without the token's proof was accepted"),
            Err(_) => return,
        }
        rest = &tail[n..];
    }
}

/// A session of the memory backend running the requests `data` holds, as
/// records of an operation (`u16`), a body length (`u16`) and the body:
/// whatever they are (handles never opened, hostile paths, any order),
/// each gets an answer and the server goes on.
pub fn session(data: &[u8]) {
    let policy = Policy {
        budget: Arc::new(HandleBudget::new(64)),
        read_only: false,
        allow_devices: false,
        max_handles: 32,
        caps: caps::ALL,
        max_read: 1 << 20,
        locks: Arc::default(),
        changes: Arc::default(),
        dirs: Arc::default(),
        seals: Arc::default(),
    };
    let backend = Arc::new(MemoryBackend::new());
    let s = Session::new(Arc::clone(&backend), policy);
    let mut rest = data;
    for _ in 0..256 {
        let Some((op, tail)) = op_and_body(rest) else { return };
        let Some((len, tail)) = tail.split_first_chunk::<2>() else { return };
        let n = usize::from(u16::from_le_bytes(*len)).min(tail.len());
        if let Ok(req) = Request::decode(op, &tail[..n]) {
            // A read's data is moved by the connection: done here the same way.
            if let Ok(crate::session::Answer::Read(c, n)) = s.execute(&req) {
                if let Ok(d) = backend.read(c.file(), c.offset(), n) {
                    c.advance(d.len());
                }
            }
        }
        rest = &tail[n..];
    }
}

/// The first bytes of a TLS connection to the server: a client's
/// handshake (`ferry_sock::tls::fuzz::handshake`) if the first byte says
/// so, else the rest as sealed records, raw bytes and all
/// (`ferry_sock::tls::fuzz::records`).
pub fn tls(data: &[u8]) {
    static CONFIG: std::sync::OnceLock<Arc<rustls::ServerConfig>> = std::sync::OnceLock::new();
    match data.split_first() {
        Some((&first, _)) if ferry_sock::tls::is_client_hello(first) => {
            let config = CONFIG.get_or_init(|| {
                let pair = rcgen::generate_simple_self_signed(vec!["ferry".to_string()]).expect("a certificate");
                let key = rustls::pki_types::PrivateKeyDer::Pkcs8(pair.key_pair.serialize_der().into());
                crate::tls::config(vec![pair.cert.der().clone()], key).expect("a TLS configuration")
            });
            ferry_sock::tls::fuzz::handshake(data, Arc::clone(config));
        }
        Some((_, rest)) => ferry_sock::tls::fuzz::records(rest),
        None => {}
    }
}
