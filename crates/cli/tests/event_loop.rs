//! The server's threads follow the work, not the connections (issue 35),
//! against a real `ferry serve` on loopback: 1,500 idle clients, each with
//! a session, add no thread each and little memory; and a client that
//! stops in the middle of a frame holds no worker — others are answered
//! meanwhile, and it is answered once its frame is whole. TLS clients are
//! served by the same workers after their handshake: many idle ones add
//! no thread, data still flows both ways, and one killed in the middle of
//! a large read leaves the server serving.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::Server;
use ferry_proto::{client_proof, Header, Reply, Request, FLAG_ERROR, HEADER_LEN, MIN_MAX_FRAME};

const IO_TIMEOUT: Duration = Duration::from_secs(20);

/// The tests run one at a time: each counts the server's threads.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Descriptors enough for the idle clients (the hard limit is ours to take).
fn raise_fd_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let l = getrlimit(Resource::Nofile);
    let _ = setrlimit(Resource::Nofile, Rlimit { current: l.maximum, maximum: l.maximum });
    getrlimit(Resource::Nofile).current.unwrap_or(1 << 20)
}

fn encode(req: &Request<'_>, id: u64) -> Vec<u8> {
    let mut v = Vec::new();
    req.encode(id, &mut v);
    v.extend_from_slice(req.bulk());
    v
}

fn read_frame(s: &mut TcpStream) -> (Header, Vec<u8>) {
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb).expect("reply header");
    let h = Header::decode(&hb);
    let mut body = vec![0u8; h.len as usize];
    s.read_exact(&mut body).expect("reply body");
    (h, body)
}

/// An authenticated raw connection with a session of its own.
fn session(server: &Server) -> TcpStream {
    let mut s = TcpStream::connect(server.addr()).expect("connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    let nonce = [7u8; 32];
    let hello = Request::Hello { min_version: 1, max_version: 1, caps: u64::MAX, max_frame: MIN_MAX_FRAME, nonce };
    s.write_all(&encode(&hello, 1)).unwrap();
    let (h, body) = read_frame(&mut s);
    assert_eq!(h.flags & FLAG_ERROR, 0, "HELLO refused");
    let Reply::Welcome(w) = Reply::decode(h.op, &body).unwrap() else { panic!("no Welcome") };
    let proof = client_proof(&server.token(), &w.nonce, &nonce);
    s.write_all(&encode(&Request::Auth { proof }, 2)).unwrap();
    let (h, _) = read_frame(&mut s);
    assert_eq!(h.flags & FLAG_ERROR, 0, "AUTH refused");
    s.write_all(&encode(&Request::SessionNew, 3)).unwrap();
    let (h, _) = read_frame(&mut s);
    assert_eq!(h.flags & FLAG_ERROR, 0, "SessionNew refused");
    s
}

/// The server's (resident KiB, threads).
fn rss_threads(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("server status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in the server's status"))
    };
    (field("VmRSS:"), field("Threads:"))
}

/// Its threads once those that end by themselves (handshakes) have.
fn settled_threads(pid: u32, at_most: u64) -> u64 {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, t) = rss_threads(pid);
        if t <= at_most || Instant::now() > until {
            return t;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn idle_clients_cost_no_thread_and_little_memory_each() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    const IDLE: usize = 1500;
    // Each connection takes a few descriptors in the server, one here.
    assert!(raise_fd_limit() >= 2 * IDLE as u64 + 100, "this test needs {} descriptors", 2 * IDLE + 100);
    let server = Server::start(&["--max-connections", "2000"]);
    let pid = server.pid();
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    // A first client, so that everything started once is counted before.
    let c = server.client();
    c.metadata("/").expect("stat before");
    let (rss0, threads0) = rss_threads(pid);
    let start = Instant::now();
    let idle: Vec<TcpStream> = (0..IDLE).map(|_| session(&server)).collect();
    let took = start.elapsed();
    let threads1 = settled_threads(pid, threads0 + 2);
    std::thread::sleep(Duration::from_millis(500));
    let (rss1, _) = rss_threads(pid);
    let per = rss1.saturating_sub(rss0) as f64 / IDLE as f64;
    eprintln!(
        "{IDLE} idle clients with sessions (connected in {:.1} s): server threads {threads0} → {threads1}, \
         memory {rss0} → {rss1} KiB ({per:.1} KiB per connection)",
        took.as_secs_f64()
    );
    assert!(
        threads1 <= threads0 + 2 && threads1 <= cpus + 16,
        "the server has {threads1} threads with {IDLE} idle clients ({threads0} before, {cpus} CPUs): a thread per connection"
    );
    assert!(per <= 64.0, "{per:.1} KiB of server memory per idle connection (at most 64)");
    // Beside them a client is served, and each idle one still is.
    let t = Instant::now();
    for i in 0..200 {
        c.metadata("/").unwrap_or_else(|e| panic!("stat {i} beside the idle clients: {e}"));
    }
    assert!(t.elapsed() < Duration::from_secs(10), "200 stats took {:?}", t.elapsed());
    for (i, mut s) in idle.into_iter().enumerate().step_by(100) {
        s.write_all(&encode(&Request::Ping, 10)).unwrap();
        let (h, _) = read_frame(&mut s);
        assert_eq!((h.id, h.flags & FLAG_ERROR), (10, 0), "idle client {i}: its ping");
    }
}

