//! Lease breaks, told to the kernel (PROTOCOL.md 8.10): the mount turns
//! leases on, and each break becomes FUSE invalidations of what the kernel
//! keeps — a node's attributes and pages (`notify_inval_inode`), a name in
//! a directory (`notify_inval_entry`) — before the break is returned, so a
//! change another client made and told of is never answered from the
//! kernel's caches.
//!
//! The notices are written by a thread of their own, which returns the
//! break once the kernel took them. The break may be read by a thread
//! serving a FUSE request, and an invalidation can wait for a lock the
//! kernel holds for that very request (a directory's, while a lookup in it
//! runs): so the reader only queues it and goes on.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use ferry_client::leases::{OnBreak, Return};
use fuser::{INodeNo, Notifier};

use crate::nodes::Nodes;
use crate::pages::Pages;
use crate::recent::Recent;

/// What the mount does for the open files of broken nodes (`None`: of
/// every node) before the kernel drops their pages: the data they hold
/// (read-ahead, a small file's contents from its open) is old, and a page
/// they read from now on is not under a lease.
pub type Untrust = dyn Fn(Option<&[u64]>) + Send + Sync;

/// One break: `(dev, ino, name)` of each object, and its answer, sent
/// when the job is dropped; or a listing the kernel must not keep
/// (`drop_listing`), by node.
struct Job {
    objects: Vec<(u64, u64, Vec<u8>)>,
    listing: Option<u64>,
    _returned: Option<Return>,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    notifier: Option<Notifier>,
    started: bool,
}

pub struct Invalidator {
    nodes: Arc<Mutex<Nodes>>,
    recent: Arc<Recent>,
    pages: Arc<Pages>,
    untrust: Box<Untrust>,
    queue: Mutex<Queue>,
    cv: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Invalidator {
    pub(crate) fn new(
        nodes: Arc<Mutex<Nodes>>,
        recent: Arc<Recent>,
        pages: Arc<Pages>,
        untrust: Box<Untrust>,
    ) -> Arc<Invalidator> {
        Arc::new(Invalidator { nodes, recent, pages, untrust, queue: Mutex::default(), cv: Condvar::new() })
    }

    /// The mount is up: invalidations can be written (breaks that came
    /// before wait in the queue until now).
    pub fn start(self: &Arc<Self>, notifier: Notifier) -> std::io::Result<()> {
        let mut q = lock(&self.queue);
        q.notifier = Some(notifier);
        if !q.started {
            q.started = true;
            let me = Arc::clone(self);
            std::thread::Builder::new().name("ferry-inval".into()).spawn(move || me.run())?;
        }
        self.cv.notify_all();
        Ok(())
    }

    /// The break handler for the mount's leases.
    pub fn on_break(self: &Arc<Self>) -> Box<OnBreak> {
        let me = Arc::clone(self);
        Box::new(move |objects, returned| {
            // The mount's own short-lived answers go at once.
            drop(me.recent.changing());
            // An open in flight now keeps no pages, and these files open
            // without a request no more (`pages`).
            let all = objects.iter().any(|b| b.dev == 0 && b.ino == 0);
            let keys = objects.iter().map(|b| (b.dev, b.ino));
            me.pages.broke((!all).then_some(keys));
            let objects = objects.iter().map(|b| (b.dev, b.ino, b.name.to_vec())).collect();
            lock(&me.queue).jobs.push_back(Job { objects, listing: None, _returned: Some(returned) });
            me.cv.notify_all();
        })
    }

    /// Directory `node` was just listed to the kernel, which keeps every
    /// listing (the mount answers no `OPENDIR`), without a lease to keep it
    /// by: its copy goes once the listing that fills it is done.
    pub fn drop_listing(&self, node: u64) {
        lock(&self.queue).jobs.push_back(Job { objects: Vec::new(), listing: Some(node), _returned: None });
        self.cv.notify_all();
    }

    fn run(&self) {
        loop {
            let (job, notifier) = {
                let mut q = lock(&self.queue);
                loop {
                    if q.notifier.is_some() {
                        if let Some(j) = q.jobs.pop_front() {
                            break (j, q.notifier.clone());
                        }
                    }
                    q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            };
            if let Some(n) = notifier {
                match job.listing {
                    Some(node) => {
                        let _ = n.inval_entry(INodeNo(node), OsStr::new(FILLED));
                        let _ = n.inval_inode(INodeNo(node), 0, 0);
                    }
                    None => self.apply(&n, &job.objects),
                }
            }
            // Returned now that the kernel holds nothing of it.
            drop(job);
        }
    }

    /// Writes the invalidations of one break. Node ids are looked up with
    /// the table's lock, which is let go before the kernel is told (it may
    /// answer with `forget`s, which take it).
    fn apply(&self, n: &Notifier, objects: &[(u64, u64, Vec<u8>)]) {
        let mut inodes = Vec::new();
        let mut entries: Vec<(u64, std::ffi::OsString)> = Vec::new();
        let mut everything = false;
        let mut dirs: Vec<u64>;
        {
            let mut nodes = lock(&self.nodes);
            for (dev, ino, name) in objects {
                if *dev == 0 && *ino == 0 {
                    everything = true;
                    // Every node's attributes and every name the kernel
                    // may keep for long: a directory's entry dropped alone
                    // could be found again with its old children.
                    let all = nodes.all();
                    for &node in &all {
                        entries.extend(nodes.entries_of(node));
                    }
                    entries.extend(nodes.take_all_misses());
                    nodes.unlist_all();
                    inodes.extend(all);
                    continue;
                }
                for node in nodes.by_server_id((*dev, *ino)) {
                    inodes.push(node);
                    // Dropped with the node's pages below.
                    nodes.unlist(node);
                    if name.is_empty() {
                        // The object itself changed, was removed or
                        // renamed: the names it is kept under go too.
                        entries.extend(nodes.entries_of(node));
                    } else {
                        entries.push((node, OsStr::from_bytes(name).to_owned()));
                    }
                    // Its lease is gone: no break will say that a name
                    // came into it, so the misses kept there go.
                    entries.extend(nodes.take_misses(node));
                }
            }
            dirs = inodes
                .iter()
                .copied()
                .filter(|&i| nodes.by_ino.get(&i).is_some_and(|n| n.fmt == libc::S_IFDIR))
                .collect();
        }
        inodes.sort_unstable();
        inodes.dedup();
        dirs.sort_unstable();
        dirs.dedup();
        // Before the pages go: a read after this fetches anew, and one
        // under way holds its page locked, so the drop below waits for it.
        (self.untrust)(if everything { None } else { Some(&inodes) });
        entries.sort_unstable();
        entries.dedup();
        for (dir, name) in entries {
            // ENOENT: the kernel had no such entry; nothing to drop.
            let _ = n.inval_entry(INodeNo(dir), &name);
        }
        // A listing the kernel is filling its copy from now may be from
        // before the change: an entry's invalidation waits for the
        // directory's lock, which a listing holds until its copy is made,
        // so the pages dropped below include it (whether or not the kernel
        // would itself drop a copy filled across an invalidation: this
        // one did in tests, which is not a promise).
        for dir in dirs {
            let _ = n.inval_entry(INodeNo(dir), OsStr::new(FILLED));
        }
        for node in inodes {
            let _ = n.inval_inode(INodeNo(node), 0, 0);
        }
    }
}

/// A name no directory's entry has (the kernel keeps no dentry for "."):
/// its invalidation only waits for the directory's lock.
const FILLED: &str = ".";
