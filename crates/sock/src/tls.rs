//! TLS 1.3 on a connection: rustls makes the handshake, then the record
//! layer is ours, one sealing state per direction — what kernel TLS would
//! do after a user-space handshake, and this machine kind's kernel has no
//! TLS (`TCP_ULP "tls"` is `ENOENT`). Directions apart means the thread
//! that sends and the thread that receives never wait for each other, as
//! with a plain socket, and a request's bytes are sealed straight from the
//! caller's buffer into one record buffer: no rustls buffers in between.
//!
//! After the handshake the server sends one application byte and the
//! client waits for it before sending anything: then neither side's
//! rustls has read application data of the other's when its secrets are
//! taken out (`dangerous_extract_secrets`), and no ticket or key update
//! ever follows (tickets are off; a key update is refused).

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex};

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::{ConnectionTrafficSecrets, ExtractedSecrets};

/// Largest plaintext in one record (TLS 1.3).
const MAX_PLAIN: usize = 16 * 1024;
/// Largest sealed record body: plaintext, content type, padding, tag.
const MAX_SEALED: usize = MAX_PLAIN + 256;
const HEADER: usize = 5;
const APPLICATION_DATA: u8 = 0x17;
const ALERT: u8 = 0x15;
const HANDSHAKE: u8 = 0x16;
/// Records one key seals at most: under RFC 8446 5.5's limit for AES-GCM
/// (2^24.5 full records). Ferry sends no key update; a connection that has
/// sealed this many (256 GiB) ends instead, and the client's reconnect
/// (sessions) carries on over a fresh handshake.
const KEY_LIMIT: u64 = 1 << 24;
/// The exporter label of ferry's channel binding (RFC 5705 / 8446 7.5).
const BINDING_LABEL: &[u8] = b"EXPERIMENTAL-ferry-channel-binding";

/// The sealed directions of one connection, shared by every handle of it.
#[derive(Debug)]
pub struct Records {
    tx: Mutex<Sealer>,
    rx: Mutex<Opener>,
}

struct Sealer {
    key: LessSafeKey,
    iv: [u8; 12],
    seq: u64,
    buf: Vec<u8>,
}

struct Opener {
    key: LessSafeKey,
    iv: [u8; 12],
    seq: u64,
    /// One record as it arrives: `have` bytes of it so far.
    buf: Box<[u8]>,
    have: usize,
    /// The opened record's plaintext not yet read: `buf[from..to]`.
    from: usize,
    to: usize,
    closed: bool,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sealer {{ seq: {} }}", self.seq)
    }
}

impl std::fmt::Debug for Opener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Opener {{ seq: {} }}", self.seq)
    }
}

fn key_of(secrets: ConnectionTrafficSecrets) -> io::Result<(LessSafeKey, [u8; 12])> {
    let (alg, key, iv) = match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (&aead::CHACHA20_POLY1305, key, iv),
        _ => return Err(io::Error::other("TLS: a cipher suite this client does not seal")),
    };
    let unbound = UnboundKey::new(alg, key.as_ref()).map_err(|_| io::Error::other("TLS: bad key"))?;
    let iv: [u8; 12] = iv.as_ref().try_into().map_err(|_| io::Error::other("TLS: bad IV"))?;
    Ok((LessSafeKey::new(unbound), iv))
}

/// The nonce of record `seq`: the IV with the sequence number XORed into
/// its last 8 bytes (RFC 8446 5.3).
fn nonce(iv: &[u8; 12], seq: u64) -> Nonce {
    let mut n = *iv;
    for (b, s) in n[4..].iter_mut().zip(seq.to_be_bytes()) {
        *b ^= s;
    }
    Nonce::assume_unique_for_key(n)
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {what}"))
}

impl Records {
    fn new(s: ExtractedSecrets) -> io::Result<Records> {
        let (tx_seq, tx) = s.tx;
        let (rx_seq, rx) = s.rx;
        let (tk, tiv) = key_of(tx)?;
        let (rk, riv) = key_of(rx)?;
        Ok(Records {
            tx: Mutex::new(Sealer { key: tk, iv: tiv, seq: tx_seq, buf: Vec::new() }),
            rx: Mutex::new(Opener {
                key: rk,
                iv: riv,
                seq: rx_seq,
                // Made at the first record (and again after each rest).
                buf: Box::default(),
                have: 0,
                from: 0,
                to: 0,
                closed: false,
            }),
        })
    }

