//! A connected stream socket of either family ferry speaks over — TCP, or a
//! Unix socket for a client on the server's own host — with what both ends
//! need of it: timeouts, the peer's name and credentials, and passing a
//! file descriptor beside a message (`SCM_RIGHTS`, Unix sockets only), and
//! TLS (`tls`).

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};

/// Where a server listens: `HOST:PORT`, or `unix:PATH` (a socket file), or
/// `unix:@NAME` (Linux's abstract name space: no file, gone with its
/// process).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Addr {
    Tcp(String),
    Unix(std::path::PathBuf),
    Abstract(Vec<u8>),
}

impl Addr {
    pub fn parse(s: &str) -> Addr {
        match s.strip_prefix("unix:") {
            Some(rest) => match rest.strip_prefix('@') {
                Some(name) => Addr::Abstract(name.as_bytes().to_vec()),
                None => Addr::Unix(rest.into()),
            },
            None => Addr::Tcp(s.to_string()),
        }
    }
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Tcp(a) => f.write_str(a),
            Addr::Unix(p) => write!(f, "unix:{}", p.display()),
            Addr::Abstract(n) => write!(f, "unix:@{}", String::from_utf8_lossy(n)),
        }
    }
}

pub mod tls;

/// A connected socket: plain, or TLS once [`Socket::start_tls`] set it up
/// (on every handle of the connection at once).
#[derive(Debug)]
pub struct Socket {
    fd: OwnedFd,
    unix: bool,
    tls: Arc<OnceLock<Arc<tls::Records>>>,
}

/// Descriptors one receive accepts at most; more in one message are
/// closed by the kernel (`MSG_CTRUNC`).
const FDS_PER_RECV: usize = 4;

