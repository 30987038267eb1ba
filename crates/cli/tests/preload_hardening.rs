//! `ferry run` against programs that push on the library's edges: programs
//! that take over low descriptors or close everything, absurd path
//! lengths, remote programs as the command itself, `*at` calls from a local
//! directory above a mount (rsync), and `fork` from a busy multi-threaded
//! program. Real `ferry serve`, real programs, results checked on the
//! server's side.

mod common;

use std::path::Path;
use std::process::Command;

use common::preload::{bash, compile, ok, run_cmd};
use common::{stderr, stdout, Server, TempDir};

// ---------------------------------------------------------------- item 1

#[test]
fn programs_cannot_take_the_connection_fd() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    // The README's example: the shell's own fd 3, 4, ... onto remote files,
    // with remote calls before (the connection exists) and after.
    let out = ok(&bash(
        &srv,
        local.path(),
        r#"set -e
echo first > /remote/first
exec 3>/remote/log 4>/remote/log4 5>/remote/log5
echo ok >&3; echo four >&4; echo five >&5
exec 3>&- 4>&- 5>&-
cat /remote/log /remote/log4 /remote/log5 /remote/first
"#,
    ));
    assert_eq!(out, "ok\nfour\nfive\nfirst\n");
    assert_eq!(std::fs::read_to_string(srv.export.path().join("log")).unwrap(), "ok\n");
}

#[test]
fn close_range_closefrom_and_dup2_leave_ferry_working() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    std::fs::write(srv.export.path().join("in"), "data\n").unwrap();
    // The program closes every descriptor above 2 in each way libc offers,
    // and dup2s onto ferry's connection sockets, then still reads and
    // writes remote files.
    let exe = compile(
        local.path(),
        "closer",
        r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>
static void roundtrip(const char *tag) {
    char path[64], buf[64];
    snprintf(path, sizeof path, "/remote/%s", tag);
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0 || write(fd, tag, strlen(tag)) != (ssize_t)strlen(tag) || close(fd) != 0) { perror(tag); exit(1); }
    fd = open("/remote/in", O_RDONLY);
    ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf);
    if (n != 5 || memcmp(buf, "data\n", 5) != 0) { perror(tag); exit(1); }
    close(fd);
    printf("%s ok\n", tag); fflush(stdout);
}
/* Every socket among our descriptors: the program only sees ferry's. */
static int sockets(int *out) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;
    char link[64], target[256];
    while ((e = readdir(d)) && n < 64) {
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(link, target, sizeof target - 1);
        if (k > 0) { target[k] = 0; if (strncmp(target, "socket:", 7) == 0) out[n++] = atoi(e->d_name); }
    }
    closedir(d);
    return n;
}
int main(void) {
    roundtrip("start");
    closefrom(3);
    roundtrip("closefrom");
    if (close_range(3, ~0U, 0) != 0) { perror("close_range"); return 1; }
    roundtrip("close_range");
    int null = open("/dev/null", O_RDONLY);
    int s[64], n = sockets(s);
    if (n == 0) { puts("no connection socket to take"); return 1; }
    for (int i = 0; i < n; i++) if (dup2(null, s[i]) != s[i]) { perror("dup2"); return 1; }
    roundtrip("dup2");
    n = sockets(s);
    for (int i = 0; i < n; i++) if (dup3(null, s[i], O_CLOEXEC) != s[i]) { perror("dup3"); return 1; }
    roundtrip("dup3");
    n = sockets(s);
    for (int i = 0; i < n; i++) close(s[i]);
    roundtrip("close");
    return 0;
}
"#,
    );
    let out = run_cmd(&srv, local.path(), 120, &[exe.to_str().unwrap()]);
    assert_eq!(ok(&out), "start ok\nclosefrom ok\nclose_range ok\ndup2 ok\ndup3 ok\nclose ok\n");
    assert_eq!(stderr(&out), "");
    assert_eq!(std::fs::read_to_string(srv.export.path().join("close")).unwrap(), "close");
    // Python's os.closerange and subprocess's close_fds too.
    let out = ok(&run_cmd(
        &srv,
        local.path(),
        120,
        &[
            "python3",
            "-c",
            r#"
import os, subprocess
open('/remote/p1', 'w').write('one')
os.closerange(3, 65536)
open('/remote/p2', 'w').write(open('/remote/p1').read() + 'two')
subprocess.run(['true'], close_fds=True, check=True)
print(open('/remote/p2').read())
"#,
        ],
    ));
    assert_eq!(out, "onetwo\n");
}

// ---------------------------------------------------------------- item 2

