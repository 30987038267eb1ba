//! `ferry://HOST:PORT/path` addresses.

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
    /// Parses `ferry://HOST[:PORT][/path]`.
    pub fn parse(s: &str) -> Result<Url, String> {
        let rest = s.strip_prefix("ferry://").ok_or_else(|| format!("{s}: not a ferry:// URL"))?;
        let (hostport, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if hostport.is_empty() {
            return Err(format!("{s}: no host"));
        }
        let addr = if let Some(v6) = hostport.strip_prefix('[') {
            let end = v6.find(']').ok_or_else(|| format!("{s}: unclosed '['"))?;
            let port = parse_port(&v6[end + 1..], s)?;
            format!("[{}]:{port}", &v6[..end])
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => format!("{h}:{}", parse_port(&format!(":{p}"), s)?),
                None => format!("{hostport}:{DEFAULT_PORT}"),
            }
        };
        Ok(Url { addr, path: normalize(path) })
    }

    /// The URL of `name` inside this one.
    pub fn join(&self, name: &str) -> Url {
        let path =
            if self.path.ends_with('/') { format!("{}{name}", self.path) } else { format!("{}/{name}", self.path) };
        Url { addr: self.addr.clone(), path }
    }
}

fn parse_port(s: &str, url: &str) -> Result<u16, String> {
    if s.is_empty() {
        return Ok(DEFAULT_PORT);
    }
    let p = s.strip_prefix(':').ok_or_else(|| format!("{url}: bad port"))?;
    p.parse().map_err(|_| format!("{url}: bad port '{p}'"))
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

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ferry://{}{}", self.addr, self.path)
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
    fn rejects_other_schemes_and_bad_ports() {
        assert!(Url::parse("nfs://h/x").is_err());
        assert!(Url::parse("ferry://h:abc/x").is_err());
        assert!(Url::parse("ferry:///x").is_err());
    }
}
