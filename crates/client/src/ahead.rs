//! Adaptive read-ahead of one open file (the AFS paper's prefetch).
//!
//! A read that continues where the last one ended is sequential, whatever
//! its size; from the second one in a row, requests for what comes next go
//! out behind the reader, and the span kept requested grows with what the
//! sequence has read (as much again, at least twice the read) up to
//! `WINDOW_MAX`, so a reader that stops early has cost at most about twice
//! what it read. Any other read drops it all and fetches only what it asks
//! for, so random readers cost nothing extra.
//!
//! The reader never waits for its own read-ahead: segments are claimed
//! under the lock and received outside it, and new requests go out only
//! when the connection's window has room now (`Engine::try_start_many`), leaving
//! the other half to requests someone waits for. A segment that matches
//! the read lands in the caller's buffer (no copy); one that straddles the
//! read's end is received aside and its rest kept for the next read.
//! Reads of `LANDS_MIN` or more are therefore fetched ahead in segments of
//! their own size, so a reader of fixed-size chunks needs no aside buffer;
//! smaller reads share segments of `SEGMENT_MIN` and more, copied out.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use ferry_proto::Request;

use crate::engine::Engine;
use crate::pagebuf::PageBuf;
use crate::{Client, Result};

/// Most bytes kept requested past the reader.
pub const WINDOW_MAX: u64 = 32 << 20;
/// The span the first read-ahead of a sequence covers at least.
const WINDOW_FIRST: u64 = 256 << 10;
/// Reads of at least this size get segments of their own size, each
/// received straight into the reader's buffer. Larger segments cut by
/// the reader's reads cost a buffer aside per segment and a copy of every
/// byte: with 50-200 readers of 64 KiB on two CPUs, the aside buffers'
/// page faults, zeroing and cache misses cost more than 16 times the
/// requests (issue 35, docs/benchmarks.md); one reader alone pays for the
/// requests.
const LANDS_MIN: usize = 64 << 10;
/// Smallest request: reads smaller than `LANDS_MIN` are served from
/// segments of at least this size.
const SEGMENT_MIN: usize = 128 << 10;
/// Segments of `SEGMENT_MIN` and more grow with the window up to this, so
/// the read-ahead's slots (half the server's grant, 32 by default) hold
/// tens of MiB; reads smaller than them are copied out anyway. (Reads of
/// 128 KiB to 1 MiB are cut from grown segments too: not measured yet.)
const SEGMENT_GROWN: usize = 1 << 20;

enum Data {
    /// Requested: the reply to this id.
    Flight(u64),
    /// Received: the segment's bytes are `.0[.1..]` (shorter than asked
    /// at the end of the file).
    Ready(PageBuf, usize),
}

struct Segment {
    offset: u64,
    len: usize,
    data: Data,
}

impl Segment {
    fn end(&self) -> u64 {
        self.offset + self.len as u64
    }
}

#[derive(Default)]
struct State {
    /// The connection and handle the segments were requested on.
    engine: Option<Arc<Engine>>,
    handle: u64,
    /// Where the next read of the sequence starts.
    next: u64,
    /// Sequential reads in a row, and their bytes.
    run: u32,
    run_bytes: u64,
    /// Bytes to keep requested past the reader.
    window: u64,
    /// Bytes requested past the reader when the last refill stopped (the
    /// window's end, or no room left on the connection): the next refill
    /// waits until half of that is read (`read`).
    full: u64,
    /// In offset order, each starting where the last ends.
    segments: VecDeque<Segment>,
    /// Nothing is requested at or past this (the size as far as known).
    size: u64,
    /// Bumped by `reset`: segments claimed before it may hold stale data.
    gen: u64,
}

impl State {
    fn drop_segments(&mut self) {
        for s in self.segments.drain(..) {
            if let (Data::Flight(id), Some(e)) = (s.data, &self.engine) {
                e.forget(id);
            }
        }
    }

    fn end(&self) -> Option<u64> {
        self.segments.back().map(Segment::end)
    }
}

pub struct Ahead {
    st: Mutex<State>,
}

