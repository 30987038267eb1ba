//! The file commands: cp, cat, ls, stat, mkdir, rm, mv.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{self, IsTerminal, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ferry_client::{Attr, Client, Error, OpenOptions, Options, Url};
use indicatif::{ProgressBar, ProgressStyle};

/// Bytes moved per call: big enough that every call fills the window.
const COPY_BUF: usize = 8 * 1024 * 1024;

/// How long the CLI and the mount try to reconnect to a server that went
/// away before giving up (`EIO`).
pub const RECONNECT_FOR: Duration = Duration::from_secs(60);

/// One connection per server for the whole command.
pub struct Clients {
    token_file: Option<PathBuf>,
    conns: HashMap<String, Client>,
    reconnect: Duration,
    metrics: Option<std::sync::Arc<ferry_metrics::Ops>>,
}

impl Clients {
    /// Reconnects for `FERRY_RECONNECT` seconds if set (0: never), else a minute.
    pub fn new(token_file: Option<&Path>) -> Self {
        let reconnect = std::env::var("FERRY_RECONNECT")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .unwrap_or(RECONNECT_FOR);
        Clients { token_file: token_file.map(Path::to_path_buf), conns: HashMap::new(), reconnect, metrics: None }
    }

    /// Reconnects for up to `bound` (`Duration::MAX`: for ever).
    pub fn reconnecting_for(mut self, bound: Duration) -> Self {
        self.reconnect = bound;
        self
    }

    /// Counts the clients' requests in `ops`.
    pub fn counting(mut self, ops: Option<std::sync::Arc<ferry_metrics::Ops>>) -> Self {
        self.metrics = ops;
        self
    }

    pub fn get(&mut self, url: &Url) -> Result<Client, String> {
        if let Some(c) = self.conns.get(&url.addr) {
            return Ok(c.clone());
        }
        let token = ferry_client::token::find_client_token(self.token_file.as_deref())?;
        let reconnect = (!self.reconnect.is_zero()).then_some(self.reconnect);
        let cache = ferry_client::cache::Cache::from_env()?;
        let metrics = self.metrics.clone();
        let opts = Options { token, reconnect, cache, metrics, ..Options::default() }.data_path_from_env()?;
        let c = Client::connect(&url.addr, &opts).map_err(|e| format!("{}: {e}", Url::show(&url.addr, "")))?;
        self.conns.insert(url.addr.clone(), c.clone());
        Ok(c)
    }
}

fn parse(s: &str) -> Result<Url, String> {
    Url::parse(s)
}

fn fail(url: &Url, e: Error) -> String {
    format!("{url}: {e}")
}

pub(crate) fn local_fail(p: &Path, e: io::Error) -> String {
    let s = e.to_string();
    let s = s.split(" (os error").next().unwrap_or(&s).to_string();
    format!("{}: {s}", p.display())
}

/// Either side of a copy. A remote side is its server's URL and the exact
/// path, whose names below the URL's own path are bytes (not always UTF-8),
/// as local names are.
#[derive(Clone, PartialEq)]
pub(crate) enum Loc {
    Local(PathBuf),
    Remote(Url, PathBuf),
}

pub(crate) fn loc(s: &OsStr) -> Result<Loc, String> {
    if Url::is_url(s.as_bytes()) {
        let u = parse(s.to_str().ok_or_else(|| format!("{}: a ferry:// URL must be UTF-8", s.to_string_lossy()))?)?;
        let p = PathBuf::from(&u.path);
        Ok(Loc::Remote(u, p))
    } else {
        Ok(Loc::Local(PathBuf::from(s)))
    }
}

pub(crate) fn base_name(l: &Loc) -> OsString {
    let p = match l {
        Loc::Local(p) | Loc::Remote(_, p) => p.as_os_str().as_bytes(),
    };
    let p = &p[..p.iter().rposition(|&b| b != b'/').map_or(0, |i| i + 1)];
    OsStr::from_bytes(p.rsplit(|&b| b == b'/').next().unwrap_or(b"")).to_owned()
}

