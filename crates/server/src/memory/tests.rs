//! The memory backend against Linux semantics, call by call.

use super::*;

const RDONLY: u32 = O_RDONLY;
const WRONLY: u32 = O_WRONLY;
const RDWR: u32 = O_RDWR;
const CREAT: u32 = O_CREAT;

fn errno<T>(r: Result<T>) -> i32 {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.0,
    }
}

fn open(b: &MemoryBackend, path: &str, flags: u32) -> MemoryFile {
    b.open(path.as_bytes(), flags, 0o644).unwrap_or_else(|e| panic!("open {path}: {e:?}")).0
}

fn mkfile(b: &MemoryBackend, path: &str, data: &[u8]) -> Attr {
    let f = open(b, path, CREAT | WRONLY | O_TRUNC);
    b.write(&f, 0, data).unwrap();
    b.getattr(Node::File(&f)).unwrap()
}

fn bytes(d: ReadData<'_>) -> Vec<u8> {
    match d {
        ReadData::Bytes(v) => v,
        ReadData::Fd { .. } => panic!("memory backend returned a descriptor"),
    }
}

fn read_at(b: &MemoryBackend, f: &MemoryFile, off: u64, len: usize) -> Vec<u8> {
    bytes(b.read(f, off, len).unwrap())
}

fn contents(b: &MemoryBackend, path: &str) -> Vec<u8> {
    let f = open(b, path, RDONLY);
    read_at(b, &f, 0, 1 << 24)
}

fn stat(b: &MemoryBackend, path: &str) -> Attr {
    b.getattr(Node::Path(path.as_bytes())).unwrap_or_else(|e| panic!("stat {path}: {e:?}"))
}

fn lstat(b: &MemoryBackend, path: &str) -> Attr {
    b.getattr(Node::PathNoFollow(path.as_bytes())).unwrap_or_else(|e| panic!("lstat {path}: {e:?}"))
}

fn list(b: &MemoryBackend, path: &str) -> Vec<String> {
    let d = open(b, path, RDONLY | O_DIRECTORY);
    let (entries, eof) = b.readdir(&d, 0, usize::MAX, false).unwrap();
    assert!(eof);
    entries.into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect()
}

fn later(a: Time, b: Time) -> bool {
    time_key(a) > time_key(b)
}

/// Lets the clock move so a changed timestamp is visibly different.
fn tick() {
    std::thread::sleep(std::time::Duration::from_millis(2));
}

#[test]
fn root_belongs_to_the_server() {
    let b = MemoryBackend::new();
    for p in ["", "/", ".", "//", "./.", "..", "/../.."] {
        let a = stat(&b, p);
        assert_eq!(a.mode, 0o40755, "{p}");
        assert_eq!(a.ino, 1);
    }
    let a = stat(&b, "");
    assert_eq!(a.nlink, 2);
    assert_eq!(a.uid, rustix::process::geteuid().as_raw());
    assert_eq!(a.gid, rustix::process::getegid().as_raw());
    assert_eq!(a.dev, DEV);
    assert_eq!(a.blksize, 4096);
}

#[test]
fn create_write_read() {
    let b = MemoryBackend::new();
    let (f, a) = b.open(b"f", CREAT | RDWR, 0o640).unwrap();
    assert_eq!(a.mode, 0o100640);
    assert_eq!(a.nlink, 1);
    assert_eq!(a.size, 0);
    assert_eq!(b.write(&f, 0, b"hello").unwrap(), 5);
    assert_eq!(b.write(&f, 5, b" world").unwrap(), 11);
    assert_eq!(read_at(&b, &f, 0, 100), b"hello world");
    assert_eq!(read_at(&b, &f, 6, 3), b"wor");
    assert_eq!(read_at(&b, &f, 11, 10), b"");
    assert_eq!(read_at(&b, &f, 1000, 10), b"");
    assert_eq!(read_at(&b, &f, 0, 0), b"");
    let a = stat(&b, "f");
    assert_eq!(a.size, 11);
    assert_eq!(a.blocks, 1);
    // The mode is used as given: the memory backend has no umask.
    let (_, a) = b.open(b"g", CREAT | WRONLY, 0o7777).unwrap();
    assert_eq!(a.mode, 0o107777);
    let (_, a) = b.open(b"h", CREAT | WRONLY, 0o170644).unwrap();
    assert_eq!(a.mode, 0o100644);
    assert_eq!(b.write(&f, 0, b"").unwrap(), 0);
    assert_eq!(errno(b.read(&f, 1 << 63, 1)), libc::EINVAL);
    assert_eq!(errno(b.write(&f, 1 << 63, b"x")), libc::EINVAL);
    assert_eq!(errno(b.write(&f, (1 << 63) - 1, b"x")), libc::EFBIG);
}

#[test]
fn holes_and_chunk_boundaries() {
    let b = MemoryBackend::new();
    let f = open(&b, "f", CREAT | RDWR);
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    b.write(&f, 10, &data).unwrap();
    let got = read_at(&b, &f, 0, 300_000);
    assert_eq!(got.len(), 200_010);
    assert_eq!(&got[..10], &[0; 10]);
    assert_eq!(&got[10..], &data[..]);
    // Reads straddling chunk edges.
    for off in [CHUNK - 3, CHUNK, 2 * CHUNK - 1, 3 * CHUNK + 5] {
        let got = read_at(&b, &f, off, 7);
        assert_eq!(got, &data[(off - 10) as usize..(off - 10 + 7) as usize]);
    }
    // Overwrite across a boundary.
    b.write(&f, CHUNK - 2, b"ABCD").unwrap();
    assert_eq!(read_at(&b, &f, CHUNK - 2, 4), b"ABCD");
    // A far write leaves a hole of zeros and costs only its chunk.
    let before = b.statfs(b"").unwrap().bfree;
    let far = 1u64 << 40;
    assert_eq!(b.write(&f, far, b"end").unwrap(), far + 3);
    assert_eq!(stat(&b, "f").size, far + 3);
    assert_eq!(read_at(&b, &f, far - 4, 100), b"\0\0\0\0end");
    assert_eq!(read_at(&b, &f, far / 2, 5), [0; 5]);
    assert!(before - b.statfs(b"").unwrap().bfree <= 1);
}

#[test]
fn append_writes_at_the_end() {
    let b = MemoryBackend::new();
    mkfile(&b, "f", b"abc");
    let f = open(&b, "f", WRONLY | O_APPEND);
    assert_eq!(b.write(&f, 0, b"de").unwrap(), 5);
    assert_eq!(b.write(&f, 1, b"f").unwrap(), 6);
    assert_eq!(b.write(&f, 0, b"").unwrap(), 6);
    assert_eq!(contents(&b, "f"), b"abcdef");
}

#[test]
fn access_modes_of_handles() {
    let b = MemoryBackend::new();
    mkfile(&b, "f", b"abc");
    let r = open(&b, "f", RDONLY);
    assert_eq!(errno(b.write(&r, 0, b"x")), libc::EBADF);
    let w = open(&b, "f", WRONLY);
    assert_eq!(errno(b.read(&w, 0, 1)), libc::EBADF);
    // Access mode 3 allows neither, as on Linux.
    let n = open(&b, "f", 3);
    assert_eq!(errno(b.read(&n, 0, 1)), libc::EBADF);
    assert_eq!(errno(b.write(&n, 0, b"x")), libc::EBADF);
    assert_eq!(errno(b.open(b"", 3, 0)), libc::EISDIR);
    let d = open(&b, "", RDONLY);
    assert_eq!(errno(b.read(&d, 0, 1)), libc::EISDIR);
    assert_eq!(errno(b.write(&d, 0, b"x")), libc::EBADF);
    b.fsync(&r, false).unwrap();
    b.fsync(&d, true).unwrap();
}

