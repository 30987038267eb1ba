//! Selective caching with real servers: where the policy comes from and in
//! what order, reads served from the local cache through the library, the
//! mount and `ferry run`, and the next open seeing another client's write.

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::fuse::{require_fuse, Detach};
use common::preload::ok;
use common::{random_bytes, stderr, stdout, Server, TempDir, FERRY};
use ferry_client::cache::{Cache, Rules};
use ferry_client::{Client, OpenOptions, Options};

fn put(c: &Client, path: &str, data: &[u8]) {
    let mut f = c.open(path, OpenOptions::new().write(true).create(true).truncate(true)).unwrap();
    f.write_all(data).unwrap();
    f.close().unwrap();
}

fn read_all(c: &Client, path: &str) -> Vec<u8> {
    let mut v = Vec::new();
    c.open(path, OpenOptions::new().read(true)).unwrap().read_to_end(&mut v).unwrap();
    v
}

/// `ferry cache ARGS` against `srv`, with the cache configuration `conf`.
fn cache_cmd(srv: &Server, conf: &Path, args: &[&str]) -> std::process::Output {
    Command::new(FERRY)
        .arg("cache")
        .args(args)
        .env("FERRY_TOKEN_FILE", &srv.token_file)
        .env("FERRY_CACHE_CONFIG", conf)
        .env("FERRY_CACHE_DIR", conf.with_file_name("cache"))
        .output()
        .unwrap()
}

fn get(srv: &Server, conf: &Path, path: &str) -> String {
    let o = cache_cmd(srv, conf, &["get", &srv.url(path)]);
    assert!(o.status.success(), "{}", stderr(&o));
    stdout(&o).trim().to_string()
}

fn policy_sources(extra: &[&str]) {
    let srv = Server::start(extra);
    let c = srv.client();
    for d in ["/d", "/__vol", "/d/sub"] {
        c.create_dir(d, 0o755).unwrap();
    }
    for f in ["/plain", "/++kept", "/__vol/f", "/d/a.iso", "/d/sub/b", "/++ruled", "/__vol/++mine"] {
        put(&c, f, b"x");
    }
    let tmp = TempDir::new("conf");
    let conf = tmp.path().join("cache.conf");
    std::fs::write(&conf, "# rules\nbypass ++ruled\ncache *.iso\n").unwrap();
    let conf_s = conf.display().to_string();
    assert_eq!(get(&srv, &conf, "/plain"), "/plain: bypass (default)");
    assert_eq!(get(&srv, &conf, "/++kept"), "/++kept: cache (naming convention: ++kept)");
    assert_eq!(get(&srv, &conf, "/__vol/f"), "/__vol/f: bypass (naming convention: __vol)");
    assert_eq!(get(&srv, &conf, "/__vol/++mine"), "/__vol/++mine: cache (naming convention: ++mine)");
    // A rule of the file beats the naming convention.
    assert_eq!(get(&srv, &conf, "/++ruled"), format!("/++ruled: bypass (rule at {conf_s}:2)"));
    assert_eq!(get(&srv, &conf, "/d/a.iso"), format!("/d/a.iso: cache (rule at {conf_s}:3)"));
    // The server's setting beats both, from the nearest directory up.
    assert!(cache_cmd(&srv, &conf, &["set", &srv.url("/d"), "bypass"]).status.success());
    assert_eq!(get(&srv, &conf, "/d/a.iso"), "/d/a.iso: bypass (set on the server, on /d)");
    assert_eq!(get(&srv, &conf, "/d/sub/b"), "/d/sub/b: bypass (set on the server, on /d)");
    assert!(cache_cmd(&srv, &conf, &["set", &srv.url("/d/sub/b"), "cache"]).status.success());
    assert_eq!(get(&srv, &conf, "/d/sub/b"), "/d/sub/b: cache (set on the server, on /d/sub/b)");
    assert!(cache_cmd(&srv, &conf, &["set", &srv.url("/"), "cache"]).status.success());
    assert_eq!(get(&srv, &conf, "/plain"), "/plain: cache (set on the server, on /)");
    assert_eq!(get(&srv, &conf, "/++ruled"), "/++ruled: cache (set on the server, on /)");
    // Another client sees the same settings (they live on the server).
    let (p, from) = srv.client().cache_policy("/d/sub").unwrap();
    assert_eq!((p, from), (ferry_client::cache_policy::BYPASS, b"/d".to_vec()));
    for u in ["/", "/d"] {
        assert!(cache_cmd(&srv, &conf, &["clear", &srv.url(u)]).status.success());
    }
    assert_eq!(get(&srv, &conf, "/d/a.iso"), format!("/d/a.iso: cache (rule at {conf_s}:3)"));
    // Clearing what is not set is no error; a missing file is.
    assert!(cache_cmd(&srv, &conf, &["clear", &srv.url("/plain")]).status.success());
    let o = cache_cmd(&srv, &conf, &["get", &srv.url("/nowhere")]);
    assert!(!o.status.success() && stderr(&o).contains("No such file"), "{}", stderr(&o));
    // A malformed configuration is an error naming its line.
    std::fs::write(&conf, "cache *.iso\nkeep all\n").unwrap();
    let o = cache_cmd(&srv, &conf, &["get", &srv.url("/plain")]);
    assert!(!o.status.success() && stderr(&o).contains("cache.conf:2"), "{}", stderr(&o));
}

