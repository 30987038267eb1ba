//! What a server holds while experiment 6's clients read: its resident
//! memory, threads and open descriptors, summed over its process tree
//! (Samba forks a process per client), from /proc. Sampled a few times
//! inside the measured window, not continuously: a scan of /proc beside
//! 200 client processes costs CPU the clients would otherwise have. The
//! peak of the samples is what is reported.

use std::collections::HashMap;
use std::thread::JoinHandle;
use std::time::Duration;

use super::wall;

/// The largest figures seen: resident KiB, threads, descriptors.
#[derive(Clone, Copy, Default)]
pub(super) struct Load {
    pub rss_kib: u64,
    pub threads: u64,
    pub fds: u64,
}

impl Load {
    fn max(self, o: Load) -> Load {
        Load { rss_kib: self.rss_kib.max(o.rss_kib), threads: self.threads.max(o.threads), fds: self.fds.max(o.fds) }
    }
}

/// The processes of the trees rooted at `roots`.
fn tree(roots: &[u32]) -> Vec<u32> {
    let mut parent: HashMap<u32, u32> = HashMap::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
            let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
            let Some((_, rest)) = s.rsplit_once(')') else { continue };
            if let Some(pp) = rest.split_whitespace().nth(1).and_then(|v| v.parse().ok()) {
                parent.insert(pid, pp);
            }
        }
    }
    let mut all: Vec<u32> = Vec::new();
    let mut todo = roots.to_vec();
    while let Some(p) = todo.pop() {
        if all.contains(&p) {
            continue;
        }
        all.push(p);
        todo.extend(parent.iter().filter(|(_, pp)| **pp == p).map(|(c, _)| *c));
    }
    all
}

/// One look at the trees rooted at `roots`.
pub(super) fn sample(roots: &[u32]) -> Load {
    let mut l = Load::default();
    for pid in tree(roots) {
        let (rss, threads, fds) = crate::soak_idle::server_sample(pid);
        l.rss_kib += rss;
        l.threads += threads;
        l.fds += fds;
    }
    l
}

/// Samples `roots` at a quarter, half and three quarters of the window
/// from `t0` to `t1` (wall-clock seconds); the peak comes from `join`.
pub(super) struct Sampler(Option<JoinHandle<Load>>);

impl Sampler {
    pub(super) fn start(roots: &[u32], t0: f64, t1: f64) -> Sampler {
        if roots.is_empty() {
            return Sampler(None);
        }
        let roots = roots.to_vec();
        let spawned = std::thread::Builder::new().name("compare-load".into()).spawn(move || {
            let mut peak = Load::default();
            for f in [0.25, 0.5, 0.75] {
                let at = t0 + (t1 - t0) * f;
                let wait = at - wall();
                if wait > 0.0 {
                    std::thread::sleep(Duration::from_secs_f64(wait));
                }
                peak = peak.max(sample(&roots));
            }
            peak
        });
        Sampler(spawned.ok())
    }

    /// The peak seen (`None`: not sampled).
    pub(super) fn join(self) -> Option<Load> {
        self.0.and_then(|h| h.join().ok())
    }
}