#[test]
fn open_flags() {
    let b = MemoryBackend::new();
    mkfile(&b, "f", b"hello");
    b.mkdir(b"d", 0o755).unwrap();
    b.symlink(b"f", b"lf").unwrap();
    b.symlink(b"d", b"ld").unwrap();
    b.symlink(b"nowhere", b"dang").unwrap();
    b.symlink(b"/d/inside", b"abs").unwrap();

    assert_eq!(errno(b.open(b"f", CREAT | O_EXCL | RDWR, 0o644)), libc::EEXIST);
    assert_eq!(errno(b.open(b"lf", CREAT | O_EXCL | RDWR, 0o644)), libc::EEXIST);
    assert_eq!(errno(b.open(b"dang", CREAT | O_EXCL | RDWR, 0o644)), libc::EEXIST);
    assert_eq!(errno(b.open(b"lf", O_NOFOLLOW | RDONLY, 0)), libc::ELOOP);
    assert_eq!(errno(b.open(b"lf", O_NOFOLLOW | CREAT | RDONLY, 0o644)), libc::ELOOP);
    assert_eq!(errno(b.open(b"ld", O_NOFOLLOW | O_DIRECTORY | RDONLY, 0)), libc::ENOTDIR);
    open(&b, "ld/", O_NOFOLLOW | RDONLY);
    assert_eq!(errno(b.open(b"f", O_DIRECTORY | RDONLY, 0)), libc::ENOTDIR);
    assert_eq!(errno(b.open(b"lf/", RDONLY, 0)), libc::ENOTDIR);
    assert_eq!(errno(b.open(b"f/", RDONLY, 0)), libc::ENOTDIR);
    assert_eq!(errno(b.open(b"d", WRONLY, 0)), libc::EISDIR);
    assert_eq!(errno(b.open(b"d", RDWR, 0)), libc::EISDIR);
    assert_eq!(errno(b.open(b"d", RDONLY | O_TRUNC, 0)), libc::EISDIR);
    assert_eq!(errno(b.open(b"d", CREAT | RDONLY, 0o644)), libc::EISDIR);
    assert_eq!(errno(b.open(b"d", CREAT | O_EXCL | RDONLY, 0o644)), libc::EEXIST);
    assert_eq!(errno(b.open(b"d/.", CREAT | O_EXCL | RDONLY, 0o644)), libc::EEXIST);
    assert_eq!(errno(b.open(b"", CREAT | RDONLY, 0o644)), libc::EISDIR);
    assert_eq!(errno(b.open(b"new", CREAT | O_DIRECTORY | RDONLY, 0o644)), libc::EINVAL);
    assert_eq!(errno(b.open(b"new/", CREAT | RDWR, 0o644)), libc::EISDIR);
    assert_eq!(errno(b.open(b"f/", CREAT | RDWR, 0o644)), libc::EISDIR);
    assert_eq!(errno(b.open(b"missing", RDONLY, 0)), libc::ENOENT);
    assert_eq!(errno(b.open(b"missing/x", CREAT | RDWR, 0o644)), libc::ENOENT);
    assert_eq!(errno(b.open(b"f/x", CREAT | RDWR, 0o644)), libc::ENOTDIR);
    open(&b, "ld", O_DIRECTORY | RDONLY);

    // O_CREAT through a dangling symlink creates its target.
    let (_, a) = b.open(b"dang", CREAT | RDWR, 0o600).unwrap();
    assert_eq!(a.mode, 0o100600);
    assert_eq!(lstat(&b, "nowhere").ino, a.ino);
    // An absolute target resolves from the export root.
    let (_, a) = b.open(b"abs", CREAT | RDWR, 0o600).unwrap();
    assert_eq!(stat(&b, "d/inside").ino, a.ino);

    // O_TRUNC truncates even a read-only open, and stamps the times.
    let before = stat(&b, "f");
    tick();
    let (_, a) = b.open(b"f", RDONLY | O_TRUNC, 0).unwrap();
    assert_eq!(a.size, 0);
    assert!(later(a.mtime, before.mtime) && later(a.ctime, before.ctime));
    // O_CREAT on an existing file keeps it.
    mkfile(&b, "f", b"data");
    let (_, a) = b.open(b"f", CREAT | RDWR, 0o600).unwrap();
    assert_eq!((a.size, a.mode), (4, 0o100644));
    // Creating updates the parent's times.
    let d0 = stat(&b, "d");
    tick();
    b.open(b"d/new", CREAT | WRONLY, 0o644).unwrap();
    let d1 = stat(&b, "d");
    assert!(later(d1.mtime, d0.mtime) && later(d1.ctime, d0.ctime));
    assert_eq!(d1.nlink, 2);
    // Ignored flags.
    let flags = RDWR | libc::O_CLOEXEC as u32 | libc::O_NONBLOCK as u32 | libc::O_SYNC as u32 | libc::O_DIRECT as u32;
    open(&b, "f", flags);
}

#[test]
fn path_resolution() {
    let b = MemoryBackend::new();
    b.mkdir(b"a", 0o755).unwrap();
    b.mkdir(b"a/b", 0o755).unwrap();
    mkfile(&b, "a/b/f", b"x");
    let ino = stat(&b, "a/b/f").ino;
    for p in ["a/b/f", "/a/b/f", "a//b///f", "./a/./b/f", "a/b/../b/f", "../../a/b/f", "a/../../a/b/f", "/../a/b/f"] {
        assert_eq!(stat(&b, p).ino, ino, "{p}");
    }
    assert_eq!(stat(&b, "a/b/..").ino, stat(&b, "a").ino);
    assert_eq!(errno(b.getattr(Node::Path(b"a/b/f/"))), libc::ENOTDIR);
    assert_eq!(errno(b.getattr(Node::Path(b"a/b/f/x"))), libc::ENOTDIR);
    assert_eq!(errno(b.getattr(Node::Path(b"a/b/f/.."))), libc::ENOTDIR);
    assert_eq!(errno(b.getattr(Node::Path(b"a/x/f"))), libc::ENOENT);
    assert_eq!(errno(b.getattr(Node::Path(b"a/x/.."))), libc::ENOENT);
    let long = "n".repeat(256);
    assert_eq!(errno(b.getattr(Node::Path(long.as_bytes()))), libc::ENAMETOOLONG);
    assert_eq!(errno(b.open(long.as_bytes(), CREAT | RDWR, 0o644)), libc::ENAMETOOLONG);
    assert_eq!(errno(b.mkdir((format!("a/{long}")).as_bytes(), 0o755)), libc::ENAMETOOLONG);
    // The walk stops at the missing directory before it sees the long name.
    assert_eq!(errno(b.getattr(Node::Path((format!("x/{long}")).as_bytes()))), libc::ENOENT);
    let ok = "n".repeat(255);
    mkfile(&b, &ok, b"");
    // Past PATH_MAX from the root is a deep tree, not an error; past
    // the wire's limit it is.
    assert_eq!(errno(b.getattr(Node::Path(("a/".repeat(2048)).as_bytes()))), libc::ENOENT);
    assert_eq!(errno(b.getattr(Node::Path(("a/".repeat(33_000)).as_bytes()))), libc::ENAMETOOLONG);
    assert_eq!(errno(b.getattr(Node::Path(b"a\0b"))), libc::EINVAL);

    // Symlinks: relative to their directory, absolute from the root,
    // never above the root.
    b.symlink(b"b/f", b"a/rel").unwrap();
    b.symlink(b"/a/b", b"a/b/absdir").unwrap();
    b.symlink(b"../../../../../a", b"a/b/up").unwrap();
    b.symlink(b"/../../a/b/f", b"escape").unwrap();
    assert_eq!(stat(&b, "a/rel").ino, ino);
    assert_eq!(stat(&b, "a/b/absdir/f").ino, ino);
    assert_eq!(stat(&b, "a/b/up/b/f").ino, ino);
    assert_eq!(stat(&b, "escape").ino, ino);
    assert_eq!(lstat(&b, "a/rel").mode, 0o120777);
    assert_eq!(lstat(&b, "a/b/absdir/").ino, stat(&b, "a/b").ino);
    assert_eq!(lstat(&b, "a/b/absdir/.").ino, stat(&b, "a/b").ino);
    b.symlink(b"missing", b"dangling").unwrap();
    assert_eq!(errno(b.getattr(Node::Path(b"dangling"))), libc::ENOENT);
    assert_eq!(lstat(&b, "dangling").size, 7);
    b.symlink(b"a/b/f", b"tofile").unwrap();
    assert_eq!(errno(b.getattr(Node::Path(b"tofile/x"))), libc::ENOTDIR);
    assert_eq!(errno(b.getattr(Node::Path(b"tofile/"))), libc::ENOTDIR);
}

