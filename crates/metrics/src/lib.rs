//! Per-operation counters and latency histograms, rendered in the
//! Prometheus text format, and the small HTTP endpoint that serves them
//! (`ferry serve --metrics`, `ferry mount --metrics`).
//!
//! Counters are relaxed atomics bumped by whoever runs a request; a scrape
//! reads them without stopping anyone, so one scrape may see a request
//! counted and its latency not yet: Prometheus tolerates that.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use ferry_proto::op;

/// Latency bucket bounds, in microseconds (the last bucket, +Inf, is the
/// count).
const BUCKETS_US: [u64; 14] =
    [10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 50_000, 250_000, 1_000_000, 5_000_000];

/// Operations are numbered below this.
const OPS: usize = 64;

#[derive(Default)]
struct OpStats {
    requests: AtomicU64,
    errors: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    /// Requests that took at most each bound (not cumulative: summed when
    /// rendered).
    buckets: [AtomicU64; BUCKETS_US.len()],
    micros: AtomicU64,
}

/// Requests by operation: how many, how many failed, their bytes, their
/// latency.
pub struct Ops {
    ops: [OpStats; OPS],
}

impl std::fmt::Debug for Ops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ops")
    }
}

impl Default for Ops {
    fn default() -> Self {
        Ops { ops: std::array::from_fn(|_| OpStats::default()) }
    }
}

/// One counter or gauge beside the operations: name, help, type, value.
pub type Sample<'a> = (&'a str, &'a str, &'a str, u64);

impl Ops {
    /// One request of `op` answered (`error`: with an errno) after
    /// `elapsed`, with `bytes_in` sent by the client and `bytes_out` of
    /// file data in the reply.
    pub fn request(&self, op: u16, elapsed: Duration, error: bool, bytes_in: u64, bytes_out: u64) {
        let s = &self.ops[usize::from(op).min(OPS - 1)];
        s.requests.fetch_add(1, Relaxed);
        if error {
            s.errors.fetch_add(1, Relaxed);
        }
        s.bytes_in.fetch_add(bytes_in, Relaxed);
        s.bytes_out.fetch_add(bytes_out, Relaxed);
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        s.micros.fetch_add(us, Relaxed);
        if let Some(i) = BUCKETS_US.iter().position(|&b| us <= b) {
            s.buckets[i].fetch_add(1, Relaxed);
        }
    }

    /// The text exposition: the operations' metrics named `PREFIX_…`, then
    /// `extra`.
    pub fn render(&self, prefix: &str, extra: &[Sample<'_>]) -> String {
        let mut o = String::with_capacity(16 * 1024);
        let per_op = |o: &mut String, name: &str, help: &str, f: &dyn Fn(&OpStats) -> u64| {
            let name = format!("{prefix}_{name}");
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter");
            for (code, s) in self.ops.iter().enumerate() {
                if s.requests.load(Relaxed) > 0 {
                    let _ = writeln!(o, "{name}{{op=\"{}\"}} {}", op::name(code as u16), f(s));
                }
            }
        };
        per_op(&mut o, "requests_total", "Requests answered, by operation.", &|s| s.requests.load(Relaxed));
        per_op(&mut o, "request_errors_total", "Requests answered with an errno.", &|s| s.errors.load(Relaxed));
        per_op(&mut o, "request_bytes_total", "Request bytes sent by the client (written data included).", &|s| {
            s.bytes_in.load(Relaxed)
        });
        per_op(&mut o, "reply_data_bytes_total", "File data in replies.", &|s| s.bytes_out.load(Relaxed));
        let name = format!("{prefix}_request_duration_seconds");
        let _ = writeln!(o, "# HELP {name} Time from a request to its reply.\n# TYPE {name} histogram");
        for (code, s) in self.ops.iter().enumerate() {
            let count = s.requests.load(Relaxed);
            if count == 0 {
                continue;
            }
            let label = op::name(code as u16);
            let mut cum = 0;
            for (b, n) in BUCKETS_US.iter().zip(&s.buckets) {
                cum += n.load(Relaxed);
                let _ = writeln!(o, "{name}_bucket{{op=\"{label}\",le=\"{}\"}} {cum}", *b as f64 / 1e6);
            }
            let _ = writeln!(o, "{name}_bucket{{op=\"{label}\",le=\"+Inf\"}} {count}");
            let _ = writeln!(o, "{name}_sum{{op=\"{label}\"}} {}", s.micros.load(Relaxed) as f64 / 1e6);
            let _ = writeln!(o, "{name}_count{{op=\"{label}\"}} {count}");
        }
        for (name, help, kind, v) in extra {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        }
        o
    }
}

/// Answers `GET /metrics` on `listener` with `render()`, one scrape at a
/// time, on a thread of its own; anything else gets a 404.
pub fn serve_http(listener: TcpListener, render: impl Fn() -> String + Send + 'static) -> std::io::Result<()> {
    std::thread::Builder::new().name("ferry-metrics".into()).spawn(move || {
        for stream in listener.incoming().flatten() {
            let _ = answer(stream, &render);
        }
    })?;
    Ok(())
}

fn answer(mut s: TcpStream, render: &dyn Fn() -> String) -> std::io::Result<()> {
    // A scraper that stalls must not hold the next one for long.
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut req = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 8192 {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
    }
    let line = req.split(|&b| b == b'\n').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, path) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let (status, body) = if method == b"GET" && (path == b"/metrics" || path.starts_with(b"/metrics?")) {
        ("200 OK", render())
    } else {
        ("404 Not Found", "only /metrics is here\n".to_string())
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_a_cumulative_histogram() {
        let m = Ops::default();
        m.request(op::PREAD, Duration::from_micros(30), false, 40, 4096);
        m.request(op::PREAD, Duration::from_millis(3), true, 40, 0);
        let text = m.render("ferry", &[("ferry_handles", "Open file handles.", "gauge", 3)]);
        assert!(text.contains("ferry_requests_total{op=\"pread\"} 2\n"), "{text}");
        assert!(text.contains("ferry_request_errors_total{op=\"pread\"} 1\n"), "{text}");
        assert!(text.contains("ferry_reply_data_bytes_total{op=\"pread\"} 4096\n"), "{text}");
        assert!(text.contains("ferry_request_duration_seconds_bucket{op=\"pread\",le=\"0.00005\"} 1\n"), "{text}");
        assert!(text.contains("ferry_request_duration_seconds_bucket{op=\"pread\",le=\"0.005\"} 2\n"), "{text}");
        assert!(text.contains("ferry_request_duration_seconds_count{op=\"pread\"} 2\n"), "{text}");
        assert!(text.contains("# TYPE ferry_handles gauge\nferry_handles 3\n"), "{text}");
        assert!(!text.contains("op=\"stat\""), "an operation never asked shows: {text}");
    }
}
