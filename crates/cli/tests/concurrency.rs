//! Many clients at once against one `ferry serve`: 200 connections doing
//! mixed work, and many threads sharing one connection. Every byte read is
//! checked; a deadline turns a hang into a failure.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use common::{random_bytes, Rng, Server};
use ferry_client::{Client, OpenOptions};

/// Time the whole of one test may take before it is declared hung.
const DEADLINE: Duration = Duration::from_secs(120);

const SHARED_LEN: usize = 4 * 1024 * 1024;

type Outcome = Result<(), String>;

/// Runs `f` on its own thread; its result (or panic message) goes to `tx`.
fn spawn_worker<F>(name: String, tx: mpsc::Sender<(String, Outcome)>, f: F)
where
    F: FnOnce() -> Outcome + Send + 'static,
{
    thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            let r = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panic".into());
                Err(format!("panicked: {msg}"))
            });
            let _ = tx.send((name, r));
        })
        .expect("spawn worker thread");
}

/// Collects `n` outcomes, failing the test on the first error or when the
/// deadline passes (the server guard then kills the server, which unblocks
/// any worker still waiting on it).
fn collect(rx: mpsc::Receiver<(String, Outcome)>, n: usize, start: Instant) {
    let mut errors = Vec::new();
    for done in 0..n {
        let left = DEADLINE.saturating_sub(start.elapsed());
        match rx.recv_timeout(left) {
            Ok((_, Ok(()))) => {}
            Ok((name, Err(e))) => errors.push(format!("{name}: {e}")),
            Err(_) => {
                panic!("hung: only {done} of {n} workers finished within {DEADLINE:?}; errors so far: {:#?}", errors)
            }
        }
    }
    assert!(errors.is_empty(), "{} of {n} workers failed:\n{}", errors.len(), errors.join("\n"));
}

fn check(got: &[u8], want: &[u8], what: &str) -> Outcome {
    if got == want {
        return Ok(());
    }
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    Err(format!("{what}: {} bytes vs {} expected, first difference at {first:?}", got.len(), want.len()))
}

