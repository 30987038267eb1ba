//! The `ferry_client` API end to end against a real `ferry serve`, on both
//! the directory backend and the in-memory one: every test body takes a
//! `&Server` and runs once per backend.

mod common;

use std::ffi::OsStr;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;

use common::{random_bytes, Server, TempDir};
use ferry_client::{Client, Error, OpenOptions, Options, Target, Time};
use ferry_proto::{caps, Reply, Request};

const RENAME_NOREPLACE: u32 = 1;
const RENAME_EXCHANGE: u32 = 2;
const XATTR_CREATE: u32 = 1;
const XATTR_REPLACE: u32 = 2;

/// Runs each listed body against a directory export and an in-memory one:
/// `server` bodies get a started server, `args` bodies get the backend's
/// arguments to start servers of their own.
macro_rules! both_backends {
    (server: [$($name:ident),* $(,)?], args: [$($aname:ident),* $(,)?] $(,)?) => {
        mod dir {
            $(#[test] fn $name() { super::$name(&super::Server::start(&[])) })*
            $(#[test] fn $aname() { super::$aname(&[]) })*
        }
        mod memory {
            $(#[test] fn $name() { super::$name(&super::Server::start(&["--memory"])) })*
            $(#[test] fn $aname() { super::$aname(&["--memory"]) })*
        }
    };
}

both_backends!(
    server: [
        read_write_seek,
        positional_io,
        append_lands_at_end,
        create_new_and_truncate,
        set_len_grows_and_shrinks,
        metadata_mode_size_and_mtime,
        sync_all_keeps_data,
        read_dir_has_attributes,
        read_dir_many_entries,
        directories,
        rename_and_flags,
        hard_link_counts,
        symlinks,
        permissions,
        chown_and_back,
        set_times,
        statfs,
        access,
        xattrs,
        exact_errnos,
        large_single_read_and_write,
        small_sequential_reads,
        small_reads_stay_exact_across_fills_seeks_and_writes,
        reads_at_end_of_file_are_prompt,
        interleaved_seeks_and_reads,
        read_ahead_sees_own_writes,
        read_ahead_sees_stream_writes_and_shrink,
        write_behind_many_small_writes,
        write_behind_error_surfaces,
        client_without_capabilities,
        incompatible_version_refused,
        wrong_token_refused,
        non_utf8_names,
        trees_deeper_than_path_max,
    ],
    args: [degraded_capabilities, special_nodes, open_read_brings_the_first_bytes, listings_with_and_without_list_dir],
);

/// FIFOs and sockets can be made anywhere; device nodes only on a server
/// started with `--allow-devices`, and no device node is ever opened.
fn special_nodes(backend: &[&str]) {
    let server = Server::start(backend);
    let c = server.client();
    let fifo = c.mknod("/fifo", libc::S_IFIFO | 0o640, 0).expect("mkfifo");
    assert_eq!(fifo.mode, libc::S_IFIFO | 0o640);
    let sock = c.mknod("/sock", libc::S_IFSOCK | 0o600, 0).expect("mknod socket");
    assert_eq!(sock.kind(), libc::S_IFSOCK);
    assert_eq!(errno(c.mknod("/fifo", libc::S_IFIFO | 0o640, 0)), libc::EEXIST);
    let kinds: Vec<(String, u8)> =
        c.read_dir("/").expect("list").into_iter().map(|e| (String::from_utf8(e.name).unwrap(), e.kind)).collect();
    assert!(kinds.contains(&("fifo".to_string(), libc::DT_FIFO)), "{kinds:?}");
    assert!(kinds.contains(&("sock".to_string(), libc::DT_SOCK)), "{kinds:?}");
    assert_eq!(errno(c.mknod("/null", libc::S_IFCHR | 0o666, libc::makedev(1, 3))), libc::EPERM);
    drop(server);

    let mut args = backend.to_vec();
    args.push("--allow-devices");
    let server = Server::start(&args);
    let c = server.client();
    let dev = c.mknod("/null", libc::S_IFCHR | 0o666, libc::makedev(1, 3)).expect("mknod char device");
    assert_eq!(dev.kind(), libc::S_IFCHR);
    assert_eq!(dev.rdev, libc::makedev(1, 3));
    // Never a way into the server's own devices.
    assert_eq!(errno(c.open("/null", OpenOptions::new().read(true))), libc::EACCES);
    assert_eq!(errno(c.open("/null", OpenOptions::new().write(true))), libc::EACCES);
}

/// The errno of a failed call; panics on success.
#[track_caller]
fn errno<T>(r: Result<T, Error>) -> i32 {
    match r {
        Ok(_) => panic!("call succeeded, an error was expected"),
        Err(e) => e.errno(),
    }
}

#[track_caller]
fn io_errno<T>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(_) => panic!("call succeeded, an error was expected"),
        Err(e) => e.raw_os_error().unwrap_or_else(|| panic!("no errno in {e}")),
    }
}

fn rw() -> OpenOptions {
    OpenOptions::new().read(true).write(true).clone()
}

fn create() -> OpenOptions {
    OpenOptions::new().read(true).write(true).create(true).truncate(true).clone()
}

/// Asserts equality of large buffers without printing them.
#[track_caller]
fn same(got: &[u8], want: &[u8], what: &str) {
    if got == want {
        return;
    }
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    panic!("{what}: {} bytes vs {} expected, first difference at {first:?}", got.len(), want.len());
}

// ---------------------------------------------------------------- file I/O

fn read_write_seek(server: &Server) {
    let c = server.client();
    let mut f = c.open("/rws", &create()).unwrap();
    f.write_all(b"hello world").unwrap();
    assert_eq!(f.stream_position().unwrap(), 11);
    assert_eq!(f.seek(SeekFrom::Start(0)).unwrap(), 0);
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "hello world");

    assert_eq!(f.seek(SeekFrom::End(-5)).unwrap(), 6);
    let mut buf = [0u8; 5];
    f.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"world");

    assert_eq!(f.seek(SeekFrom::Current(-11)).unwrap(), 0);
    assert_eq!(f.seek(SeekFrom::Current(6)).unwrap(), 6);
    f.write_all(b"WORLD").unwrap();
    assert_eq!(f.stream_position().unwrap(), 11);
    // Reading at the end returns 0.
    assert_eq!(f.read(&mut buf).unwrap(), 0);
    // Past the end: a later write leaves a hole of zeros.
    assert_eq!(f.seek(SeekFrom::End(3)).unwrap(), 14);
    f.write_all(b"!").unwrap();
    assert_eq!(f.seek(SeekFrom::End(0)).unwrap(), 15);
    // Before the start is EINVAL, and the position is unchanged.
    assert_eq!(io_errno(f.seek(SeekFrom::Current(-100))), libc::EINVAL);
    assert_eq!(io_errno(f.seek(SeekFrom::End(-100))), libc::EINVAL);
    assert_eq!(f.stream_position().unwrap(), 15);
    f.close().unwrap();
    assert_eq!(c.read("/rws").unwrap(), b"hello WORLD\0\0\0!");
}

fn positional_io(server: &Server) {
    let c = server.client();
    let f = c.open("/pos", &create()).unwrap();
    f.write_at(b"abcdef", 0).unwrap();
    f.write_at(b"XY", 2).unwrap();
    f.write_at(b"tail", 100).unwrap();
    let mut buf = vec![0u8; 200];
    let n = f.read_at(&mut buf, 0).unwrap();
    assert_eq!(n, 104, "short only at end of file");
    assert_eq!(&buf[..6], b"abXYef");
    assert!(buf[6..100].iter().all(|&b| b == 0), "hole reads as zeros");
    assert_eq!(&buf[100..104], b"tail");
    let mut small = [0u8; 3];
    assert_eq!(f.read_at(&mut small, 1).unwrap(), 3);
    assert_eq!(&small, b"bXY");
    assert_eq!(f.read_at(&mut small, 104).unwrap(), 0, "at end of file");
    assert_eq!(f.read_at(&mut small, 10_000).unwrap(), 0, "past end of file");
    assert_eq!(f.read_at(&mut small, 102).unwrap(), 2);
    assert_eq!(&small[..2], b"il");
    // Positional calls do not move the stream position.
    let mut f = f;
    assert_eq!(f.stream_position().unwrap(), 0);
    f.close().unwrap();
}

