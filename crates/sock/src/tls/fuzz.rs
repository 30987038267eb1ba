//! Entry points of the TLS fuzz target (`fuzz/fuzz_targets/tls.rs`, through
//! `ferry_server::fuzz::tls`): what a hostile peer can send to the server's
//! side of a TLS connection, without a socket. Hidden from the
//! documentation.
//!
//! The record layer is fed records sealed with the right key (so that
//! their inner plaintext — content type, padding, alerts, post-handshake
//! messages — is what the fuzzer chose), records with a wrong sequence
//! number or a lying length, and raw bytes, arriving in pieces and
//! interrupted by timeouts. Beside never panicking, what it hands over must
//! be exactly the application data of the records a model accepts, and it
//! must end (an error, or the close) where the model says.

use std::io::{self, Read, Write};
use std::sync::Arc;

use ring::aead::{self, Aad, LessSafeKey, UnboundKey};
use rustls::crypto::cipher::{AeadKey, Iv};
use rustls::{ConnectionTrafficSecrets, ExtractedSecrets};

use super::{nonce, Records, ALERT, APPLICATION_DATA, HANDSHAKE, MAX_SEALED};

/// The key and IV the fuzzed peer seals with (the receiver's `rx`).
const KEY: [u8; 32] = [3; 32];
const IV: [u8; 12] = [4; 12];

/// The peer's bytes, handed over `step` at a time, with an interruption
/// and a timeout (`WouldBlock`, as a socket's) now and then.
struct Wire {
    data: Vec<u8>,
    at: usize,
    step: usize,
    tick: u32,
}

impl Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.tick = self.tick.wrapping_add(1);
        match self.tick % 13 {
            5 => return Err(io::ErrorKind::Interrupted.into()),
            9 => return Err(io::ErrorKind::WouldBlock.into()),
            _ => {}
        }
        let n = buf.len().min(self.step).min(self.data.len() - self.at);
        buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// What the model expects after the records it could follow.
#[derive(Debug, PartialEq)]
enum End {
    /// The peer closed (no more bytes, or a close_notify alert): `Ok(0)`.
    Closed,
    /// Something the receiver must refuse.
    Refused,
}

/// Takes `n` bytes off the front of `data` (fewer if it has fewer).
fn take<'a>(data: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (a, b) = data.split_at(n.min(data.len()));
    *data = b;
    a
}