#[test]
fn policy_sources_and_precedence_on_a_directory() {
    policy_sources(&[]);
}

#[test]
fn policy_sources_and_precedence_in_memory() {
    policy_sources(&["--memory"]);
}

#[test]
fn a_read_only_export_refuses_settings() {
    let srv = Server::start(&["--read-only"]);
    let e = srv.client().set_cache_policy("/", ferry_client::cache_policy::CACHE).unwrap_err();
    assert_eq!(e.errno(), libc::EROFS);
}

/// A client caching everything in `dir`.
fn caching_client(srv: &Server, dir: &Path) -> Client {
    let rules = Rules::parse(Path::new("test"), b"cache /**\n").unwrap();
    let cache = Cache::open(dir.to_path_buf(), 1 << 30, rules).unwrap();
    Client::connect(&srv.addr(), &Options { cache: Some(Arc::new(cache)), ..srv.tcp_options() }).unwrap()
}

fn library_cache(extra: &[&str]) {
    let srv = Server::start(extra);
    let plain = srv.client();
    let tmp = TempDir::new("libcache");
    let c = caching_client(&srv, tmp.path());
    let data = random_bytes(5 << 20, 1);
    put(&plain, "/f", &data);
    let f = c.open("/f", OpenOptions::new().read(true)).unwrap();
    assert!(f.is_cached());
    drop(f);
    let before = c.bytes_fetched();
    assert!(read_all(&c, "/f") == data);
    let first = c.bytes_fetched() - before;
    assert!(((5 << 20) - 65536..=6 << 20).contains(&first), "first read fetched {first}");
    // Again: all from the cache.
    let before = c.bytes_fetched();
    assert!(read_all(&c, "/f") == data);
    assert_eq!(c.bytes_fetched() - before, 0, "a warm read went to the server");
    // Another client writes: the next open sees it.
    let w = plain.open("/f", OpenOptions::new().write(true)).unwrap();
    w.write_at(b"CHANGED", 3 << 20).unwrap();
    w.close().unwrap();
    let mut want = data.clone();
    want[3 << 20..(3 << 20) + 7].copy_from_slice(b"CHANGED");
    assert!(read_all(&c, "/f") == want, "the cache served data older than the last close");
    // A same-size overwrite within the same instant is still seen (the
    // change attribute, not the size and time alone).
    for round in 0..5u8 {
        let w = plain.open("/f", OpenOptions::new().write(true)).unwrap();
        w.write_at(&[round; 4], 0).unwrap();
        w.close().unwrap();
        let mut f = c.open("/f", OpenOptions::new().read(true)).unwrap();
        let mut b = [0u8; 4];
        f.read_exact(&mut b).unwrap();
        assert_eq!(b, [round; 4], "round {round}");
    }
    // A random read of a large file fetches its chunk, not the file.
    put(&plain, "/big", &random_bytes(32 << 20, 2));
    let before = c.bytes_fetched();
    let f = c.open("/big", OpenOptions::new().read(true)).unwrap();
    let mut b = vec![0u8; 4096];
    assert_eq!(f.read_at(&mut b, 20 << 20).unwrap(), 4096);
    let got = c.bytes_fetched() - before;
    assert!(got <= 1 << 20, "a 4 KiB read fetched {got} bytes");
}

