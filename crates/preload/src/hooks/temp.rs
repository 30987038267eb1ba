//! `mkstemp` and friends: glibc opens the file with an internal call, so a
//! template under a mount is filled in and created here.

use libc::{c_char, c_int};

use super::remote_path;
use crate::guard::{enter, set_errno};
use crate::ops;

const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

/// Tries names for `template` (ending in `XXXXXX` then `suffix` bytes)
/// until `create` does not say `EEXIST`; the template is updated in place.
fn fill(template: *mut c_char, suffix: c_int, create: &dyn Fn(&[u8]) -> Result<c_int, i32>) -> Result<c_int, i32> {
    // SAFETY: the caller passes a writable NUL-terminated template.
    let t = unsafe { std::ffi::CStr::from_ptr(template) }.to_bytes().len();
    let s = usize::try_from(suffix).map_err(|_| libc::EINVAL)?;
    if t < 6 + s {
        return Err(libc::EINVAL);
    }
    let at = t - 6 - s;
    // SAFETY: as above; `at..at + 6` lies inside the template.
    let x = unsafe { std::slice::from_raw_parts_mut(template.cast::<u8>().add(at), 6) };
    if x != b"XXXXXX" {
        return Err(libc::EINVAL);
    }
    for _ in 0..100 {
        let mut r = [0u8; 6];
        getrandom::getrandom(&mut r).map_err(|_| libc::EIO)?;
        for (d, b) in x.iter_mut().zip(r) {
            *d = LETTERS[b as usize % LETTERS.len()];
        }
        // SAFETY: the template is still a valid C string.
        let name = unsafe { std::ffi::CStr::from_ptr(template) }.to_bytes();
        match create(name) {
            Err(libc::EEXIST) => continue,
            r => return r,
        }
    }
    Err(libc::EEXIST)
}

fn temp_file(template: *mut c_char, suffix: c_int, flags: c_int) -> Option<c_int> {
    safe_path!(remote_path(template))?;
    let flags =
        (flags & (libc::O_APPEND | libc::O_CLOEXEC | libc::O_SYNC)) | libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;
    let r = enter(|| {
        fill(template, suffix, &|name| {
            let r = crate::state::resolve(name, None).ok_or(libc::EXDEV)?;
            ops::open(&r, flags, 0o600)
        })
    });
    Some(crate::guard::ret(r))
}

macro_rules! mkstemp_hook {
    ($name:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(t: *mut c_char) -> c_int {
            temp_file(t, 0, 0).unwrap_or_else(|| pass!($name(t)))
        }
    };
}
mkstemp_hook!(mkstemp);
mkstemp_hook!(mkstemp64);

macro_rules! mkostemp_hook {
    ($name:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(t: *mut c_char, f: c_int) -> c_int {
            temp_file(t, 0, f).unwrap_or_else(|| pass!($name(t, f)))
        }
    };
}
mkostemp_hook!(mkostemp);
mkostemp_hook!(mkostemp64);

macro_rules! mkstemps_hook {
    ($name:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(t: *mut c_char, s: c_int) -> c_int {
            temp_file(t, s, 0).unwrap_or_else(|| pass!($name(t, s)))
        }
    };
}
mkstemps_hook!(mkstemps);
mkstemps_hook!(mkstemps64);

macro_rules! mkostemps_hook {
    ($name:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(t: *mut c_char, s: c_int, f: c_int) -> c_int {
            temp_file(t, s, f).unwrap_or_else(|| pass!($name(t, s, f)))
        }
    };
}
mkostemps_hook!(mkostemps);
mkostemps_hook!(mkostemps64);

#[no_mangle]
pub unsafe extern "C" fn mkdtemp(t: *mut c_char) -> *mut c_char {
    if safe_path!(remote_path(t)).is_none() {
        return pass!(mkdtemp(t));
    }
    let r = enter(|| {
        fill(t, 0, &|name| {
            let r = crate::state::resolve(name, None).ok_or(libc::EXDEV)?;
            ops::with(&r, |c, p| c.create_dir(p, 0o700)).map(|_| 0)
        })
    });
    match r {
        Ok(_) => t,
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}
