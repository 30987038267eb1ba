//! A connection's input, read frame by frame. On a connection of the event
//! loop (`evloop.rs`) a read never waits: what has not arrived yet — half a
//! header, half a body — is kept here and the connection goes back to the
//! loop, so a client that stalls mid-frame holds no thread; under TLS the
//! part of a record that came waits in the connection's record layer
//! (`ferry_sock::tls`) the same way. During the handshake, on the
//! connection's own thread, reads wait within the socket's timeout and
//! the handshake's deadline.
//!
//! The 64 KiB read buffer is the thread's while the connection is idle: a
//! connection between requests keeps no buffer (or only the few bytes of a
//! header not yet whole), so thousands of idle clients cost little.

use std::cell::RefCell;
use std::io::{self, Read};
use std::sync::Arc;
use std::time::Instant;

use ferry_proto::{Header, HEADER_LEN};
use ferry_sock::Socket;

use crate::bufpool::Lent;

/// The read buffer's size: many small requests come in one `recv`.
const CAP: usize = 64 * 1024;

thread_local! {
    /// A read buffer this thread lends the connection it serves.
    static SPARE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The socket, with an optional deadline that bounds every read (used for
/// the handshake; afterwards only the idle timeout applies).
pub struct Timed {
    pub stream: Arc<Socket>,
    pub deadline: Option<Instant>,
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
        (&*self.stream).read(buf)
    }
}

/// Where a frame's body is read to.
pub enum Body {
    /// The serving thread's own buffer (frames up to 1 MiB and a bit).
    Own(Vec<u8>),
    /// A buffer of the shared pool (larger frames).
    Big(Lent),
}

/// A frame whose header is in and whose body is partly.
pub struct Partial {
    pub header: Header,
    pub body: Body,
    pub got: usize,
}

pub struct Inbox {
    pub timed: Timed,
    /// Reads never wait: one that would tells so (the event loop's).
    pub nonblocking: bool,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The frame being read when its bytes stopped coming.
    pub partial: Option<Partial>,
}

impl Inbox {
    pub fn new(stream: Arc<Socket>) -> Inbox {
        Inbox {
            timed: Timed { stream, deadline: None },
            nonblocking: false,
            buf: Vec::new(),
            start: 0,
            end: 0,
            partial: None,
        }
    }

    /// Bytes received and not yet taken.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Receives more into the buffer: `false` if nothing came without
    /// waiting. The peer's close is `UnexpectedEof`.
    fn fill(&mut self) -> io::Result<bool> {
        if self.buf.len() < CAP {
            let mut fresh = SPARE.with(|s| std::mem::take(&mut *s.borrow_mut()));
            if fresh.len() < CAP {
                fresh = vec![0; CAP];
            }
            let n = self.buffered();
            fresh[..n].copy_from_slice(&self.buf[self.start..self.end]);
            self.buf = fresh;
            (self.start, self.end) = (0, n);
        } else if self.start == self.end {
            (self.start, self.end) = (0, 0);
        } else if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        match read_some(&mut self.timed, self.nonblocking, &mut self.buf[self.end..])? {
            None => Ok(false),
            Some(0) => Err(io::ErrorKind::UnexpectedEof.into()),
            Some(n) => {
                self.end += n;
                Ok(true)
            }
        }
    }

    /// The next frame's header, once all of it is in (`None`: not yet).
    pub fn header(&mut self) -> io::Result<Option<Header>> {
        while self.buffered() < HEADER_LEN {
            if !self.fill()? {
                return Ok(None);
            }
        }
        let mut hb = [0u8; HEADER_LEN];
        hb.copy_from_slice(&self.buf[self.start..self.start + HEADER_LEN]);
        self.start += HEADER_LEN;
        Ok(Some(Header::decode(&hb)))
    }

    /// Fills `dest` from `*got` on: `false` if the rest has not come yet.
    /// Large remainders go straight to `dest`, not through the buffer.
    pub fn body(&mut self, dest: &mut [u8], got: &mut usize) -> io::Result<bool> {
        loop {
            let n = self.buffered().min(dest.len() - *got);
            dest[*got..*got + n].copy_from_slice(&self.buf[self.start..self.start + n]);
            self.start += n;
            *got += n;
            let want = dest.len() - *got;
            if want == 0 {
                return Ok(true);
            }
            if want >= CAP / 2 {
                match read_some(&mut self.timed, self.nonblocking, &mut dest[*got..])? {
                    None => return Ok(false),
                    Some(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                    Some(n) => *got += n,
                }
            } else if !self.fill()? {
                return Ok(false);
            }
        }
    }

    /// Between requests: the read buffer goes back to the thread, keeping
    /// only what arrived of a frame not yet whole.
    pub fn rest(&mut self) {
        self.timed.stream.rest();
        let kept = self.buf[self.start..self.end].to_vec();
        let buf = std::mem::replace(&mut self.buf, kept);
        (self.start, self.end) = (0, self.buf.len());
        if buf.len() == CAP {
            SPARE.with(|s| {
                let mut s = s.borrow_mut();
                if s.is_empty() {
                    *s = buf;
                }
            });
        }
    }
}

/// Reads into `into` once: `None` if nothing came without waiting.
fn read_some(timed: &mut Timed, nonblocking: bool, into: &mut [u8]) -> io::Result<Option<usize>> {
    if !nonblocking {
        return timed.read(into).map(Some);
    }
    timed.stream.recv_nowait(into)
}
