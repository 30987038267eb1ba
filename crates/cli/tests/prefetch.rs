//! Adaptive read-ahead with real servers: sequential reads of any size are
//! fetched ahead with a window that grows to tens of MiB, random reads
//! fetch nothing extra (bytes fetched ÷ bytes read ≤ 1.05), through the
//! library, the mount and `ferry run`. Bytes fetched are counted by the
//! client library, and for the mount and `ferry run` by the server
//! process's own count of bytes it wrote (`/proc/PID/io`).

mod common;

use std::io::{Read, Seek, SeekFrom, Write};
use std::process::Command;

use common::fuse::{mount_url_env, require_fuse, Detach};
use common::preload::ok;
use common::{random_bytes, stdout, Rng, Server, TempDir, FERRY};
use ferry_client::{Client, OpenOptions, READ_AHEAD_MAX};

fn put(c: &Client, path: &str, data: &[u8]) {
    let mut f = c.open(path, OpenOptions::new().write(true).create(true).truncate(true)).unwrap();
    f.write_all(data).unwrap();
    f.close().unwrap();
}

const SIZES: [usize; 7] = [4096, 100_003, 1 << 20, 7, 300_000, 65536, 2 << 20];

#[test]
fn sequential_reads_of_any_size_are_fetched_ahead_and_random_ones_are_not() {
    let srv = Server::start(&[]);
    let c = srv.tcp_client();
    let len = 48 << 20;
    let data = random_bytes(len, 21);
    put(&c, "/big", &data);

    // Stream reads whose sizes keep changing.
    let mut f = c.open("/big", OpenOptions::new().read(true)).unwrap();
    let (fetched0, ahead0) = (c.bytes_fetched(), c.bytes_read_ahead());
    let mut out = Vec::with_capacity(len);
    let mut widest = 0;
    for i in 0.. {
        let mut buf = vec![0u8; SIZES[i % SIZES.len()]];
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        widest = widest.max(f.read_ahead_window());
    }
    assert!(out == data, "the data read differs");
    let fetched = c.bytes_fetched() - fetched0;
    let ahead = c.bytes_read_ahead() - ahead0;
    assert!(widest >= 16 << 20, "the window grew only to {widest} bytes");
    assert!(widest <= READ_AHEAD_MAX, "the window grew to {widest} bytes");
    assert!(ahead >= len as u64 / 2, "only {ahead} of {len} bytes were fetched ahead");
    assert!(fetched <= len as u64 * 105 / 100, "{fetched} bytes fetched for {len} read");

    // Positional reads in sequence, sizes changing, from another handle.
    let g = c.open("/big", OpenOptions::new().read(true)).unwrap();
    let ahead0 = c.bytes_read_ahead();
    let mut pos = 0usize;
    for i in 0.. {
        let n = SIZES[(i * 3) % SIZES.len()].min(len - pos);
        if n == 0 {
            break;
        }
        let mut buf = vec![0u8; n];
        assert_eq!(g.read_at(&mut buf, pos as u64).unwrap(), n);
        assert!(buf == data[pos..pos + n], "read_at {n} at {pos}");
        pos += n;
    }
    assert!(c.bytes_read_ahead() - ahead0 >= len as u64 / 2, "positional sequential reads were not fetched ahead");

    // A random read collapses the window; random reads fetch only what
    // they ask for.
    assert!(g.read_ahead_window() > 0);
    let mut rng = Rng::new(0x2545_F491_4F6C_DD1D);
    let (fetched0, ahead0) = (c.bytes_fetched(), c.bytes_read_ahead());
    let mut read = 0u64;
    for i in 0..1500 {
        let n = [4096usize, 8192, 16384, 65536, 1][rng.below(5) as usize];
        let at = rng.below((len - n) as u64) as usize;
        let mut buf = vec![0u8; n];
        if i % 2 == 0 {
            assert_eq!(g.read_at(&mut buf, at as u64).unwrap(), n);
        } else {
            f.seek(SeekFrom::Start(at as u64)).unwrap();
            f.read_exact(&mut buf).unwrap();
        }
        assert!(buf == data[at..at + n], "random read of {n} at {at}");
        read += n as u64;
        if i == 0 {
            assert_eq!(g.read_ahead_window(), 0, "a random read left the window open");
        }
    }
    let fetched = c.bytes_fetched() - fetched0;
    assert!(fetched * 100 <= read * 105, "random reads: {fetched} bytes fetched for {read} read");
    assert!(c.bytes_read_ahead() - ahead0 <= read / 20, "random reads were fetched ahead");

    // A sequence that starts again grows again.
    let mut buf = vec![0u8; 1 << 20];
    for k in 10..20 {
        assert_eq!(g.read_at(&mut buf, k << 20).unwrap(), buf.len());
        assert!(buf == data[(k << 20) as usize..((k + 1) << 20) as usize]);
    }
    assert!(g.read_ahead_window() >= 8 << 20, "the window did not grow again: {}", g.read_ahead_window());
    drop(g);
    f.close().unwrap();
    c.ping().unwrap();
}