    /// Seals `parts` (in order) into records and hands their bytes to
    /// `send` before another sender may seal: records must leave in the
    /// order of their sequence numbers.
    pub fn send(&self, parts: &[&[u8]], send: impl FnOnce(&[u8]) -> io::Result<()>) -> io::Result<()> {
        let mut s = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let s = &mut *s;
        if s.seq >= KEY_LIMIT {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "TLS: this connection's key is used up; reconnect",
            ));
        }
        s.buf.clear();
        // Parts are gathered into full records (a request's header and its
        // data share one), then each record is sealed where it lies.
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut parts = parts.iter().flat_map(|p| p.chunks(MAX_PLAIN)).peekable();
        let mut left = total;
        while left > 0 {
            let n = left.min(MAX_PLAIN);
            let start = s.buf.len();
            s.buf.extend_from_slice(&[APPLICATION_DATA, 3, 3, 0, 0]);
            let body = s.buf.len();
            let mut need = n;
            while need > 0 {
                let Some(chunk) = parts.peek_mut() else { break };
                let take = need.min(chunk.len());
                s.buf.extend_from_slice(&chunk[..take]);
                *chunk = &chunk[take..];
                if chunk.is_empty() {
                    parts.next();
                }
                need -= take;
            }
            s.buf.push(APPLICATION_DATA);
            let sealed_len = (n + 1 + aead::MAX_TAG_LEN) as u16;
            s.buf[start + 3..start + 5].copy_from_slice(&sealed_len.to_be_bytes());
            let header: [u8; HEADER] = s.buf[start..body].try_into().expect("5 bytes");
            let tag = s
                .key
                .seal_in_place_separate_tag(nonce(&s.iv, s.seq), Aad::from(header), &mut s.buf[body..])
                .map_err(|_| bad("sealing failed"))?;
            s.buf.extend_from_slice(tag.as_ref());
            s.seq += 1;
            left -= n;
        }
        send(&s.buf)?;
        if s.buf.capacity() > 4 * 1024 * 1024 {
            s.buf = Vec::new();
        }
        Ok(())
    }

    /// Whether plaintext already opened waits to be read: a poll on the
    /// socket cannot see it.
    pub fn pending(&self) -> bool {
        let o = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        o.from < o.to
    }

    /// Reads plaintext into `out` from the records arriving on `fd` (0 at
    /// the peer's close). A timeout or interruption keeps the part of a
    /// record read so far.
    pub fn recv(&self, fd: BorrowedFd<'_>, out: &mut [u8]) -> io::Result<usize> {
        self.recv_from(&mut Raw(fd), out)
    }

    /// `recv` that never waits: `WouldBlock` if no record's plaintext is
    /// ready. The part of a record that came is kept for the next call
    /// (the event loop's reads, which go back to the loop instead).
    pub fn recv_nowait(&self, fd: BorrowedFd<'_>, out: &mut [u8]) -> io::Result<usize> {
        self.recv_from(&mut NoWait(fd), out)
    }

    /// Lets go of the buffers while the connection is idle, unless a record
    /// is half in or half read: an idle connection then keeps only its keys
    /// (thousands of idle TLS clients cost a few KiB each, not 17 KiB more
    /// each, plus whatever their largest reply grew the send buffer to).
    pub fn rest(&self) {
        if let Ok(mut o) = self.rx.try_lock() {
            if o.have == 0 && o.from >= o.to {
                o.buf = Box::default();
                (o.from, o.to) = (0, 0);
            }
        }
        if let Ok(mut s) = self.tx.try_lock() {
            s.buf = Vec::new();
        }
    }

    /// `recv` from any source of the peer's bytes (the fuzz target's).
    fn recv_from(&self, src: &mut impl Read, out: &mut [u8]) -> io::Result<usize> {
        let mut o = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        let o = &mut *o;
        loop {
            if o.from < o.to {
                let n = out.len().min(o.to - o.from);
                out[..n].copy_from_slice(&o.buf[o.from..o.from + n]);
                o.from += n;
                return Ok(n);
            }
            if o.closed || out.is_empty() {
                return Ok(0);
            }
            if o.buf.is_empty() {
                o.buf = vec![0; HEADER + MAX_SEALED].into_boxed_slice();
            }
            if !o.fill(src, HEADER)? {
                return Ok(0);
            }
            let len = u16::from_be_bytes([o.buf[3], o.buf[4]]) as usize;
            if o.buf[0] != APPLICATION_DATA || !(aead::MAX_TAG_LEN + 1..=MAX_SEALED).contains(&len) {
                return Err(bad("a record that is not sealed application data"));
            }
            o.fill(src, HEADER + len)?;
            o.have = 0;
            if o.seq >= KEY_LIMIT + KEY_LIMIT / 4 {
                return Err(bad("the peer goes on past its key's limit"));
            }
            let header: [u8; HEADER] = o.buf[..HEADER].try_into().expect("5 bytes");
            let n = nonce(&o.iv, o.seq);
            let plain = o
                .key
                .open_in_place(n, Aad::from(header), &mut o.buf[HEADER..HEADER + len])
                .map_err(|_| bad("a record failed its integrity check"))?
                .len();
            o.seq += 1;
            // Inner plaintext: content, then its type, then zero padding.
            let inner = &o.buf[HEADER..HEADER + plain];
            let Some(end) = inner.iter().rposition(|&b| b != 0) else {
                return Err(bad("a record without a content type"));
            };
            match inner[end] {
                APPLICATION_DATA => (o.from, o.to) = (HEADER, HEADER + end),
                ALERT if inner[..end] == [1, 0] => o.closed = true,
                ALERT => return Err(bad(&format!("alert {} from the peer", inner.get(1).copied().unwrap_or(0)))),
                // A NewSessionTicket would be harmless; a KeyUpdate
                // would change keys we do not follow.
                HANDSHAKE if inner.first() == Some(&4) => {}
                _ => return Err(bad("a post-handshake message ferry does not follow (key update?)")),
            }
        }
    }
}

