//! Many byte ranges of many files in one round of pipelined requests: each
//! file is opened once, then every range's reads are in flight together
//! (as many as the window holds), replies landing in their own buffers.

use std::collections::{HashMap, VecDeque};

use ferry_client::{Client, File, OpenOptions};
use ferry_proto::Request;

use crate::paths::RemotePath;

/// One request of a range: which range, where in its buffer, how much.
struct Part {
    id: u64,
    range: usize,
    at: usize,
    len: usize,
}

/// `start`/`end` with Python slice rules against `size`.
fn bounds(start: Option<i64>, end: Option<i64>, size: u64) -> (u64, u64) {
    let size = size as i64;
    let clamp = |v: i64| if v < 0 { (size + v).max(0) } else { v.min(size) };
    let s = clamp(start.unwrap_or(0));
    let e = clamp(end.unwrap_or(size));
    (s as u64, e.max(s) as u64)
}

pub fn read_ranges(
    client: &Client,
    paths: &[RemotePath],
    starts: &[Option<i64>],
    ends: &[Option<i64>],
) -> Vec<ferry_client::Result<Vec<u8>>> {
    let mut files: HashMap<&std::path::Path, ferry_client::Result<File>> = HashMap::new();
    for p in paths {
        files.entry(p.api()).or_insert_with(|| client.open(p.api(), OpenOptions::new().read(true)));
    }
    let mut out: Vec<ferry_client::Result<Vec<u8>>> = Vec::with_capacity(paths.len());
    let mut got = vec![0usize; paths.len()];
    let mut plan = Vec::new();
    let max_io = client.engine().max_io();
    for (i, p) in paths.iter().enumerate() {
        match &files[p.api()] {
            Err(e) => out.push(Err(e.clone())),
            Ok(f) => {
                let (s, e) = bounds(starts[i], ends[i], f.attr().size);
                let len = (e - s) as usize;
                out.push(Ok(vec![0u8; len]));
                let mut at = 0;
                while at < len {
                    let n = (len - at).min(max_io);
                    plan.push((i, f.handle(), s + at as u64, at, n));
                    at += n;
                }
            }
        }
    }
    let engine = client.engine();
    let depth = (engine.window() as usize).max(1);
    let mut flight: VecDeque<Part> = VecDeque::new();
    let mut finish = |part: Part, out: &mut Vec<ferry_client::Result<Vec<u8>>>| {
        let dest = match &mut out[part.range] {
            Ok(v) => Some(&mut v[part.at..part.at + part.len]),
            Err(_) => None,
        };
        match engine.finish(part.id, dest) {
            // A short part: the file ended; only the bytes before the
            // first short part count.
            Ok(fr) => got[part.range] += fr.data_len,
            Err(e) => {
                if dest_ok(out, part.range) {
                    out[part.range] = Err(e);
                }
            }
        }
    };
    for (range, handle, offset, at, len) in plan {
        if flight.len() >= depth {
            let p = flight.pop_front().expect("in flight");
            finish(p, &mut out);
        }
        match engine.start(&Request::Pread { handle, offset, count: len as u32 }, len as u64) {
            Ok(id) => flight.push_back(Part { id, range, at, len }),
            Err(e) => out[range] = Err(e),
        }
    }
    while let Some(p) = flight.pop_front() {
        finish(p, &mut out);
    }
    for (i, r) in out.iter_mut().enumerate() {
        if let Ok(v) = r {
            // Ranges are clamped to the size at open; a file that shrank
            // since reads short, and the result says so by its length.
            v.truncate(got[i]);
        }
    }
    for (_, f) in files {
        if let Ok(f) = f {
            let _ = f.close();
        }
    }
    out
}

fn dest_ok(out: &[ferry_client::Result<Vec<u8>>], i: usize) -> bool {
    out[i].is_ok()
}
