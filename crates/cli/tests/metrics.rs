//! `ferry serve --metrics ADDR`: a real server scraped over HTTP after real
//! clients used it; the counters move by what they did. And its log lines.

mod common;

use std::time::Duration;

use common::scrape::{get, metrics_addr, sample};

use common::{random_bytes, Server};
use ferry_client::{Client, OpenOptions, Options};

#[test]
fn the_metrics_endpoint_counts_what_clients_did() {
    let srv = Server::start(&["--metrics", "127.0.0.1:0"]);
    let addr = metrics_addr(&srv);
    let (status, before) = get(&addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(before.contains("# TYPE ferry_requests_total counter"), "{before}");
    // On TCP, so reads and writes are requests (not the same-host path).
    let c = srv.tcp_client();
    let data = random_bytes(3 << 20, 3);
    let mut w = c.open("/f", OpenOptions::new().write(true).create(true)).unwrap();
    w.write_at(&data, 0).unwrap();
    w.sync_all().unwrap();
    w.close().unwrap();
    let r = c.open("/f", OpenOptions::new().read(true)).unwrap();
    let mut back = vec![0u8; data.len()];
    let mut at = 0;
    while at < back.len() {
        at += r.read_at(&mut back[at..], at as u64).unwrap();
    }
    assert!(back == data);
    for _ in 0..5 {
        assert!(c.metadata("/missing").is_err());
    }
    let bad = Client::connect(&srv.addr(), &Options { token: Some(b"wrong".to_vec()), ..Options::default() });
    assert!(bad.is_err());
    let (_, m) = get(&addr, "/metrics");
    let n = |name: &str| sample(&m, name) - sample(&before, name);
    assert!(n("ferry_requests_total{op=\"pread\"}") >= 1.0, "{m}");
    assert!(n("ferry_reply_data_bytes_total{op=\"pread\"}") >= data.len() as f64, "{m}");
    assert!(n("ferry_request_bytes_total{op=\"pwrite\"}") >= data.len() as f64, "{m}");
    assert!(n("ferry_request_errors_total{op=\"stat\"}") >= 5.0, "{m}");
    assert_eq!(n("ferry_request_errors_total{op=\"pread\"}"), 0.0, "{m}");
    assert!(n("ferry_auth_failures_total") >= 1.0, "{m}");
    assert!(n("ferry_connections_total") >= 2.0, "{m}");
    assert!(sample(&m, "ferry_connections") >= 1.0, "{m}");
    assert!(sample(&m, "ferry_handles") >= 1.0, "the open file is not counted: {m}");
    let count = sample(&m, "ferry_request_duration_seconds_count{op=\"stat\"}");
    let inf = sample(&m, "ferry_request_duration_seconds_bucket{op=\"stat\",le=\"+Inf\"}");
    assert!(count >= 5.0 && count == inf, "{m}");
    assert_eq!(get(&addr, "/other").0, "HTTP/1.1 404 Not Found");
    drop(r);
}

/// Log lines (`FERRY_LOG`): one per connection event with the peer's
/// address at `debug`, refusals at the default level; the token never.
#[test]
fn the_log_says_each_connection_event_with_its_peer_and_never_the_token() {
    let srv = Server::start_env(&[], &[("FERRY_LOG", "debug")]);
    let c = srv.tcp_client();
    c.metadata("/").unwrap();
    drop(c);
    let bad = Client::connect(&srv.addr(), &Options { token: Some(b"not-the-token".to_vec()), ..Options::default() });
    assert!(bad.is_err());
    let has = |what: &str| srv.log().lines().any(|l| l.contains(what) && l.contains("peer=127.0.0.1:"));
    let found = common::fuse::wait_for(Duration::from_secs(10), || {
        has("connection accepted") && has("connection closed") && has("authentication failed")
    });
    assert!(found, "{}", srv.log());
    let token = String::from_utf8(srv.token()).unwrap();
    assert!(!srv.log().contains(&token), "the token is in the log: {}", srv.log());
    assert!(srv.log().lines().any(|l| l.contains("WARN") && l.contains("authentication failed")), "{}", srv.log());
}

/// `ferry mount --metrics ADDR`: the mount's own requests to its server.
#[test]
fn the_mount_counts_its_requests() {
    common::fuse::require_fuse();
    let srv = Server::start(&[]);
    std::fs::write(srv.export.path().join("f"), random_bytes(1 << 20, 4)).unwrap();
    let tmp = common::TempDir::new("mount-metrics");
    let mp = tmp.path().join("mp");
    std::fs::create_dir(&mp).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let _detach = common::fuse::Detach(mp.clone());
    let _m = common::fuse::mount_url_env(
        &srv.url("/"),
        &mp,
        &srv.token_file,
        &["--metrics", &addr],
        &[("FERRY_SAME_HOST", "0")],
    );
    assert_eq!(std::fs::read(mp.join("f")).unwrap().len(), 1 << 20);
    assert!(std::fs::metadata(mp.join("missing")).is_err());
    let (status, m) = get(&addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(sample(&m, "ferry_client_requests_total{op=\"pread\"}") >= 1.0, "{m}");
    assert!(sample(&m, "ferry_client_reply_data_bytes_total{op=\"pread\"}") >= (1 << 20) as f64, "{m}");
    assert!(m.contains("ferry_client_reconnects_total 0"), "{m}");
    assert!(m.lines().any(|l| l.starts_with("ferry_client_request_errors_total{") && !l.ends_with(" 0")), "{m}");
}

/// Leases in the server's metrics: a mount holding what it looked up, a
/// change by another client breaking it and waiting for the return.
#[test]
fn leases_are_counted() {
    common::fuse::require_fuse();
    let srv = Server::start(&["--metrics", "127.0.0.1:0"]);
    let addr = metrics_addr(&srv);
    std::fs::write(srv.export.path().join("f"), "1").unwrap();
    let tmp = common::TempDir::new("lease-metrics");
    let _detach = common::fuse::Detach(tmp.path().to_path_buf());
    let _m = common::fuse::mount_url(&srv.url("/"), tmp.path(), &srv.token_file, &[]);
    assert_eq!(std::fs::metadata(tmp.path().join("f")).unwrap().len(), 1);
    let (_, m) = get(&addr, "/metrics");
    assert!(sample(&m, "ferry_leased_objects") >= 1.0, "{m}");
    assert!(sample(&m, "ferry_leases_granted_total") >= 1.0, "{m}");
    let c = srv.client();
    c.truncate(ferry_client::Target::Path(b"/f"), 5).unwrap();
    assert_eq!(std::fs::metadata(tmp.path().join("f")).unwrap().len(), 5, "seen at once");
    let (_, m) = get(&addr, "/metrics");
    assert!(sample(&m, "ferry_lease_breaks_total") >= 1.0, "{m}");
    assert!(sample(&m, "ferry_lease_waits_total") >= 1.0, "{m}");
    assert!(m.contains("ferry_lease_wait_seconds_total "), "{m}");
    assert_eq!(sample(&m, "ferry_lease_timeouts_total"), 0.0, "the mount answered: {m}");
}