pub(crate) fn child(l: &Loc, name: &OsStr) -> Loc {
    match l {
        Loc::Local(p) => Loc::Local(p.join(name)),
        Loc::Remote(u, p) => Loc::Remote(u.clone(), ferry_client::join(p, name)),
    }
}

/// For messages only: a name that is not UTF-8 shows lossily.
pub(crate) fn display(l: &Loc) -> String {
    match l {
        Loc::Local(p) => p.display().to_string(),
        Loc::Remote(u, p) => Url::show(&u.addr, &p.display().to_string()),
    }
}

pub(crate) fn remote_fail(l: &Loc, e: Error) -> String {
    format!("{}: {e}", display(l))
}

/// What copies compare of a file: its mode (type bits too), size and
/// modification time.
pub(crate) struct Stat {
    pub mode: u32,
    pub size: u64,
    pub mtime: ferry_client::Time,
}

/// The `Stat` of `l`, a symbolic link followed if `follow`; None if
/// nothing is there (nor can be: a name below a file).
pub(crate) fn stat_of(c: &mut Clients, l: &Loc, follow: bool) -> Result<Option<Stat>, String> {
    let gone = |errno: Option<i32>| errno == Some(libc::ENOENT) || errno == Some(libc::ENOTDIR);
    match l {
        Loc::Local(p) => match if follow { fs::metadata(p) } else { fs::symlink_metadata(p) } {
            Ok(m) => {
                let mtime = ferry_client::Time { sec: m.mtime(), nsec: m.mtime_nsec() as u32 };
                Ok(Some(Stat { mode: m.mode(), size: m.len(), mtime }))
            }
            Err(e) if gone(e.raw_os_error()) => Ok(None),
            Err(e) => Err(local_fail(p, e)),
        },
        Loc::Remote(u, p) => {
            let client = c.get(u)?;
            match if follow { client.metadata(p) } else { client.symlink_metadata(p) } {
                Ok(a) => Ok(Some(Stat { mode: a.mode, size: a.size, mtime: a.mtime })),
                Err(e) if gone(Some(e.errno())) => Ok(None),
                Err(e) => Err(remote_fail(l, e)),
            }
        }
    }
}

/// (is_dir, mode, size) of a source, a link followed, or None if it does
/// not exist.
pub(crate) fn probe(c: &mut Clients, l: &Loc) -> Result<Option<(bool, u32, u64)>, String> {
    let s = stat_of(c, l, true)?;
    Ok(s.map(|s| (s.mode & libc::S_IFMT == libc::S_IFDIR, s.mode, s.size)))
}

/// How `ferry cp` copies.
#[derive(Clone, Copy, Default)]
pub struct CpOpts {
    pub recursive: bool,
    /// Mode, times and (as root) owner too (`-p`).
    pub preserve: bool,
    /// Symbolic links as links (`-a`, with `-r` and `-p`).
    pub links: bool,
    /// The summary line even when stderr is no terminal (`-v`).
    pub verbose: bool,
}

pub fn cp(tf: Option<&Path>, src: &OsStr, dst: &OsStr, o: CpOpts) -> Result<(), String> {
    let mut c = Clients::new(tf);
    let src = loc(src)?;
    let mut dst = loc(dst)?;
    let Some((is_dir, _, _)) = probe(&mut c, &src)? else {
        return Err(format!("{}: No such file or directory", display(&src)));
    };
    if is_dir && !o.recursive {
        return Err(format!("{}: Is a directory (use -r)", display(&src)));
    }
    // `cp x dir/` puts x inside dir, as cp(1) does.
    if let Some((true, _, _)) = probe(&mut c, &dst)? {
        dst = child(&dst, &base_name(&src));
    }
    let p = Progress::new();
    copy_any(&mut c, &src, &dst, &p, o)?;
    p.finish(o.verbose, "copied", "");
    Ok(())
}

/// What a copy has done so far: the bar people watch, and the counts of
/// its summary line.
pub(crate) struct Progress {
    bar: ProgressBar,
    pub(crate) files: Cell<u64>,
    pub(crate) bytes: Cell<u64>,
    start: Instant,
}

