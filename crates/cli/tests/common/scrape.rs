//! Reading a server's `--metrics` endpoint in tests.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::Server;

/// The metrics address the server said on stderr.
pub fn metrics_addr(srv: &Server) -> String {
    let found = super::fuse::wait_for(Duration::from_secs(10), || srv.log().contains("metrics at http://"));
    assert!(found, "no metrics address in the log: {}", srv.log());
    let log = srv.log();
    let at = log.split("metrics at http://").nth(1).unwrap();
    at.split("/metrics").next().unwrap().to_string()
}

/// `GET path` on `addr`: the status line and the body.
pub fn get(addr: &str, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP answer");
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// The value of the sample `name` (with its labels) in `text`, 0 if absent.
pub fn sample(text: &str, name: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0.0)
}