fn append_lands_at_end(server: &Server) {
    let c = server.client();
    c.write("/log", b"start;").unwrap();
    let mut a = c.open("/log", OpenOptions::new().append(true)).unwrap();
    let mut b = c.open("/log", OpenOptions::new().read(true).append(true)).unwrap();
    // A positional write elsewhere must not move where appends land.
    let other = c.open("/log", &rw()).unwrap();
    a.write_all(b"one;").unwrap();
    b.write_all(b"two;").unwrap();
    a.write_all(b"three;").unwrap();
    a.flush().unwrap();
    b.flush().unwrap();
    other.write_at(b"S", 0).unwrap();
    b.write_all(b"four;").unwrap();
    // Even after a seek to the start, O_APPEND writes go to the end.
    b.seek(SeekFrom::Start(0)).unwrap();
    b.write_all(b"five;").unwrap();
    // After appends the position is the end of the file.
    let end = b.stream_position().unwrap();
    a.close().unwrap();
    b.close().unwrap();
    other.close().unwrap();
    let want = b"Start;one;two;three;four;five;";
    assert_eq!(c.read("/log").unwrap(), want);
    assert_eq!(end, want.len() as u64);
}

fn create_new_and_truncate(server: &Server) {
    let c = server.client();
    let f = c.open("/new", OpenOptions::new().write(true).create_new(true)).unwrap();
    f.write_at(b"0123456789", 0).unwrap();
    f.close().unwrap();
    assert_eq!(errno(c.open("/new", OpenOptions::new().write(true).create_new(true))), libc::EEXIST);
    // create without create_new opens the existing file, keeping its data.
    c.open("/new", OpenOptions::new().write(true).create(true)).unwrap().close().unwrap();
    assert_eq!(c.read("/new").unwrap(), b"0123456789");
    // Truncate through a path.
    let a = c.truncate(Target::Path(b"/new"), 4).unwrap();
    assert_eq!(a.size, 4);
    assert_eq!(c.read("/new").unwrap(), b"0123");
    // Truncate on open.
    let f = c.open("/new", OpenOptions::new().write(true).truncate(true)).unwrap();
    assert_eq!(f.attr().size, 0);
    f.close().unwrap();
    assert_eq!(c.metadata("/new").unwrap().size, 0);
    // Truncate to extend, then through a handle.
    assert_eq!(c.truncate(Target::Path(b"/new"), 8192).unwrap().size, 8192);
    let f = c.open("/new", &rw()).unwrap();
    assert_eq!(c.truncate(Target::Handle(f.handle()), 3).unwrap().size, 3);
    f.close().unwrap();
    assert_eq!(c.read("/new").unwrap(), b"\0\0\0");
    assert_eq!(errno(c.truncate(Target::Path(b"/missing"), 0)), libc::ENOENT);
}

fn set_len_grows_and_shrinks(server: &Server) {
    let c = server.client();
    let mut f = c.open("/len", &create()).unwrap();
    f.write_all(b"abcdef").unwrap();
    f.set_len(3).unwrap();
    assert_eq!(f.metadata().unwrap().size, 3);
    f.set_len(10).unwrap();
    assert_eq!(f.metadata().unwrap().size, 10);
    f.close().unwrap();
    assert_eq!(c.read("/len").unwrap(), b"abc\0\0\0\0\0\0\0");
}

fn metadata_mode_size_and_mtime(server: &Server) {
    let c = server.client();
    let f = c.open("/meta", OpenOptions::new().write(true).create(true).mode(0o640)).unwrap();
    assert!(f.attr().is_file());
    assert_eq!(f.attr().mode & 0o7777, 0o640, "created mode (no umask on the server)");
    assert_eq!(f.attr().size, 0);
    f.close().unwrap();
    let old = Time { sec: 1_000_000_000, nsec: 123_456_789 };
    let a = c.set_times(Target::Path(b"/meta"), old, old).unwrap();
    assert_eq!(a.mtime, old, "nanoseconds kept");
    let mut f = c.open("/meta", OpenOptions::new().write(true)).unwrap();
    f.write_all(&[7u8; 12345]).unwrap();
    let a = f.metadata().unwrap();
    assert_eq!(a.size, 12345);
    assert!(a.is_file() && !a.is_dir() && !a.is_symlink());
    assert_eq!(a.kind(), libc::S_IFREG);
    assert_eq!(a.mode & 0o7777, 0o640);
    assert_eq!(a.nlink, 1);
    assert!((a.mtime.sec, a.mtime.nsec) > (old.sec, old.nsec), "mtime moved after a write: {:?}", a.mtime);
    assert!(a.mtime.nsec < 1_000_000_000);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert!((a.mtime.sec - now).abs() < 300, "mtime {} vs now {now}", a.mtime.sec);
    assert!((a.ctime.sec - now).abs() < 300, "ctime {} vs now {now}", a.ctime.sec);
    f.close().unwrap();
    let m = c.metadata("/meta").unwrap();
    assert_eq!(m.size, 12345);
    assert_eq!(m.mtime, a.mtime);
    let root = c.metadata("/").unwrap();
    assert!(root.is_dir());
    assert_eq!(root.kind(), libc::S_IFDIR);
    assert_ne!(m.ino, root.ino);
}

fn sync_all_keeps_data(server: &Server) {
    let c = server.client();
    let data = random_bytes(300_000, 11);
    let mut f = c.open("/sync", &create()).unwrap();
    for part in data.chunks(7000) {
        f.write_all(part).unwrap();
    }
    f.sync_all().unwrap();
    // Visible through another connection at once.
    let other = server.client();
    same(&other.read("/sync").unwrap(), &data, "after sync_all");
    f.write_all(b"more").unwrap();
    f.sync_data().unwrap();
    assert_eq!(other.metadata("/sync").unwrap().size, data.len() as u64 + 4);
    f.close().unwrap();
}

// ---------------------------------------------------------------- directories

fn read_dir_has_attributes(server: &Server) {
    let c = server.client();
    c.create_dir("/d", 0o755).unwrap();
    c.write("/d/file", b"0123456789").unwrap();
    c.write("/d/empty", b"").unwrap();
    c.create_dir("/d/sub", 0o700).unwrap();
    c.symlink("file", "/d/link").unwrap();
    check_dir_listing(&c);
}

/// The listing of `/d` made by `read_dir_has_attributes`.
fn check_dir_listing(c: &Client) {
    let mut entries = c.read_dir("/d").unwrap();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let names: Vec<&str> = entries.iter().map(|e| std::str::from_utf8(&e.name).unwrap()).collect();
    assert_eq!(names, ["empty", "file", "link", "sub"], "no . or ..");
    for e in &entries {
        let name = std::str::from_utf8(&e.name).unwrap();
        let a = e.attr.unwrap_or_else(|| panic!("{name} has no attributes"));
        let st = c.symlink_metadata(format!("/d/{name}")).unwrap();
        assert_eq!(a.ino, st.ino, "{name}");
        assert_eq!(e.ino, st.ino, "{name}");
        assert_eq!(a.mode, st.mode, "{name}");
        assert_eq!(a.size, st.size, "{name}");
        match name {
            "file" => {
                assert_eq!(e.kind, libc::DT_REG);
                assert!(a.is_file());
                assert_eq!(a.size, 10);
            }
            "empty" => {
                assert_eq!(e.kind, libc::DT_REG);
                assert_eq!(a.size, 0);
            }
            "sub" => {
                assert_eq!(e.kind, libc::DT_DIR);
                assert!(a.is_dir());
                assert_eq!(a.mode & 0o7777, 0o700);
            }
            "link" => {
                assert_eq!(e.kind, libc::DT_LNK);
                assert!(a.is_symlink(), "read_dir must not follow symlinks");
                assert_eq!(a.size, 4, "a symlink's size is its target's length");
            }
            other => panic!("unexpected entry {other}"),
        }
    }
    assert!(c.read_dir("/d/sub").unwrap().is_empty());
}

