//! The fixed 16-byte frame header shared by requests and replies.

use crate::DecodeError;

/// Size of every frame header.
pub const HEADER_LEN: usize = 16;

/// Set in a reply's flags when the body is an error (errno + message).
pub const FLAG_ERROR: u16 = 1;

/// Set in a server frame that answers no request (a notice such as
/// `LeaseBreak`; its id is 0). Clients that never turned on what sends
/// notices never see one.
pub const FLAG_NOTIFY: u16 = 2;

/// Writes `slot` into the `flags` of the request frame starting at
/// `frame[0]`: the caller the request is made for (capability `IDENTITY`;
/// request flags carry nothing else).
pub fn set_caller_slot(frame: &mut [u8], slot: u16) {
    frame[6..8].copy_from_slice(&slot.to_le_bytes());
}

/// `len` (u32, bytes after the header), `op` (u16), `flags` (u16), `id` (u64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub len: u32,
    pub op: u16,
    pub flags: u16,
    pub id: u64,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&self.len.to_le_bytes());
        b[4..6].copy_from_slice(&self.op.to_le_bytes());
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HEADER_LEN]) -> Header {
        Header {
            len: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            op: u16::from_le_bytes([b[4], b[5]]),
            flags: u16::from_le_bytes([b[6], b[7]]),
            id: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
        }
    }

    /// Rejects a frame whose body would exceed the negotiated limit before
    /// anything is allocated for it.
    pub fn check_len(&self, max_body: u32) -> Result<(), DecodeError> {
        if self.len > max_body {
            Err(DecodeError::TooLarge { len: self.len, max: max_body })
        } else {
            Ok(())
        }
    }

    pub fn is_notice(&self) -> bool {
        self.flags & FLAG_NOTIFY != 0
    }

    pub fn is_error(&self) -> bool {
        self.flags & FLAG_ERROR != 0
    }
}
