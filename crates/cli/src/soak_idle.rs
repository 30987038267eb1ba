//! `ferry soak --idle N`: thousands of connected clients that do nothing,
//! each with a session, held by a few client processes (`--idle-procs`),
//! each many raw connections (no thread per connection on the client side,
//! so the client processes stay small). Measures what they cost the
//! server: its resident memory, threads and descriptors per connection,
//! and a concurrent client's `stat` latency beside them against alone.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferry_client::{Client, Options};
use ferry_proto::handshake::{ClientHandshake, ClientOffer, HANDSHAKE_MAX_FRAME};
use ferry_proto::{caps, Header, Request, HEADER_LEN, MIN_MAX_FRAME};
use hdrhistogram::Histogram;

/// One connection through its handshake and `SessionNew`, then left idle.
fn idle_client(addr: &str) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(60))).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let offer = ClientOffer {
        min_version: 1,
        max_version: 1,
        caps: caps::ALL,
        max_frame: MIN_MAX_FRAME,
        token: None,
        binding: None,
    };
    let mut nonce = [0u8; 32];
    getrandom::getrandom(&mut nonce).map_err(|e| e.to_string())?;
    let mut hs = ClientHandshake::start(offer, nonce, &mut out);
    loop {
        s.write_all(&out).map_err(|e| format!("send: {e}"))?;
        out.clear();
        let mut hb = [0u8; HEADER_LEN];
        s.read_exact(&mut hb).map_err(|e| format!("handshake reply: {e}"))?;
        let h = hs.header(&hb).map_err(|e| format!("{e:?}"))?;
        let mut body = vec![0u8; h.len.min(HANDSHAKE_MAX_FRAME) as usize];
        s.read_exact(&mut body).map_err(|e| format!("handshake reply: {e}"))?;
        if hs.receive(&h, &body, &mut out).map_err(|e| format!("handshake: {e:?}"))?.is_some() {
            break;
        }
    }
    Request::SessionNew.encode(3, &mut out);
    s.write_all(&out).map_err(|e| format!("send: {e}"))?;
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb).map_err(|e| format!("session reply: {e}"))?;
    let h = Header::decode(&hb);
    let mut body = vec![0u8; h.len as usize];
    s.read_exact(&mut body).map_err(|e| format!("session reply: {e}"))?;
    if h.is_error() {
        return Err("SessionNew refused".into());
    }
    Ok(s)
}

/// The hidden `ferry soak --idle-child ADDR N`: holds `n` idle clients,
/// says `held N` on stdout, and keeps them until its stdin closes.
pub fn child(addr: &str, n: usize) -> Result<(), String> {
    raise_fd_limit();
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        held.push(idle_client(addr).map_err(|e| format!("idle client {i}: {e}"))?);
    }
    println!("held {}", held.len());
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    Ok(())
}

/// Lets this process open as many descriptors as the system lets it.
pub fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let l = getrlimit(Resource::Nofile);
    let _ = setrlimit(Resource::Nofile, Rlimit { current: l.maximum, maximum: l.maximum });
}

/// Idle clients held by child processes until dropped.
pub struct Idle {
    children: Vec<Child>,
}

impl Drop for Idle {
    fn drop(&mut self) {
        for c in &mut self.children {
            // Closing its stdin ends it; killed if it does not.
            drop(c.stdin.take());
        }
        let until = Instant::now() + Duration::from_secs(10);
        for c in &mut self.children {
            while Instant::now() < until && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `n` idle clients of `addr` over `procs` processes, all connected when
/// this returns.
pub fn hold(addr: &str, n: usize, procs: usize) -> Result<Idle, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let procs = procs.clamp(1, n.max(1));
    let mut idle = Idle { children: Vec::new() };
    for p in 0..procs {
        let k = n / procs + usize::from(p < n % procs);
        let c = Command::new(&exe)
            .args(["soak", "--idle-child", addr, &k.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start an idle-client process: {e}"))?;
        idle.children.push(c);
    }
    for c in &mut idle.children {
        let out = c.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line).map_err(|e| e.to_string())?;
        if !line.starts_with("held ") {
            return Err("an idle-client process failed (its message is above)".into());
        }
    }
    Ok(idle)
}

/// A client's `stat` latency: (p50, p99) in µs over `count` calls.
pub fn stat_latency(addr: &str, count: usize) -> Result<(u64, u64), String> {
    let c = Client::connect(addr, &Options::default()).map_err(|e| format!("probe client: {e}"))?;
    let mut h = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    for i in 0..count + 100 {
        let t = Instant::now();
        c.metadata("/").map_err(|e| format!("probe stat: {e}"))?;
        // The first hundred warm up.
        if i >= 100 {
            let _ = h.record(t.elapsed().as_micros() as u64);
        }
    }
    Ok((h.value_at_quantile(0.5), h.value_at_quantile(0.99)))
}

/// The server's resident memory (KiB), threads and descriptors.
pub fn server_sample(pid: u32) -> (u64, u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status.lines().find_map(|l| l.strip_prefix(name)?.split_whitespace().next()?.parse().ok()).unwrap_or(0)
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    (field("VmRSS:"), field("Threads:"), fds)
}