fn read_dir_many_entries(server: &Server) {
    let c = server.client();
    c.create_dir("/many", 0o755).unwrap();
    const N: usize = 2500;
    for i in 0..N {
        let f = c.open(format!("/many/entry-{i:05}"), OpenOptions::new().write(true).create_new(true)).unwrap();
        if i % 100 == 0 {
            f.write_at(&vec![1u8; i], 0).unwrap();
        }
        f.close().unwrap();
    }
    let entries = c.read_dir("/many").unwrap();
    assert_eq!(entries.len(), N, "every entry exactly once across batches");
    let mut names: Vec<&str> = entries.iter().map(|e| std::str::from_utf8(&e.name).unwrap()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), N, "no duplicates");
    for e in &entries {
        let i: usize = std::str::from_utf8(&e.name).unwrap().strip_prefix("entry-").unwrap().parse().unwrap();
        let want = match i % 100 {
            0 => i as u64,
            _ => 0,
        };
        assert_eq!(e.attr.expect("attr").size, want, "{:?}", e.file_name());
    }
}

fn directories(server: &Server) {
    let c = server.client();
    let a = c.create_dir("/top", 0o751).unwrap();
    assert!(a.is_dir());
    assert_eq!(a.mode & 0o7777, 0o751);
    assert_eq!(errno(c.create_dir("/top", 0o755)), libc::EEXIST);
    c.create_dir_all("/top/a/b/c", 0o755).unwrap();
    c.create_dir_all("/top/a/b/c", 0o755).unwrap();
    assert!(c.metadata("/top/a/b/c").unwrap().is_dir());
    c.write("/top/a/file", b"x").unwrap();
    assert_eq!(errno(c.create_dir_all("/top/a/file/sub", 0o755)), libc::ENOTDIR);
    assert_eq!(errno(c.create_dir("/nope/x", 0o755)), libc::ENOENT);

    assert_eq!(errno(c.remove_dir("/top/a")), libc::ENOTEMPTY);
    assert_eq!(errno(c.remove_dir("/top/a/file")), libc::ENOTDIR);
    c.remove_dir("/top/a/b/c").unwrap();
    assert_eq!(errno(c.metadata("/top/a/b/c")), libc::ENOENT);
    assert_eq!(errno(c.remove_dir("/top/a/b/c")), libc::ENOENT);

    c.symlink("/top/a", "/top/a/b/loop").unwrap();
    c.create_dir_all("/top/a/b/x/y", 0o755).unwrap();
    c.write("/top/a/b/x/y/f", b"y").unwrap();
    c.remove_dir_all("/top/a").unwrap();
    assert_eq!(errno(c.metadata("/top/a")), libc::ENOENT);
    assert!(c.read_dir("/top").unwrap().is_empty());
    c.remove_dir("/top").unwrap();
    assert!(c.read_dir("/").unwrap().is_empty());
}

fn rename_and_flags(server: &Server) {
    let c = server.client();
    c.write("/a", b"A").unwrap();
    c.write("/b", b"B").unwrap();
    c.rename("/a", "/c").unwrap();
    assert_eq!(errno(c.metadata("/a")), libc::ENOENT);
    assert_eq!(c.read("/c").unwrap(), b"A");

    assert_eq!(errno(c.rename_with_flags("/c", "/b", RENAME_NOREPLACE)), libc::EEXIST);
    assert_eq!(c.read("/c").unwrap(), b"A");
    assert_eq!(c.read("/b").unwrap(), b"B");
    c.rename_with_flags("/c", "/d", RENAME_NOREPLACE).unwrap();
    assert_eq!(c.read("/d").unwrap(), b"A");

    c.rename_with_flags("/d", "/b", RENAME_EXCHANGE).unwrap();
    assert_eq!(c.read("/d").unwrap(), b"B");
    assert_eq!(c.read("/b").unwrap(), b"A");
    assert_eq!(errno(c.rename_with_flags("/d", "/missing", RENAME_EXCHANGE)), libc::ENOENT);
    assert_eq!(errno(c.rename_with_flags("/d", "/b", RENAME_EXCHANGE | RENAME_NOREPLACE)), libc::EINVAL);

    // Plain rename replaces.
    c.rename("/d", "/b").unwrap();
    assert_eq!(c.read("/b").unwrap(), b"B");
    assert_eq!(errno(c.metadata("/d")), libc::ENOENT);
    // Into a directory, and a directory itself.
    c.create_dir("/dir", 0o755).unwrap();
    c.rename("/b", "/dir/b").unwrap();
    c.rename("/dir", "/dir2").unwrap();
    assert_eq!(c.read("/dir2/b").unwrap(), b"B");
    assert_eq!(errno(c.rename("/missing", "/x")), libc::ENOENT);
    c.create_dir("/full", 0o755).unwrap();
    c.write("/full/x", b"").unwrap();
    assert_eq!(errno(c.rename("/dir2", "/full")), libc::ENOTEMPTY);
    assert_eq!(errno(c.rename("/dir2", "/dir2/b/inside")), libc::ENOTDIR);
    assert_eq!(errno(c.rename("/dir2", "/dir2/inside")), libc::EINVAL);
}

fn hard_link_counts(server: &Server) {
    let c = server.client();
    c.write("/orig", b"shared").unwrap();
    let a = c.hard_link("/orig", "/alias").unwrap();
    assert_eq!(a.nlink, 2);
    let o = c.metadata("/orig").unwrap();
    assert_eq!(o.nlink, 2);
    assert_eq!(o.ino, a.ino);
    // Writing through one name shows through the other.
    c.open("/alias", &rw()).unwrap().write_at(b"S", 0).unwrap();
    assert_eq!(c.read("/orig").unwrap(), b"Shared");
    assert_eq!(errno(c.hard_link("/orig", "/alias")), libc::EEXIST);
    assert_eq!(errno(c.hard_link("/missing", "/x")), libc::ENOENT);
    c.create_dir("/dir", 0o755).unwrap();
    assert_eq!(errno(c.hard_link("/dir", "/dirlink")), libc::EPERM);
    c.remove_file("/orig").unwrap();
    assert_eq!(c.metadata("/alias").unwrap().nlink, 1);
    assert_eq!(c.read("/alias").unwrap(), b"Shared");
}

fn symlinks(server: &Server) {
    let c = server.client();
    c.write("/target.txt", b"pointed at").unwrap();
    let a = c.symlink("target.txt", "/ln").unwrap();
    assert!(a.is_symlink());
    assert_eq!(c.read_link("/ln").unwrap().to_str().unwrap(), "target.txt");
    let l = c.symlink_metadata("/ln").unwrap();
    assert!(l.is_symlink());
    assert_eq!(l.size, "target.txt".len() as u64);
    let m = c.metadata("/ln").unwrap();
    assert!(m.is_file());
    assert_eq!(m.size, 10);
    assert_eq!(c.read("/ln").unwrap(), b"pointed at");
    // O_NOFOLLOW refuses the link.
    assert_eq!(errno(c.open("/ln", OpenOptions::new().read(true).nofollow(true))), libc::ELOOP);
    // Dangling links.
    c.symlink("nowhere", "/dangling").unwrap();
    assert_eq!(c.read_link("/dangling").unwrap().to_str().unwrap(), "nowhere");
    assert!(c.symlink_metadata("/dangling").unwrap().is_symlink());
    assert_eq!(errno(c.metadata("/dangling")), libc::ENOENT);
    assert_eq!(errno(c.symlink("x", "/ln")), libc::EEXIST);
    assert_eq!(errno(c.read_link("/target.txt")), libc::EINVAL);
    assert_eq!(errno(c.read_link("/missing")), libc::ENOENT);
    // A link to a directory is followed by paths through it.
    c.create_dir("/real", 0o755).unwrap();
    c.write("/real/inner", b"in").unwrap();
    c.symlink("real", "/alias").unwrap();
    assert_eq!(c.read("/alias/inner").unwrap(), b"in");
    // Removing the link leaves the target.
    c.remove_file("/ln").unwrap();
    assert_eq!(c.read("/target.txt").unwrap(), b"pointed at");
}

fn permissions(server: &Server) {
    let c = server.client();
    c.write("/p", b"x").unwrap();
    for mode in [0o600, 0o644, 0o755, 0o4711, 0o1777, 0o000] {
        let a = c.set_permissions(Target::Path(b"/p"), mode).unwrap();
        assert_eq!(a.mode & 0o7777, mode, "{mode:o}");
        assert!(a.is_file(), "type bits kept");
        assert_eq!(c.metadata("/p").unwrap().mode & 0o7777, mode);
    }
    let f = c.open("/p", OpenOptions::new().read(true)).unwrap();
    assert_eq!(c.set_permissions(Target::Handle(f.handle()), 0o640).unwrap().mode & 0o7777, 0o640);
    f.close().unwrap();
    c.create_dir("/d", 0o755).unwrap();
    assert_eq!(c.set_permissions(Target::Path(b"/d"), 0o700).unwrap().mode & 0o7777, 0o700);
    assert_eq!(errno(c.set_permissions(Target::Path(b"/missing"), 0o600)), libc::ENOENT);
}