#[test]
fn symlink_hop_limit() {
    let b = MemoryBackend::new();
    mkfile(&b, "f", b"");
    b.symlink(b"f", b"l0").unwrap();
    for i in 1..=41 {
        b.symlink(format!("l{}", i - 1).as_bytes(), format!("l{i}").as_bytes()).unwrap();
    }
    // l39 needs 40 follows, l40 needs 41.
    open(&b, "l39", RDONLY);
    assert_eq!(errno(b.open(b"l40", RDONLY, 0)), libc::ELOOP);
    stat(&b, "l39");
    assert_eq!(errno(b.getattr(Node::Path(b"l40"))), libc::ELOOP);
    lstat(&b, "l40");
    b.symlink(b"loop", b"loop").unwrap();
    assert_eq!(errno(b.getattr(Node::Path(b"loop"))), libc::ELOOP);
    assert_eq!(errno(b.getattr(Node::Path(b"loop/x"))), libc::ELOOP);
    assert_eq!(errno(b.open(b"loop", CREAT | RDWR, 0o644)), libc::ELOOP);
    b.symlink(b"a", b"b").unwrap();
    b.symlink(b"b", b"a").unwrap();
    assert_eq!(errno(b.mkdir(b"a/x", 0o755)), libc::ELOOP);
    b.symlink(b"", b"empty").unwrap_err();
}

fn readdir_all(b: &MemoryBackend, d: &MemoryFile, mut cookie: u64, batch: usize) -> Vec<DirEntry> {
    let mut out = Vec::new();
    loop {
        let (entries, eof) = b.readdir(d, cookie, batch, false).unwrap();
        if let Some(last) = entries.last() {
            cookie = last.cookie;
        }
        out.extend(entries);
        if eof {
            return out;
        }
    }
}

#[test]
fn readdir_lists_and_resumes() {
    let b = MemoryBackend::new();
    b.mkdir(b"d", 0o755).unwrap();
    mkfile(&b, "d/f", b"12345");
    b.mkdir(b"d/sub", 0o700).unwrap();
    b.symlink(b"f", b"d/l").unwrap();
    let d = open(&b, "d", RDONLY | O_DIRECTORY);
    let (all, eof) = b.readdir(&d, 0, 100, true).unwrap();
    assert!(eof);
    let names: Vec<&str> = all.iter().map(|e| std::str::from_utf8(&e.name).unwrap()).collect();
    assert_eq!(names, [".", "..", "f", "sub", "l"]);
    let kinds: Vec<u8> = all.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [libc::DT_DIR, libc::DT_DIR, libc::DT_REG, libc::DT_DIR, libc::DT_LNK]);
    assert_eq!(all[0].ino, stat(&b, "d").ino);
    assert_eq!(all[1].ino, 1);
    assert_eq!(all[2].attr, Some(lstat(&b, "d/f")));
    assert_eq!(all[4].attr.map(|a| a.mode), Some(0o120777));
    assert_eq!(all[1].attr.map(|a| a.ino), Some(1));
    let cookies: Vec<u64> = all.iter().map(|e| e.cookie).collect();
    assert!(cookies.windows(2).all(|w| w[0] < w[1]) && cookies[0] > 0);
    let (plain, _) = b.readdir(&d, 0, 100, false).unwrap();
    assert!(plain.iter().all(|e| e.attr.is_none()));

    // One at a time gives the same thing.
    let one: Vec<String> = readdir_all(&b, &d, 0, 1).into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect();
    assert_eq!(one, names);
    // Exactly at the end: eof with nothing, and max 0 reports more left.
    let (none, eof) = b.readdir(&d, *cookies.last().unwrap(), 10, false).unwrap();
    assert!(none.is_empty() && eof);
    let (none, eof) = b.readdir(&d, 0, 0, false).unwrap();
    assert!(none.is_empty() && !eof);
    let (two, eof) = b.readdir(&d, 0, 2, false).unwrap();
    assert_eq!(two.len(), 2);
    assert!(!eof);

    // Cookies stay valid when entries around them come and go.
    let (first, _) = b.readdir(&d, 0, 3, false).unwrap();
    let at = first[2].cookie; // after "f"
    b.unlink(b"d/f").unwrap();
    mkfile(&b, "d/g", b"");
    let rest: Vec<String> =
        readdir_all(&b, &d, at, 2).into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect();
    assert_eq!(rest, ["sub", "l", "g"]);
    b.unlink(b"d/l").unwrap();
    let rest: Vec<String> =
        readdir_all(&b, &d, at, 2).into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect();
    assert_eq!(rest, ["sub", "g"]);

    // Root's ".." is the root.
    let r = open(&b, "", RDONLY);
    let (e, _) = b.readdir(&r, 0, 2, false).unwrap();
    assert_eq!((e[0].ino, e[1].ino), (1, 1));

    let f = open(&b, "d/g", RDONLY);
    assert_eq!(errno(b.readdir(&f, 0, 10, false)), libc::ENOTDIR);

    // A removed directory cannot be listed, as getdents says on Linux.
    b.mkdir(b"gone", 0o755).unwrap();
    let g = open(&b, "gone", RDONLY | O_DIRECTORY);
    b.rmdir(b"gone").unwrap();
    assert_eq!(errno(b.readdir(&g, 0, 10, false)), libc::ENOENT);
    let a = b.getattr(Node::File(&g)).unwrap();
    assert_eq!((a.nlink, a.size), (0, 0));
}