#[test]
fn library_reads_cached_files_locally_and_follows_changes() {
    library_cache(&[]);
}

#[test]
fn library_cache_in_memory() {
    library_cache(&["--memory"]);
}

#[test]
fn the_mount_serves_cached_files_and_sees_changes() {
    require_fuse();
    let srv = Server::start(&[]);
    let plain = srv.client();
    let data = random_bytes(3 << 20, 3);
    put(&plain, "/++data.bin", &data);
    put(&plain, "/bypassed", b"plain file");
    let tmp = TempDir::new("mountcache");
    let (mp, cache) = (tmp.path().join("mp"), tmp.path().join("cache"));
    std::fs::create_dir(&mp).unwrap();
    let _detach = Detach(mp.clone());
    let _m = mount_with_cache(&srv, &mp, &cache, &tmp.path().join("none.conf"), &[]);
    assert!(std::fs::read(mp.join("++data.bin")).unwrap() == data);
    let held: u64 = std::fs::read_dir(cache.join("v1"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".data"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert_eq!(held, data.len() as u64, "the cache does not hold the file");
    assert!(std::fs::read(mp.join("++data.bin")).unwrap() == data);
    let w = plain.open("/++data.bin", OpenOptions::new().write(true)).unwrap();
    w.write_at(b"NEW", 100).unwrap();
    w.close().unwrap();
    let mut want = data.clone();
    want[100..103].copy_from_slice(b"NEW");
    assert!(std::fs::read(mp.join("++data.bin")).unwrap() == want, "the mount served the old version");
    assert_eq!(std::fs::read(mp.join("bypassed")).unwrap(), b"plain file");
}

/// `ferry mount` of `srv` at `mp` with its client cache in `cache` (rules
/// from `conf`), once it answers.
fn mount_with_cache(srv: &Server, mp: &Path, cache: &Path, conf: &Path, extra: &[&str]) -> common::fuse::Mounted {
    let env = [("FERRY_CACHE_DIR", cache.to_str().unwrap()), ("FERRY_CACHE_CONFIG", conf.to_str().unwrap())];
    common::fuse::mount_url_env(&srv.url("/"), mp, &srv.token_file, extra, &env)
}

#[test]
fn ferry_run_gets_a_local_fd_of_a_cached_file() {
    let srv = Server::start(&[]);
    let plain = srv.client();
    let data = random_bytes(2 << 20, 4);
    put(&plain, "/++run.bin", &data);
    std::fs::write(srv.state.path().join("want"), &data).unwrap();
    let tmp = TempDir::new("runcache");
    let cache = tmp.path().join("cache");
    let script = format!(
        r#"
import mmap, os
want = open({want:?}, "rb").read()
fd = os.open("/remote/++run.bin", os.O_RDONLY)
target = os.readlink(f"/proc/self/fd/{{fd}}")
assert target.startswith({cache:?}), target
m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
assert m[:] == want
os.close(fd)
print("local", os.path.basename(target))
"#,
        want = srv.state.path().join("want").display().to_string(),
        cache = cache.display().to_string()
    );
    let run = |script: &str| {
        Command::new("timeout")
            .args(["60", FERRY, "run", "--mount"])
            .arg(format!("/remote={}", srv.url("/")))
            .args(["--", "python3", "-c", script])
            .env("FERRY_TOKEN_FILE", &srv.token_file)
            .env("FERRY_CACHE_DIR", &cache)
            .env("FERRY_CACHE_CONFIG", tmp.path().join("none.conf"))
            .env_remove("FERRY_MOUNTS")
            .output()
            .unwrap()
    };
    let first = ok(&run(&script));
    assert!(first.starts_with("local "), "{first}");
    // Another client writes; the next open gets the new version.
    let w = plain.open("/++run.bin", OpenOptions::new().write(true)).unwrap();
    w.write_at(b"Z", 0).unwrap();
    w.close().unwrap();
    let mut want = data.clone();
    want[0] = b'Z';
    std::fs::write(srv.state.path().join("want"), &want).unwrap();
    let second = ok(&run(&script));
    assert_ne!(first, second, "the same cache file served a changed file");
}

/// Reads of a cached file through the mount, told apart by the daemon's own
/// count of bytes it read (`/proc/PID/io`): with `--passthrough` the kernel
/// reads the local cache file itself and the daemon sees none of a read
/// whose page cache was dropped; by default the daemon serves such a read
/// from the local cache, and a later open of the unchanged file keeps the
/// pages, so a warm read reaches the daemon no more. Returns the daemon's
/// counts for a cold and a warm read.
fn mount_cached_reads(extra: &[&str]) -> (u64, u64) {
    require_fuse();
    let srv = Server::start(&[]);
    let plain = srv.client();
    let data = random_bytes(16 << 20, 5);
    put(&plain, "/++pt.bin", &data);
    let tmp = TempDir::new("passthrough");
    let (mp, cache) = (tmp.path().join("mp"), tmp.path().join("cache"));
    std::fs::create_dir(&mp).unwrap();
    let _detach = Detach(mp.clone());
    let m = mount_with_cache(&srv, &mp, &cache, &tmp.path().join("none.conf"), extra);
    assert!(std::fs::read(mp.join("++pt.bin")).unwrap() == data, "first read differs");
    let (again, cold) = common::fuse::read_counting(&mp.join("++pt.bin"), m.pid(), "rchar", true);
    assert!(again == data, "cold read differs");
    let (again, warm) = common::fuse::read_counting(&mp.join("++pt.bin"), m.pid(), "rchar", false);
    assert!(again == data, "warm read differs");
    (cold, warm)
}

#[test]
fn the_mount_reads_cached_files_from_kept_pages_or_with_passthrough() {
    let size = 16u64 << 20;
    let (cold, warm) = mount_cached_reads(&[]);
    eprintln!("page cache: the daemon read {cold} bytes cold, {warm} warm, for {size}");
    assert!(cold >= size / 2, "a cold read took only {cold} bytes of {size} from the daemon");
    assert!(warm < size / 8, "the daemon read {warm} bytes of an unchanged file whose pages were kept");
    let (cold, _) = mount_cached_reads(&["--passthrough"]);
    eprintln!("passthrough: the daemon read {cold} bytes cold for {size}");
    assert!(cold < size / 8, "the daemon read {cold} bytes for a passthrough file of {size}");
}

/// A program reading a cached file on the mount does not stop another from
/// opening it for writing (the kernel refuses, with `EIO`, every open of a
/// node with a passthrough backing that is not passthrough on it). By
/// default the writer writes, both see the write, and a change made on the
/// server meanwhile is seen at the next open (kept pages are only those of
/// the version an open finds). With `--passthrough` the writer is told
/// `ETXTBSY` while the reader lasts, and writes after.
#[test]
fn a_writer_opens_a_cached_file_a_program_reads_on_the_mount() {
    require_fuse();
    let srv = Server::start(&[]);
    let plain = srv.client();
    put(&plain, "/++w.bin", &random_bytes(3 << 20, 6));
    let tmp = TempDir::new("cachewriter");
    let script = r#"
import errno, os, sys
p, exported = sys.argv[1], sys.argv[2]
def read(fd):
    return os.pread(fd, 5, 0)
r = os.open(p, os.O_RDONLY)
first = read(r)
try:
    w = os.open(p, os.O_RDWR)
except OSError as e:
    assert e.errno == errno.ETXTBSY, e
    print("busy", end=" ")
    os.close(r)
    r = None
    w = os.open(p, os.O_RDWR)
assert os.pwrite(w, b"hello", 0) == 5
os.close(w)
if r is None:
    r = os.open(p, os.O_RDONLY)
r2 = os.open(p, os.O_RDONLY)
assert read(r2) == b"hello", read(r2)
os.close(r2)
assert read(r) == b"hello", ("a reader on the mount misses the mount's write", read(r))
os.close(r)
# Changed on the server (in place, same size, not through ferry): the old
# pages go. Under a lease of a server that watches its disk an open asks
# the server nothing, so the change shows once the server's notice of it
# came (milliseconds), not necessarily at the very next open.
import time
with open(exported, "r+b") as f:
    f.write(b"world")
deadline = time.monotonic() + 0.5
while True:
    r3 = os.open(p, os.O_RDONLY)
    got = read(r3)
    os.close(r3)
    if got == b"world" or time.monotonic() > deadline:
        break
    time.sleep(0.001)
assert got == b"world", got
print("ok")
"#;
    for (extra, want) in [(&[][..], "ok"), (&["--passthrough"][..], "busy ok")] {
        let (mp, cache) = (tmp.path().join("mp"), tmp.path().join("cache"));
        std::fs::create_dir_all(&mp).unwrap();
        let _detach = Detach(mp.clone());
        let _m = mount_with_cache(&srv, &mp, &cache, &tmp.path().join("none.conf"), extra);
        let o = Command::new("timeout")
            .args(["60", "python3", "-c", script])
            .arg(mp.join("++w.bin"))
            .arg(srv.export.path().join("++w.bin"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        assert_eq!(stdout(&o).trim(), want, "{extra:?}");
    }
}

/// A client that reconnects to a restarted server validates its cache
/// again at the next open: a file changed on the server while it was down
/// (same size, in place, not through ferry) is read anew; a file opened
/// before keeps the version it opened (close-to-open).
#[test]
fn after_a_server_restart_the_cache_is_validated_again() {
    use common::restart::Serve;
    let export = TempDir::new("rc-export");
    let state = TempDir::new("rc-state");
    let token = state.path().join("token");
    let mut server = Serve::start(export.path(), 0, &token);
    let port = server.port;
    let rules = Rules::parse(Path::new("test"), b"cache /**\n").unwrap();
    let cache = Cache::open(state.path().join("cache"), 1 << 30, rules).unwrap();
    let opts = Options {
        token: Some(std::fs::read_to_string(&token).unwrap().trim().as_bytes().to_vec()),
        reconnect: Some(Duration::from_secs(20)),
        cache: Some(Arc::new(cache)),
        ..Options::default()
    };
    let c = Client::connect(&format!("127.0.0.1:{port}"), &opts).unwrap();
    let data = random_bytes(3 << 20, 31);
    put(&c, "/c.bin", &data);
    put(&c, "/same.bin", &data[..1 << 20]);
    assert!(read_all(&c, "/c.bin") == data);
    assert!(read_all(&c, "/same.bin") == data[..1 << 20]);
    let before = c.bytes_fetched();
    assert!(read_all(&c, "/c.bin") == data);
    assert_eq!(c.bytes_fetched() - before, 0, "a warm read went to the server");
    let f = c.open("/c.bin", OpenOptions::new().read(true)).unwrap();
    assert!(f.is_cached());

    server.kill();
    let local = std::fs::OpenOptions::new().write(true).open(export.path().join("c.bin")).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&local, b"CHANGED", 1 << 20).unwrap();
    drop(local);
    let mut want = data.clone();
    want[1 << 20..(1 << 20) + 7].copy_from_slice(b"CHANGED");
    let _server = Serve::start(export.path(), port, &token);

    assert!(read_all(&c, "/c.bin") == want, "after the restart the cache served the old version");
    assert!(read_all(&c, "/same.bin") == data[..1 << 20]);
    let mut b = [0u8; 7];
    assert_eq!(f.read_at(&mut b, 1 << 20).unwrap(), 7);
    assert_eq!(b[..], data[1 << 20..(1 << 20) + 7], "a file open before the change changed under its reader");
    f.close().unwrap();
}

/// The `cache.conf` example of the docs, as written there (comments and
/// all), the first fenced block that starts with a `cache` rule.
fn documented_cache_conf() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = vec![root.join("README.md")];
    if let Ok(d) = std::fs::read_dir(root.join("docs")) {
        files.extend(d.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "md")));
    }
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let mut lines = text.lines();
        while let Some(l) = lines.next() {
            if l.trim_start().starts_with("```") {
                let block: Vec<&str> = lines.by_ref().take_while(|l| !l.trim_start().starts_with("```")).collect();
                if block.first().is_some_and(|l| l.trim_start().starts_with("cache ")) {
                    return block.iter().map(|l| format!("{}\n", l.trim_start())).collect();
                }
            }
        }
    }
    panic!("no cache.conf example (a block starting with `cache `) in README.md or docs/");
}

