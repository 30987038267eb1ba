//! `ferry sync SRC DST`: make DST a copy of SRC, sending only what differs
//! (size or modification time, or with `--checksum` the bytes), as
//! `rsync -a` and `rclone sync` do. Either side may be remote. Files go
//! through `ferry cp`'s copy (temporary name, then rename) and keep mode and
//! times through `cp -a`'s code.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use ferry_client::Time;

use crate::commands::{
    base_name, child, copy_file, display, is_temp_name, list_names, loc, local_fail, make_dir, open_src, probe,
    remote_fail, stat_of, strip, Clients, Loc, Progress, Stat,
};
use crate::preserve::{copy_attrs, link_target, make_symlink};

/// How `ferry sync` syncs.
#[derive(Clone, Copy, Default)]
pub struct SyncOpts {
    /// Remove what DST has and SRC has not.
    pub delete: bool,
    /// Say what would be done; change nothing.
    pub dry_run: bool,
    /// Compare files' bytes, not their sizes and times.
    pub checksum: bool,
    /// Each action on stdout, and the summary line even off a terminal.
    pub verbose: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    File,
    Dir,
    Link,
    /// A device, FIFO or socket: not synced (as rsync -a without -D).
    Special,
}

impl Stat {
    fn kind(&self) -> Kind {
        match self.mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Link,
            _ => Kind::Special,
        }
    }
}

/// What is at `l`, a symbolic link not followed.
fn entry(c: &mut Clients, l: &Loc) -> Result<Option<Stat>, String> {
    stat_of(c, l, false)
}

/// Times equal to the second, and to the nanosecond where both sides give
/// nanoseconds (a side that keeps only seconds shows 0).
fn same_time(a: Time, b: Time) -> bool {
    a.sec == b.sec && (a.nsec == 0 || b.nsec == 0 || a.nsec == b.nsec)
}

fn same_mode(a: &Stat, b: &Stat) -> bool {
    (a.mode ^ b.mode) & 0o7777 == 0
}