#[test]
fn readdir_many_entries() {
    let b = MemoryBackend::new();
    for i in 0..1000 {
        mkfile(&b, &format!("f{i}"), b"");
    }
    let d = open(&b, "", RDONLY);
    let all = readdir_all(&b, &d, 0, 37);
    assert_eq!(all.len(), 1002);
    let mut names: Vec<String> = all.into_iter().skip(2).map(|e| String::from_utf8(e.name).unwrap()).collect();
    names.sort();
    let mut want: Vec<String> = (0..1000).map(|i| format!("f{i}")).collect();
    want.sort();
    assert_eq!(names, want);
}

#[test]
fn truncate_semantics() {
    let b = MemoryBackend::new();
    mkfile(&b, "f", b"hello world");
    b.mkdir(b"d", 0o755).unwrap();
    b.symlink(b"f", b"lf").unwrap();
    let before = stat(&b, "f");
    tick();
    let a = b.truncate(Node::Path(b"f"), 5).unwrap();
    assert_eq!(a.size, 5);
    assert!(later(a.mtime, before.mtime) && later(a.ctime, before.ctime));
    assert_eq!(contents(&b, "f"), b"hello");
    // Extending reads zeros, not the old bytes.
    assert_eq!(b.truncate(Node::Path(b"lf"), 8).unwrap().size, 8);
    assert_eq!(contents(&b, "f"), b"hello\0\0\0");
    // ext4 stamps the times even when the size stays.
    let before = stat(&b, "f");
    tick();
    let a = b.truncate(Node::Path(b"f"), 8).unwrap();
    assert!(later(a.mtime, before.mtime));
    assert_eq!(errno(b.truncate(Node::Path(b"d"), 0)), libc::EISDIR);
    assert_eq!(errno(b.truncate(Node::PathNoFollow(b"lf"), 0)), libc::ELOOP);
    assert_eq!(errno(b.truncate(Node::Path(b"f/"), 0)), libc::ENOTDIR);
    assert_eq!(errno(b.truncate(Node::Path(b"missing"), 0)), libc::ENOENT);
    assert_eq!(errno(b.truncate(Node::Path(b"f"), u64::MAX)), libc::EFBIG);
    let r = open(&b, "f", RDONLY);
    assert_eq!(errno(b.truncate(Node::File(&r), 0)), libc::EINVAL);
    let dh = open(&b, "d", RDONLY);
    assert_eq!(errno(b.truncate(Node::File(&dh), 0)), libc::EINVAL);
    let w = open(&b, "f", WRONLY);
    assert_eq!(b.truncate(Node::File(&w), 2).unwrap().size, 2);
    assert_eq!(contents(&b, "f"), b"he");
    // Shrinking across chunks, then growing again.
    let big: Vec<u8> = vec![7; 3 * CHUNK as usize + 10];
    b.write(&w, 0, &big).unwrap();
    b.truncate(Node::File(&w), CHUNK + 1).unwrap();
    b.truncate(Node::File(&w), 4 * CHUNK).unwrap();
    let got = contents(&b, "f");
    assert_eq!(got.len(), 4 * CHUNK as usize);
    assert!(got[..CHUNK as usize + 1].iter().all(|&x| x == 7));
    assert!(got[CHUNK as usize + 1..].iter().all(|&x| x == 0));
    b.truncate(Node::File(&w), CHUNK).unwrap();
    b.truncate(Node::File(&w), CHUNK + 5).unwrap();
    assert_eq!(read_at(&b, &r, CHUNK - 1, 10), [7, 0, 0, 0, 0, 0]);
    // A huge sparse extension is free.
    b.truncate(Node::File(&w), 1 << 50).unwrap();
    assert_eq!(stat(&b, "f").size, 1 << 50);
}

#[test]
fn chmod_semantics() {
    let b = MemoryBackend::new();
    mkfile(&b, "f", b"");
    b.symlink(b"f", b"lf").unwrap();
    let before = stat(&b, "f");
    tick();
    let a = b.chmod(Node::Path(b"f"), 0o104751).unwrap();
    assert_eq!(a.mode, 0o104751);
    assert!(later(a.ctime, before.ctime));
    assert_eq!(a.mtime, before.mtime);
    assert_eq!(b.chmod(Node::Path(b"lf"), 0o600).unwrap().mode, 0o100600);
    assert_eq!(errno(b.chmod(Node::PathNoFollow(b"lf"), 0o600)), libc::EOPNOTSUPP);
    assert_eq!(b.chmod(Node::PathNoFollow(b"f"), 0o640).unwrap().mode, 0o100640);
    let r = open(&b, "f", RDONLY);
    assert_eq!(b.chmod(Node::File(&r), 0o444).unwrap().mode, 0o100444);
    assert_eq!(b.chmod(Node::Path(b""), 0o700).unwrap().mode, 0o40700);
    assert_eq!(errno(b.chmod(Node::Path(b"missing"), 0o700)), libc::ENOENT);
    // Root ignores permission bits.
    mkfile(&b, "f", b"still writable");
    assert_eq!(contents(&b, "f"), b"still writable");
}

#[test]
fn chown_semantics() {
    let b = MemoryBackend::new();
    mkfile(&b, "f", b"");
    b.mkdir(b"d", 0o755).unwrap();
    b.symlink(b"f", b"lf").unwrap();
    let a = b.chown(Node::Path(b"f"), 5, u32::MAX).unwrap();
    assert_eq!((a.uid, a.gid), (5, rustix::process::getegid().as_raw()));
    let a = b.chown(Node::Path(b"f"), u32::MAX, 6).unwrap();
    assert_eq!((a.uid, a.gid), (5, 6));
    let before = a;
    tick();
    let a = b.chown(Node::Path(b"f"), u32::MAX, u32::MAX).unwrap();
    assert!(later(a.ctime, before.ctime));
    // Set-user-ID always goes; set-group-ID only with group execute.
    b.chmod(Node::Path(b"f"), 0o6755).unwrap();
    assert_eq!(b.chown(Node::Path(b"f"), u32::MAX, u32::MAX).unwrap().mode, 0o100755);
    b.chmod(Node::Path(b"f"), 0o6745).unwrap();
    assert_eq!(b.chown(Node::Path(b"f"), 1, 1).unwrap().mode, 0o102745);
    b.chmod(Node::Path(b"d"), 0o6755).unwrap();
    assert_eq!(b.chown(Node::Path(b"d"), 1, 1).unwrap().mode, 0o46755);
    // No follow changes the link itself.
    let a = b.chown(Node::PathNoFollow(b"lf"), 7, 8).unwrap();
    assert_eq!((a.uid, a.gid, a.mode), (7, 8, 0o120777));
    assert_eq!(stat(&b, "lf").uid, 1);
}