/// The documented example works as written: its comments are comments, its
/// rules match, its `dir` is the directory named.
#[test]
fn the_documented_cache_conf_example_works_as_written() {
    let srv = Server::start(&[]);
    let c = srv.client();
    c.create_dir("/datasets", 0o755).unwrap();
    for f in ["/datasets/a.bin", "/datasets/x.tmp", "/img.iso", "/other"] {
        put(&c, f, b"x");
    }
    let tmp = TempDir::new("docconf");
    let conf = tmp.path().join("cache.conf");
    let text = documented_cache_conf();
    std::fs::write(&conf, &text).unwrap();
    let at = |n: usize| format!("(rule at {}:{n})", conf.display());
    assert_eq!(get(&srv, &conf, "/datasets/a.bin"), format!("/datasets/a.bin: cache {}", at(1)));
    assert_eq!(get(&srv, &conf, "/datasets/x.tmp"), format!("/datasets/x.tmp: cache {}", at(1)));
    assert_eq!(get(&srv, &conf, "/img.iso"), format!("/img.iso: cache {}", at(3)));
    assert_eq!(get(&srv, &conf, "/other"), "/other: bypass (default)");
    let rules = Rules::load(&conf).unwrap();
    assert_eq!(rules.dir.as_deref(), Some(Path::new("/var/cache/ferry")));
    assert_eq!(rules.size, Some(20 << 30));
}

