//! Receive buffers that start on a page boundary.
//!
//! The kernel's receive copy (`_copy_to_iter`) into a buffer that starts
//! off a cache line costs about twice as much as into an aligned one on
//! this machine kind (docs/benchmarks.md, "Issue 34's yardsticks"), and a
//! fresh `Vec` of a MiB sits 16 bytes past a page. So buffers the library
//! receives data into itself — the small-read buffer, read-ahead segments
//! received aside — are placed on a page, by allocating a page more and
//! starting where the page begins (no `unsafe`, no allocator of our own).

use std::ops::{Deref, DerefMut};

const PAGE: usize = 4096;

/// A byte buffer of `len` bytes; page-aligned when made by `with_len` or
/// `set_len`.
#[derive(Default)]
pub struct PageBuf {
    v: Vec<u8>,
    at: usize,
    len: usize,
}

impl PageBuf {
    /// `len` zeroed bytes starting on a page.
    pub fn with_len(len: usize) -> PageBuf {
        let v = vec![0u8; len + PAGE];
        let at = v.as_ptr().align_offset(PAGE);
        PageBuf { v, at, len }
    }

    /// Bytes received elsewhere, kept where they are.
    pub fn from_vec(v: Vec<u8>) -> PageBuf {
        let len = v.len();
        PageBuf { v, at: 0, len }
    }

    /// Makes the buffer `len` bytes long, starting on a page. What it held
    /// is kept only when no new allocation was needed: callers fill it
    /// afresh.
    pub fn set_len(&mut self, len: usize) {
        let aligned = (self.v.as_ptr() as usize + self.at).is_multiple_of(PAGE);
        if aligned && self.v.len() - self.at >= len {
            self.len = len;
        } else {
            *self = PageBuf::with_len(len);
        }
    }

    /// Keeps the first `len` bytes (at most the current length).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

impl Deref for PageBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.v[self.at..self.at + self.len]
    }
}

impl DerefMut for PageBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.at..self.at + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_start_on_a_page_and_keep_their_length() {
        for len in [1, 4096, 65536, 1 << 20] {
            let b = PageBuf::with_len(len);
            assert_eq!(b.as_ptr() as usize % PAGE, 0, "{len}");
            assert_eq!(b.len(), len);
        }
        let mut b = PageBuf::from_vec(vec![7u8; 10]);
        assert_eq!(&b[..], &[7u8; 10]);
        b.set_len(1 << 20);
        assert_eq!(b.as_ptr() as usize % PAGE, 0);
        assert_eq!(b.len(), 1 << 20);
        let p = b.as_ptr();
        b.set_len(4096);
        assert_eq!(b.as_ptr(), p, "shrinking reuses the allocation");
        b.truncate(10);
        assert_eq!(b.len(), 10);
    }
}