fn chown_and_back(server: &Server) {
    let c = server.client();
    c.write("/owned", b"x").unwrap();
    let before = c.metadata("/owned").unwrap();
    let a = c.chown(Target::Path(b"/owned"), 1234, 5678).unwrap();
    assert_eq!((a.uid, a.gid), (1234, 5678));
    let m = c.metadata("/owned").unwrap();
    assert_eq!((m.uid, m.gid), (1234, 5678));
    // u32::MAX leaves an id alone.
    let a = c.chown(Target::Path(b"/owned"), u32::MAX, 42).unwrap();
    assert_eq!((a.uid, a.gid), (1234, 42));
    let a = c.chown(Target::Path(b"/owned"), before.uid, before.gid).unwrap();
    assert_eq!((a.uid, a.gid), (before.uid, before.gid));
    // Through a handle, and on a symlink itself.
    let f = c.open("/owned", OpenOptions::new().read(true)).unwrap();
    assert_eq!(c.chown(Target::Handle(f.handle()), 7, 8).unwrap().uid, 7);
    f.close().unwrap();
    c.symlink("owned", "/ln").unwrap();
    let l = c.chown(Target::PathNoFollow(b"/ln"), 99, 98).unwrap();
    assert!(l.is_symlink());
    assert_eq!((l.uid, l.gid), (99, 98));
    assert_eq!(c.metadata("/owned").unwrap().uid, 7, "target untouched");
    assert_eq!(errno(c.chown(Target::Path(b"/missing"), 1, 1)), libc::ENOENT);
}

fn set_times(server: &Server) {
    let c = server.client();
    c.write("/t", b"x").unwrap();
    let at = Time { sec: 1_500_000_000, nsec: 123_456_789 };
    let mt = Time { sec: 1_600_000_000, nsec: 987_654_321 };
    let a = c.set_times(Target::Path(b"/t"), at, mt).unwrap();
    assert_eq!((a.atime, a.mtime), (at, mt));
    let m = c.metadata("/t").unwrap();
    assert_eq!((m.atime, m.mtime), (at, mt));

    let mt2 = Time { sec: 1_700_000_000, nsec: 5 };
    let a = c.set_times(Target::Path(b"/t"), Time::OMIT, mt2).unwrap();
    assert_eq!(a.atime, at, "OMIT leaves atime");
    assert_eq!(a.mtime, mt2);
    let a = c.set_times(Target::Path(b"/t"), Time { sec: 0, nsec: 0 }, Time::OMIT).unwrap();
    assert_eq!(a.atime, Time { sec: 0, nsec: 0 });
    assert_eq!(a.mtime, mt2, "OMIT leaves mtime");

    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let a = c.set_times(Target::Path(b"/t"), Time::NOW, Time::NOW).unwrap();
    assert!((a.mtime.sec - now).abs() < 300 && (a.atime.sec - now).abs() < 300, "{:?}", a.mtime);

    // Before 1970, through a handle, and on a symlink itself.
    let old = Time { sec: -86_400, nsec: 1 };
    let f = c.open("/t", OpenOptions::new().read(true)).unwrap();
    let a = c.set_times(Target::Handle(f.handle()), old, old).unwrap();
    assert_eq!(a.mtime, old);
    f.close().unwrap();
    c.symlink("t", "/ln").unwrap();
    let l = c.set_times(Target::PathNoFollow(b"/ln"), at, at).unwrap();
    assert!(l.is_symlink());
    assert_eq!(l.mtime, at);
    assert_eq!(c.metadata("/t").unwrap().mtime, old, "target untouched");
    assert_eq!(errno(c.set_times(Target::Path(b"/missing"), at, at)), libc::ENOENT);
}

fn statfs(server: &Server) {
    let c = server.client();
    let s = c.statfs("/").unwrap();
    assert_eq!(s.namemax, 255);
    assert!(s.bsize > 0 && s.blocks > 0, "{s:?}");
    assert!(s.bavail <= s.bfree && s.bfree <= s.blocks, "{s:?}");
    assert_eq!(s.flags & libc::ST_RDONLY, 0);
    c.create_dir("/sub", 0o755).unwrap();
    assert_eq!(c.statfs("/sub").unwrap().namemax, 255);
    assert_eq!(errno(c.statfs("/missing")), libc::ENOENT);
}

fn access(server: &Server) {
    let c = server.client();
    c.write("/f", b"x").unwrap();
    c.access("/f", libc::F_OK as u32).unwrap();
    c.access("/f", (libc::R_OK | libc::W_OK) as u32).unwrap();
    c.access("/", libc::X_OK as u32).unwrap();
    assert_eq!(errno(c.access("/missing", libc::F_OK as u32)), libc::ENOENT);
    assert_eq!(errno(c.access("/f/x", libc::F_OK as u32)), libc::ENOTDIR);
}

fn xattrs(server: &Server) {
    let c = server.client();
    c.write("/x", b"data").unwrap();
    let t = Target::Path(b"/x");
    c.set_xattr(t, "user.k", b"v", 0).unwrap();
    assert_eq!(c.get_xattr(t, "user.k").unwrap(), b"v");
    assert!(c.list_xattr(t).unwrap().iter().any(|n| n == "user.k"));
    assert_eq!(errno(c.set_xattr(t, "user.k", b"w", XATTR_CREATE)), libc::EEXIST);
    assert_eq!(c.get_xattr(t, "user.k").unwrap(), b"v");
    c.set_xattr(t, "user.k", b"replaced", XATTR_REPLACE).unwrap();
    assert_eq!(c.get_xattr(t, "user.k").unwrap(), b"replaced");
    assert_eq!(errno(c.set_xattr(t, "user.other", b"w", XATTR_REPLACE)), libc::ENODATA);
    // Empty and binary values.
    c.set_xattr(t, "user.empty", b"", 0).unwrap();
    assert_eq!(c.get_xattr(t, "user.empty").unwrap(), b"");
    let bin: Vec<u8> = (0..=255).collect();
    c.set_xattr(t, "user.bin", &bin, 0).unwrap();
    assert_eq!(c.get_xattr(t, "user.bin").unwrap(), bin);
    let mut names: Vec<String> = c
        .list_xattr(t)
        .unwrap()
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .filter(|n| n.starts_with("user."))
        .collect();
    names.sort();
    assert_eq!(names, ["user.bin", "user.empty", "user.k"]);
    // Through a handle.
    let f = c.open("/x", OpenOptions::new().read(true)).unwrap();
    assert_eq!(c.get_xattr(Target::Handle(f.handle()), "user.k").unwrap(), b"replaced");
    f.close().unwrap();

    c.remove_xattr(t, "user.k").unwrap();
    assert_eq!(errno(c.get_xattr(t, "user.k")), libc::ENODATA);
    assert_eq!(errno(c.remove_xattr(t, "user.k")), libc::ENODATA);
    assert!(!c.list_xattr(t).unwrap().iter().any(|n| n == "user.k"));
    assert_eq!(errno(c.get_xattr(Target::Path(b"/missing"), "user.k")), libc::ENOENT);
    // On a directory.
    c.create_dir("/dx", 0o755).unwrap();
    c.set_xattr(Target::Path(b"/dx"), "user.d", b"dir", 0).unwrap();
    assert_eq!(c.get_xattr(Target::Path(b"/dx"), "user.d").unwrap(), b"dir");
    // File contents untouched.
    assert_eq!(c.read("/x").unwrap(), b"data");
}