impl Progress {
    pub(crate) fn new() -> Progress {
        Progress { bar: progress_bar(), files: Cell::new(0), bytes: Cell::new(0), start: Instant::now() }
    }

    /// Clears the bar; says the summary line (`verb` and what follows the
    /// rate in `more`) with `verbose` or on a terminal.
    pub(crate) fn finish(&self, verbose: bool, verb: &str, more: &str) {
        self.bar.finish_and_clear();
        if verbose || io::stderr().is_terminal() {
            eprintln!("{}{more}", summary(verb, self.files.get(), self.bytes.get(), self.start.elapsed()));
        }
    }
}

/// `copied 3 files, 12.6 MB in 0.21 s, 60.0 MB/s` (MB: 10^6 bytes, as
/// in `ferry bench`'s figures).
fn summary(verb: &str, files: u64, bytes: u64, took: Duration) -> String {
    let secs = took.as_secs_f64();
    let mb = bytes as f64 / 1e6;
    let plural = if files == 1 { "" } else { "s" };
    format!("{verb} {files} file{plural}, {mb:.1} MB in {secs:.2} s, {:.1} MB/s", mb / secs.max(1e-6))
}

fn progress_bar() -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{bytes}/{total_bytes} {bytes_per_sec} {wide_bar} {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

fn copy_any(c: &mut Clients, src: &Loc, dst: &Loc, p: &Progress, o: CpOpts) -> Result<(), String> {
    if o.links {
        if let Some(target) = crate::preserve::link_target(c, src)? {
            crate::preserve::make_symlink(c, dst, &target)?;
            p.files.set(p.files.get() + 1);
            return Ok(());
        }
    }
    let (is_dir, mode, size) = probe(c, src)?.ok_or_else(|| format!("{}: No such file or directory", display(src)))?;
    if !is_dir {
        p.bar.inc_length(size);
        copy_file(c, src, dst, mode & 0o7777, p, false)?;
        p.files.set(p.files.get() + 1);
    } else {
        make_dir(c, dst, mode & 0o7777)?;
        for name in list_names(c, src)? {
            copy_any(c, &child(src, &name), &child(dst, &name), p, o)?;
        }
    }
    // After the contents: writing them would change a directory's times.
    if o.preserve {
        crate::preserve::copy_attrs(c, src, dst)?;
    }
    Ok(())
}

pub(crate) fn make_dir(c: &mut Clients, d: &Loc, mode: u32) -> Result<(), String> {
    match d {
        Loc::Local(p) => match fs::create_dir(p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && p.is_dir() => Ok(()),
            Err(e) => Err(local_fail(p, e)),
        },
        Loc::Remote(u, p) => match c.get(u)?.create_dir(p, mode | 0o700) {
            Ok(_) => Ok(()),
            Err(e) if e.errno() == libc::EEXIST => Ok(()),
            Err(e) => Err(remote_fail(d, e)),
        },
    }
}

pub(crate) fn list_names(c: &mut Clients, d: &Loc) -> Result<Vec<OsString>, String> {
    let mut names: Vec<OsString> = match d {
        Loc::Local(p) => fs::read_dir(p)
            .map_err(|e| local_fail(p, e))?
            .map(|e| e.map(|e| e.file_name()).map_err(|e| local_fail(p, e)))
            .collect::<Result<_, _>>()?,
        Loc::Remote(u, p) => c
            .get(u)?
            .read_dir(p)
            .map_err(|e| remote_fail(d, e))?
            .into_iter()
            .map(|e| e.file_name().to_owned())
            .collect(),
    };
    names.sort();
    Ok(names)
}

type Reader = Box<dyn Read>;

pub(crate) fn open_src(c: &mut Clients, src: &Loc) -> Result<Reader, String> {
    Ok(match src {
        Loc::Local(p) => Box::new(fs::File::open(p).map_err(|e| local_fail(p, e))?),
        Loc::Remote(u, p) => {
            Box::new(c.get(u)?.open(p, OpenOptions::new().read(true)).map_err(|e| remote_fail(src, e))?)
        }
    })
}

/// The temporary name a copy is written under, beside its destination, so
/// that an interrupted copy never leaves a partial file under the real name
/// (and never truncates a file that was there).
fn temp_name(dst: &Loc) -> Result<Loc, String> {
    let base = base_name(dst);
    if base.is_empty() || base == "." || base == ".." {
        return Err(format!("{}: not a file name", display(dst)));
    }
    let mut tmp = OsString::from(".");
    tmp.push(&base);
    tmp.push(format!(".ferry-{}.part", std::process::id()));
    Ok(match dst {
        Loc::Local(p) => Loc::Local(p.with_file_name(tmp)),
        Loc::Remote(u, p) => {
            let parent = p.parent().unwrap_or(Path::new("/"));
            Loc::Remote(u.clone(), ferry_client::join(parent, &tmp))
        }
    })
}

/// Whether `name` is one `temp_name` makes (`.NAME.ferry-PID.part`): a
/// copy cut off with its connection can leave one behind on a server.
pub(crate) fn is_temp_name(name: &OsStr) -> bool {
    let b = name.as_bytes();
    let Some(rest) = b.strip_prefix(b".").and_then(|r| r.strip_suffix(b".part")) else { return false };
    let Some(at) = rest.windows(7).rposition(|w| w == b".ferry-") else { return false };
    let pid = &rest[at + 7..];
    at > 0 && !pid.is_empty() && pid.iter().all(u8::is_ascii_digit)
}

/// Where a copy's bytes go: a file under a temporary name, renamed over the
/// destination by `finish`. Dropped unfinished (an error anywhere), it
/// removes the temporary file.
struct Sink {
    tmp: Loc,
    dst: Loc,
    file: Option<SinkFile>,
    client: Option<Client>,
}

enum SinkFile {
    Local(fs::File),
    Remote(Box<ferry_client::File>),
}

/// Whether a copy must write into `dst` itself rather than replace it: a
/// device (`ferry cp x /dev/null`), FIFO or socket, a symbolic link (cp
/// writes through it), or a file with other hard links — replacing any of
/// them would destroy what the name stood for, as cp(1) never does.
fn in_place(c: &mut Clients, dst: &Loc) -> Result<bool, String> {
    let (mode, nlink) = match dst {
        Loc::Local(p) => match fs::symlink_metadata(p) {
            Ok(m) => (m.mode(), m.nlink()),
            Err(_) => return Ok(false),
        },
        Loc::Remote(u, p) => match c.get(u)?.symlink_metadata(p) {
            Ok(a) => (a.mode, a.nlink),
            Err(_) => return Ok(false),
        },
    };
    Ok(mode & libc::S_IFMT != libc::S_IFREG || nlink > 1)
}

impl Sink {
    fn open(c: &mut Clients, dst: &Loc, mode: u32, replace: bool) -> Result<Sink, String> {
        // Written in place, the destination is its own "temporary" name:
        // `finish` renames nothing, `Drop` removes nothing.
        let tmp = if !replace && in_place(c, dst)? { dst.clone() } else { temp_name(dst)? };
        let (file, client) = match &tmp {
            Loc::Local(p) => {
                let f = fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(mode)
                    .open(p)
                    .map_err(|e| named(dst, strip(&e)))?;
                (SinkFile::Local(f), None)
            }
            Loc::Remote(u, p) => {
                let client = c.get(u)?;
                let opts = OpenOptions::new().write(true).create(true).truncate(true).mode(mode).clone();
                let f = client.open(p, &opts).map_err(|e| named(dst, e.to_string()))?;
                (SinkFile::Remote(Box::new(f)), Some(client))
            }
        };
        Ok(Sink { tmp, dst: dst.clone(), file: Some(file), client })
    }

    fn write(&mut self, b: &[u8]) -> Result<(), String> {
        match self.file.as_mut() {
            Some(SinkFile::Local(f)) => f.write_all(b).map_err(|e| format!("{}: {}", display(&self.dst), strip(&e))),
            Some(SinkFile::Remote(f)) => f.write_all(b).map_err(|e| format!("{}: {}", display(&self.dst), strip(&e))),
            None => Ok(()),
        }
    }

    /// Closes (so write-behind errors surface) and renames into place.
    fn finish(mut self) -> Result<(), String> {
        let at = display(&self.dst);
        match self.file.take() {
            // No fsync, as cp(1): the rename is about never showing a
            // partial file, not about surviving a power cut.
            Some(SinkFile::Local(f)) => drop(f),
            Some(SinkFile::Remote(f)) => f.close().map_err(|e| format!("{at}: {e}"))?,
            None => {}
        }
        match (&self.tmp, &self.dst, &self.client) {
            _ if self.tmp == self.dst => {}
            (Loc::Local(t), Loc::Local(d), _) => fs::rename(t, d).map_err(|e| local_fail(d, e))?,
            (Loc::Remote(_, t), Loc::Remote(_, d), Some(c)) => c.rename(t, d).map_err(|e| remote_fail(&self.dst, e))?,
            _ => unreachable!("a temporary name is on the destination's side"),
        }
        self.client = None;
        self.tmp = Loc::Local(PathBuf::new());
        Ok(())
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        drop(self.file.take());
        // Best effort: the server may be the reason we are failing.
        match (&self.tmp, &self.client) {
            _ if self.tmp == self.dst => {}
            (Loc::Local(t), _) if !t.as_os_str().is_empty() => {
                let _ = fs::remove_file(t);
            }
            (Loc::Remote(_, t), Some(c)) => {
                let _ = c.remove_file(t);
            }
            _ => {}
        }
    }
}

/// Errors on the temporary file are reported under the name the user gave.
fn named(l: &Loc, e: String) -> String {
    format!("{}: {e}", display(l))
}

/// Copies the bytes of `src` to `dst` (created with `mode`). With `replace`
/// the copy always goes under a temporary name renamed over `dst`, even
/// where `cp` writes into `dst` (a file with other hard links).
pub(crate) fn copy_file(
    c: &mut Clients,
    src: &Loc,
    dst: &Loc,
    mode: u32,
    p: &Progress,
    replace: bool,
) -> Result<(), String> {
    let mut r = open_src(c, src)?;
    let mut w = Sink::open(c, dst, mode, replace)?;
    let mut buf = vec![0u8; COPY_BUF];
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("{}: {}", display(src), strip(&e))),
        };
        w.write(&buf[..n])?;
        p.bar.inc(n as u64);
        p.bytes.set(p.bytes.get() + n as u64);
    }
    w.finish()
}

