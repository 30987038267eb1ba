//! The libc functions behind our hooks, found with `dlsym(RTLD_NEXT)` on
//! first use and cached.

#![allow(clippy::missing_safety_doc)]

use libc::{c_char, c_int, c_uint, c_void, mode_t, off64_t, size_t, ssize_t, FILE};

/// Looks a symbol up in the libraries after this one; aborts with a message
/// if it is missing, since a hook with no real function cannot go on.
pub fn lookup(name: &'static [u8]) -> usize {
    // SAFETY: `name` is a NUL-terminated literal; dlsym has no other precondition.
    let a = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) } as usize;
    if a == 0 {
        let msg = b"ferry preload: a libc function is missing; aborting\n";
        // SAFETY: writing a static buffer to stderr.
        unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
        std::process::abort();
    }
    a
}

macro_rules! real {
    ($( $name:ident ( $($arg:ident : $t:ty),* $(,)? ) -> $ret:ty; )*) => {
        $(
            #[allow(non_snake_case, clippy::too_many_arguments)]
            pub unsafe fn $name($($arg: $t),*) -> $ret {
                use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
                static ADDR: AtomicUsize = AtomicUsize::new(0);
                let mut a = ADDR.load(Relaxed);
                if a == 0 {
                    a = lookup(concat!(stringify!($name), "\0").as_bytes());
                    ADDR.store(a, Relaxed);
                }
                // SAFETY: `a` is libc's function of this name, whose C
                // signature is the one declared here.
                let f: unsafe extern "C" fn($($t),*) -> $ret = unsafe { std::mem::transmute(a) };
                // SAFETY: the caller upholds the function's contract.
                unsafe { f($($arg),*) }
            }
        )*
    };
}

pub type Stat = libc::stat64;