#[test]
fn utimens_semantics() {
    let b = MemoryBackend::new();
    mkfile(&b, "f", b"");
    b.symlink(b"f", b"lf").unwrap();
    let t1 = Time { sec: 100, nsec: 5 };
    let t2 = Time { sec: -3, nsec: 999_999_999 };
    let before = stat(&b, "f");
    tick();
    let a = b.utimens(Node::Path(b"f"), t1, t2).unwrap();
    assert_eq!((a.atime, a.mtime), (t1, t2));
    assert!(later(a.ctime, before.ctime));
    let a = b.utimens(Node::Path(b"f"), Time::OMIT, t1).unwrap();
    assert_eq!((a.atime, a.mtime), (t1, t1));
    let a = b.utimens(Node::Path(b"f"), Time::NOW, Time::OMIT).unwrap();
    assert!(later(a.atime, t1));
    assert_eq!(a.atime, a.ctime);
    assert_eq!(a.mtime, t1);
    // Both omitted: nothing changes, not even ctime.
    let before = a;
    tick();
    assert_eq!(b.utimens(Node::Path(b"f"), Time::OMIT, Time::OMIT).unwrap(), before);
    let bad = Time { sec: 0, nsec: 1_000_000_000 };
    assert_eq!(errno(b.utimens(Node::Path(b"f"), bad, Time::OMIT)), libc::EINVAL);
    // The path is resolved before the times are checked.
    assert_eq!(errno(b.utimens(Node::Path(b"missing"), bad, Time::OMIT)), libc::ENOENT);
    let a = b.utimens(Node::PathNoFollow(b"lf"), t2, t2).unwrap();
    assert_eq!(a.mode, 0o120777);
    assert_eq!(a.mtime, t2);
    assert_eq!(stat(&b, "f").mtime, t1);
    let f = open(&b, "f", RDONLY);
    assert_eq!(b.utimens(Node::File(&f), t2, t2).unwrap().atime, t2);
}

#[test]
fn atime_is_relatime() {
    let b = MemoryBackend::new();
    mkfile(&b, "f", b"abc");
    let f = open(&b, "f", RDONLY);
    let old = Time { sec: 1000, nsec: 0 };
    let recent = now();
    b.utimens(Node::File(&f), recent, old).unwrap();
    // atime newer than mtime but not ctime (utimens set ctime just now).
    read_at(&b, &f, 0, 1);
    let a = stat(&b, "f");
    assert!(later(a.atime, recent));
    // Now atime is newer than both: a read leaves it.
    tick();
    read_at(&b, &f, 0, 1);
    assert_eq!(stat(&b, "f").atime, a.atime);
    // O_NOATIME never touches it.
    b.utimens(Node::File(&f), old, old).unwrap();
    let n = open(&b, "f", RDONLY | O_NOATIME);
    read_at(&b, &n, 0, 1);
    assert_eq!(stat(&b, "f").atime, old);
}

#[test]
fn mkdir_semantics() {
    let b = MemoryBackend::new();
    let a = b.mkdir(b"d", 0o7777).unwrap();
    // mkdir keeps only permissions and the sticky bit.
    assert_eq!(a.mode, 0o41777);
    assert_eq!(a.nlink, 2);
    assert_eq!(a.size, 4096);
    assert_eq!(stat(&b, "").nlink, 3);
    b.mkdir(b"d/e/", 0o755).unwrap();
    assert_eq!(stat(&b, "d").nlink, 3);
    mkfile(&b, "f", b"");
    b.symlink(b"nowhere", b"dang").unwrap();
    for p in ["d", "f", "dang", "d/.", "d/..", "", "/", "f/"] {
        assert_eq!(errno(b.mkdir(p.as_bytes(), 0o755)), libc::EEXIST, "{p}");
    }
    assert_eq!(errno(b.mkdir(b"x/y", 0o755)), libc::ENOENT);
    assert_eq!(errno(b.mkdir(b"f/y", 0o755)), libc::ENOTDIR);
    // A set-group-ID directory passes on its group, and the bit to
    // subdirectories.
    b.chmod(Node::Path(b"d"), 0o2775).unwrap();
    b.chown(Node::Path(b"d"), u32::MAX, 4242).unwrap();
    let a = b.mkdir(b"d/sub", 0o755).unwrap();
    assert_eq!((a.gid, a.mode), (4242, 0o42755));
    let (_, a) = b.open(b"d/file", CREAT | WRONLY, 0o644).unwrap();
    assert_eq!((a.gid, a.mode), (4242, 0o100644));
    let a = b.symlink(b"x", b"d/link").unwrap();
    assert_eq!(a.gid, 4242);
    assert_eq!(b.mkdir(b"plain", 0o755).unwrap().gid, rustix::process::getegid().as_raw());
}

#[test]
fn rmdir_semantics() {
    let b = MemoryBackend::new();
    b.mkdir(b"d", 0o755).unwrap();
    b.mkdir(b"d/e", 0o755).unwrap();
    mkfile(&b, "f", b"");
    b.symlink(b"d", b"ld").unwrap();
    assert_eq!(errno(b.rmdir(b"d")), libc::ENOTEMPTY);
    assert_eq!(errno(b.rmdir(b"f")), libc::ENOTDIR);
    assert_eq!(errno(b.rmdir(b"ld")), libc::ENOTDIR);
    assert_eq!(errno(b.rmdir(b"d/.")), libc::EINVAL);
    assert_eq!(errno(b.rmdir(b".")), libc::EINVAL);
    assert_eq!(errno(b.rmdir(b"d/e/..")), libc::ENOTEMPTY);
    assert_eq!(errno(b.rmdir(b"")), libc::EBUSY);
    assert_eq!(errno(b.rmdir(b"/")), libc::EBUSY);
    assert_eq!(errno(b.rmdir(b"missing")), libc::ENOENT);
    assert_eq!(stat(&b, "d").nlink, 3);
    let before = stat(&b, "d");
    tick();
    b.rmdir(b"d/e/").unwrap();
    let a = stat(&b, "d");
    assert_eq!(a.nlink, 2);
    assert!(later(a.mtime, before.mtime));
    b.rmdir(b"ld/").unwrap_err();
    b.rmdir(b"d").unwrap();
    assert_eq!(stat(&b, "").nlink, 2);
    assert_eq!(list(&b, ""), [".", "..", "f", "ld"]);
}

#[test]
fn unlink_semantics() {
    let b = MemoryBackend::new();
    b.mkdir(b"d", 0o755).unwrap();
    mkfile(&b, "f", b"data");
    b.symlink(b"d", b"ld").unwrap();
    assert_eq!(errno(b.unlink(b"d")), libc::EISDIR);
    assert_eq!(errno(b.unlink(b"d/")), libc::EISDIR);
    assert_eq!(errno(b.unlink(b"d/.")), libc::EISDIR);
    assert_eq!(errno(b.unlink(b"")), libc::EISDIR);
    assert_eq!(errno(b.unlink(b"f/")), libc::ENOTDIR);
    assert_eq!(errno(b.unlink(b"ld/")), libc::ENOTDIR);
    assert_eq!(errno(b.unlink(b"missing/")), libc::ENOENT);
    assert_eq!(errno(b.unlink(b"missing")), libc::ENOENT);
    // The link goes, not its target.
    b.unlink(b"ld").unwrap();
    stat(&b, "d");
    // An open file outlives its name.
    let used = b.statfs(b"").unwrap();
    let f = open(&b, "f", RDWR);
    let before = stat(&b, "f");
    tick();
    b.unlink(b"f").unwrap();
    assert_eq!(errno(b.getattr(Node::Path(b"f"))), libc::ENOENT);
    let a = b.getattr(Node::File(&f)).unwrap();
    assert_eq!(a.nlink, 0);
    assert!(later(a.ctime, before.ctime));
    assert_eq!(b.write(&f, 4, b" more").unwrap(), 9);
    assert_eq!(read_at(&b, &f, 0, 100), b"data more");
    assert_eq!(b.statfs(b"").unwrap().ffree, used.ffree);
    drop(f);
    assert_eq!(b.statfs(b"").unwrap().ffree, used.ffree + 1);
    assert_eq!(list(&b, ""), [".", "..", "d"]);
}