pub(crate) fn strip(e: &io::Error) -> String {
    let s = e.to_string();
    s.split(" (os error").next().unwrap_or(&s).to_string()
}

pub fn cat(tf: Option<&Path>, url: &str) -> Result<(), String> {
    use std::os::fd::AsFd;
    let u = parse(url)?;
    let client = Clients::new(tf).get(&u)?;
    let mut f = client.open(&u.path, OpenOptions::new().read(true)).map_err(|e| fail(&u, e))?;
    // Straight to the descriptor: `Stdout` is line-buffered and would scan
    // every megabyte for newlines.
    let stdout = io::stdout();
    let fd = stdout.as_fd();
    let mut buf = vec![0u8; 1024 * 1024];
    loop {
        let n = f.read(&mut buf).map_err(|e| format!("{u}: {}", strip(&e)))?;
        if n == 0 {
            break;
        }
        let mut out = &buf[..n];
        while !out.is_empty() {
            match rustix::io::write(fd, out) {
                Ok(k) => out = &out[k..],
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::PIPE) => return Ok(()),
                Err(e) => return Err(format!("stdout: {}", strip(&e.into()))),
            }
        }
    }
    f.close().map_err(|e| fail(&u, e))
}

/// `ls`: files first, then each directory (with a `URL:` header when there
/// are several operands, as ls does). An operand that fails is reported and
/// the others are still listed; the command then fails.
/// How `ferry ls` shows what it lists.
#[derive(Clone, Copy, Default)]
pub struct LsOpts {
    pub long: bool,
    pub all: bool,
    /// Sizes as 1.5K, 12M (`-h`).
    pub human: bool,
    /// Into every directory below (`-R`).
    pub recursive: bool,
    /// Ids as numbers, not names (`-n`; implies `-l`).
    pub numeric: bool,
}

