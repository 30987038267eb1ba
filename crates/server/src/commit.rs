//! Commits (`Fsync`) run beside a connection's other requests. Waiting for
//! a disk is the one slow thing a request of a session does while holding
//! up everything behind it: a client that commits behind its writes (the
//! write verifier does, every 32 MiB) would stall its own pipeline for as
//! long as the disk takes. So the server takes the file (its handle's
//! `Arc`) when the `Fsync` arrives, which is after every write the session
//! sent before it has run, and a thread of the connection waits for the
//! disk and sends the reply, out of order (clients match replies by id).

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};

use ferry_proto::{ErrorReply, Reply};

use crate::backend::Backend;

struct Job<F> {
    op: u16,
    id: u64,
    file: Arc<F>,
    datasync: bool,
}

/// A connection's commit thread, started at its first `Fsync`.
pub struct Committer<B: Backend> {
    backend: Arc<B>,
    /// Commits queued or running, at most the client's request window:
    /// a client past its window has its next commit run in line (the
    /// server stops reading it meanwhile), so the queue stays bounded.
    queued: Arc<AtomicUsize>,
    window: usize,
    /// Held by whoever writes to the socket, so frames never interleave.
    wlock: Arc<Mutex<()>>,
    jobs: Option<Sender<Job<B::File>>>,
}

impl<B: Backend> Committer<B> {
    pub fn new(backend: Arc<B>, window: usize, wlock: Arc<Mutex<()>>) -> Self {
        Committer { backend, queued: Arc::default(), window: window.max(1), wlock, jobs: None }
    }

    /// Queues the commit of `file`; its reply goes to `sock`. Fails only if
    /// no thread can be started (the caller then commits in line).
    pub fn start(
        &mut self,
        sock: &ferry_sock::Socket,
        op: u16,
        id: u64,
        file: Arc<B::File>,
        datasync: bool,
    ) -> Result<(), ()> {
        if self.queued.load(Relaxed) >= self.window {
            return Err(());
        }
        if self.jobs.is_none() {
            let (tx, rx) = channel::<Job<B::File>>();
            let sock = sock.try_clone().map_err(drop)?;
            let (backend, wlock, queued) =
                (Arc::clone(&self.backend), Arc::clone(&self.wlock), Arc::clone(&self.queued));
            std::thread::Builder::new()
                .name("ferry-commit".into())
                .stack_size(128 * 1024)
                .spawn(move || {
                    let mut out = Vec::new();
                    // Ends when the connection drops its sender.
                    for j in rx {
                        out.clear();
                        match backend.fsync(&j.file, j.datasync) {
                            Ok(()) => Reply::Empty.encode(j.op, j.id, &mut out),
                            Err(e) => {
                                let msg = std::io::Error::from_raw_os_error(e.0).to_string();
                                ErrorReply { errno: e.0 as u32, message: &msg }.encode(j.op, j.id, &mut out)
                            }
                        }
                        let _g = wlock.lock().unwrap_or_else(|e| e.into_inner());
                        // A connection gone meanwhile has no one to tell.
                        let _ = (&sock).write_all(&out);
                        queued.fetch_sub(1, Relaxed);
                    }
                })
                .map_err(drop)?;
            self.jobs = Some(tx);
        }
        let job = Job { op, id, file, datasync };
        self.queued.fetch_add(1, Relaxed);
        let sent = self.jobs.as_ref().map_or(Err(()), |j| j.send(job).map_err(drop));
        if sent.is_err() {
            self.queued.fetch_sub(1, Relaxed);
        }
        sent
    }
}
