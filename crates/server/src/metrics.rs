//! The server's side of `ferry serve --metrics ADDR` (`ferry-metrics`):
//! requests by operation, and the connections' counters beside them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub use ferry_metrics::{serve_http, Ops};

/// A server's counters.
#[derive(Default)]
pub struct Metrics {
    pub ops: Ops,
    pub connections: AtomicU64,
    pub refused_busy: AtomicU64,
    pub auth_failures: AtomicU64,
    pub protocol_errors: AtomicU64,
    /// Connections that joined an existing session (a reconnect, or a data
    /// channel).
    pub session_attaches: AtomicU64,
    /// `FileFd`: descriptors passed, and requests refused because the Unix
    /// socket's peer is another user (what a test of that refusal counts).
    pub descriptors_lent: AtomicU64,
    pub descriptors_refused: AtomicU64,
}

/// Values that are the server's state rather than counters, read at each
/// scrape.
pub struct Gauges {
    pub connections: u64,
    pub handshakes: u64,
    pub sessions: u64,
    pub handles: u64,
    pub handle_budget: u64,
    pub locked_files: u64,
    /// Counters kept where they are counted (the gate, the handle budget).
    pub handshakes_evicted: u64,
    pub handles_refused: u64,
    /// Leases: objects leased now, and the counters of `leases::Counts`.
    pub leased_objects: u64,
    pub leases_granted: u64,
    pub leases_refused: u64,
    pub lease_breaks: u64,
    pub lease_waits: u64,
    pub lease_wait_seconds: f64,
    pub lease_timeouts: u64,
    /// Notices of changes outside ferry looked at, and handles opened for them.
    pub outside_notices: u64,
    pub outside_opened: u64,
    /// `leases::Timeline` of the last break waited for: start, wrote,
    /// returned, resumed.
    pub lease_last_break: [u64; 4],
}

impl Metrics {
    pub fn render(&self, g: &Gauges) -> String {
        self.ops.render(
            "ferry",
            &[
                ("ferry_connections_total", "Connections accepted.", "counter", self.connections.load(Relaxed)),
                (
                    "ferry_connections_refused_total",
                    "Connections refused at --max-connections.",
                    "counter",
                    self.refused_busy.load(Relaxed),
                ),
                (
                    "ferry_auth_failures_total",
                    "Handshakes refused for a wrong or missing token.",
                    "counter",
                    self.auth_failures.load(Relaxed),
                ),
                (
                    "ferry_protocol_errors_total",
                    "Connections closed for a protocol error.",
                    "counter",
                    self.protocol_errors.load(Relaxed),
                ),
                (
                    "ferry_session_attaches_total",
                    "Connections that joined an existing session (reconnects, data channels).",
                    "counter",
                    self.session_attaches.load(Relaxed),
                ),
                (
                    "ferry_descriptors_lent_total",
                    "Descriptors of open files passed to clients on the server's host (FileFd).",
                    "counter",
                    self.descriptors_lent.load(Relaxed),
                ),
                (
                    "ferry_descriptors_refused_total",
                    "FileFd requests refused: the Unix socket's peer is neither the server's user nor root.",
                    "counter",
                    self.descriptors_refused.load(Relaxed),
                ),
                (
                    "ferry_handshakes_evicted_total",
                    "Connections in their handshake shut down to make room for newer ones.",
                    "counter",
                    g.handshakes_evicted,
                ),
                (
                    "ferry_handles_refused_total",
                    "Opens refused for the handle budget (a peer's share, or the server's).",
                    "counter",
                    g.handles_refused,
                ),
                ("ferry_connections", "Authenticated connections open.", "gauge", g.connections),
                ("ferry_handshakes", "Connections in their handshake (not yet authenticated).", "gauge", g.handshakes),
                ("ferry_sessions", "Sessions held, with or without a connection.", "gauge", g.sessions),
                ("ferry_handles", "Open file handles.", "gauge", g.handles),
                (
                    "ferry_handle_budget",
                    "Most file handles open at once, all sessions together.",
                    "gauge",
                    g.handle_budget,
                ),
                ("ferry_locked_files", "Files with record locks held.", "gauge", g.locked_files),
                (
                    "ferry_leased_objects",
                    "Files and directories some session holds a lease on.",
                    "gauge",
                    g.leased_objects,
                ),
                ("ferry_leases_granted_total", "Leases granted with replies.", "counter", g.leases_granted),
                (
                    "ferry_leases_refused_total",
                    "Grants refused: the object changed while the request read it.",
                    "counter",
                    g.leases_refused,
                ),
                ("ferry_lease_breaks_total", "Break notices sent to holders.", "counter", g.lease_breaks),
                (
                    "ferry_lease_waits_total",
                    "Changes that waited for holders to return a break.",
                    "counter",
                    g.lease_waits,
                ),
                (
                    "ferry_lease_timeouts_total",
                    "Breaks a holder left unanswered for its lease time.",
                    "counter",
                    g.lease_timeouts,
                ),
                (
                    "ferry_outside_notices_total",
                    "Kernel notices of changes outside ferry looked at while leases were held.",
                    "counter",
                    g.outside_notices,
                ),
                (
                    "ferry_outside_handles_opened_total",
                    "File handles those notices named, opened to learn what they were.",
                    "counter",
                    g.outside_opened,
                ),
            ],
        ) + &format!(
            "# HELP ferry_lease_wait_seconds_total Time changes spent waiting for holders to return breaks.\n\
             # TYPE ferry_lease_wait_seconds_total counter\nferry_lease_wait_seconds_total {}\n",
            g.lease_wait_seconds
        ) + &last_break(&g.lease_last_break)
    }
}

/// The steps of the last break a change waited for, as CLOCK_MONOTONIC
/// stamps (a client on the same host lays its own beside them).
fn last_break(t: &[u64; 4]) -> String {
    let mut s = String::from(
        "# HELP ferry_lease_last_break_ns Steps of the last change that waited for one holder's return, \
         CLOCK_MONOTONIC ns: start (breaks about to go out, mostly before the change runs), wrote (the break's write \
         began), returned (return read), resumed (change went on).\n# TYPE ferry_lease_last_break_ns gauge\n",
    );
    for (step, v) in ["start", "wrote", "returned", "resumed"].iter().zip(t) {
        s.push_str(&format!("ferry_lease_last_break_ns{{step=\"{step}\"}} {v}\n"));
    }
    s
}
