//! `ferry du` and `ferry df`: space used under a remote directory, and the
//! export's file system, printed as coreutils' du and df print them.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use ferry_client::{Client, Url};

use crate::commands::Clients;
use crate::names::human;

fn size(bytes: u64, h: bool) -> String {
    if h {
        human(bytes)
    } else {
        bytes.div_ceil(1024).to_string()
    }
}

/// Bytes allocated under `path` (itself included), each inode once (hard
/// links), printing each directory's total after its contents unless
/// `summary`.
fn walk(
    c: &Client,
    u: &Url,
    summary: bool,
    h: bool,
    seen: &mut HashSet<(u64, u64)>,
    out: &mut impl Write,
) -> Result<u64, String> {
    let fail = |e: ferry_client::Error| format!("{u}: {e}");
    let a = c.symlink_metadata(&u.path).map_err(fail)?;
    let mut total = if seen.insert((a.dev, a.ino)) { a.blocks * 512 } else { 0 };
    if a.is_dir() {
        for e in c.read_dir(&u.path).map_err(fail)? {
            let name = e.file_name().to_string_lossy().into_owned();
            let child = u.join(&name);
            let attr = match e.attr {
                Some(a) => a,
                None => c.symlink_metadata(&child.path).map_err(|e| format!("{child}: {e}"))?,
            };
            if attr.is_dir() {
                total += walk(c, &child, summary, h, seen, out)?;
            } else if seen.insert((attr.dev, attr.ino)) {
                total += attr.blocks * 512;
            }
        }
        if !summary {
            writeln!(out, "{}\t{u}", size(total, h)).map_err(|e| e.to_string())?;
        }
    }
    Ok(total)
}

pub fn du(tf: Option<&Path>, url: &str, summary: bool, h: bool) -> Result<(), String> {
    let u = Url::parse(url)?;
    let c = Clients::new(tf).get(&u)?;
    let mut out = std::io::stdout().lock();
    let total = walk(&c, &u, summary, h, &mut HashSet::new(), &mut out)?;
    let top_is_dir = c.symlink_metadata(&u.path).is_ok_and(|a| a.is_dir());
    if summary || !top_is_dir {
        writeln!(out, "{}\t{u}", size(total, h)).map_err(|e| e.to_string())?;
    }
    Ok(())
}

pub fn df(tf: Option<&Path>, url: &str, h: bool) -> Result<(), String> {
    let u = Url::parse(url)?;
    let c = Clients::new(tf).get(&u)?;
    let s = c.statfs(&u.path).map_err(|e| format!("{u}: {e}"))?;
    let unit = if s.frsize > 0 { s.frsize } else { s.bsize };
    let (total, free, avail) = (s.blocks * unit, s.bfree * unit, s.bavail * unit);
    let used = total.saturating_sub(free);
    // As df: the share of what non-root users may use, rounded up.
    let pct = match used + avail {
        0 => "-".to_string(),
        all => format!("{}%", (used * 100).div_ceil(all)),
    };
    let head = if h { "Size" } else { "1K-blocks" };
    println!("{:<32} {head:>10} {:>10} {:>10} {:>4}", "Filesystem", "Used", "Available", "Use%");
    println!("{:<32} {:>10} {:>10} {:>10} {pct:>4}", u.to_string(), size(total, h), size(used, h), size(avail, h));
    Ok(())
}
