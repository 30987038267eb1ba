//! One client connection: handshake, then read a frame, execute it, write
//! the reply — all on the connection's own thread, so a read request never
//! changes threads between the socket and `sendfile`.

use std::io::{self, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Instant;

use crate::locks::LockTable;
use crate::session::HandleBudget;

use ferry_proto::{
    client_proof, op, proofs_equal, server_proof, DecodeError, ErrorReply, Header, Nonce, Reply, Request, Welcome,
    HEADER_LEN, VERSION_MAX, VERSION_MIN,
};

use crate::backend::{Backend, Errno, ReadData};
use crate::session::{Answer, Policy, Session};
use crate::Config;

/// Handshake frames are small; anything bigger before authentication is hostile.
const HANDSHAKE_MAX: u32 = 1024;
/// Small replies are gathered up to this size while more requests wait.
const OUT_FLUSH: usize = 64 * 1024;

/// Why a connection ended, for the one log line it gets.
#[derive(Debug)]
pub enum End {
    Closed,
    Io(io::Error),
    Protocol(String),
    AuthFailed,
}

pub struct Conn<B: Backend> {
    rx: BufReader<Timed>,
    tx: TcpStream,
    peer: SocketAddr,
    cfg: Arc<Config>,
    backend: Arc<B>,
    budget: Arc<HandleBudget>,
    locks: Arc<LockTable>,
    body: Vec<u8>,
    out: Vec<u8>,
}

impl<B: Backend> Conn<B> {
    pub fn new(
        stream: TcpStream,
        peer: SocketAddr,
        cfg: Arc<Config>,
        backend: Arc<B>,
        budget: Arc<HandleBudget>,
        locks: Arc<LockTable>,
    ) -> io::Result<Self> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(cfg.idle_timeout))?;
        let tx = stream.try_clone()?;
        Ok(Conn {
            rx: BufReader::with_capacity(64 * 1024, Timed { stream, deadline: None }),
            tx,
            peer,
            cfg,
            backend,
            budget,
            locks,
            body: Vec::new(),
            out: Vec::with_capacity(OUT_FLUSH),
        })
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Runs the connection to its end.
    pub fn run(mut self) -> End {
        let policy = match self.handshake() {
            Ok(p) => p,
            Err(e) => return e,
        };
        let mut session = Session::new(Arc::clone(&self.backend), policy);
        loop {
            match self.serve_one(&mut session) {
                Ok(()) => {}
                Err(e) => return e,
            }
        }
    }

    /// Reads one frame header and body into `self.body`.
    fn read_frame(&mut self, max: u32) -> Result<Header, End> {
        let mut hb = [0u8; HEADER_LEN];
        match self.rx.read_exact(&mut hb) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(End::Closed),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(End::Protocol("idle timeout".into()))
            }
            Err(e) => return Err(End::Io(e)),
        }
        let h = Header::decode(&hb);
        h.check_len(max).map_err(|e| End::Protocol(e.to_string()))?;
        let len = h.len as usize;
        // Grow only: zero-filling a 16 MiB buffer per write would cost more
        // than the copy it prepares.
        if self.body.len() < len {
            self.body.resize(len, 0);
        }
        self.rx.read_exact(&mut self.body[..len]).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => End::Protocol("truncated frame".into()),
            _ => End::Io(e),
        })?;
        Ok(h)
    }

    /// Refuses the handshake: error reply, then the connection closes.
    fn refuse(&mut self, h: &Header, e: Errno, msg: String) -> End {
        // Best effort: the peer may already be gone.
        let _ = self.send_error(h.op, h.id, e, &msg);
        End::Protocol(msg)
    }

    /// The handshake has one deadline for all of it, so a peer that never
    /// authenticates (or sends a byte now and then) cannot hold a
    /// connection slot for the whole idle timeout.
    fn handshake(&mut self) -> Result<Policy, End> {
        self.rx.get_mut().deadline = Some(Instant::now() + self.cfg.handshake_timeout.min(self.cfg.idle_timeout));
        let policy = self.handshake_steps();
        let t = self.rx.get_mut();
        t.deadline = None;
        t.stream.set_read_timeout(Some(self.cfg.idle_timeout)).map_err(End::Io)?;
        policy
    }

    fn handshake_steps(&mut self) -> Result<Policy, End> {
        let h = self.read_frame(HANDSHAKE_MAX)?;
        let proto = Errno(libc::EPROTO);
        if h.op != op::HELLO {
            return Err(self.refuse(&h, proto, format!("expected HELLO, got op {}", h.op)));
        }
        let hello = match Request::decode(op::HELLO, &self.body[..h.len as usize]) {
            Ok(Request::Hello { min_version, max_version, caps, max_frame, nonce }) => {
                (min_version, max_version, caps, max_frame, nonce)
            }
            Ok(_) => unreachable!("decode of HELLO yields Hello"),
            Err(e) => return Err(self.refuse(&h, proto, format!("bad HELLO: {e}"))),
        };
        let (min_version, max_version, caps, max_frame, client_nonce) = hello;
        let version = max_version.min(VERSION_MAX);
        if version < min_version.max(VERSION_MIN) {
            let msg = format!("no common protocol version (server speaks {VERSION_MIN}..{VERSION_MAX})");
            return Err(self.refuse(&h, Errno(libc::EPROTONOSUPPORT), msg));
        }
        if max_frame < ferry_proto::MIN_MAX_FRAME {
            return Err(self.refuse(&h, proto, format!("client frame limit {max_frame} below the minimum")));
        }
        let mut server_nonce: Nonce = [0; 32];
        getrandom::getrandom(&mut server_nonce).map_err(|e| End::Io(io::Error::other(e.to_string())))?;
        let caps = caps & self.cfg.caps;
        let welcome = Welcome {
            version,
            caps,
            max_frame: self.cfg.max_frame,
            window_requests: self.cfg.window_requests,
            window_bytes: self.cfg.window_bytes,
            boot_id: self.cfg.boot_id,
            nonce: server_nonce,
            auth_required: self.cfg.token.is_some(),
        };
        Reply::Welcome(welcome).encode(op::HELLO, h.id, &mut self.out);
        self.flush()?;
        if let Some(token) = self.cfg.token.clone() {
            self.authenticate(&token, &server_nonce, &client_nonce)?;
        }
        Ok(Policy {
            budget: Arc::clone(&self.budget),
            read_only: self.cfg.read_only,
            allow_devices: self.cfg.allow_devices,
            max_handles: self.cfg.max_handles,
            caps,
            max_read: max_frame.min(self.cfg.max_frame).saturating_sub(4096),
            locks: Arc::clone(&self.locks),
        })
    }

    /// Anything but a correct `Auth` fails authentication and closes.
    fn authenticate(&mut self, token: &[u8], server_nonce: &Nonce, client_nonce: &Nonce) -> Result<(), End> {
        let h = self.read_frame(HANDSHAKE_MAX)?;
        let ok = match Request::decode(h.op, &self.body[..h.len as usize]) {
            Ok(Request::Auth { proof }) => proofs_equal(&proof, &client_proof(token, server_nonce, client_nonce)),
            _ => false,
        };
        if !ok {
            // Best effort: the client learns why before the connection closes.
            let _ = self.send_error(h.op, h.id, Errno::ACCES, "authentication failed");
            return Err(End::AuthFailed);
        }
        Reply::AuthOk { proof: server_proof(token, server_nonce, client_nonce) }.encode(op::AUTH, h.id, &mut self.out);
        self.flush()
    }

    fn serve_one(&mut self, session: &mut Session<B>) -> Result<(), End> {
        let h = self.read_frame(self.cfg.max_frame)?;
        let body = &self.body[..h.len as usize];
        let req = match Request::decode(h.op, body) {
            Ok(r) => r,
            Err(DecodeError::UnknownOp(op)) => {
                return self.queue_error(h, Errno::NOSYS, &format!("unknown operation {op}"));
            }
            Err(e) => return self.queue_error(h, Errno::BADMSG, &e.to_string()),
        };
        if matches!(req, Request::Hello { .. } | Request::Auth { .. }) {
            return self.queue_error(h, Errno::INVAL, "handshake already done");
        }
        // The request borrows `self.body`; the answer may borrow the session.
        // Encode everything that needs `req` before touching `self` mutably.
        let answer = session.execute(&req);
        let mut out = std::mem::take(&mut self.out);
        let res = match answer {
            Ok(Answer::Data(data)) => {
                Reply::Data(&[]).encode(h.op, h.id, &mut out);
                let hdr_at = out.len() - HEADER_LEN;
                patch_len(&mut out[hdr_at..], data.len());
                self.out = out;
                return self.send_data(data);
            }
            Ok(a) => {
                encode_answer(a, h.op, h.id, &mut out);
                Ok(())
            }
            Err(e) => {
                let msg = io::Error::from_raw_os_error(e.0).to_string();
                ErrorReply { errno: e.0 as u32, message: &msg }.encode(h.op, h.id, &mut out);
                Ok(())
            }
        };
        self.out = out;
        res?;
        self.maybe_flush()
    }

    fn queue_error(&mut self, h: Header, e: Errno, msg: &str) -> Result<(), End> {
        eprintln!("ferry serve: {}: bad request (op {}): {msg}", self.peer, h.op);
        ErrorReply { errno: e.0 as u32, message: msg }.encode(h.op, h.id, &mut self.out);
        self.maybe_flush()
    }

    fn send_error(&mut self, op: u16, id: u64, e: Errno, msg: &str) -> Result<(), End> {
        ErrorReply { errno: e.0 as u32, message: msg }.encode(op, id, &mut self.out);
        self.flush()
    }

    /// Replies wait while more requests are already buffered, so a burst of
    /// small requests gets one `write` back.
    fn maybe_flush(&mut self) -> Result<(), End> {
        if self.rx.buffer().is_empty() || self.out.len() >= OUT_FLUSH {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), End> {
        if !self.out.is_empty() {
            self.tx.write_all(&self.out).map_err(End::Io)?;
            self.out.clear();
        }
        Ok(())
    }

    /// Sends queued replies plus the header already appended, then the data.
    fn send_data(&mut self, data: ReadData<'_>) -> Result<(), End> {
        match data {
            ReadData::Bytes(b) => {
                self.out.extend_from_slice(&b);
                self.flush()
            }
            // Nothing to send after the header: MSG_MORE would hold it back
            // until the kernel's cork timer (200 ms) fires.
            ReadData::Fd { len: 0, .. } => self.flush(),
            ReadData::Fd { fd, offset, len } => {
                send_more(&self.tx, &self.out).map_err(End::Io)?;
                self.out.clear();
                sendfile_all(&self.tx, fd, offset, len).map_err(End::Io)
            }
        }
    }
}

