//! A TCP proxy on 127.0.0.1 whose connections the test can cut at once,
//! both ways: a network drop without a server restart.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;

pub struct Proxy {
    pub port: u16,
    socks: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    /// Forwards every connection to `addr` (`HOST:PORT`).
    pub fn to(addr: String) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let socks = Arc::new(Mutex::new(Vec::new()));
        let s2 = Arc::clone(&socks);
        thread::spawn(move || {
            for c in l.incoming().flatten() {
                let Ok(s) = TcpStream::connect(&addr) else { continue };
                s2.lock().unwrap().extend([c.try_clone().unwrap(), s.try_clone().unwrap()]);
                let (c2, s3) = (c.try_clone().unwrap(), s.try_clone().unwrap());
                thread::spawn(move || pump(c, s));
                thread::spawn(move || pump(s3, c2));
            }
        });
        Proxy { port, socks }
    }

    /// Cuts every connection made so far.
    pub fn cut(&self) {
        for s in self.socks.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
}