#[test]
fn absurd_path_lengths_are_errors_not_panics() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    let exe = compile(
        local.path(),
        "longpath",
        r#"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
static char *path(size_t n, char fill, int slashes) {
    char *p = malloc(n + 1);
    strcpy(p, "/remote/");
    for (size_t i = 8; i < n; i++) p[i] = (slashes && i % 100 == 0) ? '/' : fill;
    p[n] = 0;
    return p;
}
int main(void) {
    char *huge = path(70000, 'a', 1), *comp = path(8 + 256, 'b', 0), *max = path(8 + 4096, 'c', 1);
    struct stat st;
    for (int i = 0; i < 100; i++) {
        errno = 0;
        if (stat(huge, &st) != -1 || errno != ENAMETOOLONG) { printf("stat %d: %s\n", i, strerror(errno)); return 1; }
        if (open(huge, O_CREAT | O_WRONLY, 0644) != -1 || errno != ENAMETOOLONG) { printf("open %d: %s\n", i, strerror(errno)); return 1; }
        if (mkdir(huge, 0755) != -1 || errno != ENAMETOOLONG) { printf("mkdir %d: %s\n", i, strerror(errno)); return 1; }
        if (rename("/remote/x", huge) != -1 || errno != ENAMETOOLONG) { printf("rename %d: %s\n", i, strerror(errno)); return 1; }
    }
    if (open(comp, O_CREAT | O_WRONLY, 0644) != -1 || errno != ENAMETOOLONG) { printf("component: %s\n", strerror(errno)); return 1; }
    /* Inside the export that is a path of 4096 bytes: one too many. */
    if (stat(max, &st) != -1 || errno != ENAMETOOLONG) { printf("4096: %s\n", strerror(errno)); return 1; }
    int fd = open("/remote/after", O_CREAT | O_WRONLY, 0644);
    if (fd < 0 || write(fd, "still\n", 6) != 6 || close(fd) != 0) { perror("after"); return 1; }
    puts("all ENAMETOOLONG");
    return 0;
}
"#,
    );
    let out = run_cmd(&srv, local.path(), 60, &[exe.to_str().unwrap()]);
    assert_eq!(ok(&out), "all ENAMETOOLONG\n");
    assert_eq!(stderr(&out), "", "nothing on stderr, no backtrace");
    assert_eq!(std::fs::read_to_string(srv.export.path().join("after")).unwrap(), "still\n");
}

// ---------------------------------------------------------------- item 3

