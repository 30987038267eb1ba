//! A file's data in the memory backend: sparse chunks, so a write far
//! past the end of a file (or a truncate that extends it) costs nothing for
//! the hole.

use std::collections::BTreeMap;

use super::CHUNK;

/// Sparse file contents: chunk `i` holds bytes from `i * CHUNK`; bytes below
/// `size` that no chunk holds read as zeros.
#[derive(Default)]
pub(super) struct FileData {
    pub(super) size: u64,
    chunks: BTreeMap<u64, Vec<u8>>,
}

impl FileData {
    pub(super) fn allocated(&self) -> u64 {
        self.chunks.values().map(|c| c.len() as u64).sum()
    }

    /// Bytes a write of `len` at `pos` would add to the chunks, to charge them
    /// before touching anything.
    pub(super) fn growth(&self, mut pos: u64, len: usize) -> u64 {
        let mut left = len as u64;
        let mut grow = 0;
        while left > 0 {
            let (idx, within) = (pos / CHUNK, pos % CHUNK);
            let n = left.min(CHUNK - within);
            let have = self.chunks.get(&idx).map_or(0, |c| c.len() as u64);
            grow += (within + n).saturating_sub(have);
            pos += n;
            left -= n;
        }
        grow
    }

    pub(super) fn write_at(&mut self, mut pos: u64, mut data: &[u8]) {
        while !data.is_empty() {
            let idx = pos / CHUNK;
            let within = (pos % CHUNK) as usize;
            let n = data.len().min(CHUNK as usize - within);
            let end = within + n;
            let chunk = self.chunks.entry(idx).or_default();
            if chunk.len() < end {
                if chunk.capacity() < end {
                    // Double like a Vec would, but never past one chunk, so
                    // appends stay cheap without wasting half a chunk.
                    let want = end.max(chunk.capacity() * 2).min(CHUNK as usize);
                    chunk.reserve_exact(want - chunk.len());
                }
                chunk.resize(end, 0);
            }
            chunk[within..end].copy_from_slice(&data[..n]);
            pos += n as u64;
            data = &data[n..];
        }
        self.size = self.size.max(pos);
    }

    pub(super) fn read_at(&self, offset: u64, len: usize) -> Vec<u8> {
        if offset >= self.size || len == 0 {
            return Vec::new();
        }
        let end = self.size.min(offset.saturating_add(len as u64));
        let mut out = vec![0u8; (end - offset) as usize];
        for (&idx, chunk) in self.chunks.range(offset / CHUNK..=(end - 1) / CHUNK) {
            let start = idx * CHUNK;
            let from = offset.max(start);
            let to = end.min(start + chunk.len() as u64);
            if from < to {
                out[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&chunk[(from - start) as usize..(to - start) as usize]);
            }
        }
        out
    }

    /// Returns the bytes freed.
    pub(super) fn set_size(&mut self, size: u64) -> u64 {
        let mut freed = 0;
        if size < self.size {
            let dropped = self.chunks.split_off(&size.div_ceil(CHUNK));
            freed += dropped.values().map(|c| c.len() as u64).sum::<u64>();
            let within = (size % CHUNK) as usize;
            if within != 0 {
                if let Some(c) = self.chunks.get_mut(&(size / CHUNK)) {
                    if c.len() > within {
                        freed += (c.len() - within) as u64;
                        c.truncate(within);
                    }
                }
            }
        }
        self.size = size;
        freed
    }
}