impl Opener {
    /// Reads until `n` bytes of the record are here; `Ok(false)` at a
    /// clean close before a record began.
    fn fill(&mut self, src: &mut impl Read, n: usize) -> io::Result<bool> {
        while self.have < n {
            match src.read(&mut self.buf[self.have..n]) {
                Ok(0) if self.have == 0 => return Ok(false),
                Ok(0) => {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "TLS: connection closed inside a record"))
                }
                Ok(k) => self.have += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

/// The socket's bytes that have come, `WouldBlock` when none have.
struct NoWait<'a>(BorrowedFd<'a>);

impl Read for NoWait<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match rustix::net::recv(self.0, &mut *buf, rustix::net::RecvFlags::DONTWAIT) {
                Err(rustix::io::Errno::INTR) => continue,
                r => return Ok(r?.0),
            }
        }
    }
}

/// The socket's bytes as they are, for rustls's handshake.
struct Raw<'a>(BorrowedFd<'a>);

impl Read for Raw<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match rustix::io::read(self.0, &mut *buf) {
                Err(rustix::io::Errno::INTR) => continue,
                r => return Ok(r?),
            }
        }
    }
}

impl Write for Raw<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            match rustix::net::send(self.0, buf, rustix::net::SendFlags::NOSIGNAL) {
                Err(rustix::io::Errno::INTR) => continue,
                r => return Ok(r?),
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What a finished handshake leaves: the sealed directions, and the
/// channel binding (an exporter value of this TLS session alone, which the
/// token proof is bound to so that it cannot be relayed into another).
pub struct Established {
    pub records: Arc<Records>,
    pub binding: [u8; 32],
}

fn tls_err(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Runs the client side of the handshake on `fd` (its timeouts bound it).
pub fn client(fd: impl AsFd, config: Arc<rustls::ClientConfig>, name: &str) -> io::Result<Established> {
    let fd = fd.as_fd();
    let server = rustls::pki_types::ServerName::try_from(name.to_string())
        .or_else(|_| rustls::pki_types::ServerName::try_from("ferry".to_string()))
        .map_err(|e| io::Error::other(format!("TLS: server name: {e}")))?;
    let mut c = rustls::ClientConnection::new(config, server).map_err(tls_err)?;
    let mut raw = Raw(fd);
    while c.is_handshaking() {
        c.complete_io(&mut raw)?;
    }
    // The server's one byte: after it, nothing more of the server's is in
    // rustls's hands.
    let mut ready = [0u8; 1];
    loop {
        match c.reader().read(&mut ready) {
            Ok(1) => break,
            Ok(_) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "TLS: closed after the handshake")),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                c.complete_io(&mut raw)?;
            }
            Err(e) => return Err(e),
        }
    }
    let binding = c.export_keying_material([0u8; 32], BINDING_LABEL, None).map_err(tls_err)?;
    let secrets = c.dangerous_extract_secrets().map_err(tls_err)?;
    Ok(Established { records: Arc::new(Records::new(secrets)?), binding })
}

/// Runs the server side of the handshake on `fd` (its timeouts bound it).
pub fn server(fd: impl AsFd, config: Arc<rustls::ServerConfig>) -> io::Result<Established> {
    server_on(&mut Raw(fd.as_fd()), config)
}

/// `server` over any stream of the client's bytes (the fuzz target's).
fn server_on(raw: &mut (impl Read + Write), config: Arc<rustls::ServerConfig>) -> io::Result<Established> {
    let mut c = rustls::ServerConnection::new(config).map_err(tls_err)?;
    while c.is_handshaking() {
        c.complete_io(raw)?;
    }
    c.writer().write_all(&[1])?;
    while c.wants_write() {
        c.write_tls(raw)?;
    }
    let binding = c.export_keying_material([0u8; 32], BINDING_LABEL, None).map_err(tls_err)?;
    let secrets = c.dangerous_extract_secrets().map_err(tls_err)?;
    Ok(Established { records: Arc::new(Records::new(secrets)?), binding })
}