impl Ahead {
    pub fn new(size: u64) -> Ahead {
        Ahead { st: Mutex::new(State { size, ..State::default() }) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets everything requested ahead: the file changed (a write, a
    /// size change, a lock) or its connection went.
    pub fn reset(&self) {
        let mut st = self.lock();
        st.drop_segments();
        st.run = 0;
        st.run_bytes = 0;
        st.window = 0;
        st.gen += 1;
    }

    /// Bytes currently kept requested past the reader, for tests and
    /// benchmarks that check the window grows and collapses.
    pub fn window(&self) -> u64 {
        self.lock().window
    }

    /// Reads `buf.len()` bytes at `pos` (short only at the end of the file)
    /// from what was requested ahead and, for the rest, with `direct`;
    /// then requests ahead if the read continued a sequence.
    pub fn read(
        &self,
        (engine, handle): (&Arc<Engine>, u64),
        buf: &mut [u8],
        pos: u64,
        segment: usize,
        direct: &mut dyn FnMut(&mut [u8], u64) -> Result<usize>,
        count: &Client,
    ) -> Result<usize> {
        let n = buf.len();
        let end = pos + n as u64;
        let (claimed, sequential, gen) = {
            let mut st = self.lock();
            if st.handle != handle || !st.engine.as_ref().is_some_and(|e| Arc::ptr_eq(e, engine)) {
                st.drop_segments();
                st.engine = Some(Arc::clone(engine));
                st.handle = handle;
                st.run = 0;
                st.run_bytes = 0;
                st.window = 0;
            }
            // A read inside what is requested ahead (a short skip forward)
            // keeps the sequence; anything else ends it.
            let inside = st.segments.front().is_some_and(|s| s.offset <= pos) && st.end().is_some_and(|e| pos < e);
            let sequential = pos == st.next || inside;
            if sequential {
                st.run = st.run.saturating_add(1);
            } else {
                st.drop_segments();
                st.run = 1;
                st.run_bytes = 0;
                st.window = 0;
            }
            while st.segments.front().is_some_and(|s| s.end() <= pos) {
                if let (Some(s), Some(e)) = (st.segments.pop_front(), st.engine.clone()) {
                    if let Data::Flight(id) = s.data {
                        e.forget(id);
                    }
                }
            }
            let mut claimed = Vec::new();
            if st.segments.front().is_some_and(|s| s.offset <= pos) {
                while st.segments.front().is_some_and(|s| s.offset < end) {
                    claimed.extend(st.segments.pop_front());
                }
            }
            st.next = end;
            (claimed, sequential, st.gen)
        };

        let mut at = pos;
        let mut eof = false;
        let mut rest: Option<Segment> = None;
        let mut failed = false;
        for Segment { offset, len, data } in claimed {
            let seg_end = offset + len as u64;
            if eof || failed {
                if let Data::Flight(id) = data {
                    engine.forget(id);
                }
                continue;
            }
            let got = match data {
                Data::Flight(id) if offset == at && seg_end <= end => {
                    // The whole segment is part of the read: straight in.
                    let part = &mut buf[(at - pos) as usize..(seg_end - pos) as usize];
                    match engine.finish(id, Some(part)) {
                        Ok(f) => {
                            at += f.data_len as u64;
                            eof = f.data_len < len;
                        }
                        Err(_) => failed = true,
                    }
                    continue;
                }
                Data::Flight(id) => {
                    let mut v = PageBuf::with_len(len);
                    match engine.finish(id, Some(&mut v)) {
                        Ok(f) => {
                            v.truncate(f.data_len);
                            (v, 0)
                        }
                        Err(_) => {
                            failed = true;
                            continue;
                        }
                    }
                }
                Data::Ready(v, skip) => (v, skip),
            };
            let (keep, skip) = got;
            let got = &keep[skip..];
            // Received aside: copy the part the read wants.
            let from = (at - offset) as usize;
            let upto = ((end - offset) as usize).min(got.len());
            if from >= upto {
                eof = true;
                continue;
            }
            buf[(at - pos) as usize..(at - pos) as usize + (upto - from)].copy_from_slice(&got[from..upto]);
            at += (upto - from) as u64;
            if got.len() < len && at == offset + got.len() as u64 && at < end {
                eof = true;
            }
            if seg_end > end && got.len() > upto {
                rest = Some(Segment { offset: end, len: len - upto, data: Data::Ready(keep, skip + upto) });
            }
        }
        // A failed segment is read again directly: a lost connection is
        // the caller's to handle, a real error shows there too.
        if !eof && at < end {
            if failed {
                self.reset();
            }
            at += direct(&mut buf[(at - pos) as usize..], at)? as u64;
            eof = at < end;
        }
        let done = (at - pos) as usize;

        let mut st = self.lock();
        if st.gen != gen || failed {
            return Ok(done);
        }
        if eof {
            // The file ends here as far as anyone knows: nothing past it.
            st.size = at;
            st.drop_segments();
            return Ok(done);
        }
        st.size = st.size.max(end);
        if let Some(r) = rest {
            if st.next == end && st.segments.front().is_none_or(|s| s.offset == r.end()) {
                st.segments.push_front(r);
            }
        }
        if !sequential || st.run < 2 {
            return Ok(done);
        }
        st.run_bytes += done as u64;
        st.window = st
            .run_bytes
            .max(2 * n as u64)
            .max(WINDOW_FIRST)
            .clamp(2 * segment as u64, WINDOW_MAX.max(2 * segment as u64));
        let segment =
            if segment < SEGMENT_MIN { segment } else { segment.max(((st.window / 32) as usize).min(SEGMENT_GROWN)) };
        // Refilled in batches, not a segment per read: a reader of 64 KiB
        // fed one request per read kept the server's worker draining the
        // socket and waiting in epoll once per request (12,000 wake-ups per
        // GiB against 76 with 1 MiB segments; issue 35, docs/benchmarks.md).
        let ahead = st.end().map_or(0, |e| e.saturating_sub(st.next));
        if ahead > 0 && ahead > st.full / 2 {
            return Ok(done);
        }
        let mut from = st.end().unwrap_or(st.next);
        let mut reqs = Vec::new();
        while from < st.next + st.window && from < st.size {
            let len = (segment as u64).min(st.size - from) as usize;
            reqs.push((Request::Pread { handle, offset: from, count: len as u32 }, len as u64));
            from += len as u64;
        }
        // One send for the batch. Read-ahead is best effort: what is
        // refused or fails is left to the reader.
        let ids = engine.try_start_many(&reqs).unwrap_or_default();
        for ((req, len), id) in reqs.iter().zip(ids) {
            let Request::Pread { offset, .. } = *req else { continue };
            st.segments.push_back(Segment { offset, len: *len as usize, data: Data::Flight(id) });
            count.count_ahead(*len as usize);
        }
        st.full = st.end().map_or(0, |e| e.saturating_sub(st.next));
        Ok(done)
    }
}

/// The request size of read-ahead for reads sent as requests of `chunk`
/// bytes: the same from `LANDS_MIN` up (so each lands in the caller's
/// buffer), `SEGMENT_MIN` for smaller reads, at most one request.
pub fn segment_for(chunk: usize, max_io: usize) -> usize {
    let s = if chunk >= LANDS_MIN { chunk } else { SEGMENT_MIN };
    s.min(max_io)
}
