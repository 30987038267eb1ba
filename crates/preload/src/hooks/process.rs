//! Process life: start and exit, `fork`/`vfork`/`exec`/`posix_spawn`, and
//! the working directory.

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering::Relaxed;

use libc::{c_char, c_int, pid_t, size_t};

use super::{remote_fd, remote_path};
use crate::guard::{self, enter, ret};
use crate::{ops, real, state};

extern "C" {
    static mut environ: *const *const c_char;
}

/// The process ends: its shared mappings' files go if no one else uses them.
fn leave_mappings() {
    if state::ACTIVE.load(Relaxed) && !guard::busy() && state::owner() {
        let _ = enter(|| {
            crate::maps::leave_all();
            Ok(())
        });
    }
}

/// Writes gathered data through before the process image changes hands.
fn sync_before_handoff() {
    if state::ACTIVE.load(Relaxed) && !guard::busy() && state::owner() {
        let _ = enter(|| {
            ops::sync_all();
            Ok(())
        });
    }
}

// ---- the environment a new program gets ----

/// `envp` with ferry's settings put back where a program dropped them, and
/// `FERRY_CWD` saying where the remote working directory is. `None` when
/// nothing needs changing (the common case: no allocation).
///
/// # Safety
/// `envp` is NULL or a NULL-terminated array of C strings.
unsafe fn fixed_env(envp: *const *const c_char, keep: &[c_int]) -> Option<(Vec<CString>, Vec<*const c_char>)> {
    let cfg = state::config()?;
    let mut have: Vec<&[u8]> = Vec::new();
    if !envp.is_null() {
        let mut i = 0;
        // SAFETY: per the function's contract.
        while let Some(p) = unsafe { envp.add(i).as_ref() }.filter(|p| !p.is_null()) {
            // SAFETY: each entry is a C string.
            have.push(unsafe { CStr::from_ptr(*p) }.to_bytes());
            i += 1;
        }
    }
    let find =
        |name: &str| have.iter().position(|e| e.starts_with(name.as_bytes()) && e.get(name.len()) == Some(&b'='));
    let mut changes: Vec<(Option<usize>, Option<Vec<u8>>)> = Vec::new();
    for (k, v) in &cfg.keep_env {
        match find(k) {
            None => changes.push((None, Some(format!("{k}={v}").into_bytes()))),
            Some(i) if k == "LD_PRELOAD" => {
                let cur = std::str::from_utf8(&have[i][k.len() + 1..]).unwrap_or("");
                if !cur.split([':', ' ']).any(|x| v.split([':', ' ']).any(|y| y == x && x.contains("ferry"))) {
                    changes.push((Some(i), Some(format!("{k}={v}:{cur}").into_bytes())));
                }
            }
            Some(_) => {}
        }
    }
    let cwd = state::CWD.read().clone();
    let want = cwd.map(|c| [&b"FERRY_CWD="[..], &c].concat());
    match (find("FERRY_CWD"), want) {
        (Some(i), Some(w)) if have[i] != w => changes.push((Some(i), Some(w))),
        (Some(i), None) => changes.push((Some(i), None)),
        (None, Some(w)) => changes.push((None, Some(w))),
        _ => {}
    }
    // Sockets holding the handles of lent descriptors the program inherits
    // (`lent.rs`): its library keeps them out of the program's way.
    let want = (!keep.is_empty()).then(|| format!("FERRY_KEEP={}", crate::lent::keep_value(keep)).into_bytes());
    match (find("FERRY_KEEP"), want) {
        (Some(i), Some(w)) if have[i] != w => changes.push((Some(i), Some(w))),
        (Some(i), None) => changes.push((Some(i), None)),
        (None, Some(w)) => changes.push((None, Some(w))),
        _ => {}
    }
    if changes.is_empty() {
        return None;
    }
    let mut owned: Vec<CString> = Vec::new();
    for (i, e) in have.iter().enumerate() {
        match changes.iter().find(|(at, _)| *at == Some(i)) {
            Some((_, Some(new))) => owned.push(CString::new(new.as_slice()).ok()?),
            Some((_, None)) => {}
            None => owned.push(CString::new(*e).ok()?),
        }
    }
    for (at, new) in &changes {
        if let (None, Some(new)) = (at, new) {
            owned.push(CString::new(new.as_slice()).ok()?);
        }
    }
    let mut ptrs: Vec<*const c_char> = owned.iter().map(|c| c.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    Some((owned, ptrs))
}

/// Runs `f` with the fixed environment (or the given one unchanged).
///
/// # Safety
/// As for `fixed_env`.
/// `spawn`: a `posix_spawn` whose file actions may move any descriptor into
/// place (every lent one is taken as inherited).
unsafe fn with_env<T>(envp: *const *const c_char, spawn: bool, f: impl FnOnce(*const *const c_char) -> T) -> T {
    if guard::busy() || !state::ACTIVE.load(Relaxed) {
        return f(envp);
    }
    let exposed = lent_before_exec(spawn);
    // SAFETY: per the function's contract.
    let r = match unsafe { fixed_env(envp, &exposed.keep) } {
        Some((_owned, ptrs)) => f(ptrs.as_ptr()),
        None => f(envp),
    };
    crate::lent::after_exec(&exposed);
    r
}

/// Lent descriptors a new program inherits keep their handles (`lent.rs`).
fn lent_before_exec(all: bool) -> crate::lent::Exposed {
    let mut x = None;
    let _ = enter(|| {
        x = Some(crate::lent::before_exec(all));
        Ok(())
    });
    x.unwrap_or_else(crate::lent::Exposed::none)
}

#[no_mangle]
pub unsafe extern "C" fn execve(p: *const c_char, a: *const *const c_char, e: *const *const c_char) -> c_int {
    let fixed = safe_path!(super::local_fix(p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    // SAFETY: p is the caller's C string.
    if let Some(r) = unsafe { remote_path(p) } {
        return crate::links::follow_out(
            &r,
            // SAFETY: the caller's arguments.
            || unsafe { exec_remote(&r, p, a, e) },
            // SAFETY: this hook again, on the path a symlink's target gives
            // (the program's arguments unchanged: `argv[0]` still names the
            // link, as the kernel leaves it).
            |next| unsafe { execve(next.as_ptr(), a, e) },
        );
    }
    sync_before_handoff();
    // SAFETY: forwarding the caller's arguments, with a fixed environment.
    unsafe { with_env(e, false, |env| real::execve(p, a, env)) }
}

/// `execve` of a program stored on the server: its bytes go into a memfd,
/// which the kernel runs (a script's interpreter opens it as /dev/fd/N).
/// A script whose `#!` interpreter is itself under a mount (a venv's
/// `bin/pip`: `#!/remote/v/bin/python3`) the kernel could not start: it
/// runs here as the kernel would run it, `INTERP [ARG] SCRIPT ARGS...`,
/// through this `execve` again.
///
/// # Safety
/// As for `execve`.
unsafe fn exec_remote(
    r: &crate::mounts::Remote,
    p: *const c_char,
    a: *const *const c_char,
    e: *const *const c_char,
) -> c_int {
    let data = match enter(|| program_bytes(r)) {
        Ok(d) => d,
        Err(e) => return ret::<c_int>(Err(e)),
    };
    if let Some((interp, arg)) = shebang(&data) {
        if state::resolve(&interp, None).is_some() {
            let Ok(interp) = CString::new(interp) else { return ret::<c_int>(Err(libc::ENOEXEC)) };
            let arg = arg.and_then(|x| CString::new(x).ok());
            let mut argv: Vec<*const c_char> = vec![interp.as_ptr()];
            argv.extend(arg.as_ref().map(|x| x.as_ptr()));
            argv.push(p);
            // SAFETY: a is the caller's NULL-terminated argument vector.
            unsafe {
                if !a.is_null() && !(*a).is_null() {
                    let mut i = 1;
                    while !(*a.add(i)).is_null() {
                        argv.push(*a.add(i));
                        i += 1;
                    }
                }
            }
            argv.push(std::ptr::null());
            // SAFETY: our execve with a vector we built of valid strings.
            return unsafe { execve(interp.as_ptr(), argv.as_ptr(), e) };
        }
    }
    let fd = match enter(|| program_memfd(&data)) {
        Ok(fd) => fd,
        Err(e) => return ret::<c_int>(Err(e)),
    };
    sync_before_handoff();
    // SAFETY: fd is our memfd; the arguments are the caller's.
    let rc = unsafe { with_env(e, false, |env| real::fexecve(fd, a, env)) };
    let err = guard::errno();
    // SAFETY: exec failed: the copy is ours to close.
    unsafe { real::close(fd) };
    guard::set_errno(err);
    rc
}

/// `#!INTERP [ARG]` of a script, as the kernel splits it.
fn shebang(data: &[u8]) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
    let line = data.strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|b| *b == b'\n').unwrap_or(line.len())];
    let line = line.trim_ascii();
    let cut = line.iter().position(|b| *b == b' ' || *b == b'\t');
    let (interp, arg) = match cut {
        Some(i) => (&line[..i], Some(line[i..].trim_ascii().to_vec()).filter(|x| !x.is_empty())),
        None => (line, None),
    };
    (!interp.is_empty()).then(|| (interp.to_vec(), arg))
}

