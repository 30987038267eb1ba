//! Bounded little-endian reader and writer: the only place that touches bytes.

use crate::DecodeError;

/// Reads fields from a borrowed body; every length is checked.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or(DecodeError::Short(what))?;
        let s = self.buf.get(self.pos..end).ok_or(DecodeError::Short(what))?;
        self.pos = end;
        Ok(s)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }
    pub fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    pub fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }
    pub fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
    pub fn i64(&mut self, what: &'static str) -> Result<i64, DecodeError> {
        Ok(self.u64(what)? as i64)
    }
    pub fn bool(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Invalid(what)),
        }
    }
    pub fn array32(&mut self, what: &'static str) -> Result<[u8; 32], DecodeError> {
        Ok(self.take(32, what)?.try_into().expect("32 bytes"))
    }
    /// Bytes with a u16 length prefix: paths and names, which on Linux are
    /// any bytes but NUL (a NUL is left for the server to refuse with `EINVAL`).
    pub fn name(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let n = self.u16(what)? as usize;
        self.take(n, what)
    }
    /// A UTF-8 string with a u16 length prefix (error messages).
    pub fn str(&mut self, what: &'static str) -> Result<&'a str, DecodeError> {
        let n = self.u16(what)? as usize;
        let b = self.take(n, what)?;
        std::str::from_utf8(b).map_err(|_| DecodeError::Invalid(what))
    }
    /// Opaque bytes with a u32 length prefix (xattr values).
    pub fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let n = self.u32(what)? as usize;
        self.take(n, what)
    }
    /// Everything left: the raw bulk tail of a frame.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }
    pub fn finish(&self, what: &'static str) -> Result<(), DecodeError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(DecodeError::Trailing(what))
        }
    }
}

/// Appends fields to a frame buffer.
pub struct Writer<'a> {
    pub out: &'a mut Vec<u8>,
}

impl Writer<'_> {
    pub fn u8(&mut self, v: u8) {
        self.out.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.u64(v as u64);
    }
    pub fn bool(&mut self, v: bool) {
        self.u8(v as u8);
    }
    pub fn raw(&mut self, v: &[u8]) {
        self.out.extend_from_slice(v);
    }
    /// Names longer than u16::MAX are a caller bug: senders check requests
    /// with `Request::check_limits` before they reach the encoder.
    pub fn name(&mut self, v: &[u8]) {
        let n = u16::try_from(v.len()).expect("name longer than 65535 bytes");
        self.u16(n);
        self.raw(v);
    }
    /// Text (error messages): cut at a character boundary to what the
    /// length field holds, so no message can make the encoder fail.
    pub fn str(&mut self, v: &str) {
        let mut end = v.len().min(u16::MAX as usize);
        while !v.is_char_boundary(end) {
            end -= 1;
        }
        self.name(&v.as_bytes()[..end]);
    }
    pub fn bytes(&mut self, v: &[u8]) {
        let n = u32::try_from(v.len()).expect("byte field longer than 4 GiB");
        self.u32(n);
        self.raw(v);
    }
}
