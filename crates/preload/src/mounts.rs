//! The mount table and path resolution: which local paths are remote, and
//! where they land inside an export. Pure logic, no system calls.

use ferry_client::Url;

/// One `PREFIX=URL` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// Normalised absolute local path, no trailing slash (never "/").
    pub prefix: String,
    pub url: Url,
}

/// Where a path points.
#[derive(Debug, PartialEq, Eq)]
pub struct Remote {
    pub mount: usize,
    /// Path inside the export (always starts with `/`).
    pub path: String,
    /// The normalised local view of the same path (e.g. `/remote/a/b`).
    pub local: String,
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
    let prefix = normalize(prefix);
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
pub fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    let mut s = String::with_capacity(path.len());
    for p in &parts {
        s.push('/');
        s.push_str(p);
    }
    if s.is_empty() {
        s.push('/');
    }
    s
}

/// `base/rel`, normalised.
pub fn join(base: &str, rel: &str) -> String {
    normalize(&format!("{base}/{rel}"))
}

/// Could `path` (absolute) be under one of the mounts? A cheap test that
/// lets the common local case skip normalisation and allocation.
pub fn might_match(mounts: &[Mount], path: &[u8]) -> bool {
    // `..` or `.` components or doubled slashes can hide a prefix.
    let odd = path.windows(2).any(|w| w == b"/." || w == b"//");
    odd || mounts.iter().any(|m| path.starts_with(m.prefix.as_bytes()))
}

/// Maps an absolute local path to a mount, if it is inside one.
pub fn resolve(mounts: &[Mount], abs: &str) -> Option<Remote> {
    let local = normalize(abs);
    for (i, m) in mounts.iter().enumerate() {
        let rest = match local.strip_prefix(m.prefix.as_str()) {
            Some(r) if r.is_empty() || r.starts_with('/') => r,
            _ => continue,
        };
        let path = if m.url.path == "/" {
            if rest.is_empty() {
                "/".to_string()
            } else {
                rest.to_string()
            }
        } else {
            format!("{}{}", m.url.path.trim_end_matches('/'), rest)
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
        assert_eq!(normalize("/a//b/./c/../d/"), "/a/b/d");
        assert_eq!(normalize("/.."), "/");
        assert_eq!(normalize("/../remote/x"), "/remote/x");
        assert_eq!(join("/remote/a", "../b"), "/remote/b");
        assert_eq!(join("/remote", "../../etc"), "/etc");
    }

    #[test]
    fn resolves_longest_prefix() {
        let t = table();
        let r = resolve(&t, "/remote/sub/f").unwrap();
        assert_eq!((t[r.mount].url.addr.as_str(), r.path.as_str()), ("h:1", "/x/y/f"));
        let r = resolve(&t, "/remote/subway").unwrap();
        assert_eq!((t[r.mount].url.addr.as_str(), r.path.as_str()), ("127.0.0.1:7070", "/subway"));
        let r = resolve(&t, "/remote").unwrap();
        assert_eq!(r.path, "/");
        assert_eq!(resolve(&t, "/data/../remote/q").unwrap().path, "/q");
        assert_eq!(resolve(&t, "/data").unwrap().path, "/d");
    }

    #[test]
    fn leaves_local_paths() {
        let t = table();
        assert!(resolve(&t, "/remotex").is_none());
        assert!(resolve(&t, "/remote/../etc/passwd").is_none());
        assert!(resolve(&t, "/etc").is_none());
        assert!(!might_match(&t, b"/etc/passwd"));
        assert!(might_match(&t, b"/remote/a"));
        assert!(might_match(&t, b"/x/../remote/a"));
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