/// Requests the mount at `metrics` answered so far, pings (keep-alives,
/// which follow the clock) left out.
fn mount_requests(metrics: &str) -> u64 {
    let (_, body) = common::scrape::get(metrics, "/metrics");
    body.lines()
        .filter(|l| l.starts_with("ferry_client_requests_total{") && !l.contains("op=\"ping\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Every cache on (`--cache` and a rule caching everything) costs the mount
/// no request the default mount does not make, under a lease of a server
/// that watches its disk, on what `git` and `tar` do with small files:
/// each made under a temporary name, renamed, then read three times. And
/// files their opens brought whole (64 KiB or less) are not put in the
/// disk cache. Before, a `--cache` mount wrote through the page cache (the
/// kernel asked the server for each file's `security.capability`, and the
/// reads of a file it had written went to the server for 3 s), and each
/// small file read made a disk cache entry: ~25 system calls and two files.
#[test]
fn caches_on_ask_the_server_no_more_than_caches_off_for_small_files() {
    require_fuse();
    let srv = Server::start(&[]);
    let w = common::fuse::wait_for(Duration::from_secs(10), || srv.log().contains("watching"));
    assert!(w, "the server watches its export: {}", srv.log());
    let tmp = TempDir::new("cacheson");
    let conf = tmp.path().join("all.conf");
    std::fs::write(&conf, "cache /**\n").unwrap();
    let cache = tmp.path().join("cache");
    let script = r#"
import os, sys
d = sys.argv[1]
os.mkdir(d)
for i in range(60):
    t = f"{d}/tmp_{i}"
    fd = os.open(t, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, bytes([i]) * (1000 + 50 * i))
    os.close(fd)
    os.rename(t, f"{d}/f{i}")
for r in range(3):
    for i in range(60):
        with open(f"{d}/f{i}", "rb") as f:
            assert f.read() == bytes([i]) * (1000 + 50 * i)
"#;
    let mut asked = Vec::new();
    for (name, on) in [("off", false), ("on", true)] {
        let mp = tmp.path().join(format!("mp-{name}"));
        std::fs::create_dir(&mp).unwrap();
        let _detach = Detach(mp.clone());
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let metrics = format!("127.0.0.1:{port}");
        let mut extra = vec!["--metrics", &metrics];
        // Both over TCP: a `--cache` mount does not take the same-host
        // path (ARCHITECTURE.md), which spares the default mount requests
        // on the server's host.
        let env: Vec<(&str, &str)> = if on {
            extra.push("--cache");
            vec![
                ("FERRY_CACHE_DIR", cache.to_str().unwrap()),
                ("FERRY_CACHE_CONFIG", conf.to_str().unwrap()),
                ("FERRY_SAME_HOST", "0"),
            ]
        } else {
            vec![("FERRY_CACHE", "off"), ("FERRY_SAME_HOST", "0")]
        };
        let _m = common::fuse::mount_url_env(&srv.url("/"), &mp, &srv.token_file, &extra, &env);
        assert!(common::fuse::wait_for(Duration::from_secs(10), || std::net::TcpStream::connect(&metrics).is_ok()));
        let before = mount_requests(&metrics);
        let o = Command::new("timeout").args(["60", "python3", "-c", script]).arg(mp.join(name)).output().unwrap();
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        asked.push(mount_requests(&metrics) - before);
    }
    let (off, on) = (asked[0], asked[1]);
    eprintln!("requests: caches off {off}, caches on {on}");
    assert!(on <= off + off / 20, "caches on asked the server {on} times, caches off {off}");
    let held = std::fs::read_dir(cache.join("v1")).map(|d| d.flatten().count()).unwrap_or(0);
    assert!(held <= 2, "the disk cache holds {held} files for small files the opens brought whole");
}

/// `ferry run` with a cache policy opens a cached file again without
/// asking the server while its lease of a server that sees every change
/// holds: 20 opens of a 1 MiB file cost one `OpenCached`, and each gets a
/// descriptor of the local copy. Another client's write breaks the lease
/// before it is acknowledged, so the next open asks again and gets the new
/// version. Before, every open was validated by a round trip.
#[test]
fn ferry_run_opens_a_cached_file_again_by_its_lease() {
    use std::io::BufRead;
    let srv = Server::start(&["--metrics", "127.0.0.1:0"]);
    let w = common::fuse::wait_for(Duration::from_secs(10), || srv.log().contains("watching"));
    assert!(w, "the server watches its export: {}", srv.log());
    let metrics = common::scrape::metrics_addr(&srv);
    let opens = || {
        let (_, body) = common::scrape::get(&metrics, "/metrics");
        common::scrape::sample(&body, "ferry_requests_total{op=\"open_cached\"}") as u64
    };
    let plain = srv.client();
    let data = random_bytes(1 << 20, 7);
    put(&plain, "/++lease.bin", &data);
    let tmp = TempDir::new("runlease");
    let cache = tmp.path().join("cache");
    let script = format!(
        r#"
import os, sys
p = "/remote/++lease.bin"
first = None
for i in range(20):
    fd = os.open(p, os.O_RDONLY)
    target = os.readlink(f"/proc/self/fd/{{fd}}")
    assert target.startswith({cache:?}), target
    got = os.pread(fd, 16, 0)
    first = first or got
    assert got == first
    os.close(fd)
print("opened", first.hex(), flush=True)
sys.stdin.readline()
fd = os.open(p, os.O_RDONLY)
print("again", os.pread(fd, 16, 0).hex(), flush=True)
"#,
        cache = cache.display().to_string()
    );
    let mut child = Command::new("timeout")
        .args(["60", FERRY, "run", "--mount"])
        .arg(format!("/remote={}", srv.url("/")))
        .args(["--", "python3", "-c", &script])
        .env("FERRY_TOKEN_FILE", &srv.token_file)
        .env("FERRY_CACHE_DIR", &cache)
        .env("FERRY_CACHE_CONFIG", tmp.path().join("none.conf"))
        .env_remove("FERRY_MOUNTS")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let before = opens();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), format!("opened {}", hex(&data[..16])), "the copy differs");
    let asked = opens() - before;
    eprintln!("20 opens of a cached file under a lease: {asked} OpenCached");
    // Another client changes the file; its write returns once the lease broke.
    let w = plain.open("/++lease.bin", OpenOptions::new().write(true)).unwrap();
    w.write_at(b"CHANGED", 0).unwrap();
    w.close().unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    let mut want = data[..16].to_vec();
    want[..7].copy_from_slice(b"CHANGED");
    assert_eq!(line.trim(), format!("again {}", hex(&want)), "an open after a change got the old copy");
    assert!(child.wait().unwrap().success());
    assert!(asked <= 2, "20 opens under a lease asked the server {asked} times");
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