#[test]
fn rename_files() {
    let b = MemoryBackend::new();
    mkfile(&b, "a", b"A");
    mkfile(&b, "b", b"B");
    let ia = stat(&b, "a").ino;
    let f = open(&b, "b", RDONLY);
    tick();
    let before = stat(&b, "");
    b.rename(b"a", b"b", 0).unwrap();
    assert_eq!(contents(&b, "b"), b"A");
    assert_eq!(stat(&b, "b").ino, ia);
    assert_eq!(errno(b.getattr(Node::Path(b"a"))), libc::ENOENT);
    // The replaced file lives on through its handle, with no links.
    assert_eq!(b.getattr(Node::File(&f)).unwrap().nlink, 0);
    assert_eq!(read_at(&b, &f, 0, 10), b"B");
    let after = stat(&b, "");
    assert!(later(after.mtime, before.mtime));
    assert!(later(stat(&b, "b").ctime, before.ctime));
    // Same file under two names: nothing happens.
    b.link(b"b", b"c").unwrap();
    b.rename(b"b", b"c", 0).unwrap();
    assert_eq!(stat(&b, "b").nlink, 2);
    assert_eq!(list(&b, ""), [".", "..", "b", "c"]);
    b.rename(b"b", b"b", 0).unwrap();
    assert_eq!(errno(b.rename(b"b", b"b", RENAME_NOREPLACE)), libc::EEXIST);
    assert_eq!(errno(b.rename(b"b", b"c", RENAME_NOREPLACE)), libc::EEXIST);
    b.rename(b"b", b"z", RENAME_NOREPLACE).unwrap();
    assert_eq!(errno(b.rename(b"missing", b"q", 0)), libc::ENOENT);
    assert_eq!(errno(b.rename(b"missing", b"z", RENAME_NOREPLACE)), libc::ENOENT);
    assert_eq!(errno(b.rename(b"z", b"q/", 0)), libc::ENOTDIR);
    assert_eq!(errno(b.rename(b"z/", b"q", 0)), libc::ENOTDIR);
    assert_eq!(errno(b.rename(b"z", b"nodir/q", 0)), libc::ENOENT);
    assert_eq!(errno(b.rename(b".", b"q", 0)), libc::EBUSY);
    assert_eq!(errno(b.rename(b"", b"q", 0)), libc::EBUSY);
    assert_eq!(errno(b.rename(b"z", b".", 0)), libc::EBUSY);
    assert_eq!(errno(b.rename(b"z", b".", RENAME_NOREPLACE)), libc::EEXIST);
    assert_eq!(errno(b.rename(b"z", b"c", 3)), libc::EINVAL);
    assert_eq!(errno(b.rename(b"z", b"c", 4)), libc::EINVAL);
    assert_eq!(errno(b.rename(b"z", b"c", 8)), libc::EINVAL);
    // A symlink moves as itself.
    b.symlink(b"z", b"l").unwrap();
    b.rename(b"l", b"m", 0).unwrap();
    assert_eq!(b.readlink(b"m").unwrap(), "z".as_bytes());
    // Renaming within a directory re-lists the name at the end.
    assert_eq!(list(&b, ""), [".", "..", "c", "z", "m"]);
}

#[test]
fn rename_directories() {
    let b = MemoryBackend::new();
    b.mkdir(b"a", 0o755).unwrap();
    b.mkdir(b"a/b", 0o755).unwrap();
    b.mkdir(b"a/b/c", 0o755).unwrap();
    b.mkdir(b"e", 0o755).unwrap();
    mkfile(&b, "f", b"");
    assert_eq!(errno(b.rename(b"a", b"a/b/x", 0)), libc::EINVAL);
    assert_eq!(errno(b.rename(b"a", b"a/x", 0)), libc::EINVAL);
    assert_eq!(errno(b.rename(b"a/b", b"a", 0)), libc::ENOTEMPTY);
    assert_eq!(errno(b.rename(b"a/b/c", b"a", 0)), libc::ENOTEMPTY);
    assert_eq!(errno(b.rename(b"a/b/c", b"a", RENAME_EXCHANGE)), libc::EINVAL);
    assert_eq!(errno(b.rename(b"a", b"a/b", RENAME_EXCHANGE)), libc::EINVAL);
    assert_eq!(errno(b.rename(b"f", b"a", 0)), libc::EISDIR);
    assert_eq!(errno(b.rename(b"a", b"f", 0)), libc::ENOTDIR);
    assert_eq!(errno(b.rename(b"e", b"a", 0)), libc::ENOTEMPTY);
    b.rename(b"a/b", b"a/b", 0).unwrap();
    // Move a directory to another parent: link counts and `..` follow.
    let ib = stat(&b, "a/b").ino;
    b.rename(b"a/b", b"e/b2/", 0).unwrap();
    assert_eq!(stat(&b, "a").nlink, 2);
    assert_eq!(stat(&b, "e").nlink, 3);
    assert_eq!(stat(&b, "e/b2").ino, ib);
    assert_eq!(stat(&b, "e/b2/c/../..").ino, stat(&b, "e").ino);
    let d = open(&b, "e/b2", RDONLY);
    let (ents, _) = b.readdir(&d, 0, 2, false).unwrap();
    assert_eq!(ents[1].ino, stat(&b, "e").ino);
    // Replace an empty directory.
    let ia = stat(&b, "a").ino;
    let root_links = stat(&b, "").nlink;
    b.rename(b"a", b"e/b2/c", 0).unwrap();
    assert_eq!(stat(&b, "e/b2/c").ino, ia);
    assert_eq!(stat(&b, "").nlink, root_links - 1);
    assert_eq!(stat(&b, "e/b2").nlink, 3);
    // Same parent, dir over empty dir: the parent loses one link.
    b.mkdir(b"e/b2/x", 0o755).unwrap();
    assert_eq!(stat(&b, "e/b2").nlink, 4);
    b.rename(b"e/b2/x", b"e/b2/c", 0).unwrap();
    assert_eq!(stat(&b, "e/b2").nlink, 3);
    // A moved directory's ctime changes.
    let before = stat(&b, "e/b2");
    tick();
    b.rename(b"e/b2", b"top", 0).unwrap();
    assert!(later(stat(&b, "top").ctime, before.ctime));
    assert_eq!(stat(&b, "top/..").ino, 1);
}

#[test]
fn rename_exchange() {
    let b = MemoryBackend::new();
    b.mkdir(b"d1", 0o755).unwrap();
    b.mkdir(b"d2", 0o755).unwrap();
    b.mkdir(b"d1/sub", 0o755).unwrap();
    mkfile(&b, "d2/file", b"F");
    let (isub, ifile) = (stat(&b, "d1/sub").ino, stat(&b, "d2/file").ino);
    assert_eq!(errno(b.rename(b"d1/sub", b"d2/none", RENAME_EXCHANGE)), libc::ENOENT);
    assert_eq!(errno(b.rename(b"d2/file/", b"d1/sub", RENAME_EXCHANGE)), libc::ENOTDIR);
    assert_eq!(errno(b.rename(b"d1/sub", b"d2/file/", RENAME_EXCHANGE)), libc::ENOTDIR);
    b.rename(b"d1/sub", b"d2/file", RENAME_EXCHANGE).unwrap();
    assert_eq!(stat(&b, "d1/sub").ino, ifile);
    assert_eq!(stat(&b, "d2/file").ino, isub);
    assert_eq!(stat(&b, "d1").nlink, 2);
    assert_eq!(stat(&b, "d2").nlink, 3);
    assert_eq!(stat(&b, "d2/file/..").ino, stat(&b, "d2").ino);
    assert_eq!(contents(&b, "d1/sub"), b"F");
    // Names keep their places in the listing.
    mkfile(&b, "x", b"X");
    mkfile(&b, "y", b"Y");
    b.rename(b"x", b"y", RENAME_EXCHANGE).unwrap();
    assert_eq!(contents(&b, "x"), b"Y");
    assert_eq!(list(&b, ""), [".", "..", "d1", "d2", "x", "y"]);
    b.rename(b"x", b"x", RENAME_EXCHANGE).unwrap();
    assert_eq!(contents(&b, "x"), b"Y");
}