fn exact_errnos(server: &Server) {
    let c = server.client();
    c.write("/file", b"x").unwrap();
    c.create_dir("/dir", 0o755).unwrap();
    assert_eq!(errno(c.open("/missing", OpenOptions::new().read(true))), libc::ENOENT);
    assert_eq!(errno(c.open("/no/such/file", OpenOptions::new().write(true).create(true))), libc::ENOENT);
    assert_eq!(errno(c.metadata("/missing")), libc::ENOENT);
    assert_eq!(errno(c.remove_file("/missing")), libc::ENOENT);
    assert_eq!(errno(c.read_dir("/missing")), libc::ENOENT);
    assert_eq!(errno(c.open("/dir", OpenOptions::new().write(true))), libc::EISDIR);
    assert_eq!(errno(c.open("/dir", &rw())), libc::EISDIR);
    assert_eq!(errno(c.remove_file("/dir")), libc::EISDIR);
    assert_eq!(errno(c.metadata("/file/x")), libc::ENOTDIR);
    assert_eq!(errno(c.open("/file/x", OpenOptions::new().read(true))), libc::ENOTDIR);
    assert_eq!(errno(c.read_dir("/file")), libc::ENOTDIR);
    assert_eq!(errno(c.open("/file", OpenOptions::new().read(true).directory(true))), libc::ENOTDIR);
    assert_eq!(errno(c.create_dir("/file/sub", 0o755)), libc::ENOTDIR);
    assert_eq!(errno(c.remove_dir("/file")), libc::ENOTDIR);
    let long = format!("/{}", "n".repeat(256));
    assert_eq!(errno(c.open(&long, OpenOptions::new().write(true).create(true))), libc::ENAMETOOLONG);
    assert_eq!(errno(c.create_dir(&long, 0o755)), libc::ENAMETOOLONG);
    // The root stays put.
    assert!(matches!(errno(c.remove_dir("/")), libc::EBUSY | libc::EPERM | libc::EINVAL));
    // The connection survives all of it.
    c.ping().unwrap();
    assert_eq!(c.read("/file").unwrap(), b"x");
}

// ---------------------------------------------------------------- transfer paths

fn large_single_read_and_write(server: &Server) {
    let c = server.client();
    const N: usize = 48 * 1024 * 1024;
    let data = random_bytes(N, 48);
    let f = c.open("/big", &create()).unwrap();
    f.write_at(&data, 0).unwrap();
    assert_eq!(c.metadata("/big").unwrap().size, N as u64);
    let mut back = vec![0u8; N];
    assert_eq!(f.read_at(&mut back, 0).unwrap(), N);
    same(&back, &data, "48 MiB read_at");
    // An unaligned window in the middle, larger than one request, and a
    // buffer running past the end.
    let mut mid = vec![0u8; 5 * 1024 * 1024 + 3];
    assert_eq!(f.read_at(&mut mid, 12_345_677).unwrap(), mid.len());
    same(&mid, &data[12_345_677..12_345_677 + mid.len()], "middle read_at");
    let mut tail = vec![0xAAu8; 3 * 1024 * 1024];
    let off = (N - 1024 * 1024 - 1) as u64;
    assert_eq!(f.read_at(&mut tail, off).unwrap(), 1024 * 1024 + 1, "short read at end");
    same(&tail[..1024 * 1024 + 1], &data[off as usize..], "tail read_at");
    f.close().unwrap();
    // And through another connection.
    same(&server.client().read("/big").unwrap(), &data, "Client::read of 48 MiB");
}

fn small_sequential_reads(server: &Server) {
    let c = server.client();
    let data = random_bytes(8 * 1024 * 1024, 8);
    c.write("/seq", &data).unwrap();
    let mut f = c.open("/seq", OpenOptions::new().read(true)).unwrap();
    let mut out = Vec::with_capacity(data.len());
    let mut buf = [0u8; 4096];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        assert_eq!(n, buf.len().min(data.len() - out.len()), "no short reads before the end");
        out.extend_from_slice(&buf[..n]);
    }
    same(&out, &data, "8 MiB in 4 KiB reads");
    assert_eq!(f.read(&mut buf).unwrap(), 0, "still at end");
    f.close().unwrap();

    // A size that is not a divisor of the file: the last read is short.
    let mut f = c.open("/seq", OpenOptions::new().read(true)).unwrap();
    let mut out = Vec::new();
    let mut buf = vec![0u8; 100_003];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    same(&out, &data, "8 MiB in 100003-byte reads");
    // The connection is clean after abandoned read-ahead.
    drop(f);
    c.ping().unwrap();
    assert_eq!(c.read("/seq").unwrap().len(), data.len());
}

/// A read at or past the end of a file answers at once (no reply may sit in
/// a corked socket waiting for data that never comes).
fn reads_at_end_of_file_are_prompt(server: &Server) {
    let c = server.client();
    c.write("/eof", b"hello").unwrap();
    let mut f = c.open("/eof", OpenOptions::new().read(true)).unwrap();
    let mut buf = [0u8; 64];
    let start = std::time::Instant::now();
    for i in 0..10 {
        assert_eq!(f.read_at(&mut buf, 5).unwrap(), 0, "at end");
        assert_eq!(f.read_at(&mut buf, 1000 + i).unwrap(), 0, "past end");
    }
    // read_to_end ends with a read that finds the end.
    for _ in 0..5 {
        f.seek(SeekFrom::Start(0)).unwrap();
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        assert_eq!(v, b"hello");
    }
    let took = start.elapsed();
    assert!(took < std::time::Duration::from_secs(2), "25 reads at end of file took {took:?} (about 200 ms each?)");
    f.close().unwrap();
}

fn interleaved_seeks_and_reads(server: &Server) {
    let c = server.client();
    let len = 6 * 1024 * 1024 + 777;
    let data = random_bytes(len, 9);
    c.write("/il", &data).unwrap();
    let mut f = c.open("/il", OpenOptions::new().read(true)).unwrap();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move |m: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % m
    };
    let mut pos: u64 = 0;
    let sizes = [4096usize, 4096, 4096, 1, 512, 65536, 4096, 1 << 20, 3000];
    for step in 0..300 {
        match next(4) {
            0 => {
                pos = next(len as u64 + 10);
                assert_eq!(f.seek(SeekFrom::Start(pos)).unwrap(), pos);
            }
            1 => {
                let back = next(pos + 1) as i64;
                pos -= back as u64;
                assert_eq!(f.seek(SeekFrom::Current(-back)).unwrap(), pos);
            }
            2 => {
                let from_end = next(200_000) as i64;
                pos = (len as i64 - from_end).max(0) as u64;
                assert_eq!(f.seek(SeekFrom::End(-(len as i64 - pos as i64))).unwrap(), pos);
            }
            _ => {}
        }
        // A run of same-sized sequential reads, enough to start read-ahead.
        let n = sizes[next(sizes.len() as u64) as usize];
        let mut buf = vec![0u8; n];
        for _ in 0..1 + next(6) {
            let got = f.read(&mut buf).unwrap();
            let want = n.min(len.saturating_sub(pos as usize));
            assert_eq!(got, want, "step {step}: read of {n} at {pos}");
            same(&buf[..got], &data[pos as usize..pos as usize + got], &format!("step {step}: read at {pos}"));
            pos += got as u64;
        }
        assert_eq!(f.stream_position().unwrap(), pos, "step {step}");
    }
    f.close().unwrap();
}

fn read_ahead_sees_own_writes(server: &Server) {
    let c = server.client();
    let len = 2 * 1024 * 1024;
    let mut data = random_bytes(len, 10);
    c.write("/fresh", &data).unwrap();
    let mut f = c.open("/fresh", &rw()).unwrap();
    let mut buf = [0u8; 4096];
    // Sequential reads so read-ahead is running past position 16 KiB.
    for i in 0..4 {
        f.read_exact(&mut buf).unwrap();
        same(&buf, &data[i * 4096..(i + 1) * 4096], "warm-up read");
    }
    // A positional write just ahead of the reader.
    let patch = vec![0x5Au8; 8192];
    f.write_at(&patch, 16384).unwrap();
    data[16384..16384 + 8192].copy_from_slice(&patch);
    for i in 4..8 {
        f.read_exact(&mut buf).unwrap();
        same(&buf, &data[i * 4096..(i + 1) * 4096], &format!("read {i} after write_at ahead of the reader"));
    }
    f.close().unwrap();
}