/// Whether two files hold the same bytes (their sizes already equal).
fn same_bytes(c: &mut Clients, a: &Loc, b: &Loc) -> Result<bool, String> {
    let (mut ra, mut rb) = (open_src(c, a)?, open_src(c, b)?);
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = read_full(&mut ra, &mut ba).map_err(|e| format!("{}: {}", display(a), strip(&e)))?;
        let m = read_full(&mut rb, &mut bb).map_err(|e| format!("{}: {}", display(b), strip(&e)))?;
        if n != m || ba[..n] != bb[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Removes `l` (a directory with what it holds).
fn remove(c: &mut Clients, l: &Loc, is_dir: bool) -> Result<(), String> {
    match l {
        Loc::Local(p) if is_dir => fs::remove_dir_all(p).map_err(|e| local_fail(p, e)),
        Loc::Local(p) => fs::remove_file(p).map_err(|e| local_fail(p, e)),
        Loc::Remote(u, p) => {
            let client = c.get(u)?;
            let r = if is_dir { client.remove_dir_all(p) } else { client.remove_file(p) };
            r.map_err(|e| remote_fail(l, e))
        }
    }
}

/// Whether `inner` is `outer` or below it, on the same side.
fn within(inner: &Loc, outer: &Loc) -> bool {
    let abs = |p: &Path| fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    match (inner, outer) {
        (Loc::Local(i), Loc::Local(o)) => {
            // DST may not exist yet: its parent tells where it would be.
            let i = match (i.parent(), i.file_name()) {
                (Some(d), Some(n)) if !i.exists() => {
                    abs(if d.as_os_str().is_empty() { Path::new(".") } else { d }).join(n)
                }
                _ => abs(i),
            };
            i.starts_with(abs(o))
        }
        (Loc::Remote(ui, i), Loc::Remote(uo, o)) => ui.addr == uo.addr && i.starts_with(o),
        _ => false,
    }
}

struct Sync {
    c: Clients,
    o: SyncOpts,
    p: Progress,
    skipped: u64,
    deleted: u64,
    /// Errors so far, said at the end; any stops `--delete`.
    errors: Vec<String>,
}

pub fn sync(tf: Option<&Path>, src: &OsStr, dst: &OsStr, o: SyncOpts) -> Result<(), String> {
    let mut c = Clients::new(tf);
    let src = loc(src)?;
    let mut dst = loc(dst)?;
    let Some(top) = entry(&mut c, &src)? else {
        return Err(format!("{}: No such file or directory", display(&src)));
    };
    // A file synced to a directory goes into it, as with cp.
    if top.kind() != Kind::Dir && matches!(probe(&mut c, &dst)?, Some((true, _, _))) {
        dst = child(&dst, &base_name(&src));
    }
    if top.kind() == Kind::Dir && within(&dst, &src) {
        return Err(format!("{}: is inside the source {}", display(&dst), display(&src)));
    }
    let mut s = Sync { c, o, p: Progress::new(), skipped: 0, deleted: 0, errors: Vec::new() };
    // Actions are said by paths below DST (a file: its name).
    let rel = if top.kind() == Kind::Dir { PathBuf::new() } else { PathBuf::from(base_name(&dst)) };
    if let Err(e) = s.one(&src, &dst, &rel) {
        s.errors.push(e);
    }
    let verb = if o.dry_run { "would copy" } else { "copied" };
    let deleted = if o.dry_run { "would be deleted" } else { "deleted" };
    let last = s.errors.pop();
    for e in &s.errors {
        eprintln!("ferry: {e}");
    }
    s.p.finish(o.verbose, verb, &format!("; {} up to date, {} {deleted}", s.skipped, s.deleted));
    last.map_or(Ok(()), Err)
}

impl Sync {
    /// Says an action (on stdout, with -v or -n); true if it is to be done.
    fn act(&self, what: &str, rel: &Path) -> bool {
        if self.o.verbose || self.o.dry_run {
            let would = if self.o.dry_run { "would " } else { "" };
            let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
            println!("{would}{what} {}", rel.display());
        }
        !self.o.dry_run
    }

    /// Makes `dst` what `src` is; an error in a directory's entry is kept
    /// and the others are still synced.
    fn one(&mut self, src: &Loc, dst: &Loc, rel: &Path) -> Result<(), String> {
        let s = entry(&mut self.c, src)?.ok_or_else(|| format!("{}: No such file or directory", display(src)))?;
        let d = entry(&mut self.c, dst)?;
        match s.kind() {
            Kind::Special => {
                eprintln!("ferry: {}: skipped: not a file, directory or symbolic link", display(src));
                Ok(())
            }
            Kind::Dir => self.dir(src, dst, rel, &s, d),
            Kind::Link => self.link(src, dst, rel, d),
            Kind::File => self.file(src, dst, rel, &s, d),
        }
    }

    /// Clears the way for `src`'s kind where DST has another: a directory
    /// goes only with --delete.
    fn clear(&mut self, dst: &Loc, rel: &Path, d: &Stat) -> Result<(), String> {
        if d.kind() == Kind::Dir && !self.o.delete {
            return Err(format!("{}: is a directory on the destination (use --delete to replace it)", display(dst)));
        }
        self.deleted += 1;
        if self.act("delete", rel) {
            remove(&mut self.c, dst, d.kind() == Kind::Dir)?;
        }
        Ok(())
    }

    fn file(&mut self, src: &Loc, dst: &Loc, rel: &Path, s: &Stat, d: Option<Stat>) -> Result<(), String> {
        if let Some(d) = d {
            if d.kind() == Kind::File && s.size == d.size {
                let same =
                    if self.o.checksum { same_bytes(&mut self.c, src, dst)? } else { same_time(s.mtime, d.mtime) };
                if same {
                    self.skipped += 1;
                    if !(same_mode(s, &d) && same_time(s.mtime, d.mtime)) && self.act("set mode and times of", rel) {
                        copy_attrs(&mut self.c, src, dst)?;
                    }
                    return Ok(());
                }
            }
            if d.kind() != Kind::File {
                self.clear(dst, rel, &d)?;
            }
        }
        self.p.files.set(self.p.files.get() + 1);
        if !self.act("copy", rel) {
            self.p.bytes.set(self.p.bytes.get() + s.size);
            return Ok(());
        }
        copy_file(&mut self.c, src, dst, s.mode & 0o7777, &self.p, true)?;
        copy_attrs(&mut self.c, src, dst)
    }

    fn link(&mut self, src: &Loc, dst: &Loc, rel: &Path, d: Option<Stat>) -> Result<(), String> {
        let target =
            link_target(&mut self.c, src)?.ok_or_else(|| format!("{}: changed while syncing", display(src)))?;
        if let Some(d) = d {
            if d.kind() == Kind::Link {
                if link_target(&mut self.c, dst)?.as_ref() == Some(&target) {
                    self.skipped += 1;
                    return Ok(());
                }
            } else {
                self.clear(dst, rel, &d)?;
            }
        }
        self.p.files.set(self.p.files.get() + 1);
        if self.act("copy", rel) {
            make_symlink(&mut self.c, dst, &target)?;
        }
        Ok(())
    }

    fn dir(&mut self, src: &Loc, dst: &Loc, rel: &Path, s: &Stat, d: Option<Stat>) -> Result<(), String> {
        let exists = match &d {
            Some(d) if d.kind() == Kind::Dir => true,
            Some(d) => {
                self.clear(dst, rel, d)?;
                false
            }
            None => false,
        };
        if !exists && self.act("mkdir", rel) {
            make_dir(&mut self.c, dst, s.mode & 0o7777)?;
        }
        // What an interrupted copy left behind is no data: not copied,
        // and so removed from DST by --delete.
        let mut names = list_names(&mut self.c, src)?;
        names.retain(|n| !is_temp_name(n));
        for name in &names {
            if let Err(e) = self.one(&child(src, name), &child(dst, name), &rel.join(name)) {
                self.errors.push(e);
            }
        }
        if self.o.delete && exists {
            self.delete_extra(dst, rel, &names)?;
        }
        // After the contents: writing them changed the directory's times.
        let now = if self.o.dry_run { None } else { entry(&mut self.c, dst)? };
        match now {
            Some(n) if same_mode(s, &n) && same_time(s.mtime, n.mtime) => Ok(()),
            Some(_) => copy_attrs(&mut self.c, src, dst),
            None => Ok(()),
        }
    }

    /// --delete: what `dst` holds that SRC's directory (`names`) has not.
    /// Not after an error: what failed to copy is no reason to delete.
    fn delete_extra(&mut self, dst: &Loc, rel: &Path, names: &[OsString]) -> Result<(), String> {
        if !self.errors.is_empty() {
            return Err(format!("{}: nothing deleted here, after the errors above", display(dst)));
        }
        let keep: HashSet<&OsString> = names.iter().collect();
        for name in list_names(&mut self.c, dst)? {
            if keep.contains(&name) {
                continue;
            }
            let at = child(dst, &name);
            let Some(d) = entry(&mut self.c, &at)? else { continue };
            self.deleted += 1;
            if self.act("delete", &rel.join(&name)) {
                remove(&mut self.c, &at, d.kind() == Kind::Dir)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    use crate::commands::is_temp_name;

    #[test]
    fn temporary_names_are_only_those_copies_make() {
        for yes in [&b".big.ferry-123.part"[..], b".a.b.ferry-1.part", b".\xff.ferry-9.part"] {
            assert!(is_temp_name(OsStr::from_bytes(yes)), "{yes:?}");
        }
        for no in [&b"big"[..], b".big.ferry-.part", b"..ferry-1.part", b".big.ferry-1x.part", b"big.ferry-1.part"] {
            assert!(!is_temp_name(OsStr::from_bytes(no)), "{no:?}");
        }
    }
}