pub fn ls(tf: Option<&Path>, urls: &[String], o: LsOpts) -> Result<(), String> {
    let o = LsOpts { long: o.long || o.numeric, ..o };
    let names = crate::names::Names::load();
    let mut clients = Clients::new(tf);
    let mut out = io::stdout().lock();
    let mut failed = Vec::new();
    let mut dirs = Vec::new();
    for url in urls {
        match ls_one(&mut clients, url, o, &names, &mut out) {
            Ok(Some(dir)) => dirs.push(dir),
            Ok(None) => {}
            Err(e) => failed.push(e),
        }
    }
    let headers = urls.len() > 1 || o.recursive;
    let mut first = dirs.len() == urls.len();
    for (u, client) in &dirs {
        ls_tree(client, u, o, &names, headers, &mut first, &mut out, &mut failed)?;
    }
    match failed.len() {
        0 => Ok(()),
        1 => Err(failed.remove(0)),
        _ => {
            let last = failed.pop().unwrap_or_default();
            for e in failed {
                eprintln!("ferry: {e}");
            }
            Err(last)
        }
    }
}

/// A directory's listing, and with `-R` those of the directories below it
/// (depth first, in name order, as `ls -R`). A directory that cannot be
/// listed is reported and skipped, as `ls` does.
#[allow(clippy::too_many_arguments)]
fn ls_tree(
    client: &Client,
    u: &Url,
    o: LsOpts,
    names: &crate::names::Names,
    headers: bool,
    first: &mut bool,
    out: &mut impl Write,
    failed: &mut Vec<String>,
) -> Result<(), String> {
    if headers {
        let gap = if *first { "" } else { "\n" };
        writeln!(out, "{gap}{u}:").map_err(|e| e.to_string())?;
    }
    *first = false;
    let subdirs = match ls_dir(client, u, o, names, out) {
        Ok(d) => d,
        Err(e) => {
            failed.push(e);
            return Ok(());
        }
    };
    if o.recursive {
        for name in subdirs {
            ls_tree(client, &u.join(&name), o, names, headers, first, out, failed)?;
        }
    }
    Ok(())
}