#[test]
fn a_client_stalled_mid_frame_holds_no_worker() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let server = Server::start(&[]);
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let stat = encode(&Request::Stat { target: ferry_proto::Target::Path(b"/") }, 20);
    // More stalled clients than workers: half a header, or a header and
    // half its body, then nothing.
    let mut stalled: Vec<(TcpStream, usize)> = (0..2 * cpus + 4)
        .map(|k| {
            let mut s = session(&server);
            let cut = if k % 2 == 0 { HEADER_LEN / 2 } else { HEADER_LEN + (stat.len() - HEADER_LEN) / 2 };
            s.write_all(&stat[..cut]).unwrap();
            (s, cut)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let c = server.client();
    let t = Instant::now();
    for i in 0..100 {
        c.metadata("/").unwrap_or_else(|e| panic!("stat {i} beside clients stalled mid-frame: {e}"));
    }
    assert!(t.elapsed() < Duration::from_secs(10), "100 stats beside stalled clients took {:?}", t.elapsed());
    // The rest of each frame, a byte at a time for one of them: answered.
    for (k, (s, cut)) in stalled.iter_mut().enumerate() {
        if k == 0 {
            for b in &stat[*cut..] {
                s.write_all(std::slice::from_ref(b)).unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
        } else {
            s.write_all(&stat[*cut..]).unwrap();
        }
        let (h, body) = read_frame(s);
        assert_eq!((h.id, h.flags & FLAG_ERROR), (20, 0), "stalled client {k}: its stat");
        assert!(matches!(Reply::decode(h.op, &body), Ok(Reply::Attr(_))), "stalled client {k}: an Attr reply");
    }
}

#[test]
fn tls_clients_are_served_by_the_workers_not_a_thread_each() {
    use ferry_client::{Client, OpenOptions, Options};
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    const IDLE: usize = 300;
    assert!(raise_fd_limit() >= 4 * IDLE as u64 + 100, "this test needs {} descriptors", 4 * IDLE + 100);
    let keys = common::TempDir::new("evloop-tls");
    let (cert, key) = (keys.path().join("cert.pem"), keys.path().join("key.pem"));
    let server = Server::start(&[
        "--tls",
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--max-connections",
        "1000",
    ]);
    let pid = server.pid();
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    // The server made its certificate before it listened: this loads it.
    let fingerprint = ferry_server::tls::load_or_make(&cert, &key).expect("the server's certificate").fingerprint;
    let trust = ferry_client::tls::Trust { fingerprint: Some(fingerprint.clone()), ..Default::default() };
    let opts = Options { tls: Some(true), trust, ..server.tcp_options() };
    let connect = || Client::connect(&server.addr(), &opts);
    let c = connect().expect("a TLS client");
    c.metadata("/").expect("stat over TLS");
    std::thread::sleep(Duration::from_millis(300));
    let (rss0, threads0) = rss_threads(pid);
    let idle: Vec<Client> = (0..IDLE)
        .map(|i| {
            let k = connect().unwrap_or_else(|e| panic!("TLS client {i}: {e}"));
            k.metadata("/").unwrap_or_else(|e| panic!("TLS client {i}: stat: {e}"));
            k
        })
        .collect();
    let threads1 = settled_threads(pid, threads0 + 2);
    std::thread::sleep(Duration::from_millis(500));
    let (rss1, _) = rss_threads(pid);
    let per = rss1.saturating_sub(rss0) as f64 / IDLE as f64;
    eprintln!(
        "{IDLE} idle TLS clients: server threads {threads0} → {threads1}, memory {rss0} → {rss1} KiB ({per:.1} KiB each)"
    );
    assert!(
        threads1 <= threads0 + 2 && threads1 <= cpus + 16,
        "the server has {threads1} threads with {IDLE} idle TLS clients ({threads0} before): a thread per connection"
    );
    assert!(per <= 64.0, "{per:.1} KiB of server memory per idle TLS connection (at most 64)");

    // Large data both ways, through records the workers seal and open.
    let data = common::random_bytes(24 << 20, 35);
    {
        use std::io::Write as _;
        let mut f = c.open("/big", OpenOptions::new().write(true).create(true).truncate(true)).expect("create /big");
        f.write_all(&data).expect("write 24 MiB over TLS");
        f.sync_all().expect("fsync over TLS");
    }
    assert_eq!(std::fs::read(server.export.path().join("big")).unwrap(), data, "what the server wrote");
    common::read_both_ways(&c, "/big", &data);
    for (i, k) in idle.iter().enumerate().step_by(30) {
        k.metadata("/big").unwrap_or_else(|e| panic!("idle TLS client {i}: stat after idling: {e}"));
    }

    // A client killed in the middle of a large read: the worker writing to
    // it finds the socket gone and serves the others.
    for round in 0..3 {
        let mut child = std::process::Command::new(common::FERRY)
            .args(["cat", &server.url("/big")])
            .env("FERRY_TOKEN_FILE", &server.token_file)
            .env("FERRY_TLS", "1")
            .env("FERRY_TLS_FINGERPRINT", &fingerprint)
            .env("FERRY_SAME_HOST", "0")
            .env_remove("FERRY_TOKEN")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("ferry cat");
        let mut out = child.stdout.take().unwrap();
        let mut first = vec![0u8; 1 << 20];
        out.read_exact(&mut first).unwrap_or_else(|e| panic!("round {round}: the first MiB of ferry cat: {e}"));
        assert!(first == data[..1 << 20], "round {round}: ferry cat's first MiB");
        child.kill().unwrap();
        child.wait().unwrap();
        drop(out);
        let t = Instant::now();
        for i in 0..50 {
            c.metadata("/big").unwrap_or_else(|e| panic!("round {round}: stat {i} after a killed reader: {e}"));
        }
        assert!(t.elapsed() < Duration::from_secs(10), "50 stats after a killed reader took {:?}", t.elapsed());
    }
    common::read_both_ways(&c, "/big", &data);
    let threads2 = settled_threads(pid, threads0 + 2);
    assert!(threads2 <= threads0 + 2, "{threads2} server threads after the killed readers ({threads0} before)");
    drop(idle);
}

#[test]
fn commits_wait_on_a_shared_pool_not_a_thread_per_connection() {
    use ferry_client::OpenOptions;
    use std::io::Write as _;
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    const CLIENTS: usize = 60;
    let server = Server::start(&[]);
    let pid = server.pid();
    let c = server.tcp_client();
    c.metadata("/").expect("stat before");
    std::thread::sleep(Duration::from_millis(300));
    let (_, threads0) = rss_threads(pid);
    // Each client commits once and stays connected: a commit thread of
    // each connection's own would stay as long.
    let mut clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let k = server.tcp_client();
            let mut f = k
                .open(format!("/c{i}"), OpenOptions::new().write(true).create(true).truncate(true))
                .unwrap_or_else(|e| panic!("client {i}: create: {e}"));
            f.write_all(&[i as u8; 100_000]).unwrap_or_else(|e| panic!("client {i}: write: {e}"));
            f.sync_all().unwrap_or_else(|e| panic!("client {i}: fsync: {e}"));
            (k, f)
        })
        .collect();
    for i in 0..CLIENTS {
        let got = std::fs::read(server.export.path().join(format!("c{i}"))).unwrap();
        assert!(got.len() == 100_000 && got.iter().all(|&b| b == i as u8), "file {i} as committed");
    }
    // Commits of many connections at once, each answered.
    std::thread::scope(|s| {
        for (i, (_, f)) in clients.iter_mut().enumerate() {
            s.spawn(move || {
                f.write_all(b"more").unwrap_or_else(|e| panic!("client {i}: write: {e}"));
                f.sync_all().unwrap_or_else(|e| panic!("client {i}: a second fsync: {e}"));
            });
        }
    });
    // The pool's threads leave after two idle seconds.
    let threads1 = settled_threads(pid, threads0 + 2);
    assert!(
        threads1 <= threads0 + 2,
        "{threads1} server threads with {CLIENTS} connections that committed ({threads0} before): a thread each"
    );
    drop(clients);
}