#[test]
fn the_command_itself_may_be_remote() {
    use std::os::unix::fs::PermissionsExt;
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    let ex = srv.export.path();
    std::fs::copy("/bin/echo", ex.join("echo")).unwrap();
    std::fs::write(ex.join("script.sh"), "#!/bin/bash\necho \"script $1 $(cat /remote/data)\"\n").unwrap();
    std::fs::write(ex.join("data"), "from-server").unwrap();
    for f in ["echo", "script.sh"] {
        std::fs::set_permissions(ex.join(f), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    assert_eq!(ok(&run_cmd(&srv, local.path(), 60, &["/remote/echo", "hello", "there"])), "hello there\n");
    assert_eq!(ok(&run_cmd(&srv, local.path(), 60, &["/remote/script.sh", "arg"])), "script arg from-server\n");
    // A missing remote program is the error a local one gives.
    let o = run_cmd(&srv, local.path(), 60, &["/remote/missing"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("No such file or directory"), "{}", stderr(&o));
}

// ---------------------------------------------------------------- item 4

#[test]
fn at_calls_from_a_local_directory_above_a_mount() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    std::fs::create_dir_all(srv.export.path().join("d")).unwrap();
    std::fs::write(srv.export.path().join("d/f"), "12345").unwrap();
    let exe = compile(
        local.path(),
        "atcalls",
        r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
int main(void) {
    int root = open("/", O_PATH | O_DIRECTORY);
    struct stat st;
    if (fstatat(root, "remote/d/f", &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_size != 5) { perror("fstatat"); return 1; }
    int fd = openat(root, "remote/d/f", O_RDONLY);
    char buf[16] = {0};
    if (fd < 0 || read(fd, buf, sizeof buf) != 5 || strcmp(buf, "12345") != 0) { perror("openat"); return 1; }
    if (mkdirat(root, "remote/d/new", 0755) != 0) { perror("mkdirat"); return 1; }
    int w = openat(root, "./remote/d/new/../w", O_CREAT | O_WRONLY, 0644);
    if (w < 0 || write(w, "w", 1) != 1 || close(w) != 0) { perror("openat create"); return 1; }
    int tmp = open("/tmp", O_PATH | O_DIRECTORY);
    if (fstatat(tmp, "../remote/d/w", &st, 0) != 0 || st.st_size != 1) { perror("fstatat .."); return 1; }
    if (renameat(root, "remote/d/w", root, "remote/d/w2") != 0) { perror("renameat"); return 1; }
    if (faccessat(root, "remote/d/w2", R_OK, 0) != 0) { perror("faccessat"); return 1; }
    if (unlinkat(root, "remote/d/new", AT_REMOVEDIR) != 0) { perror("unlinkat"); return 1; }
    /* Local names from the same fd stay local. */
    if (fstatat(root, "etc/hostname", &st, 0) != 0) { perror("local fstatat"); return 1; }
    puts("at-ok");
    return 0;
}
"#,
    );
    assert_eq!(ok(&run_cmd(&srv, local.path(), 60, &[exe.to_str().unwrap()])), "at-ok\n");
    assert_eq!(std::fs::read_to_string(srv.export.path().join("d/w2")).unwrap(), "w");
    assert!(!srv.export.path().join("d/new").exists());
}

#[test]
fn rsync_into_and_out_of_a_mount() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    let src = local.path().join("src");
    std::fs::create_dir_all(src.join("a/b")).unwrap();
    std::fs::write(src.join("top.txt"), "top\n").unwrap();
    std::fs::write(src.join("a/b/big.bin"), common::random_bytes(2 << 20, 11)).unwrap();
    std::fs::write(src.join("a/small"), "s").unwrap();
    std::os::unix::fs::symlink("a/small", src.join("link")).unwrap();
    std::fs::create_dir_all(srv.export.path().join("dir")).unwrap();
    let out = ok(&bash(
        &srv,
        local.path(),
        "set -e; rsync -a src/ /remote/dir/ && rsync -a /remote/dir/ back/ && diff -r src back && echo same \
         && echo more >> src/top.txt && rsync -a src/ /remote/dir/ && cat /remote/dir/top.txt",
    ));
    assert_eq!(out, "same\ntop\nmore\n");
    let o = Command::new("diff").arg("-r").arg(&src).arg(srv.export.path().join("dir")).output().unwrap();
    assert!(o.status.success(), "trees differ: {}", stdout(&o));
    assert_eq!(std::fs::read_link(srv.export.path().join("dir/link")).unwrap(), Path::new("a/small"));
}

// ---------------------------------------------------------------- item 7

#[test]
fn fork_and_exec_while_other_threads_do_remote_io() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    let exe = compile(
        local.path(),
        "forker",
        r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
static volatile int stop;
static void *worker(void *arg) {
    long id = (long)arg;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/remote/w%ld", id);
    long rounds = 0;
    while (!stop) {
        int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0644);
        if (fd < 0) { perror("open"); exit(2); }
        for (int i = 0; i < 8; i++) if (write(fd, "0123456789abcdef", 16) != 16) { perror("write"); exit(2); }
        if (pread(fd, buf, 128, 0) != 128) { perror("pread"); exit(2); }
        struct stat st;
        if (fstat(fd, &st) != 0 || st.st_size != 128) { perror("fstat"); exit(2); }
        close(fd);
        if (chdir(id % 2 ? "/remote" : "/tmp") != 0) { perror("chdir"); exit(2); }
        rounds++;
    }
    return (void *)rounds;
}
int main(int argc, char **argv) {
    int forks = atoi(argv[1]);
    pthread_t t[4];
    for (long i = 0; i < 4; i++) pthread_create(&t[i], 0, worker, (void *)i);
    int fd = open("/remote/shared", O_CREAT | O_WRONLY | O_TRUNC, 0644);
    for (int i = 0; i < forks; i++) {
        pid_t p = fork();
        if (p < 0) { perror("fork"); return 1; }
        if (p == 0) {
            if (i % 3 == 0) { execl("/bin/true", "true", (char *)0); _exit(3); }
            if (i % 3 == 1) { struct stat st; if (stat("/remote/shared", &st) != 0) _exit(4); _exit(0); }
            _exit(0);
        }
        int status;
        if (waitpid(p, &status, 0) != p || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            printf("child %d failed: %d\n", i, status); return 1;
        }
        if (write(fd, "x", 1) != 1) { perror("write shared"); return 1; }
    }
    stop = 1;
    long total = 0;
    for (int i = 0; i < 4; i++) { void *r; pthread_join(t[i], &r); total += (long)r; }
    close(fd);
    printf("forks done, workers %s\n", total > 0 ? "ran" : "idle");
    return 0;
}
"#,
    );
    let out = run_cmd(&srv, local.path(), 120, &[exe.to_str().unwrap(), "2000"]);
    assert_eq!(ok(&out), "forks done, workers ran\n");
    assert_eq!(std::fs::metadata(srv.export.path().join("shared")).unwrap().len(), 2000);
}