/// Prints a file operand now; returns a directory operand for later.
fn ls_one(
    c: &mut Clients,
    url: &str,
    o: LsOpts,
    names: &crate::names::Names,
    out: &mut impl Write,
) -> Result<Option<(Url, Client)>, String> {
    let u = parse(url)?;
    let client = c.get(&u)?;
    let top = client.symlink_metadata(&u.path).map_err(|e| fail(&u, e))?;
    let follow = if top.is_symlink() { client.metadata(&u.path).ok() } else { None };
    if top.is_dir() || follow.is_some_and(|a| a.is_dir()) {
        return Ok(Some((u, client)));
    }
    let name = u.path.rsplit('/').next().unwrap_or("").to_string();
    print_entry(out, &client, Path::new(&u.path), &name, &top, o, names)?;
    Ok(None)
}

/// Lists one directory; returns the names of its subdirectories (not
/// symbolic links to them), for `-R`.
fn ls_dir(
    client: &Client,
    u: &Url,
    o: LsOpts,
    names: &crate::names::Names,
    out: &mut impl Write,
) -> Result<Vec<String>, String> {
    let mut entries = client.read_dir(&u.path).map_err(|e| fail(u, e))?;
    entries.retain(|e| o.all || !e.name.starts_with(b"."));
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    if o.all {
        // `.` and `..` as ls -a shows them (the export's top is its own parent).
        for (name, path) in [(".", u.path.clone()), ("..", parent_of(&u.path))] {
            let a = client.metadata(&path).map_err(|e| fail(u, e))?;
            print_entry(out, client, Path::new(&path), name, &a, o, names)?;
        }
    }
    let mut subdirs = Vec::new();
    for e in entries {
        let path = ferry_client::join(&u.path, e.file_name());
        let name = e.file_name().to_string_lossy();
        let attr = match e.attr {
            Some(a) => Some(a),
            None if o.long || o.recursive => client.symlink_metadata(&path).ok(),
            None => None,
        };
        match attr {
            Some(a) => {
                print_entry(out, client, &path, &name, &a, o, names)?;
                if a.is_dir() {
                    subdirs.push(name.into_owned());
                }
            }
            None => writeln!(out, "{name}").map_err(|e| e.to_string())?,
        }
    }
    Ok(subdirs)
}