/// The bytes of the remote program at `r`, which must be a regular file
/// with an execute bit.
fn program_bytes(r: &crate::mounts::Remote) -> Result<Vec<u8>, i32> {
    let a = ops::stat_path(r, true)?;
    if a.mode & libc::S_IFMT != libc::S_IFREG || a.mode & 0o111 == 0 {
        return Err(libc::EACCES);
    }
    ops::with_ro(r, |c, p| c.read(p))
}

/// A memfd holding `data` (not close-on-exec, so a script's interpreter
/// can open it).
fn program_memfd(data: &[u8]) -> Result<c_int, i32> {
    // SAFETY: the name is a NUL-terminated literal.
    let fd = unsafe { libc::memfd_create(c"ferry-exec".as_ptr(), 0) };
    if fd < 0 {
        return Err(guard::errno());
    }
    let mut off = 0;
    while off < data.len() {
        // SAFETY: writing our buffer to our memfd.
        let n = unsafe { real::write(fd, data[off..].as_ptr().cast(), data.len() - off) };
        if n <= 0 {
            let e = guard::errno();
            // SAFETY: closing our memfd.
            unsafe { real::close(fd) };
            return Err(if n == 0 { libc::EIO } else { e });
        }
        off += n as usize;
    }
    Ok(fd)
}