fn read_ahead_sees_stream_writes_and_shrink(server: &Server) {
    let c = server.client();
    let len = 2 * 1024 * 1024;
    let mut data = random_bytes(len, 10);
    c.write("/fresh", &data).unwrap();
    let mut f = c.open("/fresh", &rw()).unwrap();
    let mut buf = [0u8; 4096];
    // A stream write ahead of a running read-ahead (seek, write, seek back).
    f.seek(SeekFrom::Start(8 * 4096)).unwrap();
    for i in 8..12 {
        f.read_exact(&mut buf).unwrap();
        same(&buf, &data[i * 4096..(i + 1) * 4096], "read");
    }
    f.seek(SeekFrom::Start(12 * 4096)).unwrap();
    f.write_all(&[0xC3u8; 4096]).unwrap();
    data[12 * 4096..13 * 4096].fill(0xC3);
    f.seek(SeekFrom::Start(12 * 4096)).unwrap();
    for i in 12..16 {
        f.read_exact(&mut buf).unwrap();
        same(&buf, &data[i * 4096..(i + 1) * 4096], &format!("read {i} after a stream write"));
    }
    // A shrink ahead of the reader: reads stop at the new end.
    f.set_len(17 * 4096 + 100).unwrap();
    f.read_exact(&mut buf).unwrap();
    same(&buf, &data[16 * 4096..17 * 4096], "read before the new end");
    assert_eq!(f.read(&mut buf).unwrap(), 100, "short read at the new end");
    assert_eq!(f.read(&mut buf).unwrap(), 0);
    // Writes through another connection, after a seek, are seen.
    let other = server.client();
    f.seek(SeekFrom::Start(0)).unwrap();
    for i in 0..4 {
        f.read_exact(&mut buf).unwrap();
        same(&buf, &data[i * 4096..(i + 1) * 4096], "re-read");
    }
    other.open("/fresh", &rw()).unwrap().write_at(&[1u8; 4096], 8 * 4096).unwrap();
    f.seek(SeekFrom::Start(8 * 4096)).unwrap();
    f.read_exact(&mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 1), "after a seek elsewhere, the other client's write is visible");
    f.close().unwrap();
}

fn write_behind_many_small_writes(server: &Server) {
    let c = server.client();
    let mut want = Vec::new();
    let mut f = c.open("/wb", &create()).unwrap();
    let src = random_bytes(1 << 20, 12);
    let mut at = 0;
    for i in 0..5000usize {
        let n = 1 + (i * 37) % 300;
        let part = &src[at % (src.len() - 400)..][..n];
        f.write_all(part).unwrap();
        want.extend_from_slice(part);
        at += n;
    }
    // Overwrite a stretch in the middle after a seek, still write-behind.
    f.seek(SeekFrom::Start(1000)).unwrap();
    for k in 0..100u8 {
        f.write_all(&[k; 10]).unwrap();
        want[1000 + k as usize * 10..1010 + k as usize * 10].fill(k);
    }
    f.close().unwrap();
    same(&c.read("/wb").unwrap(), &want, "content after write-behind");

    // A read after writes on the same file sees them without a flush.
    let mut f = c.open("/wb2", &create()).unwrap();
    for i in 0..100u8 {
        f.write_all(&[i; 33]).unwrap();
    }
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut back = vec![0u8; 3300];
    f.read_exact(&mut back).unwrap();
    for i in 0..100usize {
        assert!(back[i * 33..(i + 1) * 33].iter().all(|&b| b == i as u8), "block {i}");
    }
    f.close().unwrap();
}

fn write_behind_error_surfaces(server: &Server) {
    let c = server.client();
    c.write("/ro", b"original").unwrap();
    // The write itself may be accepted into the pipeline; flush must fail.
    let mut f = c.open("/ro", OpenOptions::new().read(true)).unwrap();
    let res = f.write(b"nope").and_then(|_| f.flush());
    assert_eq!(io_errno(res), libc::EBADF, "write to a read-only handle");
    f.close().unwrap();
    // Or close reports it.
    let mut f = c.open("/ro", OpenOptions::new().read(true)).unwrap();
    match f.write(b"nope") {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EBADF), "{e}"),
        Ok(_) => assert_eq!(errno(f.close()), libc::EBADF, "close reports the failed write"),
    }
    // Many writes: the error is reported before the writes are all accepted
    // or on close, never lost.
    let mut f = c.open("/ro", OpenOptions::new().read(true)).unwrap();
    let mut failed = false;
    for _ in 0..50 {
        if let Err(e) = f.write(b"x") {
            assert_eq!(e.raw_os_error(), Some(libc::EBADF), "{e}");
            failed = true;
            break;
        }
    }
    if !failed {
        assert_eq!(errno(f.close()), libc::EBADF);
    }
    // Positional writes report at once.
    let f = c.open("/ro", OpenOptions::new().read(true)).unwrap();
    assert_eq!(errno(f.write_at(b"zz", 0)), libc::EBADF);
    f.close().unwrap();
    // A read from a write-only handle.
    let f = c.open("/ro", OpenOptions::new().write(true)).unwrap();
    let mut buf = [0u8; 4];
    assert_eq!(errno(f.read_at(&mut buf, 0)), libc::EBADF);
    f.close().unwrap();
    assert_eq!(c.read("/ro").unwrap(), b"original");
    c.ping().unwrap();
}

// ---------------------------------------------------------------- negotiation

/// `ListDir` lists a directory by path in one round trip; one longer than a
/// batch is read through a handle; the same results without the capability.
fn listings_with_and_without_list_dir(backend: &[&str]) {
    let mut seen: Vec<Vec<Vec<u8>>> = Vec::new();
    for off in [false, true] {
        let mut args = backend.to_vec();
        if off {
            args.extend(["--disable-caps", "list-dir"]);
        }
        let server = Server::start(&args);
        let c = server.client();
        assert_eq!(c.engine().has_cap(caps::LIST_DIR), !off);
        c.create_dir("/small", 0o755).unwrap();
        c.write("/small/a", b"1").unwrap();
        c.create_dir("/small/d", 0o700).unwrap();
        c.create_dir("/big", 0o755).unwrap();
        for i in 0..1500 {
            c.write(format!("/big/f{i:05}"), b"").unwrap();
        }
        let names = |p: &str| -> Vec<Vec<u8>> {
            let mut v: Vec<Vec<u8>> = c
                .read_dir(p)
                .unwrap()
                .into_iter()
                .map(|e| {
                    assert!(e.attr.is_some(), "attributes with every entry");
                    e.name
                })
                .collect();
            v.sort();
            v
        };
        let small = names("/small");
        assert_eq!(small, [b"a".to_vec(), b"d".to_vec()]);
        let big = names("/big");
        assert_eq!(big.len(), 1500);
        assert_eq!(big[1499], b"f01499");
        seen.push(big);
        assert_eq!(errno(c.read_dir("/small/a")), libc::ENOTDIR);
        assert_eq!(errno(c.read_dir("/missing")), libc::ENOENT);
        assert!(c.read_dir("/small/d").unwrap().is_empty());
        c.ping().unwrap();
    }
    assert_eq!(seen[0], seen[1]);
}

/// `OpenRead`: a read-only open brings the file's first 64 KiB; a small
/// file is read in that one round trip, a larger one goes on from there;
/// the same results with the capability off.
fn open_read_brings_the_first_bytes(backend: &[&str]) {
    for off in [false, true] {
        let mut args = backend.to_vec();
        if off {
            args.extend(["--disable-caps", "open-read"]);
        }
        let server = Server::start(&args);
        let c = server.client();
        assert_eq!(c.engine().has_cap(caps::OPEN_READ), !off);
        let sizes = [0usize, 1, 1000, 65535, 65536, 65537, 300_000];
        for (i, &n) in sizes.iter().enumerate() {
            let data = random_bytes(n, 40 + i as u64);
            let p = format!("/f{n}");
            c.write(&p, &data).unwrap();
            assert!(c.read(&p).unwrap() == data, "read of {n} bytes (open-read off: {off})");
            // Small reads through `Read` after the open, then a seek.
            let mut f = c.open(&p, OpenOptions::new().read(true)).unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 777];
            loop {
                let k = f.read(&mut buf).unwrap();
                if k == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..k]);
            }
            assert!(got == data, "small reads of {n} bytes (open-read off: {off})");
            if n > 10 {
                f.seek(SeekFrom::Start(n as u64 / 2)).unwrap();
                let k = f.read(&mut buf).unwrap();
                assert_eq!(&buf[..k], &data[n / 2..(n / 2 + k).min(n)]);
            }
            f.close().unwrap();
        }
        // A directory opened read-only brings nothing; a write-only open
        // of a file is an ordinary open.
        c.create_dir("/dir", 0o755).unwrap();
        assert!(c.read_dir("/dir").unwrap().is_empty());
        let mut w = c.open("/f1", OpenOptions::new().write(true)).unwrap();
        w.write_all(b"Z").unwrap();
        w.close().unwrap();
        assert_eq!(c.read("/f1").unwrap(), b"Z");
        assert_eq!(errno(c.read("/missing")), libc::ENOENT);
        c.ping().unwrap();
    }
}