/// The socket, with an optional deadline that bounds every read (used for
/// the handshake; afterwards only the idle timeout applies).
struct Timed {
    stream: TcpStream,
    deadline: Option<Instant>,
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(d) = self.deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            self.stream.set_read_timeout(Some(left))?;
        }
        self.stream.read(buf)
    }
}

fn patch_len(hdr: &mut [u8], len: usize) {
    hdr[0..4].copy_from_slice(&(len as u32).to_le_bytes());
}

fn encode_answer(a: Answer<'_>, op: u16, id: u64, out: &mut Vec<u8>) {
    match a {
        Answer::Empty => Reply::Empty.encode(op, id, out),
        Answer::Opened { handle, attr } => Reply::Opened { handle, attr }.encode(op, id, out),
        Answer::Data(_) => unreachable!("data answers are sent by send_data"),
        Answer::Written(count) => Reply::Written { count }.encode(op, id, out),
        Answer::Offset(offset) => Reply::Offset { offset }.encode(op, id, out),
        Answer::Attr(a) => Reply::Attr(a).encode(op, id, out),
        Answer::Name(n) => Reply::Name(&n).encode(op, id, out),
        Answer::StatFs(s) => Reply::StatFs(s).encode(op, id, out),
        Answer::Xattr { size, value } => Reply::Xattr { size, value: &value }.encode(op, id, out),
        Answer::Dir { eof, entries } => Reply::Dir { eof, entries }.encode(op, id, out),
        Answer::Lock { typ, start, len, pid } => Reply::Lock { typ, start, len, pid }.encode(op, id, out),
    }
}

/// Writes `buf` with `MSG_MORE`, so the header leaves in the same segment
/// as the data `sendfile` sends next.
fn send_more(sock: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        let n = rustix::net::send(sock, buf, rustix::net::SendFlags::MORE)?;
        buf = &buf[n..];
    }
    Ok(())
}

/// `sendfile`s exactly `len` bytes. If the file shrank since the length was
/// announced, the rest is zeros: the frame must stay whole.
fn sendfile_all(sock: &TcpStream, fd: std::os::fd::BorrowedFd<'_>, mut offset: u64, len: usize) -> io::Result<()> {
    let mut left = len;
    while left > 0 {
        let n = rustix::fs::sendfile(sock.as_fd(), fd, Some(&mut offset), left)?;
        if n == 0 {
            let zeros = vec![0u8; left.min(1 << 20)];
            while left > 0 {
                let k = left.min(zeros.len());
                (&*sock).write_all(&zeros[..k])?;
                left -= k;
            }
            break;
        }
        left -= n;
    }
    Ok(())
}