impl Socket {
    /// Connects to `addr` (each of a TCP name's addresses in turn, within
    /// `timeout` each).
    pub fn connect(addr: &Addr, timeout: Duration) -> io::Result<Socket> {
        let name = match addr {
            Addr::Tcp(name) => name,
            Addr::Unix(p) => return Ok(Socket::from(UnixStream::connect(p)?)),
            Addr::Abstract(n) => {
                return Ok(Socket::from(UnixStream::connect_addr(&SocketAddr::from_abstract_name(n)?)?))
            }
        };
        let mut last = None;
        for a in name.to_socket_addrs()? {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => return Ok(Socket::from(s)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address")))
    }

    /// Whether this is a Unix socket (so the peer is on this host).
    pub fn is_unix(&self) -> bool {
        self.unix
    }

    /// A socket for the same connection under another descriptor, before
    /// any TLS (see [`with_fd`](Self::with_fd) after).
    pub fn from_fd(fd: OwnedFd, unix: bool) -> Socket {
        Socket { fd, unix, tls: Arc::default() }
    }

    /// This connection under another descriptor (its TLS state goes along).
    pub fn with_fd(&self, fd: OwnedFd) -> Socket {
        Socket { fd, unix: self.unix, tls: Arc::clone(&self.tls) }
    }

    pub fn try_clone(&self) -> io::Result<Socket> {
        Ok(self.with_fd(self.fd.try_clone()?))
    }

    /// The sealed record layer, once TLS is up.
    pub fn tls(&self) -> Option<&Arc<tls::Records>> {
        self.tls.get()
    }

    /// From now on every handle of this connection reads and writes
    /// through `records`.
    pub fn start_tls(&self, records: Arc<tls::Records>) {
        let _ = self.tls.set(records);
    }

    /// Sends all of `parts`, in order (sealed into shared records under
    /// TLS: no copy to join them first).
    pub fn write_parts(&self, parts: &[&[u8]]) -> io::Result<()> {
        match self.tls() {
            Some(t) => t.send(parts, |sealed| write_all_raw(&self.fd, sealed)),
            None => parts.iter().try_for_each(|p| write_all_raw(&self.fd, p)),
        }
    }

    /// The first byte the peer sent, left unread (waits for it within the
    /// read timeout); `None` if the peer closed first.
    pub fn peek_first(&self) -> io::Result<Option<u8>> {
        let mut b = [0u8; 1];
        loop {
            match rustix::net::recv(&self.fd, &mut b, RecvFlags::PEEK) {
                Ok((0, _)) => return Ok(None),
                Ok(_) => return Ok(Some(b[0])),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// `TCP_NODELAY` (nothing to do on a Unix socket).
    pub fn set_nodelay(&self) -> io::Result<()> {
        match self.unix {
            true => Ok(()),
            false => Ok(rustix::net::sockopt::set_tcp_nodelay(&self.fd, true)?),
        }
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        Ok(rustix::net::sockopt::set_socket_timeout(&self.fd, rustix::net::sockopt::Timeout::Recv, t)?)
    }

    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        Ok(rustix::net::sockopt::set_socket_timeout(&self.fd, rustix::net::sockopt::Timeout::Send, t)?)
    }

    pub fn shutdown_write(&self) -> io::Result<()> {
        Ok(rustix::net::shutdown(&self.fd, rustix::net::Shutdown::Write)?)
    }

    /// Ends the connection for every clone of this socket.
    pub fn shutdown_both(&self) -> io::Result<()> {
        Ok(rustix::net::shutdown(&self.fd, rustix::net::Shutdown::Both)?)
    }

    /// The peer for messages: its address, or for a Unix peer its process.
    pub fn peer_name(&self) -> String {
        if self.unix {
            return match self.peer_cred() {
                Some((pid, uid)) => format!("local process {pid} (uid {uid})"),
                None => "local process".into(),
            };
        }
        let addr = rustix::net::getpeername(&self.fd).ok().flatten();
        addr.and_then(|a| std::net::SocketAddr::try_from(a).ok()).map_or_else(|| "peer".into(), |a| a.to_string())
    }

    /// The Unix peer's process id and user id, as the kernel saw them when
    /// it connected.
    pub fn peer_cred(&self) -> Option<(u32, u32)> {
        if !self.unix {
            return None;
        }
        let c = rustix::net::sockopt::socket_peercred(&self.fd).ok()?;
        Some((c.pid.as_raw_nonzero().get() as u32, c.uid.as_raw()))
    }

    /// Sends `buf` with `fd` attached to its first byte (a Unix socket);
    /// returns how much of `buf` went (the rest is sent plainly).
    pub fn send_with_fd(&self, buf: &[u8], fd: BorrowedFd<'_>) -> io::Result<usize> {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut anc = SendAncillaryBuffer::new(&mut space);
        let fds = [fd];
        if !anc.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(io::Error::other("no room for the descriptor"));
        }
        loop {
            match rustix::net::sendmsg(&self.fd, &[IoSlice::new(buf)], &mut anc, SendFlags::NOSIGNAL) {
                Err(rustix::io::Errno::INTR) => continue,
                r => return Ok(r?),
            }
        }
    }

    /// Reads like `read`, and adds descriptors that came with the bytes to
    /// `fds` (close-on-exec). On a TCP socket, a plain `read`.
    pub fn recv_with_fds(&self, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
        if !self.unix {
            return self.read_plain(buf);
        }
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(FDS_PER_RECV))];
        let mut anc = RecvAncillaryBuffer::new(&mut space);
        let got = rustix::net::recvmsg(&self.fd, &mut [IoSliceMut::new(buf)], &mut anc, RecvFlags::CMSG_CLOEXEC)?;
        for m in anc.drain() {
            if let RecvAncillaryMessage::ScmRights(new) = m {
                fds.extend(new);
            }
        }
        Ok(got.bytes)
    }

    /// Reads what has come without waiting (through TLS records on a TLS
    /// connection): `None` if nothing has. 0 at the peer's close.
    pub fn recv_nowait(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let r = match self.tls() {
            Some(t) => t.recv_nowait(self.fd.as_fd(), buf),
            None => loop {
                match rustix::net::recv(&self.fd, &mut *buf, RecvFlags::DONTWAIT) {
                    Err(rustix::io::Errno::INTR) => continue,
                    r => break r.map(|(n, _)| n).map_err(io::Error::from),
                }
            },
        };
        match r {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The connection is idle: buffers it would make again are let go.
    pub fn rest(&self) {
        if let Some(t) = self.tls() {
            t.rest();
        }
    }

    fn read_plain(&self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(t) = self.tls() {
            return t.recv(self.fd.as_fd(), buf);
        }
        loop {
            match rustix::io::read(&self.fd, &mut *buf) {
                Err(rustix::io::Errno::INTR) => continue,
                r => return Ok(r?),
            }
        }
    }
}

impl Read for &Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_plain(buf)
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Write for &Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(t) = self.tls() {
            t.send(&[buf], |sealed| write_all_raw(&self.fd, sealed))?;
            return Ok(buf.len());
        }
        loop {
            match rustix::net::send(&self.fd, buf, SendFlags::NOSIGNAL) {
                Err(rustix::io::Errno::INTR) => continue,
                r => return Ok(r?),
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for Socket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Sends all of `buf` as it is.
fn write_all_raw(fd: &OwnedFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match rustix::net::send(fd, buf, SendFlags::NOSIGNAL) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

impl From<TcpStream> for Socket {
    fn from(s: TcpStream) -> Socket {
        Socket::from_fd(s.into(), false)
    }
}

impl From<UnixStream> for Socket {
    fn from(s: UnixStream) -> Socket {
        Socket::from_fd(s.into(), true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        assert_eq!(Addr::parse("127.0.0.1:7070"), Addr::Tcp("127.0.0.1:7070".into()));
        assert_eq!(Addr::parse("unix:/run/f.sock"), Addr::Unix("/run/f.sock".into()));
        assert_eq!(Addr::parse("unix:@ferry-1"), Addr::Abstract(b"ferry-1".to_vec()));
        assert_eq!(Addr::parse("unix:@ferry-1").to_string(), "unix:@ferry-1");
    }

    #[test]
    fn a_descriptor_travels_with_its_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let (a, b) = (Socket::from(a), Socket::from(b));
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        assert_eq!(a.send_with_fd(b"hdr", f.as_fd()).unwrap(), 3);
        (&a).write_all(b"tail").unwrap();
        let mut fds = Vec::new();
        let mut buf = [0u8; 16];
        let n = b.recv_with_fds(&mut buf, &mut fds).unwrap();
        assert_eq!(&buf[..n], b"hdr", "a receive stops where the descriptor's bytes end");
        assert_eq!(fds.len(), 1);
        let n = b.recv_with_fds(&mut buf, &mut fds).unwrap();
        assert_eq!(&buf[..n], b"tail");
        assert_eq!(fds.len(), 1);
        let (want, got) = (rustix::fs::fstat(&f).unwrap(), rustix::fs::fstat(&fds[0]).unwrap());
        assert_eq!((want.st_dev, want.st_ino), (got.st_dev, got.st_ino));
        assert_eq!(b.peer_cred().map(|c| c.0), Some(std::process::id()));
    }
}