real! {
    open(p: *const c_char, f: c_int, m: c_uint) -> c_int;
    open64(p: *const c_char, f: c_int, m: c_uint) -> c_int;
    __open_2(p: *const c_char, f: c_int) -> c_int;
    __open64_2(p: *const c_char, f: c_int) -> c_int;
    openat(d: c_int, p: *const c_char, f: c_int, m: c_uint) -> c_int;
    openat64(d: c_int, p: *const c_char, f: c_int, m: c_uint) -> c_int;
    __openat_2(d: c_int, p: *const c_char, f: c_int) -> c_int;
    __openat64_2(d: c_int, p: *const c_char, f: c_int) -> c_int;
    creat(p: *const c_char, m: mode_t) -> c_int;
    creat64(p: *const c_char, m: mode_t) -> c_int;
    close(fd: c_int) -> c_int;
    close_range(a: c_uint, b: c_uint, f: c_int) -> c_int;
    closefrom(a: c_int) -> ();
    read(fd: c_int, b: *mut c_void, n: size_t) -> ssize_t;
    __read_chk(fd: c_int, b: *mut c_void, n: size_t, bl: size_t) -> ssize_t;
    pread(fd: c_int, b: *mut c_void, n: size_t, o: libc::off_t) -> ssize_t;
    pread64(fd: c_int, b: *mut c_void, n: size_t, o: off64_t) -> ssize_t;
    __pread_chk(fd: c_int, b: *mut c_void, n: size_t, o: libc::off_t, bl: size_t) -> ssize_t;
    __pread64_chk(fd: c_int, b: *mut c_void, n: size_t, o: off64_t, bl: size_t) -> ssize_t;
    readv(fd: c_int, v: *const libc::iovec, n: c_int) -> ssize_t;
    preadv(fd: c_int, v: *const libc::iovec, n: c_int, o: libc::off_t) -> ssize_t;
    preadv64(fd: c_int, v: *const libc::iovec, n: c_int, o: off64_t) -> ssize_t;
    write(fd: c_int, b: *const c_void, n: size_t) -> ssize_t;
    pwrite(fd: c_int, b: *const c_void, n: size_t, o: libc::off_t) -> ssize_t;
    pwrite64(fd: c_int, b: *const c_void, n: size_t, o: off64_t) -> ssize_t;
    writev(fd: c_int, v: *const libc::iovec, n: c_int) -> ssize_t;
    pwritev(fd: c_int, v: *const libc::iovec, n: c_int, o: libc::off_t) -> ssize_t;
    pwritev64(fd: c_int, v: *const libc::iovec, n: c_int, o: off64_t) -> ssize_t;
    lseek(fd: c_int, o: libc::off_t, w: c_int) -> libc::off_t;
    lseek64(fd: c_int, o: off64_t, w: c_int) -> off64_t;
    dup(fd: c_int) -> c_int;
    dup2(a: c_int, b: c_int) -> c_int;
    dup3(a: c_int, b: c_int, f: c_int) -> c_int;
    fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int;
    fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int;
    stat(p: *const c_char, s: *mut Stat) -> c_int;
    stat64(p: *const c_char, s: *mut Stat) -> c_int;
    lstat(p: *const c_char, s: *mut Stat) -> c_int;
    lstat64(p: *const c_char, s: *mut Stat) -> c_int;
    fstat(fd: c_int, s: *mut Stat) -> c_int;
    fstat64(fd: c_int, s: *mut Stat) -> c_int;
    fstatat(d: c_int, p: *const c_char, s: *mut Stat, f: c_int) -> c_int;
    fstatat64(d: c_int, p: *const c_char, s: *mut Stat, f: c_int) -> c_int;
    __xstat(v: c_int, p: *const c_char, s: *mut Stat) -> c_int;
    __xstat64(v: c_int, p: *const c_char, s: *mut Stat) -> c_int;
    __lxstat(v: c_int, p: *const c_char, s: *mut Stat) -> c_int;
    __lxstat64(v: c_int, p: *const c_char, s: *mut Stat) -> c_int;
    __fxstat(v: c_int, fd: c_int, s: *mut Stat) -> c_int;
    __fxstat64(v: c_int, fd: c_int, s: *mut Stat) -> c_int;
    __fxstatat(v: c_int, d: c_int, p: *const c_char, s: *mut Stat, f: c_int) -> c_int;
    __fxstatat64(v: c_int, d: c_int, p: *const c_char, s: *mut Stat, f: c_int) -> c_int;
    statx(d: c_int, p: *const c_char, f: c_int, m: c_uint, s: *mut libc::statx) -> c_int;
    statfs(p: *const c_char, s: *mut libc::statfs) -> c_int;
    statfs64(p: *const c_char, s: *mut libc::statfs64) -> c_int;
    fstatfs(fd: c_int, s: *mut libc::statfs) -> c_int;
    fstatfs64(fd: c_int, s: *mut libc::statfs64) -> c_int;
    statvfs(p: *const c_char, s: *mut libc::statvfs) -> c_int;
    statvfs64(p: *const c_char, s: *mut libc::statvfs64) -> c_int;
    fstatvfs(fd: c_int, s: *mut libc::statvfs) -> c_int;
    fstatvfs64(fd: c_int, s: *mut libc::statvfs64) -> c_int;
    access(p: *const c_char, m: c_int) -> c_int;
    faccessat(d: c_int, p: *const c_char, m: c_int, f: c_int) -> c_int;
    euidaccess(p: *const c_char, m: c_int) -> c_int;
    eaccess(p: *const c_char, m: c_int) -> c_int;
    mkdir(p: *const c_char, m: mode_t) -> c_int;
    mkdirat(d: c_int, p: *const c_char, m: mode_t) -> c_int;
    mknod(p: *const c_char, m: mode_t, dev: libc::dev_t) -> c_int;
    mknodat(d: c_int, p: *const c_char, m: mode_t, dev: libc::dev_t) -> c_int;
    mkfifo(p: *const c_char, m: mode_t) -> c_int;
    unlink(p: *const c_char) -> c_int;
    unlinkat(d: c_int, p: *const c_char, f: c_int) -> c_int;
    rmdir(p: *const c_char) -> c_int;
    remove(p: *const c_char) -> c_int;
    rename(a: *const c_char, b: *const c_char) -> c_int;
    renameat(d1: c_int, a: *const c_char, d2: c_int, b: *const c_char) -> c_int;
    renameat2(d1: c_int, a: *const c_char, d2: c_int, b: *const c_char, f: c_uint) -> c_int;
    link(a: *const c_char, b: *const c_char) -> c_int;
    linkat(d1: c_int, a: *const c_char, d2: c_int, b: *const c_char, f: c_int) -> c_int;
    symlink(a: *const c_char, b: *const c_char) -> c_int;
    symlinkat(a: *const c_char, d: c_int, b: *const c_char) -> c_int;
    readlink(p: *const c_char, b: *mut c_char, n: size_t) -> ssize_t;
    readlinkat(d: c_int, p: *const c_char, b: *mut c_char, n: size_t) -> ssize_t;
    chmod(p: *const c_char, m: mode_t) -> c_int;
    fchmod(fd: c_int, m: mode_t) -> c_int;
    fchmodat(d: c_int, p: *const c_char, m: mode_t, f: c_int) -> c_int;
    chown(p: *const c_char, u: libc::uid_t, g: libc::gid_t) -> c_int;
    lchown(p: *const c_char, u: libc::uid_t, g: libc::gid_t) -> c_int;
    fchown(fd: c_int, u: libc::uid_t, g: libc::gid_t) -> c_int;
    fchownat(d: c_int, p: *const c_char, u: libc::uid_t, g: libc::gid_t, f: c_int) -> c_int;
    utimensat(d: c_int, p: *const c_char, t: *const libc::timespec, f: c_int) -> c_int;
    futimens(fd: c_int, t: *const libc::timespec) -> c_int;
    utimes(p: *const c_char, t: *const libc::timeval) -> c_int;
    lutimes(p: *const c_char, t: *const libc::timeval) -> c_int;
    futimes(fd: c_int, t: *const libc::timeval) -> c_int;
    utime(p: *const c_char, t: *const libc::utimbuf) -> c_int;
    truncate(p: *const c_char, l: libc::off_t) -> c_int;
    truncate64(p: *const c_char, l: off64_t) -> c_int;
    ftruncate(fd: c_int, l: libc::off_t) -> c_int;
    ftruncate64(fd: c_int, l: off64_t) -> c_int;
    fsync(fd: c_int) -> c_int;
    fdatasync(fd: c_int) -> c_int;
    posix_fadvise(fd: c_int, o: libc::off_t, l: libc::off_t, a: c_int) -> c_int;
    posix_fadvise64(fd: c_int, o: off64_t, l: off64_t, a: c_int) -> c_int;
    posix_fallocate(fd: c_int, o: libc::off_t, l: libc::off_t) -> c_int;
    posix_fallocate64(fd: c_int, o: off64_t, l: off64_t) -> c_int;
    fallocate(fd: c_int, m: c_int, o: libc::off_t, l: libc::off_t) -> c_int;
    fallocate64(fd: c_int, m: c_int, o: off64_t, l: off64_t) -> c_int;
    copy_file_range(a: c_int, ao: *mut off64_t, b: c_int, bo: *mut off64_t, n: size_t, f: c_uint) -> ssize_t;
    sendfile(o: c_int, i: c_int, off: *mut libc::off_t, n: size_t) -> ssize_t;
    sendfile64(o: c_int, i: c_int, off: *mut off64_t, n: size_t) -> ssize_t;
    splice(a: c_int, ao: *mut off64_t, b: c_int, bo: *mut off64_t, n: size_t, f: c_uint) -> ssize_t;
    flock(fd: c_int, op: c_int) -> c_int;
    lockf(fd: c_int, cmd: c_int, l: libc::off_t) -> c_int;
    lockf64(fd: c_int, cmd: c_int, l: off64_t) -> c_int;
    mmap(a: *mut c_void, l: size_t, p: c_int, f: c_int, fd: c_int, o: libc::off_t) -> *mut c_void;
    mmap64(a: *mut c_void, l: size_t, p: c_int, f: c_int, fd: c_int, o: off64_t) -> *mut c_void;
    munmap(a: *mut c_void, l: size_t) -> c_int;
    msync(a: *mut c_void, l: size_t, f: c_int) -> c_int;
    getxattr(p: *const c_char, n: *const c_char, v: *mut c_void, s: size_t) -> ssize_t;
    lgetxattr(p: *const c_char, n: *const c_char, v: *mut c_void, s: size_t) -> ssize_t;
    fgetxattr(fd: c_int, n: *const c_char, v: *mut c_void, s: size_t) -> ssize_t;
    setxattr(p: *const c_char, n: *const c_char, v: *const c_void, s: size_t, f: c_int) -> c_int;
    lsetxattr(p: *const c_char, n: *const c_char, v: *const c_void, s: size_t, f: c_int) -> c_int;
    fsetxattr(fd: c_int, n: *const c_char, v: *const c_void, s: size_t, f: c_int) -> c_int;
    listxattr(p: *const c_char, l: *mut c_char, s: size_t) -> ssize_t;
    llistxattr(p: *const c_char, l: *mut c_char, s: size_t) -> ssize_t;
    flistxattr(fd: c_int, l: *mut c_char, s: size_t) -> ssize_t;
    removexattr(p: *const c_char, n: *const c_char) -> c_int;
    lremovexattr(p: *const c_char, n: *const c_char) -> c_int;
    fremovexattr(fd: c_int, n: *const c_char) -> c_int;
    chdir(p: *const c_char) -> c_int;
    fchdir(fd: c_int) -> c_int;
    getcwd(b: *mut c_char, n: size_t) -> *mut c_char;
    get_current_dir_name() -> *mut c_char;
    realpath(p: *const c_char, r: *mut c_char) -> *mut c_char;
    canonicalize_file_name(p: *const c_char) -> *mut c_char;
    umask(m: mode_t) -> mode_t;
    opendir(p: *const c_char) -> *mut libc::DIR;
    fdopendir(fd: c_int) -> *mut libc::DIR;
    readdir(d: *mut libc::DIR) -> *mut libc::dirent;
    readdir64(d: *mut libc::DIR) -> *mut libc::dirent64;
    readdir_r(d: *mut libc::DIR, e: *mut libc::dirent, r: *mut *mut libc::dirent) -> c_int;
    readdir64_r(d: *mut libc::DIR, e: *mut libc::dirent64, r: *mut *mut libc::dirent64) -> c_int;
    closedir(d: *mut libc::DIR) -> c_int;
    dirfd(d: *mut libc::DIR) -> c_int;
    rewinddir(d: *mut libc::DIR) -> ();
    telldir(d: *mut libc::DIR) -> libc::c_long;
    seekdir(d: *mut libc::DIR, l: libc::c_long) -> ();
    fopen(p: *const c_char, m: *const c_char) -> *mut FILE;
    fopen64(p: *const c_char, m: *const c_char) -> *mut FILE;
    fdopen(fd: c_int, m: *const c_char) -> *mut FILE;
    freopen(p: *const c_char, m: *const c_char, s: *mut FILE) -> *mut FILE;
    freopen64(p: *const c_char, m: *const c_char, s: *mut FILE) -> *mut FILE;
    fileno(s: *mut FILE) -> c_int;
    fileno_unlocked(s: *mut FILE) -> c_int;
    execve(p: *const c_char, a: *const *const c_char, e: *const *const c_char) -> c_int;
    execvpe(p: *const c_char, a: *const *const c_char, e: *const *const c_char) -> c_int;
    fexecve(fd: c_int, a: *const *const c_char, e: *const *const c_char) -> c_int;
    posix_spawn(pid: *mut libc::pid_t, p: *const c_char, fa: *const libc::posix_spawn_file_actions_t,
        at: *const libc::posix_spawnattr_t, a: *const *mut c_char, e: *const *mut c_char) -> c_int;
    posix_spawnp(pid: *mut libc::pid_t, p: *const c_char, fa: *const libc::posix_spawn_file_actions_t,
        at: *const libc::posix_spawnattr_t, a: *const *mut c_char, e: *const *mut c_char) -> c_int;
    fork() -> libc::pid_t;
    wait(status: *mut c_int) -> libc::pid_t;
    waitpid(pid: libc::pid_t, status: *mut c_int, options: c_int) -> libc::pid_t;
    wait3(status: *mut c_int, options: c_int, usage: *mut libc::rusage) -> libc::pid_t;
    wait4(pid: libc::pid_t, status: *mut c_int, options: c_int, usage: *mut libc::rusage) -> libc::pid_t;
    waitid(idtype: libc::idtype_t, id: libc::id_t, info: *mut libc::siginfo_t, options: c_int) -> c_int;
    pclose(f: *mut FILE) -> c_int;
    system(c: *const c_char) -> c_int;
    popen(c: *const c_char, m: *const c_char) -> *mut FILE;
    _exit(s: c_int) -> ();
    _Exit(s: c_int) -> ();
}

real! {
    mkstemp(t: *mut c_char) -> c_int;
    mkstemp64(t: *mut c_char) -> c_int;
    mkostemp(t: *mut c_char, f: c_int) -> c_int;
    mkostemp64(t: *mut c_char, f: c_int) -> c_int;
    mkstemps(t: *mut c_char, s: c_int) -> c_int;
    mkstemps64(t: *mut c_char, s: c_int) -> c_int;
    mkostemps(t: *mut c_char, s: c_int, f: c_int) -> c_int;
    mkostemps64(t: *mut c_char, s: c_int, f: c_int) -> c_int;
    mkdtemp(t: *mut c_char) -> *mut c_char;
}
