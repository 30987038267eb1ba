//! Who made each FUSE request, told to a server that acts as each caller
//! (capability `IDENTITY`): the kernel gives the uid, gid and pid; the
//! supplementary groups are the process's, read from `/proc/PID/status`
//! and kept a moment, since one process makes requests in bursts.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferry_client::{acting_as, Acting, Caller};
use fuser::Request;

/// How long a process's groups are taken as read.
const GROUPS_FRESH: Duration = Duration::from_secs(1);
/// Processes remembered at most (the table is emptied past it).
const MAX_PIDS: usize = 4096;

pub struct Callers {
    /// Whether the server acts as each caller; if not, nothing is named.
    on: bool,
    groups: Mutex<HashMap<u32, (Instant, Vec<u32>)>>,
}

impl Callers {
    pub fn new(on: bool) -> Self {
        Callers { on, groups: Mutex::new(HashMap::new()) }
    }

    pub fn on(&self) -> bool {
        self.on
    }

    /// Names `req`'s caller for the requests this thread makes until the
    /// guard is dropped.
    pub fn acting(&self, req: &Request) -> Option<Acting> {
        if !self.on {
            return None;
        }
        let groups = self.groups_of(req.pid());
        Some(acting_as(Caller { uid: req.uid(), gid: req.gid(), groups }))
    }

    fn groups_of(&self, pid: u32) -> Vec<u32> {
        if pid == 0 {
            return Vec::new();
        }
        let now = Instant::now();
        let mut m = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, g)) = m.get(&pid) {
            if now.duration_since(*at) < GROUPS_FRESH {
                return g.clone();
            }
        }
        let g = read_groups(pid);
        if m.len() >= MAX_PIDS {
            m.clear();
        }
        m.insert(pid, (now, g.clone()));
        g
    }
}

/// A process's supplementary groups; none if it is gone.
fn read_groups(pid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return Vec::new() };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| g.split_whitespace().filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_default()
}
