//! Which files a client caches: the policy stored on the server, else the
//! rules of the user's configuration file, else the AFS naming convention,
//! else no cache (strong coherence, as without a cache at all).

use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use ferry_proto::cache;

/// The decision for one file, and what made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub cache: bool,
    pub source: Source,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// Stored on the server, on this path (the file or a directory above).
    Server(Vec<u8>),
    /// A rule of the configuration file: the file and the line number.
    Rule(PathBuf, usize),
    /// The naming convention: the name that decided.
    Name(Vec<u8>),
    Default,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.cache { "cache" } else { "bypass" })?;
        match &self.source {
            Source::Server(p) => write!(f, " (set on the server, on {})", String::from_utf8_lossy(p)),
            Source::Rule(file, line) => write!(f, " (rule at {}:{line})", file.display()),
            Source::Name(n) => write!(f, " (naming convention: {})", String::from_utf8_lossy(n)),
            Source::Default => f.write_str(" (default)"),
        }
    }
}

/// The rules of a configuration file: `cache GLOB` or `bypass GLOB` lines,
/// the first that matches a file's path from the export root wins.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    file: PathBuf,
    rules: Vec<(bool, Vec<u8>, usize)>,
    /// `dir PATH` and `size BYTES` lines, for `Cache::from_env`.
    pub dir: Option<PathBuf>,
    pub size: Option<u64>,
}

impl Rules {
    /// `FERRY_CACHE_CONFIG`, else `$XDG_CONFIG_HOME/ferry/cache.conf`,
    /// else `$HOME/.config/ferry/cache.conf`.
    pub fn default_path() -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("FERRY_CACHE_CONFIG") {
            return Some(PathBuf::from(p));
        }
        let base = match std::env::var_os("XDG_CONFIG_HOME") {
            Some(x) if !x.is_empty() => PathBuf::from(x),
            _ => PathBuf::from(std::env::var_os("HOME")?).join(".config"),
        };
        Some(base.join("ferry/cache.conf"))
    }

    /// Reads `path`; a missing file is no rules, a malformed one an error
    /// naming the line (a typo must not silently cache or bypass).
    pub fn load(path: &Path) -> Result<Rules, String> {
        match std::fs::read(path) {
            Ok(text) => Rules::parse(path, &text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Rules::default()),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    pub fn parse(path: &Path, text: &[u8]) -> Result<Rules, String> {
        let mut r = Rules { file: path.to_path_buf(), ..Rules::default() };
        for (i, line) in text.split(|&c| c == b'\n').enumerate() {
            let line = strip_comment(line).trim_ascii();
            if line.is_empty() {
                continue;
            }
            let bad = |what: &str| format!("{}:{}: {what}", path.display(), i + 1);
            let (word, arg) = match line.iter().position(|c| c.is_ascii_whitespace()) {
                Some(at) => (&line[..at], line[at..].trim_ascii()),
                None => return Err(bad("expected `cache GLOB`, `bypass GLOB`, `dir PATH` or `size BYTES`")),
            };
            match word {
                b"cache" | b"bypass" => {
                    let mut glob = arg.to_vec();
                    if glob.contains(&b'/') && !glob.starts_with(b"/") {
                        glob.insert(0, b'/');
                    }
                    r.rules.push((word == b"cache", glob, i + 1));
                }
                b"dir" => r.dir = Some(PathBuf::from(std::ffi::OsStr::from_bytes(arg))),
                b"size" => r.size = Some(parse_size(arg).ok_or_else(|| bad("size: expected bytes, e.g. 10G"))?),
                _ => return Err(bad("unknown word; expected cache, bypass, dir or size")),
            }
        }
        Ok(r)
    }

    /// The first rule matching `path` (from the export root).
    fn decide(&self, path: &[u8]) -> Option<Decision> {
        let name = path.rsplit(|&c| c == b'/').find(|n| !n.is_empty()).unwrap_or(b"");
        self.rules.iter().find_map(|(cache, glob, line)| {
            let subject = if glob.contains(&b'/') { path } else { name };
            glob_match(glob, subject)
                .then(|| Decision { cache: *cache, source: Source::Rule(self.file.clone(), *line) })
        })
    }
}

/// The line without its comment: from a `#` that starts the line or
/// follows a blank, as in the shell (a `#` inside a glob stays).
fn strip_comment(line: &[u8]) -> &[u8] {
    let at = (0..line.len()).find(|&i| line[i] == b'#' && (i == 0 || line[i - 1].is_ascii_whitespace()));
    at.map_or(line, |i| &line[..i])
}

/// `10G`, `512M`, `4096`.
pub fn parse_size(s: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(s).ok()?.trim();
    let (num, mul) = match s.char_indices().last()? {
        (i, 'K' | 'k') => (&s[..i], 1 << 10),
        (i, 'M' | 'm') => (&s[..i], 1 << 20),
        (i, 'G' | 'g') => (&s[..i], 1 << 30),
        (i, 'T' | 't') => (&s[..i], 1u64 << 40),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mul)
}

/// Shell-style matching on bytes: `*` any run within a name, `**` any run
/// across names, `?` one byte other than `/`.
pub fn glob_match(glob: &[u8], s: &[u8]) -> bool {
    match glob.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) if rest.first() == Some(&b'*') => {
            let rest = rest.strip_prefix(b"*").unwrap_or(rest);
            let rest = rest.strip_prefix(b"/").map_or(rest, |r| if r.is_empty() { rest } else { r });
            (0..=s.len()).any(|i| glob_match(rest, &s[i..]))
        }
        Some((b'*', rest)) => {
            let mut i = 0;
            loop {
                if glob_match(rest, &s[i..]) {
                    return true;
                }
                if i == s.len() || s[i] == b'/' {
                    return false;
                }
                i += 1;
            }
        }
        Some((b'?', rest)) => s.first().is_some_and(|&c| c != b'/') && glob_match(rest, &s[1..]),
        Some((&c, rest)) => s.first() == Some(&c) && glob_match(rest, &s[1..]),
    }
}