fn degraded_capabilities(backend: &[&str]) {
    let mut args = vec!["--disable-caps", "readdirplus,xattr,rename-flags"];
    args.extend_from_slice(backend);
    let server = Server::start(&args);
    let c = server.client();
    let off = caps::READDIRPLUS | caps::XATTR | caps::RENAME_FLAGS;
    assert_eq!(c.engine().welcome().caps & off, 0, "the disabled caps are off");
    c.create_dir("/d", 0o755).unwrap();
    c.write("/d/file", b"0123456789").unwrap();
    c.write("/d/empty", b"").unwrap();
    c.create_dir("/d/sub", 0o700).unwrap();
    c.symlink("file", "/d/link").unwrap();
    check_dir_listing(&c);

    let t = Target::Path(b"/d/file");
    assert_eq!(errno(c.set_xattr(t, "user.k", b"v", 0)), libc::EOPNOTSUPP);
    assert_eq!(errno(c.get_xattr(t, "user.k")), libc::EOPNOTSUPP);
    assert_eq!(errno(c.list_xattr(t)), libc::EOPNOTSUPP);
    assert_eq!(errno(c.remove_xattr(t, "user.k")), libc::EOPNOTSUPP);

    c.write("/a", b"A").unwrap();
    c.write("/b", b"B").unwrap();
    assert_eq!(errno(c.rename_with_flags("/a", "/b", RENAME_NOREPLACE)), libc::EINVAL);
    assert_eq!(errno(c.rename_with_flags("/a", "/b", RENAME_EXCHANGE)), libc::EINVAL);
    assert_eq!(c.read("/a").unwrap(), b"A");
    c.rename("/a", "/b").unwrap();
    assert_eq!(c.read("/b").unwrap(), b"A");
    assert_eq!(errno(c.metadata("/a")), libc::ENOENT);

    // The server enforces it too, whatever a client sends.
    let e = c.engine();
    let r = e.call(&Request::Rename { from: b"/b", to: b"/c", flags: RENAME_NOREPLACE });
    assert_eq!(errno(r), libc::EINVAL);
    let r = e.call(&Request::SetXattr { target: t, name: b"user.k", value: b"v", flags: 0 });
    assert_eq!(errno(r), libc::EOPNOTSUPP);
    let r = e.call(&Request::GetXattr { target: t, name: b"user.k", size: 100 });
    assert_eq!(errno(r), libc::EOPNOTSUPP);
    let dir = c.open("/d", OpenOptions::new().read(true).directory(true)).unwrap();
    let frame = e.call(&Request::ReadDir { handle: dir.handle(), cookie: 0, max_entries: 100, plus: true }).unwrap();
    match frame.reply().unwrap() {
        Reply::Dir { entries, .. } => {
            assert!(entries.len() >= 4, "{entries:?}");
            assert!(entries.iter().all(|d| d.attr.is_none()), "plus ignored without the capability");
        }
        r => panic!("unexpected reply {r:?}"),
    }
    dir.close().unwrap();
    assert_eq!(c.read("/b").unwrap(), b"A");
    c.ping().unwrap();
}

fn client_without_capabilities(server: &Server) {
    let setup = server.client();
    setup.create_dir("/d", 0o755).unwrap();
    setup.write("/d/file", b"0123456789").unwrap();
    setup.write("/d/empty", b"").unwrap();
    setup.create_dir("/d/sub", 0o700).unwrap();
    setup.symlink("file", "/d/link").unwrap();
    let c = Client::connect(&server.addr(), &Options { caps: 0, ..server.options() }).unwrap();
    assert_eq!(c.engine().welcome().caps, 0, "session uses the intersection");
    check_dir_listing(&c);
    assert_eq!(errno(c.get_xattr(Target::Path(b"/d/file"), "user.k")), libc::EOPNOTSUPP);
    assert_eq!(errno(c.rename_with_flags("/d/file", "/d/empty", RENAME_NOREPLACE)), libc::EINVAL);
    // The capable client on the same server still has everything.
    assert_ne!(setup.engine().welcome().caps & caps::READDIRPLUS, 0);
    assert_eq!(errno(setup.rename_with_flags("/d/file", "/d/empty", RENAME_NOREPLACE)), libc::EEXIST);
}

fn incompatible_version_refused(server: &Server) {
    let opts = Options { versions: (2, 3), ..server.options() };
    let err = match Client::connect(&server.addr(), &opts) {
        Ok(_) => panic!("a client speaking only versions 2..3 was accepted"),
        Err(e) => e,
    };
    let msg = format!("{err} / {err:?}");
    assert!(
        err.errno() == libc::EPROTONOSUPPORT || msg.to_lowercase().contains("protocol version"),
        "unclear refusal: {msg}"
    );
    assert_eq!(err.errno(), libc::EPROTONOSUPPORT, "{msg}");
    // The server keeps serving other clients, and a fresh one.
    let c = server.client();
    c.write("/still", b"here").unwrap();
    assert!(server.client().ping().is_ok());
    for _ in 0..3 {
        assert!(Client::connect(&server.addr(), &opts).is_err());
    }
    assert_eq!(c.read("/still").unwrap(), b"here");
    assert_eq!(server.client().read("/still").unwrap(), b"here");
}

fn wrong_token_refused(server: &Server) {
    let opts = Options { token: Some(b"wrong".to_vec()), ..Options::default() };
    let err = Client::connect(&server.addr(), &opts).err().expect("wrong token accepted");
    assert!(err.to_string().contains("authentication failed"), "{err}");
    assert_eq!(err.errno(), libc::EACCES);
    let err = Client::connect(&server.addr(), &Options::default()).err().expect("no token accepted");
    assert!(err.to_string().contains("authentication failed"), "{err}");
    server.client().ping().unwrap();
}

// ---------------------------------------------------------------- directory backend only

/// 256 MiB up and down through `ferry cp`, checked byte for byte.
#[test]
fn dir_cp_256_mib_round_trip() {
    let server = Server::start(&[]);
    let local = TempDir::new("big");
    const N: usize = 256 * 1024 * 1024;
    let data = random_bytes(N, 256);
    let src = local.path().join("big.bin");
    std::fs::write(&src, &data).unwrap();
    let o = server.ferry(&["cp", src.to_str().unwrap(), &server.url("/big.bin")]);
    assert!(o.status.success(), "cp up: {}", common::stderr(&o));
    std::fs::remove_file(&src).unwrap();
    same(&std::fs::read(server.export.path().join("big.bin")).unwrap(), &data, "uploaded 256 MiB");
    let back = local.path().join("back.bin");
    let o = server.ferry(&["cp", &server.url("/big.bin"), back.to_str().unwrap()]);
    assert!(o.status.success(), "cp down: {}", common::stderr(&o));
    same(&std::fs::read(&back).unwrap(), &data, "downloaded 256 MiB");
}

/// Small reads of odd sizes across buffer fills, seeks back into data the
/// buffer held, and a write through the same handle in between: every byte
/// read is the file's current byte.
fn small_reads_stay_exact_across_fills_seeks_and_writes(server: &Server) {
    let c = server.client();
    let mut data = random_bytes(3 * 1024 * 1024 + 17, 21);
    c.write("/odd", &data).unwrap();
    let mut f = c.open("/odd", OpenOptions::new().read(true).write(true)).unwrap();
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1000];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        assert!(n == 1000 || out.len() + n == data.len(), "short read before the end");
        out.extend_from_slice(&buf[..n]);
    }
    same(&out, &data, "1000-byte reads");
    // Back into what the buffer held, after changing it through this handle.
    f.seek(SeekFrom::Start(70_000)).unwrap();
    f.write_all(b"fresh bytes").unwrap();
    data[70_000..70_011].copy_from_slice(b"fresh bytes");
    f.seek(SeekFrom::Start(69_995)).unwrap();
    let mut small = [0u8; 20];
    f.read_exact(&mut small).unwrap();
    assert_eq!(&small[..], &data[69_995..70_015]);
    // Continue sequentially from there with small reads.
    let mut rest = Vec::new();
    loop {
        let n = f.read(&mut buf[..333]).unwrap();
        if n == 0 {
            break;
        }
        rest.extend_from_slice(&buf[..n]);
    }
    same(&rest, &data[70_015..], "333-byte reads after a seek");
    f.close().unwrap();
}