fn parent_of(p: &str) -> String {
    match p.trim_end_matches('/').rsplit_once('/') {
        Some(("", _)) | None => "/".into(),
        Some((d, _)) => d.into(),
    }
}

/// Names that are not UTF-8 show lossily: the output edge is text.
fn print_entry(
    out: &mut impl Write,
    c: &Client,
    path: &Path,
    name: &str,
    a: &Attr,
    o: LsOpts,
    names: &crate::names::Names,
) -> Result<(), String> {
    let line = if o.long {
        let (user, group) =
            if o.numeric { (a.uid.to_string(), a.gid.to_string()) } else { (names.user(a.uid), names.group(a.gid)) };
        let size = if o.human { crate::names::human(a.size) } else { a.size.to_string() };
        let mut s = format!(
            "{} {:>3} {user:>8} {group:>8} {size:>12} {} {name}",
            mode_string(a.mode),
            a.nlink,
            format_time(a.mtime.sec)
        );
        if a.is_symlink() {
            if let Ok(t) = c.read_link(path) {
                s.push_str(&format!(" -> {}", t.display()));
            }
        }
        s
    } else {
        name.to_string()
    };
    writeln!(out, "{line}").map_err(|e| e.to_string())
}

/// `ls -l` style `-rw-r--r--`.
pub fn mode_string(mode: u32) -> String {
    let kind = match mode & 0o170000 {
        0o040000 => 'd',
        0o120000 => 'l',
        0o020000 => 'c',
        0o060000 => 'b',
        0o010000 => 'p',
        0o140000 => 's',
        _ => '-',
    };
    let mut s = String::with_capacity(10);
    s.push(kind);
    let bits = [
        (0o400, 'r'),
        (0o200, 'w'),
        (0o100, 'x'),
        (0o40, 'r'),
        (0o20, 'w'),
        (0o10, 'x'),
        (0o4, 'r'),
        (0o2, 'w'),
        (0o1, 'x'),
    ];
    for (i, (bit, ch)) in bits.iter().enumerate() {
        let set = mode & bit != 0;
        let special = match i {
            2 => mode & 0o4000 != 0,
            5 => mode & 0o2000 != 0,
            8 => mode & 0o1000 != 0,
            _ => false,
        };
        s.push(match (special, set, i) {
            (true, true, 8) => 't',
            (true, false, 8) => 'T',
            (true, true, _) => 's',
            (true, false, _) => 'S',
            (false, true, _) => *ch,
            (false, false, _) => '-',
        });
    }
    s
}

