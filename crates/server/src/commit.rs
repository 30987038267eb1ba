//! Commits (`Fsync`) run beside a connection's other requests. Waiting for
//! a disk is the one slow thing a request of a session does while holding
//! up everything behind it: a client that commits behind its writes (the
//! write verifier does, every 32 MiB) would stall its own pipeline for as
//! long as the disk takes. So the server takes the file (its handle's
//! `Arc`) when the `Fsync` arrives, which is after every write the session
//! sent before it has run, and a thread of the commit pool waits for the
//! disk and sends the reply, out of order (clients match replies by id).
//!
//! The pool is the server's, not a connection's: a thread per connection
//! that ever committed, kept for the connection's life, made 200 writers
//! 200 threads more (and a descriptor each) long after their last commit.
//! A commit takes a waiting thread or starts one, up to [`MAX_THREADS`]
//! (past that it waits in the queue); a thread idle for [`LINGER`] leaves.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use ferry_proto::{ErrorReply, Reply};
use ferry_sock::Socket;

use crate::backend::Backend;

/// Commit threads at most: disks waited for at once.
const MAX_THREADS: usize = 64;
/// How long a commit thread waits for work before it leaves.
const LINGER: Duration = Duration::from_secs(2);

type Job = Box<dyn FnOnce() + Send>;

struct Queue {
    jobs: VecDeque<Job>,
    /// Threads waiting for a job.
    waiting: usize,
    threads: usize,
}

struct Pool {
    queue: Mutex<Queue>,
    more: Condvar,
}

static POOL: Pool =
    Pool { queue: Mutex::new(Queue { jobs: VecDeque::new(), waiting: 0, threads: 0 }), more: Condvar::new() };

fn lock(m: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `job` on a thread of the pool: `Err` only if there is none and
/// none can start (the caller then runs it in line).
fn submit(job: Job) -> Result<(), Job> {
    let mut q = lock(&POOL.queue);
    // Each queued job has a waiting thread to take it, or one starts.
    if q.jobs.len() + 1 > q.waiting && q.threads < MAX_THREADS {
        let spawned = std::thread::Builder::new().name("ferry-commit".into()).stack_size(128 * 1024).spawn(committer);
        match spawned {
            Ok(_) => q.threads += 1,
            Err(e) if q.threads == 0 => {
                tracing::warn!("no commit thread ({e}): committing in line");
                return Err(job);
            }
            // Those running take it when they are done.
            Err(_) => {}
        }
    }
    q.jobs.push_back(job);
    drop(q);
    POOL.more.notify_one();
    Ok(())
}

/// A thread of the pool: runs jobs until none came for [`LINGER`].
fn committer() {
    let mut q = lock(&POOL.queue);
    loop {
        if let Some(job) = q.jobs.pop_front() {
            drop(q);
            job();
            q = lock(&POOL.queue);
            continue;
        }
        q.waiting += 1;
        let (g, t) = POOL.more.wait_timeout(q, LINGER).unwrap_or_else(|e| e.into_inner());
        q = g;
        q.waiting -= 1;
        if t.timed_out() && q.jobs.is_empty() {
            q.threads -= 1;
            return;
        }
    }
}

/// A connection's commits: how many it has queued or running.
pub struct Committer<B: Backend> {
    backend: Arc<B>,
    /// Commits queued or running, at most the client's request window:
    /// a client past its window has its next commit run in line (the
    /// server stops reading it meanwhile), so the queue stays bounded.
    queued: Arc<AtomicUsize>,
    window: usize,
    /// Held by whoever writes to the socket, so frames never interleave.
    wlock: Arc<Mutex<()>>,
}

impl<B: Backend> Committer<B> {
    pub fn new(backend: Arc<B>, window: usize, wlock: Arc<Mutex<()>>) -> Self {
        Committer { backend, queued: Arc::default(), window: window.max(1), wlock }
    }

    /// Queues the commit of `file`; its reply goes to `sock`. Fails if the
    /// connection's window of commits is full or no thread can take it
    /// (the caller then commits in line).
    pub fn start(
        &mut self,
        sock: &Arc<Socket>,
        op: u16,
        id: u64,
        file: Arc<B::File>,
        datasync: bool,
    ) -> Result<(), ()> {
        if self.queued.load(Relaxed) >= self.window {
            return Err(());
        }
        let (backend, wlock, queued, sock) =
            (Arc::clone(&self.backend), Arc::clone(&self.wlock), Arc::clone(&self.queued), Arc::clone(sock));
        self.queued.fetch_add(1, Relaxed);
        let job = Box::new(move || {
            let mut out = Vec::new();
            match backend.fsync(&file, datasync) {
                Ok(()) => Reply::Empty.encode(op, id, &mut out),
                Err(e) => {
                    let msg = std::io::Error::from_raw_os_error(e.0).to_string();
                    ErrorReply { errno: e.0 as u32, message: &msg }.encode(op, id, &mut out)
                }
            }
            let _g = wlock.lock().unwrap_or_else(|e| e.into_inner());
            // A connection gone meanwhile has no one to tell.
            let _ = (&*sock).write_all(&out);
            queued.fetch_sub(1, Relaxed);
        });
        submit(job).map_err(|_| {
            self.queued.fetch_sub(1, Relaxed);
        })
    }
}