/// Names are bytes on Linux: Latin-1 `café`, bytes that are no UTF-8 at
/// all, and a symlink target that is neither, each stored, listed, found
/// and renamed byte for byte. A NUL, which no Linux name can hold, is
/// `EINVAL`.
/// A tree deeper than `PATH_MAX` from the export root: every name is within
/// `NAME_MAX`, each path the library sends is longer than 4 KiB.
fn trees_deeper_than_path_max(server: &Server) {
    let c = server.client();
    let name = "d".repeat(250);
    let mut dir = String::new();
    for _ in 0..40 {
        dir = format!("{dir}/{name}");
        c.create_dir(&dir, 0o755).unwrap();
    }
    assert!(dir.len() > 10_000);
    let file = format!("{dir}/leaf");
    c.write(&file, b"deep").unwrap();
    assert_eq!(c.read(&file).unwrap(), b"deep");
    assert_eq!(c.metadata(&file).unwrap().size, 4);
    let listed: Vec<Vec<u8>> = c.read_dir(&dir).unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(listed, [b"leaf".to_vec()]);
    let moved = format!("{dir}/leaf2");
    c.rename(&file, &moved).unwrap();
    c.symlink("leaf2", format!("{dir}/ln")).unwrap();
    assert_eq!(c.read(format!("{dir}/ln")).unwrap(), b"deep");
    c.set_permissions(Target::Path(moved.as_bytes()), 0o600).unwrap();
    assert_eq!(c.metadata(&moved).unwrap().mode & 0o777, 0o600);
    // Climbing out of a deep tree: the memory backend walks one name at a
    // time from the root (`..` stops there: `/top`); the directory backend
    // walks in steps and refuses a `..` above its step's start (EXDEV).
    // Never anything outside the export either way.
    c.write("/top", b"top").unwrap();
    let up = format!("{dir}/{}top", "../".repeat(45));
    match c.read(&up) {
        Ok(d) => assert_eq!(d, b"top"),
        Err(e) => assert_eq!(errno::<()>(Err(e)), libc::EXDEV),
    }
    c.symlink("/top", format!("{dir}/abs")).unwrap();
    match c.read(format!("{dir}/abs")) {
        Ok(d) => assert_eq!(d, b"top"),
        Err(e) => assert_eq!(errno::<()>(Err(e)), libc::EXDEV),
    }
    c.remove_file(format!("{dir}/abs")).unwrap();
    c.remove_file("/top").unwrap();
    // Past the wire's limit (a u16 length), a clear ENAMETOOLONG.
    let too_deep = format!("{}/x", format!("/{name}").repeat(262));
    assert!(too_deep.len() > ferry_proto::MAX_PATH);
    assert_eq!(errno(c.metadata(&too_deep)), libc::ENAMETOOLONG);
    // A name over NAME_MAX deep down is still refused.
    assert_eq!(errno(c.create_dir(format!("{dir}/{}", "n".repeat(256)), 0o755)), libc::ENAMETOOLONG);
    c.remove_file(&moved).unwrap();
    c.remove_file(format!("{dir}/ln")).unwrap();
    c.remove_dir_all(format!("/{name}")).unwrap();
    assert_eq!(errno(c.metadata(format!("/{name}"))), libc::ENOENT);
}

fn non_utf8_names(server: &Server) {
    let c = server.client();
    let os = |b: &[u8]| OsStr::from_bytes(b).to_owned();
    let cafe = os(b"/caf\xe9");
    let dir = os(b"/\xff\xfe");
    let inner = os(b"/\xff\xfe/na\xefve\x80");
    c.write(&cafe, b"latin-1").unwrap();
    c.create_dir(&dir, 0o755).unwrap();
    c.write(&inner, b"inside").unwrap();
    let mut names: Vec<Vec<u8>> = c.read_dir("/").unwrap().into_iter().map(|e| e.name).collect();
    names.sort();
    assert_eq!(names, [b"caf\xe9".to_vec(), b"\xff\xfe".to_vec()], "root listing, byte for byte");
    let inside = c.read_dir(&dir).unwrap();
    assert_eq!(inside.len(), 1);
    assert_eq!(inside[0].file_name(), OsStr::from_bytes(b"na\xefve\x80"));
    assert_eq!(inside[0].attr.expect("readdirplus attributes").size, 6);
    assert_eq!(c.metadata(&cafe).unwrap().size, 7);
    assert!(c.symlink_metadata(&dir).unwrap().is_dir());
    assert_eq!(c.read(&inner).unwrap(), b"inside");
    // A valid UTF-8 spelling of the same word is another name.
    assert_eq!(errno(c.metadata("/café")), libc::ENOENT);

    let renamed = os(b"/\xff\xfe/\xe0 bient\xf4t");
    c.rename(&inner, &renamed).unwrap();
    assert_eq!(errno(c.metadata(&inner)), libc::ENOENT);
    assert_eq!(c.read(&renamed).unwrap(), b"inside");

    let link = os(b"/lien-\xe9");
    c.symlink(OsStr::from_bytes(b"\xff\xfe/\xe0 bient\xf4t"), &link).unwrap();
    assert_eq!(c.read_link(&link).unwrap().as_os_str().as_bytes(), b"\xff\xfe/\xe0 bient\xf4t");
    assert_eq!(c.symlink_metadata(&link).unwrap().size, 12);
    assert_eq!(c.read(&link).unwrap(), b"inside", "the link resolves through the non-UTF-8 names");
    let hard = os(b"/dur-\xe9");
    assert_eq!(c.hard_link(&cafe, &hard).unwrap().nlink, 2);
    assert_eq!(c.read(&hard).unwrap(), b"latin-1");

    // The directory backend (the memory one leaves its export empty) stores
    // the bytes themselves on disk.
    if std::fs::read_dir(server.export.path()).unwrap().next().is_some() {
        let on_disk = server.export.path().join(OsStr::from_bytes(b"caf\xe9"));
        assert_eq!(std::fs::read(on_disk).unwrap(), b"latin-1");
    }

    assert_eq!(errno(c.write("/nul\0byte", b"x")), libc::EINVAL);
    assert_eq!(errno(c.create_dir("/nul\0dir", 0o755)), libc::EINVAL);
    assert_eq!(errno(c.symlink("tar\0get", "/l2")), libc::EINVAL);

    c.remove_file(&hard).unwrap();
    c.remove_file(&link).unwrap();
    c.remove_dir_all(&dir).unwrap();
    c.remove_file(&cafe).unwrap();
    assert!(c.read_dir("/").unwrap().is_empty());
}

/// Requests over Linux's limits fail before they are encoded, with the
/// errno Linux gives, and hold no window slot: far more of them than the
/// window holds leave the connection working.
#[test]
fn over_long_requests_fail_locally_and_free_their_slot() {
    let server = Server::start(&[]);
    let c = server.client();
    c.write("/f", b"x").unwrap();
    let huge = format!("/{}", "a/".repeat(35_000));
    let component = format!("/{}", "n".repeat(256));
    let max = format!("/{}", "d/".repeat(2047) + "z");
    assert_eq!(max.len(), 4096);
    for _ in 0..100 {
        assert_eq!(errno(c.metadata(&huge)), libc::ENAMETOOLONG);
        assert_eq!(errno(c.rename("/f", &huge)), libc::ENAMETOOLONG);
        assert_eq!(errno(c.metadata(&component)), libc::ENAMETOOLONG);
        // PATH_MAX from the export root is a deep tree, looked up.
        assert_eq!(errno(c.metadata(&max)), libc::ENOENT);
        assert_eq!(errno(c.set_xattr(Target::Path(b"/f"), "user.big", &vec![0u8; 65537], 0)), libc::E2BIG);
        assert_eq!(errno(c.set_xattr(Target::Path(b"/f"), "n".repeat(256), b"v", 0)), libc::ERANGE);
    }
    c.ping().unwrap();
    assert_eq!(c.read("/f").unwrap(), b"x");
}