/// The record layer fed the records `data` describes (see the module
/// documentation): a control byte, then what it says.
pub fn records(data: &[u8]) {
    let mut data = data;
    let step = match take(&mut data, 1) {
        [0xff] | [] => usize::MAX,
        [s] => usize::from(*s) + 1,
        _ => unreachable!(),
    };
    let key = LessSafeKey::new(UnboundKey::new(&aead::CHACHA20_POLY1305, &KEY).expect("a 32-byte key"));
    let mut wire = Vec::new();
    let mut expected = Vec::new();
    // `None` while the model still follows the stream.
    let mut end: Option<End> = None;
    let mut seq = 0u64;
    while let [c, ..] = *data {
        data = &data[1..];
        let len = take(&mut data, 2);
        let len = if len.len() == 2 { usize::from(u16::from_le_bytes([len[0], len[1]])) } else { 0 };
        let body = take(&mut data, len);
        if c & 1 == 1 {
            // Raw bytes: nothing sealed with the key (a forgery is out of
            // reach), so the stream cannot go on past them.
            if !body.is_empty() {
                wire.extend_from_slice(body);
                end.get_or_insert(End::Refused);
            }
            continue;
        }
        // A sealed record whose inner plaintext is `body`.
        let outer = if c & 2 == 0 { APPLICATION_DATA } else { c };
        let at = if c & 4 == 0 { seq } else { seq.wrapping_add(u64::from(c >> 3) + 1) };
        let sealed = body.len() + aead::MAX_TAG_LEN;
        let Ok(honest) = u16::try_from(sealed) else { continue };
        let claimed = if c & 8 == 0 { honest } else { u16::from(c).wrapping_mul(257) };
        let header = [outer, 3, 3, (claimed >> 8) as u8, claimed as u8];
        let mut rec = body.to_vec();
        let tag = key.seal_in_place_separate_tag(nonce(&IV, at), Aad::from(header), &mut rec).expect("sealing");
        wire.extend_from_slice(&header);
        wire.extend_from_slice(&rec);
        wire.extend_from_slice(tag.as_ref());
        if end.is_some() {
            continue;
        }
        if outer != APPLICATION_DATA || at != seq || claimed != honest || sealed > MAX_SEALED {
            end = Some(End::Refused);
            continue;
        }
        seq += 1;
        // What the receiver does with the inner plaintext.
        let Some(last) = body.iter().rposition(|&b| b != 0) else {
            end = Some(End::Refused);
            continue;
        };
        match body[last] {
            APPLICATION_DATA => expected.extend_from_slice(&body[..last]),
            ALERT if body[..last] == [1, 0] => end = Some(End::Closed),
            HANDSHAKE if body.first() == Some(&4) => {}
            _ => end = Some(End::Refused),
        }
    }
    let end = end.unwrap_or(End::Closed);

    let secrets = |k: [u8; 32], iv: [u8; 12]| ConnectionTrafficSecrets::Chacha20Poly1305 {
        key: AeadKey::from(k),
        iv: Iv::from(iv),
    };
    let r = Records::new(ExtractedSecrets { tx: (0, secrets([1; 32], [2; 12])), rx: (0, secrets(KEY, IV)) })
        .expect("the receiver's keys");
    let limit = wire.len() as u64 * 2 + 64;
    let mut src = Wire { data: wire, at: 0, step, tick: 0 };
    let mut got = Vec::new();
    let mut out = [0u8; 700];
    let mut calls = 0u64;
    let ended = loop {
        calls += 1;
        // Every call hands over a byte, reads more of the wire, or ends.
        assert!(calls <= limit, "the receiver goes round without end");
        let want = 1 + (calls as usize * 37) % out.len();
        match r.recv_from(&mut src, &mut out[..want]) {
            Ok(0) => break End::Closed,
            Ok(n) => {
                assert!(n <= want);
                got.extend_from_slice(&out[..n]);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(_) => break End::Refused,
        }
    };
    assert!(got == expected, "handed over {} bytes where the records hold {}", got.len(), expected.len());
    assert_eq!(ended, end, "the receiver's end differs from the model's");
}

/// The server's side of the handshake reading `data` as the client's
/// bytes (what it writes goes nowhere): it must end, with an error for
/// anything but a real client's handshake.
pub fn handshake(data: &[u8], config: Arc<rustls::ServerConfig>) {
    struct Peer<'a> {
        data: &'a [u8],
    }
    impl Read for Peer<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.data.read(buf)
        }
    }
    impl Write for Peer<'_> {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let first = data.first().copied().unwrap_or(0);
    if !super::is_client_hello(first) {
        return;
    }
    let r = super::server_on(&mut Peer { data }, config);
    assert!(r.is_err(), "a handshake completed with a client that never saw the server's reply");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Input that describes one sealed application-data record of `text`.
    fn sealed(text: &[u8]) -> Vec<u8> {
        let mut inner = text.to_vec();
        inner.push(APPLICATION_DATA);
        inner.extend_from_slice(&[0, 0]);
        let mut v = vec![0u8];
        v.extend_from_slice(&(inner.len() as u16).to_le_bytes());
        v.extend_from_slice(&inner);
        v
    }

    #[test]
    fn the_model_and_the_receiver_agree_on_plain_cases() {
        // Pieces of 3 bytes; two good records, then each way of ending.
        let mut good = vec![2u8];
        good.extend(sealed(b"hello"));
        good.extend(sealed(b" world"));
        records(&good);
        let mut raw = good.clone();
        raw.extend_from_slice(&[1, 3, 0, 0x17, 3, 3]);
        records(&raw);
        let mut close = good.clone();
        close.extend_from_slice(&[0, 3, 0, 1, 0, ALERT]);
        close.extend(sealed(b"after the close"));
        records(&close);
        let mut replay = good;
        replay.extend_from_slice(&[4, 2, 0, b'x', APPLICATION_DATA]);
        records(&replay);
        records(&[]);
    }
}