#[test]
fn deep_tree_drops_without_recursion() {
    let b = MemoryBackend::new();
    b.mkdir(b"a", 0o755).unwrap();
    // Renames build a chain deeper than any path could name.
    for _ in 0..200_000 {
        b.mkdir(b"t", 0o755).unwrap();
        b.rename(b"a", b"t/a", 0).unwrap();
        b.rename(b"t", b"a", 0).unwrap();
    }
    assert_eq!(b.statfs(b"").unwrap().files - b.statfs(b"").unwrap().ffree, 200_002);
    drop(b);
}

#[test]
fn link_semantics() {
    let b = MemoryBackend::new();
    mkfile(&b, "f", b"x");
    b.mkdir(b"d", 0o755).unwrap();
    b.symlink(b"f", b"lf").unwrap();
    let before = stat(&b, "f");
    tick();
    let a = b.link(b"f", b"d/g").unwrap();
    assert_eq!(a.ino, before.ino);
    assert_eq!(a.nlink, 2);
    assert!(later(a.ctime, before.ctime));
    assert_eq!(stat(&b, "d/g").nlink, 2);
    assert_eq!(errno(b.link(b"d", b"dl")), libc::EPERM);
    assert_eq!(errno(b.link(b".", b"dl")), libc::EPERM);
    assert_eq!(errno(b.link(b"d", b"f")), libc::EEXIST);
    assert_eq!(errno(b.link(b"f", b"d/g")), libc::EEXIST);
    assert_eq!(errno(b.link(b"f", b"new/")), libc::ENOENT);
    assert_eq!(errno(b.link(b"f", b"d/..")), libc::EEXIST);
    assert_eq!(errno(b.link(b"missing", b"x")), libc::ENOENT);
    assert_eq!(errno(b.link(b"f/", b"x")), libc::ENOTDIR);
    // A hard link to a symlink is to the link itself.
    let a = b.link(b"lf", b"lf2").unwrap();
    assert_eq!(a.mode, 0o120777);
    assert_eq!(lstat(&b, "lf").nlink, 2);
    b.unlink(b"f").unwrap();
    assert_eq!(contents(&b, "d/g"), b"x");
    assert_eq!(stat(&b, "d/g").nlink, 1);
}

#[test]
fn symlink_and_readlink() {
    let b = MemoryBackend::new();
    mkfile(&b, "f", b"");
    b.mkdir(b"d", 0o755).unwrap();
    let a = b.symlink(b"some/target", b"l").unwrap();
    assert_eq!((a.mode, a.size, a.nlink, a.blocks), (0o120777, 11, 1, 0));
    assert_eq!(b.readlink(b"l").unwrap(), "some/target".as_bytes());
    assert_eq!(b.readlink(b"/l").unwrap(), "some/target".as_bytes());
    assert_eq!(errno(b.symlink(b"x", b"l")), libc::EEXIST);
    assert_eq!(errno(b.symlink(b"x", b"f")), libc::EEXIST);
    assert_eq!(errno(b.symlink(b"x", b"f/")), libc::EEXIST);
    assert_eq!(errno(b.symlink(b"x", b"new/")), libc::ENOENT);
    assert_eq!(errno(b.symlink(b"x", b"d/.")), libc::EEXIST);
    assert_eq!(errno(b.symlink(b"", b"e")), libc::ENOENT);
    assert_eq!(errno(b.symlink("x".repeat(4096).as_bytes(), b"e")), libc::ENAMETOOLONG);
    assert_eq!(errno(b.readlink(b"f")), libc::EINVAL);
    assert_eq!(errno(b.readlink(b"d")), libc::EINVAL);
    assert_eq!(errno(b.readlink(b"")), libc::EINVAL);
    assert_eq!(errno(b.readlink(b"missing")), libc::ENOENT);
    b.symlink(b"f", b"lf").unwrap();
    b.symlink(b"d", b"ld").unwrap();
    assert_eq!(errno(b.readlink(b"lf/")), libc::ENOTDIR);
    assert_eq!(errno(b.readlink(b"ld/")), libc::EINVAL);
    b.symlink(b"../lf", b"d/up").unwrap();
    assert_eq!(b.readlink(b"ld/up").unwrap(), "../lf".as_bytes());
    assert_eq!(stat(&b, "d/up").ino, stat(&b, "f").ino);
}

#[test]
fn statfs_and_access() {
    let b = MemoryBackend::new();
    let s = b.statfs(b"").unwrap();
    assert_eq!((s.bsize, s.frsize, s.namemax), (4096, 4096, 255));
    assert_eq!(s.blocks, BUDGET / 4096);
    assert_eq!(s.bfree, s.blocks);
    assert_eq!(s.files - s.ffree, 1);
    mkfile(&b, "f", &vec![1; 1 << 20]);
    let s2 = b.statfs(b"f").unwrap();
    assert_eq!(s.bfree - s2.bfree, 256);
    assert_eq!(s.ffree - s2.ffree, 1);
    b.unlink(b"f").unwrap();
    assert_eq!(b.statfs(b"/").unwrap(), s);
    assert_eq!(errno(b.statfs(b"missing")), libc::ENOENT);

    mkfile(&b, "f", b"");
    b.mkdir(b"d", 0o000).unwrap();
    b.symlink(b"f", b"lf").unwrap();
    b.chmod(Node::Path(b"f"), 0o000).unwrap();
    for m in [0, 2, 4, 6] {
        b.access(b"f", m).unwrap();
    }
    assert_eq!(errno(b.access(b"f", 1)), libc::EACCES);
    assert_eq!(errno(b.access(b"lf", 1)), libc::EACCES);
    b.access(b"d", 7).unwrap();
    b.chmod(Node::Path(b"f"), 0o001).unwrap();
    b.access(b"f", 1).unwrap();
    assert_eq!(errno(b.access(b"f", 8)), libc::EINVAL);
    assert_eq!(errno(b.access(b"missing", 0)), libc::ENOENT);
}