fn ensure(cond: bool, what: impl FnOnce() -> String) -> Outcome {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

/// 1 B to 2 MiB, the big ones rarer.
const SIZES: [usize; 12] =
    [1, 7, 100, 4096, 4097, 20_000, 65_536, 131_073, 300_001, 1 << 20, (1 << 20) + 12_345, 2 << 20];

const ITERATIONS: usize = 5;

/// One of the 200 clients: its own connection, its own directory.
fn client_work(
    i: usize,
    client: ferry_client::Result<Client>,
    barrier: &Barrier,
    shared: &[u8],
    sizes_seen: &std::sync::Mutex<BTreeMap<usize, usize>>,
) -> Outcome {
    // Everyone is connected before anyone starts working.
    barrier.wait();
    let c = client.map_err(|e| format!("connect: {e}"))?;
    let e = |what: &str| {
        let what = what.to_string();
        move |err: ferry_client::Error| format!("{what}: {err}")
    };
    let mut rng = Rng::new(0x1234_5678 + i as u64 * 7919);
    let dir = format!("/c{i:03}");
    c.create_dir(&dir, 0o755).map_err(e("mkdir"))?;
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();

    for it in 0..ITERATIONS {
        let size = SIZES[(i * 5 + it * 7 + rng.index(3)) % SIZES.len()];
        *sizes_seen.lock().unwrap().entry(size).or_default() += 1;
        let data = random_bytes(size, (i * 1000 + it) as u64 + 1);
        let path = format!("{dir}/f{it}");

        // Write it, three different ways.
        match (i + it) % 3 {
            0 => c.write(&path, &data).map_err(e("write"))?,
            1 => {
                let mut f = c
                    .open(&path, OpenOptions::new().write(true).create_new(true))
                    .map_err(e("open for write-behind"))?;
                for part in data.chunks(1 + rng.index(70_000)) {
                    f.write_all(part).map_err(|x| format!("write_all: {x}"))?;
                }
                f.close().map_err(e("close"))?;
            }
            _ => {
                let f = c
                    .open(&path, OpenOptions::new().read(true).write(true).create(true))
                    .map_err(e("open for write_at"))?;
                let half = data.len() / 2;
                f.write_at(&data[half..], half as u64).map_err(e("write_at 2nd half"))?;
                f.write_at(&data[..half], 0).map_err(e("write_at 1st half"))?;
                f.close().map_err(e("close"))?;
            }
        }

        // Stat.
        let a = c.metadata(&path).map_err(e("stat"))?;
        ensure(a.is_file() && a.size == size as u64, || format!("stat {path}: {a:?}, want size {size}"))?;

        // Read it back, three different ways.
        let back = match (i + it) % 3 {
            0 => {
                let mut f = c.open(&path, OpenOptions::new().read(true)).map_err(e("open for read"))?;
                let mut out = vec![0u8; size];
                let chunk = [4096, 65_536, 1 << 20][rng.index(3)];
                for part in out.chunks_mut(chunk) {
                    f.read_exact(part).map_err(|x| format!("read_exact: {x}"))?;
                }
                f.close().map_err(e("close"))?;
                out
            }
            1 => {
                let f = c.open(&path, OpenOptions::new().read(true)).map_err(e("open for read_at"))?;
                let mut out = vec![0u8; size + 10];
                let n = f.read_at(&mut out, 0).map_err(e("read_at"))?;
                out.truncate(n);
                f.close().map_err(e("close"))?;
                out
            }
            _ => c.read(&path).map_err(e("read"))?,
        };
        check(&back, &data, &format!("read back {path}"))?;

        // List the directory: exactly the files so far, with attributes.
        files.insert(format!("f{it}"), data);
        let mut listed: Vec<(String, u64)> = c
            .read_dir(&dir)
            .map_err(e("read_dir"))?
            .into_iter()
            .map(|d| (String::from_utf8_lossy(&d.name).into_owned(), d.attr.map_or(u64::MAX, |a| a.size)))
            .collect();
        listed.sort();
        let want: Vec<(String, u64)> = files.iter().map(|(n, d)| (n.clone(), d.len() as u64)).collect();
        ensure(listed == want, || format!("read_dir {dir}: {listed:?}, want {want:?}"))?;

        // Rename, and check both names.
        let renamed = format!("g{it}");
        c.rename(&path, format!("{dir}/{renamed}")).map_err(e("rename"))?;
        let data = files.remove(&format!("f{it}")).expect("just inserted");
        match c.metadata(&path) {
            Err(x) if x.errno() == libc::ENOENT => {}
            other => return Err(format!("old name {path} after rename: {other:?}")),
        }
        files.insert(renamed, data);

        // A slice of the shared file.
        let off = rng.index(SHARED_LEN);
        let len = (1 + rng.index(512 * 1024)).min(SHARED_LEN - off);
        let f = c.open("/shared", OpenOptions::new().read(true)).map_err(e("open shared"))?;
        let mut buf = vec![0u8; len];
        let n = f.read_at(&mut buf, off as u64).map_err(e("read_at shared"))?;
        ensure(n == len, || format!("shared read_at {off}+{len}: got {n}"))?;
        check(&buf, &shared[off..off + len], &format!("shared slice at {off}"))?;
        f.close().map_err(e("close shared"))?;
    }

    // The whole shared file, sequentially.
    let mut f = c.open("/shared", OpenOptions::new().read(true)).map_err(e("open shared"))?;
    let mut all = vec![0u8; SHARED_LEN];
    for part in all.chunks_mut(256 * 1024) {
        f.read_exact(part).map_err(|x| format!("read shared: {x}"))?;
    }
    f.close().map_err(e("close shared"))?;
    check(&all, shared, "whole shared file")?;

    // Everything this client wrote is still exactly there.
    for (name, data) in &files {
        check(&c.read(format!("{dir}/{name}")).map_err(e("final read"))?, data, &format!("final {dir}/{name}"))?;
    }
    c.remove_dir_all(&dir).map_err(e("remove_dir_all"))?;
    match c.metadata(&dir) {
        Err(x) if x.errno() == libc::ENOENT => Ok(()),
        other => Err(format!("{dir} after remove_dir_all: {other:?}")),
    }
}

#[test]
fn two_hundred_concurrent_clients_dir() {
    two_hundred_concurrent_clients(&[]);
}

#[test]
fn two_hundred_concurrent_clients_memory() {
    two_hundred_concurrent_clients(&["--memory"]);
}

fn two_hundred_concurrent_clients(backend: &[&str]) {
    const CLIENTS: usize = 200;
    let start = Instant::now();
    let server = Server::start(backend);
    let shared = Arc::new(random_bytes(SHARED_LEN, 4242));
    server.client().write("/shared", &shared).unwrap();
    let barrier = Arc::new(Barrier::new(CLIENTS));
    let sizes_seen = Arc::new(std::sync::Mutex::new(BTreeMap::new()));
    let (tx, rx) = mpsc::channel();
    for i in 0..CLIENTS {
        let (addr, opts) = (server.addr(), server.options());
        let (barrier, shared, sizes_seen) = (Arc::clone(&barrier), Arc::clone(&shared), Arc::clone(&sizes_seen));
        spawn_worker(format!("client-{i}"), tx.clone(), move || {
            // Each thread its own connection, all open at the same time.
            let client = Client::connect(&addr, &opts);
            client_work(i, client, &barrier, &shared, &sizes_seen)
        });
    }
    drop(tx);
    collect(rx, CLIENTS, start);

    // The mix really was mixed, and nothing was left behind.
    let seen = sizes_seen.lock().unwrap();
    assert!(seen.contains_key(&1) && seen.contains_key(&(2 << 20)), "sizes used: {seen:?}");
    let c = server.client();
    let names: Vec<String> =
        c.read_dir("/").unwrap().into_iter().map(|d| String::from_utf8_lossy(&d.name).into_owned()).collect();
    assert_eq!(names, ["shared"]);
    assert_eq!(c.read("/shared").unwrap(), *shared);
}

/// Threads sharing ONE connection, each with its own files, all pipelining
/// at once: every reply must reach the thread that asked for it.
fn shared_connection(server: &Server) {
    const THREADS: usize = 16;
    let start = Instant::now();
    let client = server.client();
    let shared = Arc::new(random_bytes(SHARED_LEN, 77));
    client.write("/shared", &shared).unwrap();
    let (tx, rx) = mpsc::channel();
    let barrier = Arc::new(Barrier::new(THREADS));
    for t in 0..THREADS {
        let (c, shared, barrier) = (client.clone(), Arc::clone(&shared), Arc::clone(&barrier));
        spawn_worker(format!("thread-{t}"), tx.clone(), move || {
            barrier.wait();
            shared_connection_work(t, &c, &shared)
        });
    }
    drop(tx);
    collect(rx, THREADS, start);
    // The connection is still in order afterwards.
    client.ping().unwrap();
    assert_eq!(client.read("/shared").unwrap(), *shared);
    for t in 0..THREADS {
        let a = client.metadata(format!("/t{t}")).unwrap();
        assert_eq!(a.size, (3 << 20) as u64, "t{t}");
    }
}

fn shared_connection_work(t: usize, c: &Client, shared: &[u8]) -> Outcome {
    const ROUNDS: usize = 6;
    let e = |what: &'static str| move |err: ferry_client::Error| format!("{what}: {err}");
    let io = |what: &'static str| move |err: std::io::Error| format!("{what}: {err}");
    let mut rng = Rng::new(0xDEAD_BEEF + t as u64);
    let path = format!("/t{t}");
    let len = 3 << 20;
    let mut model = random_bytes(len, 500 + t as u64);
    let mut f = c
        .open(&path, OpenOptions::new().read(true).write(true).create(true).truncate(true))
        .map_err(e("open own file"))?;
    // Write-behind: many small stream writes.
    for part in model.chunks(3000 + t * 17) {
        f.write_all(part).map_err(io("write_all"))?;
    }
    f.flush().map_err(io("flush"))?;
    let mut sf = c.open("/shared", OpenOptions::new().read(true)).map_err(e("open shared"))?;

    for round in 0..ROUNDS {
        // One large read, split into several requests in flight.
        let mut big = vec![0u8; len];
        let n = f.read_at(&mut big, 0).map_err(e("read_at whole"))?;
        ensure(n == len, || format!("round {round}: read_at got {n}"))?;
        check(&big, &model, &format!("round {round}: whole own file"))?;

        // A large positional write, then stream writes (write-behind).
        let off = rng.index(len - (1 << 20));
        let patch = random_bytes(1 + rng.index(1 << 20), (t * 100 + round) as u64);
        f.write_at(&patch, off as u64).map_err(e("write_at"))?;
        model[off..off + patch.len()].copy_from_slice(&patch);
        let off2 = rng.index(len - 100_000);
        f.seek(SeekFrom::Start(off2 as u64)).map_err(io("seek"))?;
        for k in 0..50usize {
            let piece = [(t * 31 + round * 7 + k) as u8; 2000];
            f.write_all(&piece).map_err(io("stream write"))?;
            model[off2 + k * 2000..off2 + (k + 1) * 2000].copy_from_slice(&piece);
        }

        // Small sequential reads with read-ahead, from a random place.
        let from = rng.index(len - 200 * 4096);
        f.seek(SeekFrom::Start(from as u64)).map_err(io("seek"))?;
        let mut buf = [0u8; 4096];
        for k in 0..200 {
            f.read_exact(&mut buf).map_err(io("read_exact"))?;
            let at = from + k * 4096;
            check(&buf, &model[at..at + 4096], &format!("round {round}: 4 KiB read at {at}"))?;
        }

        // Sequential reads of the shared file on its own handle.
        let soff = rng.index(SHARED_LEN - 64 * 16 * 1024);
        sf.seek(SeekFrom::Start(soff as u64)).map_err(io("seek shared"))?;
        let mut sbuf = vec![0u8; 16 * 1024];
        for k in 0..64 {
            sf.read_exact(&mut sbuf).map_err(io("read shared"))?;
            let at = soff + k * sbuf.len();
            check(&sbuf, &shared[at..at + sbuf.len()], &format!("round {round}: shared read at {at}"))?;
        }
        // And a big split read of it.
        let mut sbig = vec![0u8; 2 << 20];
        let soff = rng.index(SHARED_LEN - sbig.len());
        ensure(sf.read_at(&mut sbig, soff as u64).map_err(e("read_at shared"))? == sbig.len(), || {
            "short shared read_at".into()
        })?;
        check(&sbig, &shared[soff..soff + sbig.len()], &format!("round {round}: shared read_at {soff}"))?;

        // Metadata calls mixed in.
        let a = f.metadata().map_err(e("fstat"))?;
        ensure(a.size == len as u64, || format!("round {round}: size {}", a.size))?;
    }
    f.close().map_err(e("close"))?;
    sf.close().map_err(e("close shared"))?;
    check(&c.read(&path).map_err(e("final read"))?, &model, "final own file")
}

#[test]
fn threads_share_one_connection_dir() {
    shared_connection(&Server::start(&[]));
}

#[test]
fn threads_share_one_connection_memory() {
    shared_connection(&Server::start(&["--memory"]));
}