#[no_mangle]
pub unsafe extern "C" fn execv(p: *const c_char, a: *const *const c_char) -> c_int {
    let fixed = safe_path!(super::local_fix(p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    // SAFETY: our execve with the process environment.
    unsafe { execve(p, a, environ) }
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(p: *const c_char, a: *const *const c_char, e: *const *const c_char) -> c_int {
    // A name with a slash is not searched in PATH: it may be remote.
    // SAFETY: p is the caller's C string.
    if unsafe { super::bytes(p) }.is_some_and(|b| b.contains(&b'/')) {
        // SAFETY: our execve with the caller's arguments.
        return unsafe { execve(p, a, e) };
    }
    let fixed = safe_path!(super::local_fix(p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    sync_before_handoff();
    // SAFETY: forwarding the caller's arguments, with a fixed environment.
    unsafe { with_env(e, false, |env| real::execvpe(p, a, env)) }
}

#[no_mangle]
pub unsafe extern "C" fn execvp(p: *const c_char, a: *const *const c_char) -> c_int {
    let fixed = safe_path!(super::local_fix(p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    // SAFETY: our execvpe with the process environment.
    unsafe { execvpe(p, a, environ) }
}

#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: c_int, a: *const *const c_char, e: *const *const c_char) -> c_int {
    if remote_fd(fd).is_some() {
        return ret::<c_int>(Err(libc::EACCES));
    }
    sync_before_handoff();
    // SAFETY: forwarding the caller's arguments, with a fixed environment.
    unsafe { with_env(e, false, |env| real::fexecve(fd, a, env)) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut pid_t,
    p: *const c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    at: *const libc::posix_spawnattr_t,
    a: *const *mut c_char,
    e: *const *mut c_char,
) -> c_int {
    sync_before_handoff();
    // SAFETY: forwarding the caller's arguments, with a fixed environment.
    unsafe { with_env(e.cast(), !fa.is_null(), |env| real::posix_spawn(pid, p, fa, at, a, env.cast())) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut pid_t,
    p: *const c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    at: *const libc::posix_spawnattr_t,
    a: *const *mut c_char,
    e: *const *mut c_char,
) -> c_int {
    sync_before_handoff();
    // SAFETY: as in posix_spawn.
    unsafe { with_env(e.cast(), !fa.is_null(), |env| real::posix_spawnp(pid, p, fa, at, a, env.cast())) }
}

/// `vfork` becomes `fork`: a vfork child shares our memory, and the state
/// of remote files in it must stay the parent's. POSIX allows vfork to be
/// fork; only the speed of starting a child differs.
#[no_mangle]
pub unsafe extern "C" fn vfork() -> pid_t {
    // SAFETY: fork runs our atfork handlers, which keep the state right.
    pass!(fork())
}

#[no_mangle]
pub unsafe extern "C" fn system(c: *const c_char) -> c_int {
    sync_before_handoff();
    let exposed = if guard::busy() { crate::lent::Exposed::none() } else { lent_before_exec(false) };
    let r = pass!(system(c));
    crate::lent::after_exec(&exposed);
    waited(1);
    r
}

#[no_mangle]
pub unsafe extern "C" fn popen(c: *const c_char, m: *const c_char) -> *mut libc::FILE {
    sync_before_handoff();
    let exposed = if guard::busy() { crate::lent::Exposed::none() } else { lent_before_exec(false) };
    let f = pass!(popen(c, m));
    crate::lent::after_exec(&exposed);
    f
}

// ---- waiting for children ----

/// A child this process waited for (`r` > 0: one ended, or changed state)
/// may have changed remote files, as `make`'s compiler did the object its
/// linker step then looks at: what this process keeps of remote files
/// (attributes, listings, open answers, read-ahead) goes, so that a parent
/// sees at once what a child it waited for did.
fn waited(r: i64) {
    if r > 0 && state::ACTIVE.load(Relaxed) {
        crate::open::Open::all_changed();
    }
}

#[no_mangle]
pub unsafe extern "C" fn pclose(f: *mut libc::FILE) -> c_int {
    let r = pass!(pclose(f));
    waited(1);
    r
}

#[no_mangle]
pub unsafe extern "C" fn wait(status: *mut c_int) -> pid_t {
    let r = pass!(wait(status));
    waited(r.into());
    r
}

#[no_mangle]
pub unsafe extern "C" fn waitpid(pid: pid_t, status: *mut c_int, options: c_int) -> pid_t {
    let r = pass!(waitpid(pid, status, options));
    waited(r.into());
    r
}

#[no_mangle]
pub unsafe extern "C" fn wait3(status: *mut c_int, options: c_int, usage: *mut libc::rusage) -> pid_t {
    let r = pass!(wait3(status, options, usage));
    waited(r.into());
    r
}

#[no_mangle]
pub unsafe extern "C" fn wait4(pid: pid_t, status: *mut c_int, options: c_int, usage: *mut libc::rusage) -> pid_t {
    let r = pass!(wait4(pid, status, options, usage));
    waited(r.into());
    r
}

#[no_mangle]
pub unsafe extern "C" fn waitid(
    idtype: libc::idtype_t,
    id: libc::id_t,
    info: *mut libc::siginfo_t,
    options: c_int,
) -> c_int {
    let r = pass!(waitid(idtype, id, info, options));
    // 0 also with WNOHANG and no child ready: then `si_pid` is 0.
    // SAFETY: `info` is NULL or the caller's siginfo_t, which waitid filled.
    let child = unsafe { info.as_ref() }.is_none_or(|i| {
        // SAFETY: waitid filled `si_pid` (the union's child fields).
        let pid = unsafe { i.si_pid() };
        pid != 0
    });
    waited(i64::from(r == 0 && child));
    r
}

#[no_mangle]
pub unsafe extern "C" fn _exit(s: c_int) -> ! {
    sync_before_handoff();
    leave_mappings();
    // SAFETY: ends the process.
    pass!(_exit(s));
    unreachable!("_exit returned")
}

#[no_mangle]
pub unsafe extern "C" fn _Exit(s: c_int) -> ! {
    sync_before_handoff();
    leave_mappings();
    // SAFETY: ends the process.
    pass!(_Exit(s));
    unreachable!("_Exit returned")
}

// ---- working directory ----

fn set_cwd(local: Option<Vec<u8>>) {
    let changed = *state::CWD.read() != local;
    if !changed {
        return;
    }
    // Kept in the environment too, so a new program (after exec) starts
    // in the same remote directory.
    match &local {
        Some(l) => std::env::set_var("FERRY_CWD", std::ffi::OsStr::from_bytes(l)),
        None => std::env::remove_var("FERRY_CWD"),
    }
    *state::CWD.write() = local;
}

/// A successful local `chdir`/`fchdir`: the working directory is local again.
fn left_remote_cwd() {
    if state::ACTIVE.load(Relaxed) && !guard::busy() && state::CWD.read().is_some() {
        let _ = enter(|| {
            set_cwd(None);
            Ok(())
        });
    }
}

#[no_mangle]
pub unsafe extern "C" fn chdir(p: *const c_char) -> c_int {
    let fixed = safe_path!(super::local_fix(p));
    let p = fixed.as_ref().map_or(p, |c| c.as_ptr());
    let Some(r) = safe_path!(remote_path(p)) else {
        let rc = pass!(chdir(p));
        if rc == 0 {
            left_remote_cwd();
        }
        return rc;
    };
    crate::links::follow_out(
        &r,
        || {
            ret(enter(|| {
                let a = ops::stat_path(&r, true)?;
                if a.mode & libc::S_IFMT != libc::S_IFDIR {
                    return Err(libc::ENOTDIR);
                }
                set_cwd(Some(r.local.clone()));
                Ok(0)
            }))
        },
        // SAFETY: this hook again, on the path a symlink's target gives.
        |next| unsafe { chdir(next.as_ptr()) },
    )
}

#[no_mangle]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    let Some(o) = remote_fd(fd) else {
        let rc = pass!(fchdir(fd));
        if rc == 0 {
            left_remote_cwd();
        }
        return rc;
    };
    ret(enter(|| {
        if !o.dir {
            return Err(libc::ENOTDIR);
        }
        set_cwd(Some(o.local.clone()));
        Ok(0)
    }))
}

fn remote_cwd() -> Option<Vec<u8>> {
    if guard::busy() || !state::ACTIVE.load(Relaxed) {
        return None;
    }
    state::CWD.read().clone()
}

#[no_mangle]
pub unsafe extern "C" fn getcwd(buf: *mut c_char, size: size_t) -> *mut c_char {
    let Some(cwd) = remote_cwd() else { return pass!(getcwd(buf, size)) };
    let need = cwd.len() + 1;
    let dst = if buf.is_null() {
        // SAFETY: glibc's extension: a NULL buffer is allocated for the caller.
        unsafe { libc::malloc(need.max(size)) }.cast::<c_char>()
    } else {
        if size == 0 {
            guard::set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        if size < need {
            guard::set_errno(libc::ERANGE);
            return std::ptr::null_mut();
        }
        buf
    };
    if dst.is_null() {
        guard::set_errno(libc::ENOMEM);
        return dst;
    }
    // SAFETY: dst has room for need bytes (checked or allocated).
    unsafe {
        std::ptr::copy_nonoverlapping(cwd.as_ptr().cast(), dst, cwd.len());
        *dst.add(cwd.len()) = 0;
    }
    dst
}

#[no_mangle]
pub unsafe extern "C" fn get_current_dir_name() -> *mut c_char {
    if remote_cwd().is_none() {
        return pass!(get_current_dir_name());
    }
    // SAFETY: our getcwd with a NULL buffer allocates.
    unsafe { getcwd(std::ptr::null_mut(), 0) }
}

#[no_mangle]
pub unsafe extern "C" fn umask(m: libc::mode_t) -> libc::mode_t {
    state::UMASK.store(m & 0o777, Relaxed);
    pass!(umask(m))
}

// ---- start and exit ----

extern "C" fn atfork_prepare() {
    if state::ACTIVE.load(Relaxed) && !guard::busy() {
        let _ = enter(|| {
            state::before_fork();
            Ok(())
        });
    }
}

extern "C" fn atfork_parent() {
    if state::ACTIVE.load(Relaxed) && !guard::busy() {
        state::after_fork_parent();
    }
}

extern "C" fn atfork_child() {
    if state::ACTIVE.load(Relaxed) && !guard::busy() {
        state::after_fork_child();
    }
}

/// `FERRY_RECONNECT` (seconds, as `ferry run --reconnect` sets it).
fn reconnect_bound() -> Option<std::time::Duration> {
    let secs = match std::env::var("FERRY_RECONNECT") {
        Ok(v) => v.parse::<f64>().ok().filter(|s| s.is_finite() && *s >= 0.0).unwrap_or(60.0),
        Err(_) => 60.0,
    };
    (secs > 0.0).then(|| std::time::Duration::from_secs_f64(secs))
}

/// Runs when the library is loaded, before `main`.
pub fn init() {
    state::OWNER.store(state::getpid(), Relaxed);
    // A panic inside the library becomes an errno (`guard::enter`); its
    // message and backtrace must not land on the program's stderr. This is
    // the library's own std: a Rust program keeps its own hook.
    std::panic::set_hook(Box::new(|_| {}));
    let _ = enter(|| {
        let Ok(table) = std::env::var("FERRY_MOUNTS") else { return Ok(()) };
        let mounts = match crate::mounts::parse_table(&table) {
            Ok(m) if !m.is_empty() => m,
            Ok(_) => return Ok(()),
            Err(e) => {
                eprintln!("ferry: FERRY_MOUNTS: {e}; remote paths are disabled");
                return Ok(());
            }
        };
        *state::MOUNTS.write() = mounts;
        crate::attrs::configure(std::env::var("FERRY_ATTR_TIMEOUT").ok().as_deref());
        let token = match ferry_client::token::find_client_token(None) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("ferry: {e}");
                None
            }
        };
        let mut keep_env = Vec::new();
        for k in [
            "LD_PRELOAD",
            "FERRY_MOUNTS",
            "FERRY_TOKEN_FILE",
            "FERRY_TOKEN",
            "FERRY_RECONNECT",
            "FERRY_GATEWAY_TIMEOUT",
            "FERRY_ATTR_TIMEOUT",
            "FERRY_CACHE",
            "FERRY_CACHE_DIR",
            "FERRY_CACHE_SIZE",
            "FERRY_CACHE_CONFIG",
        ] {
            if let Ok(v) = std::env::var(k) {
                keep_env.push((k.to_string(), v));
            }
        }
        // Connections live on high, close-on-exec descriptors, out of the
        // program's way (`exec 3>file` in a shell, `dup2(x, 4)`).
        // A lost connection is replaced, as in the CLI and the mount (for up
        // to `ferry run --reconnect` seconds, a minute by default, then
        // `EIO`; 0: at once), and files open before a server restart
        // are opened again. A volatile session: a process's handles and
        // locks must end with its connection (a killed process holds no
        // lock for a lease), so after any reconnect its files are re-opened
        // by identity, and one that held a lock is stale; the session keeps
        // only the replies of requests that must not run twice, so one in
        // flight when the connection broke runs once.
        let options = ferry_client::Options {
            token,
            place_fd: Some(state::place_high),
            reconnect: reconnect_bound(),
            session_keeps_handles: false,
            // A program's own path argument: Linux's limit.
            max_path: libc::PATH_MAX as usize - 1,
            // A further connection would be one more descriptor a program
            // could close or take, and a volatile session has nothing for
            // it to share.
            data_channels: 0,
            // A malformed configuration is said once, and nothing cached.
            cache: ferry_client::cache::Cache::from_env().unwrap_or_else(|e| {
                eprintln!("ferry: {e}; nothing is cached");
                None
            }),
            ..Default::default()
        };
        let options = match options.clone().gateways_from_env() {
            Ok(o) => o,
            Err(e) => {
                eprintln!("ferry: {e}; the default applies");
                options
            }
        };
        // TLS's settings now, before any fork (never read while connecting).
        let options = match options.clone().tls_from_env() {
            Ok(o) => o,
            Err(e) => {
                // Unreadable: the safe reading.
                eprintln!("ferry: {e}; TLS for every server");
                ferry_client::Options { tls: Some(true), ..options }
            }
        };
        state::set_config(state::Config { options, keep_env });
        // SAFETY: umask has no preconditions; read it by setting it back.
        let m = pass!(umask(0o022));
        // SAFETY: as above.
        pass!(umask(m));
        state::UMASK.store(m, Relaxed);
        // Remote fds inherited across exec: their placeholders say what they are.
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            let fds: Vec<c_int> =
                dir.flatten().filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok())).collect();
            for fd in fds {
                ops::adopt(fd);
            }
        }
        crate::lent::adopt_kept();
        if let Some(cwd) = std::env::var_os("FERRY_CWD") {
            if state::resolve(cwd.as_bytes(), None).is_some() {
                *state::CWD.write() = Some(crate::mounts::normalize(cwd.as_bytes()));
            }
        }
        super::stdio::remember_std();
        // SAFETY: registering plain functions.
        unsafe { libc::pthread_atfork(Some(atfork_prepare), Some(atfork_parent), Some(atfork_child)) };
        state::ACTIVE.store(true, Relaxed);
        Ok(())
    });
    if state::ACTIVE.load(Relaxed) {
        for fd in 0..=2 {
            super::stdio::fd_changed(fd);
        }
    }
}

/// Runs at exit (from the dynamic linker's destructors).
pub fn fini() {
    if !state::ACTIVE.load(Relaxed) || guard::busy() || !state::owner() {
        return;
    }
    // Streams first (their data goes through our hooks), then our buffers.
    // SAFETY: flushing every stdio stream, as exit does.
    unsafe { libc::fflush(std::ptr::null_mut()) };
    state::EXITING.store(true, Relaxed);
    let _ = enter(|| {
        ops::sync_all();
        crate::maps::leave_all();
        Ok(())
    });
}
