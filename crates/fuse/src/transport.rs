//! The FUSE transport: FUSE over io_uring where the kernel offers it, else
//! `/dev/fuse` reads (the ring channel is in the vendored fuser,
//! `vendor/fuser/src/uring.rs`).

use std::io;
use std::path::Path;

/// The `fuse` module's switch: the kernel offers FUSE over io_uring in
/// `INIT` only while it is on.
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether a mount asks for the rings: yes unless the caller or
/// `FERRY_FUSE_URING=0` says `/dev/fuse` only.
pub fn ring_wanted(dev_fuse_only: bool) -> bool {
    !dev_fuse_only && std::env::var("FERRY_FUSE_URING").map_or(true, |v| v != "0")
}

/// Sets `enable_uring` for as long as it lives, then puts back the value
/// it found (benchmarks compare both transports in one run).
pub struct EnableUring {
    old: Option<bool>,
}

impl EnableUring {
    /// Sets the switch to `on`; an error where it cannot be (no such
    /// kernel support, not root).
    pub fn set(on: bool) -> io::Result<EnableUring> {
        let old = read(Path::new(ENABLE_URING))?;
        std::fs::write(ENABLE_URING, if on { "Y" } else { "N" })?;
        Ok(EnableUring { old: Some(old) })
    }
}

impl Drop for EnableUring {
    fn drop(&mut self) {
        if let Some(old) = self.old.take() {
            let _ = std::fs::write(ENABLE_URING, if old { "Y" } else { "N" });
        }
    }
}

fn read(p: &Path) -> io::Result<bool> {
    Ok(std::fs::read_to_string(p)?.trim() == "Y")
}