/// Reads a file sequentially in changing sizes, then at random, and prints
/// what the server process wrote meanwhile (its `wchar`).
const READER: &str = r#"
import hashlib, os, random, sys, time
path, pid, size, want = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def sent():
    for l in open(f"/proc/{pid}/io"):
        if l.startswith("wchar:"):
            return int(l.split()[1])
sizes = [262144, 4096, 100003, 1048576, 65536, 300000]
fd = os.open(path, os.O_RDONLY)
s0 = sent()
h = hashlib.sha256()
pos = i = 0
while pos < 8 << 20:
    b = os.read(fd, sizes[i % len(sizes)]); i += 1
    h.update(b); pos += len(b)
time.sleep(0.5)
ahead = sent() - s0 - pos
while True:
    b = os.read(fd, sizes[i % len(sizes)]); i += 1
    if not b:
        break
    h.update(b); pos += len(b)
total = sent() - s0
os.close(fd)
assert pos == size and h.hexdigest() == want, (pos, size)
rng = random.Random(7)
fd = os.open(path, os.O_RDONLY)
s0 = sent()
got = 0
for _ in range(1500):
    n = rng.choice([4096, 8192, 16384, 65536])
    got += len(os.pread(fd, n, rng.randrange(0, size - n)))
fetched = sent() - s0
os.close(fd)
print(ahead, total, got, fetched)
"#;

fn sha256(data: &[u8]) -> String {
    let tmp = TempDir::new("sha");
    std::fs::write(tmp.path().join("f"), data).unwrap();
    let o = Command::new("sha256sum").arg(tmp.path().join("f")).output().unwrap();
    stdout(&o).split_whitespace().next().unwrap().to_string()
}

/// Checks the figures READER printed.
fn check(what: &str, out: &str, size: u64) {
    let v: Vec<u64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
    let [ahead, total, got, fetched] = v[..] else { panic!("{what}: reader printed {out:?}") };
    eprintln!("{what}: ahead of the reader {ahead}, sequential total {total} for {size}, random {fetched} for {got}");
    assert!(ahead >= 2 << 20, "{what}: only {ahead} bytes fetched ahead of a sequential reader");
    assert!(total <= size * 105 / 100, "{what}: {total} bytes sent for a {size}-byte file read once");
    assert!(fetched * 100 <= got * 105, "{what}: random reads: {fetched} bytes sent for {got} read");
}

fn reader_setup(srv: &Server) -> (u64, String) {
    let c = srv.tcp_client();
    let data = random_bytes(40 << 20, 22);
    put(&c, "/seq.bin", &data);
    (data.len() as u64, sha256(&data))
}

#[test]
fn the_mount_fetches_ahead_of_sequential_readers_only() {
    require_fuse();
    let srv = Server::start(&[]);
    let (size, sum) = reader_setup(&srv);
    let tmp = TempDir::new("prefetch-mount");
    let mp = tmp.path().join("mp");
    std::fs::create_dir(&mp).unwrap();
    let _detach = Detach(mp.clone());
    let _m = mount_url_env(&srv.url("/"), &mp, &srv.token_file, &[], &[("FERRY_SAME_HOST", "0")]);
    let path = mp.join("seq.bin");
    let o = Command::new("timeout")
        .args(["120", "python3", "-c", READER])
        .arg(&path)
        .args([srv.pid().to_string(), size.to_string(), sum])
        .output()
        .unwrap();
    check("mount", &ok(&o), size);
}