#[doc(hidden)]
pub mod fuzz;

/// Whether `first` (a connection's first byte) starts a TLS handshake.
pub fn is_client_hello(first: u8) -> bool {
    first == HANDSHAKE
}

/// How a certificate is named to people: `sha256:` and the hex SHA-256 of
/// its DER bytes.
pub fn fingerprint(der: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(der);
    let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::cipher::{AeadKey, Iv};
    use std::os::unix::net::UnixStream;

    fn secrets(key: u8, iv: u8) -> ConnectionTrafficSecrets {
        ConnectionTrafficSecrets::Chacha20Poly1305 { key: AeadKey::from([key; 32]), iv: Iv::from([iv; 12]) }
    }

    /// Two ends whose directions match: what `a` seals `b` opens.
    fn pair() -> (Records, Records) {
        let a = Records::new(ExtractedSecrets { tx: (1, secrets(1, 2)), rx: (1, secrets(3, 4)) }).unwrap();
        let b = Records::new(ExtractedSecrets { tx: (1, secrets(3, 4)), rx: (1, secrets(1, 2)) }).unwrap();
        (a, b)
    }

    fn read_all(r: &Records, fd: BorrowedFd<'_>, n: usize) -> io::Result<Vec<u8>> {
        let mut out = vec![0u8; n];
        let mut got = 0;
        while got < n {
            match r.recv(fd, &mut out[got..])? {
                0 => break,
                k => got += k,
            }
        }
        out.truncate(got);
        Ok(out)
    }

    #[test]
    fn a_key_that_sealed_its_share_seals_no_more() {
        let a = Records::new(ExtractedSecrets { tx: (KEY_LIMIT - 1, secrets(1, 2)), rx: (1, secrets(3, 4)) }).unwrap();
        assert!(a.send(&[b"last"], |_| Ok(())).is_ok());
        let e = a.send(&[b"one more"], |_| Ok(())).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted, "{e}");
    }

    #[test]
    fn what_one_end_seals_the_other_opens_across_records_and_parts() {
        let (a, b) = pair();
        let (x, y) = UnixStream::pair().unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let mut wire = Vec::new();
        a.send(&[b"head", &data, b""], |sealed| {
            wire.extend_from_slice(sealed);
            Ok(())
        })
        .unwrap();
        assert!(wire.windows(16).all(|w| w != &data[1000..1016]), "plaintext on the wire");
        let writer = std::thread::spawn(move || (&x).write_all(&wire).unwrap());
        let got = read_all(&b, y.as_fd(), 4 + data.len()).unwrap();
        writer.join().unwrap();
        assert_eq!(&got[..4], b"head");
        assert_eq!(&got[4..], &data[..]);
    }

    #[test]
    fn a_changed_byte_a_replayed_record_and_a_stray_record_are_refused() {
        let send = |a: &Records, data: &[u8]| {
            let mut wire = Vec::new();
            a.send(&[data], |s| {
                wire.extend_from_slice(s);
                Ok(())
            })
            .unwrap();
            wire
        };
        // One byte flipped in the sealed body.
        let (a, b) = pair();
        let (x, y) = UnixStream::pair().unwrap();
        let mut wire = send(&a, b"payload");
        wire[8] ^= 1;
        (&x).write_all(&wire).unwrap();
        assert_eq!(read_all(&b, y.as_fd(), 7).unwrap_err().kind(), io::ErrorKind::InvalidData);
        // The same record twice: the second has the wrong sequence number.
        let (a, b) = pair();
        let (x, y) = UnixStream::pair().unwrap();
        let wire = send(&a, b"once");
        (&x).write_all(&wire).unwrap();
        (&x).write_all(&wire).unwrap();
        assert_eq!(read_all(&b, y.as_fd(), 4).unwrap(), b"once");
        assert!(read_all(&b, y.as_fd(), 4).is_err(), "a replayed record must not open");
        // Not a sealed record at all (a plaintext frame, say).
        let (_, b) = pair();
        let (x, y) = UnixStream::pair().unwrap();
        (&x).write_all(&[0x34, 0, 0, 0, 1, 0, 0, 0, 9, 9]).unwrap();
        assert!(read_all(&b, y.as_fd(), 4).is_err());
        // A clean end before a record: end of file, not an error.
        let (_, b) = pair();
        let (x, y) = UnixStream::pair().unwrap();
        drop(x);
        assert_eq!(read_all(&b, y.as_fd(), 4).unwrap(), b"");
    }
}