/// UTC `YYYY-MM-DD HH:MM:SS` without a date library.
pub fn format_time(sec: i64) -> String {
    let days = sec.div_euclid(86400);
    let rem = sec.rem_euclid(86400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

pub fn stat(tf: Option<&Path>, url: &str) -> Result<(), String> {
    let u = parse(url)?;
    let a = Clients::new(tf).get(&u)?.symlink_metadata(&u.path).map_err(|e| fail(&u, e))?;
    let kind = match a.kind() {
        0o040000 => "directory",
        0o120000 => "symbolic link",
        0o100000 if a.size == 0 => "regular empty file",
        0o100000 => "regular file",
        0o010000 => "fifo",
        0o140000 => "socket",
        0o020000 => "character special file",
        0o060000 => "block special file",
        _ => "unknown",
    };
    let t = |x: ferry_client::Time| format!("{}.{:09} UTC", format_time(x.sec), x.nsec);
    println!("  File: {u}");
    println!("  Size: {:<12} Blocks: {:<10} IO Block: {:<6} {kind}", a.size, a.blocks, a.blksize);
    println!("Device: {:<12} Inode: {:<11} Links: {}", a.dev, a.ino, a.nlink);
    println!("Access: ({:04o}/{})  Uid: {:>5}   Gid: {:>5}", a.mode & 0o7777, mode_string(a.mode), a.uid, a.gid);
    println!("Access: {}", t(a.atime));
    println!("Modify: {}", t(a.mtime));
    println!("Change: {}", t(a.ctime));
    Ok(())
}

pub fn mkdir(tf: Option<&Path>, url: &str, parents: bool) -> Result<(), String> {
    let u = parse(url)?;
    let c = Clients::new(tf).get(&u)?;
    let r = if parents { c.create_dir_all(&u.path, 0o755) } else { c.create_dir(&u.path, 0o755).map(|_| ()) };
    r.map_err(|e| fail(&u, e))
}

pub fn rm(tf: Option<&Path>, url: &str, recursive: bool, force: bool) -> Result<(), String> {
    let u = parse(url)?;
    let c = Clients::new(tf).get(&u)?;
    let a = match c.symlink_metadata(&u.path) {
        // -f: what is not there is already removed.
        Err(e) if force && e.errno() == libc::ENOENT => return Ok(()),
        r => r.map_err(|e| fail(&u, e))?,
    };
    let r = if a.is_dir() {
        if !recursive {
            return Err(format!("{u}: Is a directory (use -r)"));
        }
        c.remove_dir_all(&u.path)
    } else {
        c.remove_file(&u.path)
    };
    r.map_err(|e| fail(&u, e))
}

pub fn mv(tf: Option<&Path>, src: &str, dst: &str) -> Result<(), String> {
    let s = parse(src)?;
    let mut d = parse(dst)?;
    if s.addr != d.addr {
        return Err(format!("{d}: Invalid cross-device link (mv works within one server; use cp then rm)"));
    }
    let c = Clients::new(tf).get(&s)?;
    if c.metadata(&d.path).is_ok_and(|a| a.is_dir()) {
        let name = s.path.trim_end_matches('/').rsplit('/').next().unwrap_or("").to_string();
        d = d.join(&name);
    }
    c.rename(&s.path, &d.path).map_err(|e| fail(&s, e))
}

/// `ferry cache set|clear|get URL`: the policy stored on the server, and
/// for `get`, the decision in force for the path and what made it.
pub fn cache(tf: Option<&Path>, verb: &str, url: &str, policy: Option<&str>) -> Result<(), String> {
    let u = parse(url)?;
    let client = Clients::new(tf).get(&u)?;
    match verb {
        "set" => {
            let p = match policy {
                Some("cache") => ferry_client::cache_policy::CACHE,
                Some("bypass") => ferry_client::cache_policy::BYPASS,
                _ => return Err(format!("cache set {u}: say which policy: cache or bypass")),
            };
            client.set_cache_policy(&u.path, p).map_err(|e| fail(&u, e))
        }
        "clear" => client.set_cache_policy(&u.path, ferry_client::cache_policy::NONE).map_err(|e| fail(&u, e)),
        _ => {
            let rules = match ferry_client::cache::Rules::default_path() {
                Some(p) => ferry_client::cache::Rules::load(&p)?,
                None => Default::default(),
            };
            let (policy, from) = client.cache_policy(&u.path).map_err(|e| fail(&u, e))?;
            let d = ferry_client::cache::decide(&rules, u.path.as_bytes(), policy, &from);
            println!("{}: {d}", u.path);
            Ok(())
        }
    }
}