#[test]
fn ferry_run_fetches_ahead_of_sequential_readers_only() {
    let srv = Server::start(&[]);
    let (size, sum) = reader_setup(&srv);
    let o = Command::new("timeout")
        .args(["120", FERRY, "run", "--mount"])
        .arg(format!("/remote={}", srv.url("/")))
        .args(["--", "python3", "-c", READER, "/remote/seq.bin"])
        .args([srv.pid().to_string(), size.to_string(), sum])
        .env("FERRY_TOKEN_FILE", &srv.token_file)
        // The TCP data path: on the server's host a reader would get its
        // descriptor and the server would send nothing.
        .env("FERRY_SAME_HOST", "0")
        .env_remove("FERRY_MOUNTS")
        .output()
        .unwrap();
    check("ferry run", &ok(&o), size);
}

/// One read larger than the server's byte window (256 MiB) goes as several
/// requests collected in order: each reply lands in its part of the
/// caller's buffer, none is received aside and copied (they all were, when
/// the next request waited for room by reading replies itself).
#[test]
fn a_read_larger_than_the_window_lands_in_place() {
    let srv = Server::start(&[]);
    let len = 320 << 20;
    let data = random_bytes(len, 5);
    std::fs::write(srv.export.path().join("huge"), &data).unwrap();
    let c = srv.tcp_client();
    let f = c.open("/huge", OpenOptions::new().read(true)).unwrap();
    // On a page: a buffer off a cache line is received through the file's
    // aligned buffer instead (the next test).
    let mut v = vec![0u8; len + 4096];
    let at = v.as_ptr().align_offset(4096);
    let buf = &mut v[at..at + len];
    let aside0 = c.engine().bytes_read_aside();
    assert_eq!(f.read_at(buf, 0).unwrap(), len);
    assert!(*buf == data[..], "the data read differs");
    assert_eq!(c.engine().bytes_read_aside() - aside0, 0, "bytes received aside and copied");
    f.close().unwrap();
}

/// Reads into buffers that start off a cache line, as a program's own
/// `malloc`ed ones do, are received into the thread's aligned buffer and
/// copied over (the kernel's receive copy costs 2-4 times more into them):
/// the data must be the file's, for reads smaller and larger than the
/// piece the copy goes by, across the file's end, sequential and
/// positional, and with two threads reading one file at once.
#[test]
fn reads_into_buffers_off_a_cache_line_get_the_files_bytes() {
    let srv = Server::start(&[]);
    let len = (12 << 20) + 12_345;
    let data = random_bytes(len, 34);
    std::fs::write(srv.export.path().join("f"), &data).unwrap();
    let c = srv.tcp_client();
    let sizes = [16 << 10, 100_003, 1 << 20, (3 << 20) + 5, 65_536];
    for (i, skew) in [1usize, 16, 48, 4095].into_iter().enumerate() {
        let mut f = c.open("/f", OpenOptions::new().read(true)).unwrap();
        let mut out = Vec::with_capacity(len);
        for k in 0.. {
            let n = sizes[(k + i) % sizes.len()];
            let mut v = vec![0u8; n + 4096 + skew];
            let at = v.as_ptr().align_offset(4096) + skew;
            let got = f.read(&mut v[at..at + n]).unwrap();
            if got == 0 {
                break;
            }
            out.extend_from_slice(&v[at..at + got]);
        }
        assert!(out == data, "sequential reads at skew {skew} differ");
        f.close().unwrap();
    }
    let f = c.open("/f", OpenOptions::new().read(true)).unwrap();
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (f, data) = (&f, &data);
            s.spawn(move || {
                let mut rng = Rng::new(0x9E37_79B9 + t);
                for _ in 0..60 {
                    let n = [20_000usize, 1 << 20, (2 << 20) + 3][rng.below(3) as usize];
                    let pos = rng.below(len as u64) as usize;
                    let mut v = vec![0u8; n + 4096 + 16];
                    let at = v.as_ptr().align_offset(4096) + 16;
                    let got = f.read_at(&mut v[at..at + n], pos as u64).unwrap();
                    assert_eq!(got, n.min(len - pos), "read_at {n} at {pos}");
                    assert!(v[at..at + got] == data[pos..pos + got], "read_at {n} at {pos} differs");
                }
            });
        }
    });
    f.close().unwrap();
}
