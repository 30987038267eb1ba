//! `ferry://HOST:PORT/path` addresses (`ferry://H1:P1,H2:P2/path` for
//! several gateways exporting one file system), and `ferry+unix://SOCKET/path` for a
//! server's Unix socket on this host, the socket's path percent-encoded as
//! the host (`ferry+unix://%2Frun%2Fferry.sock/data`; `%40NAME` for an
//! abstract socket `@NAME`).

use std::fmt;

/// Port used when a URL names none.
pub const DEFAULT_PORT: u16 = 7070;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    /// `host:port`, with IPv6 hosts in brackets, ready for `connect`.
    pub addr: String,
    /// Path inside the export, always starting with `/`.
    pub path: String,
}

impl Url {
    /// Parses `ferry://HOST[:PORT][,HOST[:PORT]…][/path]` or
    /// `ferry+unix://SOCKET[/path]`.
    pub fn parse(s: &str) -> Result<Url, String> {
        if let Some(rest) = s.strip_prefix("ferry+unix://") {
            let (sock, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let sock = percent_decode(sock).ok_or_else(|| format!("{s}: bad %-escape in the socket"))?;
            if sock.is_empty() {
                return Err(format!(
                    "{s}: no socket (write its path %-encoded, e.g. ferry+unix://%2Frun%2Fferry.sock/)"
                ));
            }
            return Ok(Url { addr: format!("unix:{sock}"), path: normalize(if path.is_empty() { "/" } else { path }) });
        }
        let rest = s.strip_prefix("ferry://").ok_or_else(|| format!("{s}: not a ferry:// URL"))?;
        let (hostport, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if hostport.is_empty() {
            return Err(format!("{s}: no host"));
        }
        // Several gateways of one file system: `h1:7070,h2:7070`.
        let addrs: Result<Vec<String>, String> = hostport.split(',').map(|hp| host_port(hp, s)).collect();
        let addr = addrs?.join(",");
        Ok(Url { addr, path: normalize(path) })
    }

    /// Whether `s` is written as a ferry URL (of either form).
    pub fn is_url(s: &[u8]) -> bool {
        s.starts_with(b"ferry://") || s.starts_with(b"ferry+unix://")
    }

    /// The URL of `name` inside this one.
    pub fn join(&self, name: &str) -> Url {
        let path =
            if self.path.ends_with('/') { format!("{}{name}", self.path) } else { format!("{}/{name}", self.path) };
        Url { addr: self.addr.clone(), path }
    }
}

/// `HOST[:PORT]` (IPv6 hosts in brackets) as `connect` wants it.
fn host_port(hostport: &str, url: &str) -> Result<String, String> {
    if hostport.is_empty() {
        return Err(format!("{url}: no host"));
    }
    if let Some(v6) = hostport.strip_prefix('[') {
        let end = v6.find(']').ok_or_else(|| format!("{url}: unclosed '['"))?;
        let port = parse_port(&v6[end + 1..], url)?;
        return Ok(format!("[{}]:{port}", &v6[..end]));
    }
    Ok(match hostport.rsplit_once(':') {
        Some((h, p)) => format!("{h}:{}", parse_port(&format!(":{p}"), url)?),
        None => format!("{hostport}:{DEFAULT_PORT}"),
    })
}

fn parse_port(s: &str, url: &str) -> Result<u16, String> {
    if s.is_empty() {
        return Ok(DEFAULT_PORT);
    }
    let p = s.strip_prefix(':').ok_or_else(|| format!("{url}: bad port"))?;
    p.parse().map_err(|_| format!("{url}: bad port '{p}'"))
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Percent-decoding is not done: paths are taken literally, `//` collapsed.
fn normalize(p: &str) -> String {
    let mut out = String::with_capacity(p.len());
    for c in p.chars() {
        if c == '/' && out.ends_with('/') {
            continue;
        }
        out.push(c);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

impl Url {
    /// The URL of `path` on the server at `addr` (as `Url::addr` holds it).
    pub fn show(addr: &str, path: &str) -> String {
        match addr.strip_prefix("unix:") {
            Some(sock) => {
                let enc: String = sock
                    .bytes()
                    .map(|c| match c {
                        b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'_' | b'-' | b'~' => (c as char).to_string(),
                        _ => format!("%{c:02X}"),
                    })
                    .collect();
                format!("ferry+unix://{enc}{path}")
            }
            None => format!("ferry://{addr}{path}"),
        }
    }
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&Url::show(&self.addr, &self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_host_port_and_path() {
        let u = Url::parse("ferry://127.0.0.1:9000/a//b").unwrap();
        assert_eq!(u.addr, "127.0.0.1:9000");
        assert_eq!(u.path, "/a/b");
        assert_eq!(u.to_string(), "ferry://127.0.0.1:9000/a/b");
    }

    #[test]
    fn defaults_port_and_root() {
        let u = Url::parse("ferry://localhost").unwrap();
        assert_eq!(u.addr, "localhost:7070");
        assert_eq!(u.path, "/");
    }

    #[test]
    fn parses_ipv6() {
        let u = Url::parse("ferry://[::1]:7/x").unwrap();
        assert_eq!(u.addr, "[::1]:7");
        assert_eq!(u.path, "/x");
    }

    #[test]
    fn parses_gateway_lists() {
        let u = Url::parse("ferry://a:1,b,[::1]:3/x").unwrap();
        assert_eq!(u.addr, "a:1,b:7070,[::1]:3");
        assert_eq!(u.to_string(), "ferry://a:1,b:7070,[::1]:3/x");
        assert!(Url::parse("ferry://a:1,/x").is_err());
        assert!(Url::parse("ferry://a:1,b:x/x").is_err());
    }

    #[test]
    fn parses_unix_sockets() {
        let u = Url::parse("ferry+unix://%2Frun%2Fferry.sock/a//b").unwrap();
        assert_eq!(u.addr, "unix:/run/ferry.sock");
        assert_eq!(u.path, "/a/b");
        assert_eq!(u.to_string(), "ferry+unix://%2Frun%2Fferry.sock/a/b");
        let u = Url::parse("ferry+unix://%40ferry-1").unwrap();
        assert_eq!((u.addr.as_str(), u.path.as_str()), ("unix:@ferry-1", "/"));
        assert!(Url::parse("ferry+unix:///x").is_err());
        assert!(Url::parse("ferry+unix://%2/x").is_err());
    }

    #[test]
    fn rejects_other_schemes_and_bad_ports() {
        assert!(Url::parse("nfs://h/x").is_err());
        assert!(Url::parse("ferry://h:abc/x").is_err());
        assert!(Url::parse("ferry:///x").is_err());
    }
}
