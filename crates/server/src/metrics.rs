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
            ],
        )
    }
}
