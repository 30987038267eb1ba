//! The mount table and path resolution: which local paths are remote, and
//! where they land inside an export. Pure logic, no system calls.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use ferry_client::Url;

/// A path held as bytes (Linux names need not be UTF-8) as a `Path`.
pub fn as_path(b: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(b))
}

/// One `PREFIX=URL` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// Normalised absolute local path, no trailing slash (never "/").
    pub prefix: String,
    pub url: Url,
}

/// Where a path points.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Remote {
    pub mount: usize,
    /// Path inside the export (always starts with `/`).
    pub path: Vec<u8>,
    /// The normalised local view of the same path (e.g. `/remote/a/b`).
    pub local: Vec<u8>,
}

/// Parses `PREFIX=URL[;PREFIX=URL...]` (also separated by newlines).
pub fn parse_table(s: &str) -> Result<Vec<Mount>, String> {
    let mut out: Vec<Mount> = Vec::new();
    for item in s.split([';', '\n']).map(str::trim).filter(|i| !i.is_empty()) {
        let (prefix, url) = item.split_once('=').ok_or_else(|| format!("{item}: expected PREFIX=URL"))?;
        out.push(parse_one(prefix, url)?);
    }
    // Longest prefix first, so nested mounts win.
    out.sort_by_key(|m| std::cmp::Reverse(m.prefix.len()));
    Ok(out)
}

pub fn parse_one(prefix: &str, url: &str) -> Result<Mount, String> {
    if !prefix.starts_with('/') {
        return Err(format!("{prefix}: mount point must be an absolute path"));
    }
    let prefix = String::from_utf8(normalize(prefix.as_bytes())).map_err(|_| format!("{prefix}: not UTF-8"))?;
    if prefix == "/" {
        return Err("/: cannot mount over the root directory".into());
    }
    Ok(Mount { prefix, url: Url::parse(url)? })
}

/// Serialises a table for `FERRY_MOUNTS`.
pub fn format_table(mounts: &[Mount]) -> String {
    let items: Vec<String> =
        mounts.iter().map(|m| format!("{}=ferry://{}{}", m.prefix, m.url.addr, m.url.path)).collect();
    items.join(";")
}

/// Lexical normalisation of an absolute path: collapses `//`, `.` and
/// `..` (`..` at the root stays at the root, as the kernel does).
pub fn normalize(path: &[u8]) -> Vec<u8> {
    // Most paths programs pass are normal already: one scan, one copy.
    let odd = |c: &[u8]| c.is_empty() || c == b"." || c == b"..";
    if path == b"/" || path.strip_prefix(b"/").is_some_and(|rest| !rest.split(|b| *b == b'/').any(odd)) {
        return path.to_vec();
    }
    let mut parts: Vec<&[u8]> = Vec::new();
    for c in path.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    let mut s = Vec::with_capacity(path.len());
    for p in &parts {
        s.push(b'/');
        s.extend_from_slice(p);
    }
    if s.is_empty() {
        s.push(b'/');
    }
    s
}

/// `base/rel`, normalised.
pub fn join(base: &[u8], rel: &[u8]) -> Vec<u8> {
    let mut s = Vec::with_capacity(base.len() + rel.len() + 1);
    s.extend_from_slice(base);
    s.push(b'/');
    s.extend_from_slice(rel);
    normalize(&s)
}

/// Could `path` (absolute) be under one of the mounts? A cheap test that
/// lets the common local case skip normalisation and allocation.
pub fn might_match(mounts: &[Mount], path: &[u8]) -> bool {
    // `..` or `.` components or doubled slashes can hide a prefix.
    let odd = path.windows(2).any(|w| w == b"/." || w == b"//");
    odd || mounts.iter().any(|m| path.starts_with(m.prefix.as_bytes()))
}

/// Maps an absolute local path to a mount, if it is inside one.
pub fn resolve(mounts: &[Mount], abs: &[u8]) -> Option<Remote> {
    let local = normalize(abs);
    for (i, m) in mounts.iter().enumerate() {
        let rest = match local.strip_prefix(m.prefix.as_bytes()) {
            Some(r) if r.is_empty() || r.starts_with(b"/") => r,
            _ => continue,
        };
        let path = if m.url.path == "/" {
            if rest.is_empty() {
                b"/".to_vec()
            } else {
                rest.to_vec()
            }
        } else {
            let mut p = m.url.path.trim_end_matches('/').as_bytes().to_vec();
            p.extend_from_slice(rest);
            p
        };
        return Some(Remote { mount: i, path, local });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Vec<Mount> {
        parse_table("/remote=ferry://127.0.0.1:7070/;/remote/sub=ferry://h:1/x/y; /data=ferry://[::1]:9/d").unwrap()
    }

    #[test]
    fn normalizes() {
        assert_eq!(normalize(b"/a//b/./c/../d/"), b"/a/b/d");
        assert_eq!(normalize(b"/.."), b"/");
        assert_eq!(normalize(b"/../remote/x"), b"/remote/x");
        assert_eq!(normalize(b"/a/b.c/..d/.e"), b"/a/b.c/..d/.e");
        for odd in [&b"/a/"[..], b"/a/.", b"/a/..", b"//a", b"/a//b", b"a/b", b"", b"/./a"] {
            assert_ne!(normalize(odd), odd, "{:?}", String::from_utf8_lossy(odd));
        }
        assert_eq!(normalize(b"/"), b"/");
        assert_eq!(join(b"/remote/a", b"../b"), b"/remote/b");
        assert_eq!(join(b"/remote", b"../../etc"), b"/etc");
    }

    #[test]
    fn resolves_longest_prefix() {
        let t = table();
        let r = resolve(&t, b"/remote/sub/f").unwrap();
        assert_eq!((t[r.mount].url.addr.as_str(), &r.path[..]), ("h:1", &b"/x/y/f"[..]));
        let r = resolve(&t, b"/remote/subway").unwrap();
        assert_eq!((t[r.mount].url.addr.as_str(), &r.path[..]), ("127.0.0.1:7070", &b"/subway"[..]));
        let r = resolve(&t, b"/remote").unwrap();
        assert_eq!(r.path, b"/");
        assert_eq!(resolve(&t, b"/data/../remote/q").unwrap().path, b"/q");
        assert_eq!(resolve(&t, b"/data").unwrap().path, b"/d");
    }

    #[test]
    fn leaves_local_paths() {
        let t = table();
        assert!(resolve(&t, b"/remotex").is_none());
        assert!(resolve(&t, b"/remote/../etc/passwd").is_none());
        assert!(resolve(&t, b"/etc").is_none());
        assert!(!might_match(&t, b"/etc/passwd"));
        assert!(might_match(&t, b"/remote/a"));
        assert!(might_match(&t, b"/x/../remote/a"));
    }

    #[test]
    fn names_need_not_be_utf8() {
        let t = table();
        let r = resolve(&t, b"/remote/a\xff/./b\xfe").unwrap();
        assert_eq!(r.path, b"/a\xff/b\xfe");
        assert_eq!(r.local, b"/remote/a\xff/b\xfe");
    }

    #[test]
    fn rejects_bad_tables() {
        assert!(parse_table("remote=ferry://h/").is_err());
        assert!(parse_table("/=ferry://h/").is_err());
        assert!(parse_table("/r=http://h/").is_err());
        assert!(parse_table("/r").is_err());
        let t = table();
        assert_eq!(parse_table(&format_table(&t)).unwrap(), t);
    }
}