#[test]
fn xattrs() {
    let b = MemoryBackend::new();
    mkfile(&b, "f", b"");
    b.mkdir(b"d", 0o755).unwrap();
    b.symlink(b"f", b"lf").unwrap();
    let before = stat(&b, "f");
    tick();
    b.setxattr(Node::Path(b"f"), b"user.a", b"1", 0).unwrap();
    assert!(later(stat(&b, "f").ctime, before.ctime));
    b.setxattr(Node::Path(b"f"), b"trusted.t", b"", 0).unwrap();
    b.setxattr(Node::Path(b"f"), b"security.s", b"sss", 0).unwrap();
    assert_eq!(b.getxattr(Node::Path(b"f"), b"user.a").unwrap(), b"1");
    assert_eq!(b.getxattr(Node::Path(b"lf"), b"trusted.t").unwrap(), b"");
    assert_eq!(b.listxattr(Node::Path(b"f")).unwrap(), b"security.s\0trusted.t\0user.a\0");
    assert_eq!(errno(b.setxattr(Node::Path(b"f"), b"user.a", b"2", XATTR_CREATE)), libc::EEXIST);
    assert_eq!(errno(b.setxattr(Node::Path(b"f"), b"user.b", b"2", XATTR_REPLACE)), libc::ENODATA);
    assert_eq!(errno(b.setxattr(Node::Path(b"f"), b"user.b", b"2", 3)), libc::ENODATA);
    assert_eq!(errno(b.setxattr(Node::Path(b"f"), b"user.b", b"2", 4)), libc::EINVAL);
    b.setxattr(Node::Path(b"f"), b"user.a", b"22", XATTR_REPLACE).unwrap();
    assert_eq!(b.getxattr(Node::Path(b"f"), b"user.a").unwrap(), b"22");
    b.setxattr(Node::Path(b"f"), b"user.b", b"3", XATTR_CREATE).unwrap();
    assert_eq!(errno(b.getxattr(Node::Path(b"f"), b"user.zz")), libc::ENODATA);
    assert_eq!(errno(b.removexattr(Node::Path(b"f"), b"user.zz")), libc::ENODATA);
    b.removexattr(Node::Path(b"f"), b"user.b").unwrap();
    assert_eq!(errno(b.getxattr(Node::Path(b"f"), b"user.b")), libc::ENODATA);
    // Names.
    for (name, e) in [
        ("", libc::ERANGE),
        ("user.", libc::EINVAL),
        ("foo.a", libc::EOPNOTSUPP),
        ("system.posix_acl_access", libc::EOPNOTSUPP),
        ("user", libc::EOPNOTSUPP),
    ] {
        assert_eq!(errno(b.setxattr(Node::Path(b"f"), name.as_bytes(), b"v", 0)), e, "{name}");
        assert_eq!(errno(b.getxattr(Node::Path(b"f"), name.as_bytes())), e, "{name}");
        assert_eq!(errno(b.removexattr(Node::Path(b"f"), name.as_bytes())), e, "{name}");
    }
    let long = format!("user.{}", "n".repeat(250));
    b.setxattr(Node::Path(b"f"), long.as_bytes(), b"v", 0).unwrap();
    let too_long = format!("user.{}", "n".repeat(251));
    assert_eq!(errno(b.setxattr(Node::Path(b"f"), too_long.as_bytes(), b"v", 0)), libc::ERANGE);
    // Values.
    let big = vec![9; XATTR_SIZE_MAX];
    b.setxattr(Node::Path(b"d"), b"user.big", &big, 0).unwrap();
    assert_eq!(b.getxattr(Node::Path(b"d"), b"user.big").unwrap(), big);
    assert_eq!(errno(b.setxattr(Node::Path(b"d"), b"user.big", &vec![0; XATTR_SIZE_MAX + 1], 0)), libc::E2BIG);
    // user.* is only for files and directories.
    assert_eq!(errno(b.setxattr(Node::PathNoFollow(b"lf"), b"user.a", b"v", 0)), libc::EPERM);
    assert_eq!(errno(b.setxattr(Node::PathNoFollow(b"lf"), b"user.", b"v", 0)), libc::EPERM);
    assert_eq!(errno(b.getxattr(Node::PathNoFollow(b"lf"), b"user.a")), libc::ENODATA);
    assert_eq!(errno(b.removexattr(Node::PathNoFollow(b"lf"), b"user.a")), libc::EPERM);
    b.setxattr(Node::PathNoFollow(b"lf"), b"trusted.x", b"v", 0).unwrap();
    assert_eq!(b.listxattr(Node::PathNoFollow(b"lf")).unwrap(), b"trusted.x\0");
    assert_eq!(b.getxattr(Node::Path(b"lf"), b"user.a").unwrap(), b"22");
    // Through a handle, whatever its access mode.
    let r = open(&b, "f", RDONLY);
    b.setxattr(Node::File(&r), b"user.h", b"h", 0).unwrap();
    assert_eq!(b.getxattr(Node::Path(b"f"), b"user.h").unwrap(), b"h");
    assert_eq!(errno(b.listxattr(Node::Path(b"missing"))), libc::ENOENT);
    // Attribute bytes count against the budget and come back.
    let free = b.statfs(b"").unwrap().bfree;
    b.removexattr(Node::Path(b"d"), b"user.big").unwrap();
    assert_eq!(b.statfs(b"").unwrap().bfree, free + 16);
}

#[test]
fn out_of_space() {
    let b = MemoryBackend::new();
    let f = open(&b, "f", CREAT | RDWR);
    // Pretend the budget is nearly spent.
    b.shared.bytes.store(BUDGET - 10, Ordering::Relaxed);
    assert_eq!(b.write(&f, 0, b"0123456789").unwrap(), 10);
    assert_eq!(errno(b.write(&f, 10, b"x")), libc::ENOSPC);
    // Overwriting allocated bytes needs no new space.
    assert_eq!(b.write(&f, 0, b"abc").unwrap(), 3);
    assert_eq!(errno(b.setxattr(Node::File(&f), b"user.x", b"", 0)), libc::ENOSPC);
    b.truncate(Node::File(&f), 0).unwrap();
    assert_eq!(b.shared.bytes.load(Ordering::Relaxed), BUDGET - 10);
    b.shared.inodes.store(MAX_INODES, Ordering::Relaxed);
    assert_eq!(errno(b.mkdir(b"d", 0o755)), libc::ENOSPC);
    assert_eq!(errno(b.open(b"g", CREAT | RDWR, 0o644)), libc::ENOSPC);
    assert_eq!(list(&b, ""), [".", "..", "f"]);
}

#[test]
fn concurrent_use() {
    let b = Arc::new(MemoryBackend::new());
    b.mkdir(b"shared", 0o755).unwrap();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let b = b.clone();
            std::thread::spawn(move || {
                let dir = format!("t{t}");
                b.mkdir(dir.as_bytes(), 0o755).unwrap();
                for i in 0..200 {
                    let p = format!("{dir}/f{i}");
                    let f = open(&b, &p, CREAT | RDWR);
                    b.write(&f, 0, p.as_bytes()).unwrap();
                    assert_eq!(read_at(&b, &f, 0, 100), p.as_bytes());
                    let q = format!("shared/{t}-{i}");
                    b.rename(p.as_bytes(), q.as_bytes(), 0).unwrap();
                    if i % 2 == 0 {
                        b.unlink(q.as_bytes()).unwrap();
                    }
                }
                b.rmdir(dir.as_bytes()).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let names = list(&b, "shared");
    assert_eq!(names.len(), 2 + 8 * 100);
    assert_eq!(stat(&b, "").nlink, 3);
    assert_eq!(contents(&b, "shared/3-7"), b"t3/f7");
}

#[test]
fn inode_numbers_are_unique() {
    let b = MemoryBackend::new();
    let mut seen = std::collections::HashSet::new();
    seen.insert(1);
    for i in 0..100 {
        assert!(seen.insert(mkfile(&b, &format!("f{i}"), b"").ino));
        assert!(seen.insert(b.mkdir((format!("d{i}")).as_bytes(), 0o755).unwrap().ino));
        assert!(seen.insert(b.symlink(b"x", (format!("l{i}")).as_bytes()).unwrap().ino));
    }
}
