//! Several servers ("gateways") exporting the same file system, named by
//! one address list (`h1:7070,h2:7070`, from `ferry://h1:7070,h2:7070/`):
//! a client starts at a random one, so that clients spread over them, and
//! moves on to the next when the one it uses stops answering: when its
//! connection is lost, or — from a gateway that fences — when a request
//! goes unanswered for `Options::gateway_timeout` (a stopped or hung
//! gateway, whose connection the kernel keeps alive).

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use crate::engine::{Engine, Options};
use crate::error::{Error, Result};

pub(crate) struct Gateways {
    addrs: Vec<String>,
    /// The one in use (or to try first).
    at: AtomicUsize,
}

impl Gateways {
    /// The gateways of `list` (comma-separated addresses; one address is a
    /// list of one).
    pub(crate) fn new(list: &str) -> Gateways {
        let mut addrs: Vec<String> =
            list.split(',').map(str::trim).filter(|a| !a.is_empty()).map(String::from).collect();
        if addrs.is_empty() {
            addrs.push(list.to_string());
        }
        let mut r = [0u8; 8];
        let start = match getrandom::getrandom(&mut r) {
            Ok(()) => (u64::from_le_bytes(r) % addrs.len() as u64) as usize,
            Err(_) => std::process::id() as usize % addrs.len(),
        };
        Gateways { addrs, at: AtomicUsize::new(start) }
    }

    pub(crate) fn is_several(&self) -> bool {
        self.addrs.len() > 1
    }

    /// How long a request on `e` may go unanswered before the client
    /// leaves it: only with another gateway to go to, a client that
    /// reconnects, and a gateway that fences the session left (a hung
    /// gateway that woke would otherwise apply the client's old requests
    /// after newer ones sent through the next).
    fn stall_for(&self, e: &Engine, opts: &Options) -> Option<std::time::Duration> {
        let fences = e.has_cap(ferry_proto::caps::FENCE);
        (self.is_several() && opts.reconnect.is_some() && fences && !opts.gateway_timeout.is_zero())
            .then_some(opts.gateway_timeout)
    }

    /// After `addr` was given up for not answering: the next gateway is
    /// tried first (the one given up last), so that a stopped gateway,
    /// which still accepts connections, does not hold the move up for a
    /// handshake's timeout.
    pub(crate) fn pass(&self, addr: &str) {
        let at = self.at.load(Relaxed);
        if self.addrs[at] == addr {
            self.at.store((at + 1) % self.addrs.len(), Relaxed);
        }
    }

    /// A connection to the first gateway that answers, trying each once
    /// from the one in use. An authentication refusal ends the round: the
    /// gateways share their tokens, and the others would refuse too.
    pub(crate) fn connect(&self, opts: &Options) -> Result<Engine> {
        let start = self.at.load(Relaxed);
        let mut failed = Vec::new();
        for i in 0..self.addrs.len() {
            let at = (start + i) % self.addrs.len();
            match Engine::connect(&self.addrs[at], opts) {
                Ok(e) => {
                    if let Some(bound) = self.stall_for(&e, opts) {
                        e.set_stall(Some(bound));
                    }
                    self.at.store(at, Relaxed);
                    return Ok(e);
                }
                Err(e @ Error::Auth(_)) => return Err(e),
                Err(e) => failed.push((at, e)),
            }
        }
        let (_, last) = failed.last().expect("at least one gateway");
        if !self.is_several() {
            return Err(last.clone());
        }
        // Each gateway's own reason: the last one's alone would hide a
        // mistyped address among the list.
        let (kind, errno) = match last {
            Error::Io { kind, errno, .. } => (*kind, *errno),
            e => (std::io::ErrorKind::Other, Some(e.errno())),
        };
        let why: Vec<String> = failed.iter().map(|(at, e)| format!("{}: {e}", self.addrs[*at])).collect();
        Err(Error::Io { kind, errno, message: format!("no gateway answered ({})", why.join("; ")) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_spreads() {
        let g = Gateways::new("a:1, b:2,,c:3");
        assert_eq!(g.addrs, ["a:1", "b:2", "c:3"]);
        assert!(g.is_several());
        assert!(!Gateways::new("a:1").is_several());
        // Clients start at different gateways.
        let starts: std::collections::HashSet<String> =
            (0..64).map(|_| Gateways::new("a:1,b:2,c:3")).map(|g| g.addrs[g.at.load(Relaxed)].clone()).collect();
        assert_eq!(starts.len(), 3, "64 clients all started on {starts:?}");
    }
}