/// The naming convention of the AFS paper: a top-level directory whose
/// name starts with `__` is not cached; a file whose name starts with `++`
/// is, one whose name starts with `__` is not. The file's own name is the
/// more specific, so it wins over its top-level directory.
fn by_name(path: &[u8]) -> Option<Decision> {
    let mut names = path.split(|&c| c == b'/').filter(|n| !n.is_empty());
    let top = names.next()?;
    let last = names.next_back();
    let name = last.unwrap_or(top);
    let said = |cache, n: &[u8]| Some(Decision { cache, source: Source::Name(n.to_vec()) });
    if name.starts_with(b"++") {
        return said(true, name);
    }
    if name.starts_with(b"__") {
        return said(false, name);
    }
    if last.is_some() && top.starts_with(b"__") {
        return said(false, top);
    }
    None
}

/// The decision for `path`, given what the server stores for it
/// (`cache::NONE` when nothing, or a server without the capability).
pub fn decide(rules: &Rules, path: &[u8], server: u8, from: &[u8]) -> Decision {
    if server != cache::NONE {
        return Decision { cache: server == cache::CACHE, source: Source::Server(from.to_vec()) };
    }
    rules.decide(path).or_else(|| by_name(path)).unwrap_or(Decision { cache: false, source: Source::Default })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(text: &str) -> Rules {
        Rules::parse(Path::new("c.conf"), text.as_bytes()).unwrap()
    }

    #[test]
    fn globs() {
        assert!(glob_match(b"*.iso", b"x.iso"));
        assert!(!glob_match(b"*.iso", b"a/x.iso"));
        assert!(glob_match(b"/data/**", b"/data/a/b/c"));
        assert!(glob_match(b"/data/**/*.bin", b"/data/x.bin"));
        assert!(glob_match(b"/data/**/*.bin", b"/data/a/b/x.bin"));
        assert!(!glob_match(b"/data/*", b"/data/a/b"));
        assert!(glob_match(b"/d?ta/*", b"/data/a"));
        assert!(!glob_match(b"?", b"/"));
        assert!(glob_match(b"\xff*", b"\xff\xfe"));
    }

    #[test]
    fn precedence_server_then_rules_then_names() {
        let r = rules("# comment\nbypass /big/++keep\ncache *.iso\ncache scratch/**\nsize 2G\ndir /var/c\n");
        assert_eq!(r.size, Some(2 << 30));
        assert_eq!(r.dir, Some(PathBuf::from("/var/c")));
        // The server's setting wins over a rule.
        let d = decide(&r, b"/a.iso", cache::BYPASS, b"/");
        assert_eq!(d, Decision { cache: false, source: Source::Server(b"/".to_vec()) });
        // A rule wins over the naming convention.
        let d = decide(&r, b"/big/++keep", cache::NONE, b"");
        assert_eq!(d, Decision { cache: false, source: Source::Rule(PathBuf::from("c.conf"), 2) });
        assert!(decide(&r, b"/x/a.iso", cache::NONE, b"").cache);
        assert!(decide(&r, b"/scratch/q/r", cache::NONE, b"").cache);
        // Names, then the default.
        assert_eq!(decide(&r, b"/d/++f", cache::NONE, b"").source, Source::Name(b"++f".to_vec()));
        assert!(decide(&r, b"/d/++f", cache::NONE, b"").cache);
        assert!(!decide(&r, b"/__vol/f", cache::NONE, b"").cache);
        assert!(decide(&r, b"/__vol/++f", cache::NONE, b"").cache);
        assert!(!decide(&r, b"/d/__f", cache::NONE, b"").cache);
        assert_eq!(decide(&r, b"/d/f", cache::NONE, b""), Decision { cache: false, source: Source::Default });
        // A top-level file named __x is itself the name that decides.
        assert_eq!(decide(&r, b"/__x", cache::NONE, b"").source, Source::Name(b"__x".to_vec()));
    }

    #[test]
    fn trailing_comments_are_not_part_of_a_value() {
        let r = rules("cache  /datasets/**   # from the root\nbypass *.tmp # name\ncache a#b\ndir /var/c  # there\nsize 20G # max\n");
        assert_eq!(r.dir, Some(PathBuf::from("/var/c")));
        assert_eq!(r.size, Some(20 << 30));
        assert!(decide(&r, b"/datasets/a.bin", cache::NONE, b"").cache);
        assert_eq!(decide(&r, b"/x/y.tmp", cache::NONE, b"").source, Source::Rule(PathBuf::from("c.conf"), 2));
        assert!(decide(&r, b"/d/a#b", cache::NONE, b"").cache);
    }

    #[test]
    fn malformed_lines_are_errors_naming_the_line() {
        let e = Rules::parse(Path::new("c.conf"), b"cache *.iso\nkeep x\n").unwrap_err();
        assert!(e.contains("c.conf:2"), "{e}");
        assert!(Rules::parse(Path::new("c"), b"size lots\n").is_err());
        assert!(Rules::parse(Path::new("c"), b"cache\n").is_err());
    }
}
