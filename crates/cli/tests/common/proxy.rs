//! A TCP proxy on 127.0.0.1 whose connections the test can cut at once,
//! both ways (a network drop without a server restart), or that cuts each
//! connection by itself once so many bytes went one way.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// Run when a reply is swallowed, before the connection is cut.
type Hook = Arc<Mutex<Option<Box<dyn FnOnce() + Send>>>>;

pub struct Proxy {
    pub port: u16,
    socks: Arc<Mutex<Vec<TcpStream>>>,
    swallow: Arc<AtomicBool>,
    hook: Hook,
}

impl Proxy {
    /// Forwards every connection to `addr` (`HOST:PORT`).
    pub fn to(addr: String) -> Proxy {
        Proxy::cutting(addr, usize::MAX, usize::MAX)
    }

    /// Like `to`, but each connection is cut once `up` bytes went from the
    /// client to the server, or `down` bytes the other way.
    pub fn cutting(addr: String, up: usize, down: usize) -> Proxy {
        Proxy::cutting_only(addr, None, up, down)
    }

    /// Like `cutting`, for the `nth` connection only (from 0; `None`:
    /// every one).
    pub fn cutting_only(addr: String, nth: Option<usize>, up: usize, down: usize) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let socks = Arc::new(Mutex::new(Vec::new()));
        let swallow = Arc::new(AtomicBool::new(false));
        let hook: Hook = Arc::default();
        let (s2, sw, hk) = (Arc::clone(&socks), Arc::clone(&swallow), Arc::clone(&hook));
        thread::spawn(move || {
            for (i, c) in l.incoming().flatten().enumerate() {
                let Ok(s) = TcpStream::connect(&addr) else { continue };
                let (up, down) = if nth.is_none_or(|n| n == i) { (up, down) } else { (usize::MAX, usize::MAX) };
                s2.lock().unwrap().extend([c.try_clone().unwrap(), s.try_clone().unwrap()]);
                let (c2, s3) = (c.try_clone().unwrap(), s.try_clone().unwrap());
                let (sw, hk) = (Arc::clone(&sw), Arc::clone(&hk));
                thread::spawn(move || pump(c, s, up, None));
                thread::spawn(move || pump(s3, c2, down, Some((sw, hk))));
            }
        });
        Proxy { port, socks, swallow, hook }
    }

    /// The next bytes the server sends on any connection are dropped and
    /// that connection cut: a request that reached the server loses its
    /// reply (the case where a client cannot know whether it ran).
    pub fn swallow_next_reply(&self) {
        self.swallow.store(true, Ordering::SeqCst);
    }

    /// As `swallow_next_reply`, and `then` runs (a server killed and
    /// restarted, say) before the connection is cut.
    pub fn swallow_next_reply_then(&self, then: impl FnOnce() + Send + 'static) {
        *self.hook.lock().unwrap() = Some(Box::new(then));
        self.swallow_next_reply();
    }

    /// Cuts every connection made so far.
    pub fn cut(&self) {
        for s in self.socks.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Copies `from` to `to` until either ends or `limit` bytes went, or (when
/// `swallow` is given and set) data arrives, which is dropped; then cuts
/// both.
fn pump(mut from: TcpStream, mut to: TcpStream, mut limit: usize, swallow: Option<(Arc<AtomicBool>, Hook)>) {
    let mut buf = vec![0u8; 64 * 1024];
    while limit > 0 {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n.min(limit),
        };
        if let Some((s, hook)) = &swallow {
            if s.swap(false, Ordering::SeqCst) {
                if let Some(f) = hook.lock().unwrap().take() {
                    f();
                }
                break;
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        limit -= n;
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
