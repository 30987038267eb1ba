//! `ferry run`: real programs (coreutils, tar, gzip, bash, python3, small C
//! programs) against a real `ferry serve`, each result checked against the
//! export directory on the server's side.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::preload::{bash, compile, library, ok};
use common::{stderr, stdout, Server, TempDir, FERRY};

/// `ferry run --mount /remote=URL -- bash -c SCRIPT`, bounded in time.
fn run_in(srv: &Server, cwd: &Path, script: &str) -> Output {
    bash(srv, cwd, script)
}

#[test]
fn coreutils() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    let ex = srv.export.path();
    std::fs::write(ex.join("hello.txt"), "hello\nworld\n").unwrap();
    let big = common::random_bytes(3 << 20, 7);
    std::fs::write(local.path().join("big.bin"), &big).unwrap();
    std::fs::create_dir_all(local.path().join("tree/sub")).unwrap();
    std::fs::write(local.path().join("tree/sub/f"), "in tree\n").unwrap();
    let out = ok(&run_in(
        &srv,
        local.path(),
        r#"set -e
cat /remote/hello.txt
cp big.bin /remote/big.bin
sha256sum /remote/big.bin big.bin | awk '{print $1}' | uniq | wc -l
cp /remote/big.bin back.bin && cmp big.bin back.bin && echo cp-back-ok
cp -r tree /remote/tree && cp -a tree /remote/tree-a && cp -r /remote/tree tree-back && cat tree-back/sub/f && cp -a /remote/tree-a tree-a-back && diff -r tree tree-a-back
mv /remote/tree-a /remote/tree-moved
ls -l /remote | grep -c tree
ls -la /remote/tree >/dev/null && ls -la /remote >/dev/null && echo ls-la-ok
stat -c '%s %F' /remote/hello.txt
head -n1 /remote/hello.txt; tail -n1 /remote/hello.txt; wc -l < /remote/hello.txt
dd if=/remote/big.bin of=/remote/dd.bin bs=64k 2>/dev/null && cmp /remote/dd.bin big.bin && echo dd-ok
mkdir -p /remote/a/b/c && touch /remote/a/b/c/t && ln -s ../hello.txt /remote/a/link && readlink /remote/a/link
cat /remote/a/link | head -n1
find /remote/a | sort | tr '\n' ' '; echo
du -s /remote/tree | awk '{print ($1 > 0)}'
chmod 640 /remote/hello.txt && stat -c '%a' /remote/hello.txt
truncate -s 3 /remote/a/b/c/t && stat -c '%s' /remote/a/b/c/t
grep -r world /remote --include=hello.txt
rm -r /remote/a && test ! -e /remote/a && echo rm-ok
cat /etc/hostname >/dev/null && echo local-ok
"#,
    ));
    let want = [
        "hello\nworld\n1\ncp-back-ok\nin tree\n",
        "2\nls-la-ok\n12 regular file\nhello\nworld\n2\ndd-ok\n../hello.txt\nhello\n",
        "/remote/a /remote/a/b /remote/a/b/c /remote/a/b/c/t /remote/a/link \n1\n640\n3\n",
        "/remote/hello.txt:world\nrm-ok\nlocal-ok\n",
    ]
    .concat();
    assert_eq!(out, want);
    // What the programs did is on the server.
    assert_eq!(std::fs::read(ex.join("big.bin")).unwrap(), big);
    assert_eq!(std::fs::read_to_string(ex.join("tree-moved/sub/f")).unwrap(), "in tree\n");
    assert!(!ex.join("tree-a").exists() && !ex.join("a").exists());
}

#[test]
fn tar_and_gzip_both_ways() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    std::fs::create_dir_all(local.path().join("src/d")).unwrap();
    std::fs::write(local.path().join("src/d/x"), "x\n").unwrap();
    std::fs::write(local.path().join("src/y"), common::random_bytes(200_000, 3)).unwrap();
    let out = ok(&run_in(
        &srv,
        local.path(),
        r#"set -e
tar czf /remote/t.tgz src
mkdir /remote/ex && tar xzf /remote/t.tgz -C /remote/ex
diff -r src /remote/ex/src && echo same-up
tar cf - -C /remote/ex src | tar xf - -C . --transform s/src/down/ 
diff -r src down && echo same-down
cp src/y /remote/y && gzip /remote/y && test -f /remote/y.gz && gunzip -c /remote/y.gz | cmp - src/y && echo gz-ok
gunzip /remote/y.gz && cmp /remote/y src/y && echo gunzip-ok
"#,
    ));
    assert_eq!(out, "same-up\nsame-down\ngz-ok\ngunzip-ok\n");
    assert_eq!(std::fs::read_to_string(srv.export.path().join("ex/src/d/x")).unwrap(), "x\n");
}

#[test]
fn bash_redirections_cwd_and_shared_offsets() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    std::fs::write(srv.export.path().join("in.txt"), "line1\nline2\n").unwrap();
    std::fs::create_dir(srv.export.path().join("dir")).unwrap();
    let out = ok(&run_in(
        &srv,
        local.path(),
        r#"set -e
echo first > /remote/f
echo second >> /remote/f
{ echo a; /bin/echo b; } > /remote/g
while read l; do echo "got $l"; done < /remote/in.txt
cd /remote/dir
pwd
echo rel > relative.txt
cat relative.txt
ls
head -c 4 ../../etc/passwd; echo
cd ..
pwd
cd ..
pwd
ls -d ../remote/dir
exec 3</remote/in.txt
cat <&3
"#,
    ));
    assert_eq!(
        out,
        "got line1\ngot line2\n/remote/dir\nrel\nrelative.txt\nroot\n/remote\n/\n../remote/dir\nline1\nline2\n"
    );
    let ex = srv.export.path();
    assert_eq!(std::fs::read_to_string(ex.join("f")).unwrap(), "first\nsecond\n");
    assert_eq!(std::fs::read_to_string(ex.join("g")).unwrap(), "a\nb\n");
    assert_eq!(std::fs::read_to_string(ex.join("dir/relative.txt")).unwrap(), "rel\n");
}

#[test]
fn python_programs() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    std::fs::write(
        local.path().join("t.py"),
        r#"
import os, shutil, pathlib, subprocess, sys
with open('/remote/p.txt', 'w') as f:
    f.write('py\n' * 1000)
print(len(open('/remote/p.txt').read()), os.stat('/remote/p.txt').st_size)
os.makedirs('/remote/w/x/y')
open('/remote/w/x/y/z', 'wb').write(b'z')
print(sorted(os.listdir('/remote/w/x')))
print([(r, sorted(d), sorted(f)) for r, d, f in os.walk('/remote/w')])
shutil.copytree('/remote/w', '/remote/w2')
print(open('/remote/w2/x/y/z').read())
p = pathlib.Path('/remote/pkg'); p.mkdir()
(p / 'mod_on_remote.py').write_text('VALUE = 42\n')
sys.path.insert(0, '/remote/pkg')
import mod_on_remote
print('import', mod_on_remote.VALUE)
print(subprocess.run(['cat', '/remote/w/x/y/z'], capture_output=True, check=True).stdout.decode())
print(subprocess.run('echo sub >> /remote/p2.txt; cat /remote/p2.txt', shell=True, capture_output=True).stdout.decode().strip())
pid = os.posix_spawn('/bin/sh', ['sh', '-c', 'cat /remote/w/x/y/z > /remote/spawned'], {})
os.waitpid(pid, 0)
print(open('/remote/spawned').read())
os.chdir('/remote/w')
print(os.getcwd(), os.listdir('.'))
d = os.open('/remote/w/x', os.O_RDONLY | os.O_DIRECTORY)
os.chdir('/')
os.fchdir(d)
print(os.getcwd(), os.listdir('.'))
# From a remote directory fd, '..' can lead back out of the mount.
print(os.stat('../../..', dir_fd=d).st_ino == os.stat('/').st_ino)
"#,
    )
    .unwrap();
    let out = ok(&run_in(&srv, local.path(), "python3 t.py"));
    let want = "3000 3000\n['y']\n[('/remote/w', ['x'], []), ('/remote/w/x', ['y'], []), ('/remote/w/x/y', [], ['z'])]\nz\nimport 42\nz\nsub\nz\n/remote/w ['x']\n/remote/w/x ['y']\nTrue\n";
    assert_eq!(out, want);
    assert_eq!(std::fs::read_to_string(srv.export.path().join("spawned")).unwrap(), "z");
}

#[test]
fn exec_keeps_remote_fds_and_restores_the_environment() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    std::fs::write(srv.export.path().join("f"), "content\n").unwrap();
    let out = ok(&run_in(
        &srv,
        local.path(),
        r#"set -e
bash -c 'exec 3</remote/f; cat <&3'
env -i /bin/cat /remote/f
env -u LD_PRELOAD -u FERRY_MOUNTS /bin/cat /remote/f
cd /remote && env -i /bin/cat f
"#,
    ));
    assert_eq!(out, "content\n".repeat(4));
}

const THREADS: &str = r#"
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#define N 8
#define SZ (256 * 1024)
static void *work(void *arg) {
    long id = (long)arg;
    char path[64], buf[SZ], back[SZ];
    snprintf(path, sizeof path, "/remote/t%ld", id);
    for (int i = 0; i < SZ; i++) buf[i] = (char)(i * 7 + id);
    for (int round = 0; round < 5; round++) {
        int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0644);
        if (fd < 0) return (void *)1;
        for (int off = 0; off < SZ; off += 4096)
            if (write(fd, buf + off, 4096) != 4096) return (void *)2;
        if (pread(fd, back, SZ, 0) != SZ || memcmp(buf, back, SZ)) return (void *)3;
        close(fd);
        int s = open("/remote/shared", O_RDONLY);
        char sh[4096];
        for (int k = 0; k < 16; k++) {
            if (pread(s, sh, sizeof sh, k * 4096) != 4096) return (void *)4;
            for (int j = 0; j < 4096; j++) if (sh[j] != (char)(k + j)) return (void *)5;
        }
        close(s);
    }
    return 0;
}
int main(void) {
    int s = open("/remote/shared", O_CREAT | O_TRUNC | O_WRONLY, 0644);
    char sh[4096];
    for (int k = 0; k < 16; k++) { for (int j = 0; j < 4096; j++) sh[j] = (char)(k + j); write(s, sh, 4096); }
    close(s);
    pthread_t t[N];
    for (long i = 0; i < N; i++) pthread_create(&t[i], 0, work, (void *)i);
    int bad = 0;
    for (int i = 0; i < N; i++) { void *r; pthread_join(t[i], &r); if (r) { printf("thread %d: %ld\n", i, (long)r); bad = 1; } }
    printf(bad ? "FAIL\n" : "threads ok\n");
    return bad;
}
"#;

#[test]
fn many_threads_on_remote_files() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    let exe = compile(local.path(), "threads", THREADS);
    let out = ok(&run_in(&srv, local.path(), exe.to_str().unwrap()));
    assert_eq!(out, "threads ok\n");
    assert_eq!(std::fs::metadata(srv.export.path().join("t7")).unwrap().len(), 256 * 1024);
}

const STDIO: &str = r#"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
int main(void) {
    FILE *f = fopen("/remote/s.txt", "w+");
    if (!f) { perror("fopen"); return 1; }
    fprintf(f, "alpha %d\n", 1);
    fputs("beta\n", f);
    fwrite("gamma\n", 1, 6, f);
    fflush(f);
    printf("tell %ld fileno-ok %d\n", ftell(f), fileno(f) > 2);
    fseek(f, 0, SEEK_SET);
    char line[64];
    fgets(line, sizeof line, f); printf("1: %s", line);
    fgets(line, sizeof line, f); printf("2: %s", line);
    fclose(f);
    int fd = open("/remote/s.txt", O_RDONLY);
    FILE *g = fdopen(fd, "r");
    char buf[64] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, g);
    printf("fread %zu fileno-same %d\n", n, fileno(g) == fd);
    fclose(g);
    if (!freopen("/remote/out.txt", "w", stdout)) { perror("freopen"); return 1; }
    printf("to the remote stdout\n");
    fflush(stdout);
    int m = open("/remote/s.txt", O_RDONLY);
    char *p = mmap(0, 4096, PROT_READ, MAP_PRIVATE, m, 0);
    if (p == MAP_FAILED) { fprintf(stderr, "mmap failed\n"); return 1; }
    fprintf(stderr, "mmap %.5s\n", p);
    void *q = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, m, 0);
    fprintf(stderr, "shared-writable %s\n", q == MAP_FAILED && errno == EACCES ? "refused" : "MAPPED");
    struct stat st; fstat(m, &st);
    fprintf(stderr, "size %ld\n", (long)st.st_size);
    return 0;
}
"#;

#[test]
fn stdio_and_mmap() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    let exe = compile(local.path(), "stdio", STDIO);
    let o = run_in(&srv, local.path(), exe.to_str().unwrap());
    let out = ok(&o);
    assert_eq!(out, "tell 19 fileno-ok 1\n1: alpha 1\n2: beta\nfread 19 fileno-same 1\n");
    assert_eq!(stderr(&o), "mmap alpha\nshared-writable refused\nsize 19\n");
    assert_eq!(std::fs::read_to_string(srv.export.path().join("out.txt")).unwrap(), "to the remote stdout\n");
}

#[test]
fn writes_of_a_forked_child_to_an_inherited_fd_are_kept() {
    // A subshell writing to its parent's redirection: the child's first
    // call on the file is a small (gathered) write.
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    let o = run_in(
        &srv,
        local.path(),
        "exec 3>/remote/f; (echo child >&3); echo parent >&3; exec 3>&-; { echo a; (echo b; (echo c)); echo d; } > /remote/g",
    );
    ok(&o);
    assert_eq!(std::fs::read_to_string(srv.export.path().join("f")).unwrap(), "child\nparent\n");
    assert_eq!(std::fs::read_to_string(srv.export.path().join("g")).unwrap(), "a\nb\nc\nd\n");
}

#[test]
fn names_that_are_not_utf8_are_carried_as_bytes() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    let src = local.path().join("src");
    let names: [&[u8]; 3] = [b"a\xffb", b"d\xfe/f\xfd", b"new\nline\xe9"];
    std::fs::create_dir_all(src.join(OsStr::from_bytes(b"d\xfe"))).unwrap();
    for (i, n) in names.iter().enumerate() {
        std::fs::write(src.join(OsStr::from_bytes(n)), format!("{i}\n")).unwrap();
    }
    // tar into the mount and back out of it, and a remote working directory
    // whose name is not UTF-8, inherited by a new program.
    let o = run_in(
        &srv,
        local.path(),
        "set -e; tar -C src -cf - . | tar -C /remote -xf -; tar -C /remote -cf back.tar .; mkdir back; tar -C back -xf back.tar; cd /remote/$'d\\xfe'; bash -c \"pwd | od -An -c; cat f\\$'\\xfd'\"",
    );
    let out = ok(&o);
    assert!(out.contains("/   r   e   m   o   t   e   /   d 376"), "{out}");
    assert!(out.ends_with("1\n"), "{out}");
    for (i, n) in names.iter().enumerate() {
        let name = OsStr::from_bytes(n);
        assert_eq!(
            std::fs::read_to_string(srv.export.path().join(name)).unwrap(),
            format!("{i}\n"),
            "{name:?} on the server"
        );
        assert_eq!(
            std::fs::read_to_string(local.path().join("back").join(name)).unwrap(),
            format!("{i}\n"),
            "{name:?} copied back"
        );
    }
}

/// Writes through a shared mapping, in the parent and in a forked child,
/// next to a `pwrite` and a change made on the server meanwhile.
const SHARED_MAP: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
int main(void) {
    int fd = open("/remote/m.bin", O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { perror("open"); return 1; }
    char buf[8192];
    memset(buf, 'a', sizeof buf);
    if (write(fd, buf, sizeof buf) != sizeof buf) { perror("write"); return 1; }
    char *p = mmap(0, sizeof buf, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 1; }
    memcpy(p + 100, "hello", 5);
    if (msync(p, sizeof buf, MS_SYNC)) { perror("msync"); return 1; }
    printf("synced\n");
    fflush(stdout);
    char line[8];
    if (!fgets(line, sizeof line, stdin)) return 1;
    pid_t pid = fork();
    if (pid == 0) { memcpy(p + 5000, "child", 5); _exit(0); }
    waitpid(pid, 0, 0);
    printf("parent sees %.5s\n", p + 5000);
    if (pwrite(fd, "WRITE", 5, 6000) != 5) { perror("pwrite"); return 1; }
    printf("mapping sees %.5s\n", p + 6000);
    if (munmap(p, sizeof buf)) { perror("munmap"); return 1; }
    return close(fd) ? 1 : 0;
}
"#;

/// Maps a file shared, writes through the mapping and exits without
/// `munmap` (as most programs do).
const MAP_AND_EXIT: &str = r#"
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
int main(void) {
    int fd = open("/remote/e.bin", O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ftruncate(fd, 65536)) return 1;
    char *p = mmap(0, 65536, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return 1;
    memcpy(p + 60000, "at exit", 7);
    return 0;
}
"#;

fn shadow_files() -> std::collections::BTreeSet<std::ffi::OsString> {
    let uid = rustix::process::geteuid().as_raw();
    match std::fs::read_dir(format!("/dev/shm/ferry-{uid}")) {
        Ok(d) => d.map(|e| e.unwrap().file_name()).collect(),
        Err(_) => Default::default(),
    }
}

#[test]
fn a_mapping_left_at_exit_is_written_back_and_its_shadow_removed() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    let exe = compile(local.path(), "map_exit", MAP_AND_EXIT);
    let before = shadow_files();
    ok(&run_in(&srv, local.path(), &format!("{0} && {0}", exe.display())));
    let data = std::fs::read(srv.export.path().join("e.bin")).unwrap();
    assert_eq!(&data[60000..60007], b"at exit");
    let left: Vec<_> = shadow_files().difference(&before).cloned().collect();
    assert!(left.is_empty(), "shadow files left behind: {left:?}");
}

#[test]
fn shared_writable_mappings_reach_the_server() {
    use std::io::{BufRead, BufReader, Write};
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    let exe = compile(local.path(), "shared_map", SHARED_MAP);
    let mut child = Command::new("timeout")
        .args(["60", FERRY, "run", "--mount"])
        .arg(format!("/remote={}", srv.url("/")))
        .arg("--")
        .arg(&exe)
        .env("FERRY_TOKEN_FILE", &srv.token_file)
        .env_remove("FERRY_TOKEN")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "synced\n");
    // msync(MS_SYNC) put the mapped write on the server.
    let file = srv.export.path().join("m.bin");
    let now = std::fs::read(&file).unwrap();
    assert_eq!(&now[100..105], b"hello");
    // Another client changes a byte the program never touched: the later
    // write-backs must leave it alone.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        f.write_all_at(b"Z", 3000).unwrap();
    }
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(child.wait().unwrap().success(), "{rest}");
    assert_eq!(rest, "parent sees child\nmapping sees WRITE\n");
    let mut want = vec![b'a'; 8192];
    want[100..105].copy_from_slice(b"hello");
    want[3000] = b'Z';
    want[5000..5005].copy_from_slice(b"child");
    want[6000..6005].copy_from_slice(b"WRITE");
    let got = std::fs::read(&file).unwrap();
    let wrong: Vec<usize> = (0..want.len().max(got.len())).filter(|&i| got.get(i) != want.get(i)).collect();
    assert!(
        wrong.is_empty(),
        "{} bytes differ on the server, first at {:?} (size {})",
        wrong.len(),
        wrong.first(),
        got.len()
    );
}

#[test]
fn unreachable_server_fails_cleanly() {
    // A port nothing listens on: take one, then free it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let local = TempDir::new("local");
    // A server not there is waited for (`--reconnect`, 60 s by default),
    // then given up on.
    let o = Command::new("timeout")
        .args(["60", FERRY, "run", "--reconnect", "1", "--mount"])
        .arg(format!("/remote=ferry://127.0.0.1:{port}/"))
        .args(["--", "bash", "-c", "cat /remote/x; echo rc=$?; ls /etc >/dev/null && echo local-still-works"])
        .current_dir(local.path())
        .env("FERRY_TOKEN", "t")
        .output()
        .unwrap();
    assert_eq!(stdout(&o), "rc=1\nlocal-still-works\n");
    let err = stderr(&o);
    assert!(err.contains(&format!("ferry: cannot use ferry://127.0.0.1:{port}/")), "{err}");
    assert!(err.contains("waited 1 s for it"), "{err}");
    assert!(err.contains("Input/output error"), "{err}");
}

#[test]
fn run_reports_bad_usage() {
    let o = Command::new(FERRY).args(["run", "--mount", "relative=ferry://h/", "--", "true"]).output().unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("PREFIX must be an absolute path"), "{}", stderr(&o));
    let o = Command::new(FERRY).args(["run", "--mount", "/r=http://h/", "--", "true"]).output().unwrap();
    assert!(stderr(&o).contains("not a ferry:// URL"), "{}", stderr(&o));
    let o = Command::new(FERRY)
        .args(["run", "--mount", "/r=ferry://h/", "--library", "/nonexistent.so", "--", "true"])
        .output()
        .unwrap();
    assert!(stderr(&o).contains("preload library not found"), "{}", stderr(&o));
}

#[test]
fn errors_are_what_libc_would_say() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    std::fs::create_dir_all(srv.export.path().join("full/x")).unwrap();
    std::fs::write(srv.export.path().join("file"), "f").unwrap();
    let o = run_in(
        &srv,
        local.path(),
        // Placeholders (`FERRY_SAME_HOST=0`): on the server's host a writer
        // gets the server's own descriptor, the file itself, which a raw
        // system call writes as the program's own open allows.
        r#"cat /remote/missing; mkdir /remote/file; rmdir /remote/full; ls /remote/file/x; rm /remote/full
FERRY_SAME_HOST=0 python3 -c "
import errno, os
for f in (lambda: os.open('/remote/file', os.O_CREAT | os.O_EXCL | os.O_WRONLY),
          lambda: os.open('/remote/missing', os.O_RDONLY),
          lambda: os.read(os.open('/remote/file', os.O_WRONLY), 1),
          lambda: os.write(os.open('/remote/file', os.O_RDONLY), b'x'),
          lambda: os.rename('/remote/file', '/tmp/elsewhere'),
          lambda: os.link('/remote/file', '/tmp/elsewhere')):
    try:
        f(); print('no error')
    except OSError as e:
        print(errno.errorcode[e.errno])
# A call that escapes interception (a raw system call) meets the sealed
# placeholder: reads see end-of-file, writes fail; no other file is touched.
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open('/remote/file', os.O_RDWR)
buf = ctypes.create_string_buffer(8)
print(libc.syscall(0, fd, buf, 8), libc.syscall(1, fd, b'zz', 2), errno.errorcode[ctypes.get_errno()])
print(os.read(fd, 8))
""#,
    );
    assert_eq!(stdout(&o), "EEXIST\nENOENT\nEBADF\nEBADF\nEXDEV\nEXDEV\n0 -1 EPERM\nb'f'\n");
    let err = stderr(&o);
    for want in [
        "cat: /remote/missing: No such file or directory",
        "mkdir: cannot create directory ‘/remote/file’: File exists",
        "rmdir: failed to remove '/remote/full': Directory not empty",
        "ls: cannot access '/remote/file/x': Not a directory",
        "rm: cannot remove '/remote/full': Is a directory",
    ] {
        assert!(err.contains(want), "missing {want:?} in\n{err}");
    }
    assert!(srv.export.path().join("full/x").is_dir(), "nothing lost");
}

#[test]
fn fork_shares_offsets_and_sees_parent_writes() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    std::fs::write(srv.export.path().join("digits"), "0123456789").unwrap();
    let o = run_in(
        &srv,
        local.path(),
        r#"python3 -c "
import os
fd = os.open('/remote/digits', os.O_RDONLY)
print(os.read(fd, 3).decode())
w = os.open('/remote/out', os.O_CREAT | os.O_WRONLY, 0o644)
os.write(w, b'parent ')
pid = os.fork()
if pid == 0:
    print(os.read(fd, 3).decode(), flush=True)
    os.write(w, b'child ')
    print(open('/remote/out').read(), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print(os.read(fd, 3).decode())
os.write(w, b'parent-again')
os.close(w)
print(open('/remote/out').read())
""#,
    );
    assert_eq!(ok(&o), "012\n345\nparent child \n678\nparent child parent-again\n");
}

/// With a short reconnect bound, a server that is gone for good gives
/// `EIO` soon after (the default waits a minute for it to come back).
#[test]
fn a_dying_server_gives_errors_not_hangs() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    std::fs::write(srv.export.path().join("f"), "x".repeat(1 << 20)).unwrap();
    let mut child = Command::new("timeout")
        .args(["60", FERRY, "run", "--reconnect", "0.5", "--mount"])
        .arg(format!("/remote={}", srv.url("/")))
        .args(["--", "python3", "-c"])
        .arg("import sys,time\nf=open('/remote/f','rb')\nf.read(10)\nprint('opened',flush=True)\ntime.sleep(2)\ntry:\n  f.seek(0); f.read(); print('read ok?')\nexcept OSError as e: print('error', e.errno)\ntry:\n  open('/remote/g','w').write('x'); print('write ok?')\nexcept OSError as e: print('error', e.errno)\n")
        .env("FERRY_TOKEN_FILE", &srv.token_file)
        // A file read through the server: on its host a reader would hold
        // its descriptor, which stays readable when the server dies.
        .env("FERRY_SAME_HOST", "0")
        .current_dir(local.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the file is open before the server goes.
    let mut first = String::new();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut out, &mut first).unwrap();
    assert_eq!(first, "opened\n");
    // Kill the server (by PID: Server's Drop) while the file is open.
    let port = srv.port;
    drop(srv);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let done = child.wait_with_output().unwrap();
    assert_eq!(rest, "error 5\nerror 5\n", "stderr: {}", stderr(&done));
    assert!(stderr(&done).contains(&format!("ferry: cannot use ferry://127.0.0.1:{port}/")), "{}", stderr(&done));
}

#[test]
fn git_and_a_compiler_on_remote_files() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    let out = ok(&run_in(
        &srv,
        local.path(),
        r#"set -e
export GIT_CONFIG_NOSYSTEM=1 HOME=$PWD
git config --global user.email t@example.com && git config --global user.name t
mkdir /remote/repo && cd /remote/repo && git init -q
echo one > a && git add a && git commit -qm first
echo two >> a && git status --short
git commit -qam second && git log --format=%s | tr '\n' ' '; echo
git fsck --strict 2>&1 | grep -c error || true
echo 'int main(void) { return 3; }' > m.c && gcc -o m m.c && test -s m && echo compiled
./m || echo "ran, exit $?"
printf '#!/bin/sh\necho script "$@"\n' > s.sh && chmod +x s.sh && ./s.sh arg
python3 -c "import subprocess; print(subprocess.run(['/remote/repo/s.sh', 'py']).returncode)"
"#,
    ));
    assert_eq!(out, " M a\nsecond first \n0\ncompiled\nran, exit 3\nscript arg\nscript py\n0\n");
    assert!(srv.export.path().join("repo/.git/HEAD").is_file());
    assert!(srv.export.path().join("repo/m").is_file());
}

#[test]
fn a_server_dying_under_a_writer_is_an_error_not_sigpipe() {
    use std::os::unix::process::ExitStatusExt;
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    let child = Command::new("timeout")
        .args(["60", FERRY, "run", "--reconnect", "0.5", "--mount"])
        .arg(format!("/remote={}", srv.url("/")))
        .args(["--", "dd", "if=/dev/zero", "of=/remote/big", "bs=1M", "count=20000"])
        .env("FERRY_TOKEN_FILE", &srv.token_file)
        // Over TCP: on the server's host dd would write the server's own
        // file, which a dying server does not take away.
        .env("FERRY_SAME_HOST", "0")
        .current_dir(local.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Once data arrives on the server, stop it (by PID, in Server's Drop).
    let target = srv.export.path().join("big");
    let t0 = std::time::Instant::now();
    while std::fs::metadata(&target).map_or(0, |m| m.len()) < (8 << 20) {
        assert!(t0.elapsed().as_secs() < 30, "dd never wrote");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    drop(srv);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.signal(), None, "killed by a signal: {:?}", out.status);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("Input/output error"), "{}", stderr(&out));
}

#[test]
fn ld_preload_by_hand_with_ferry_mounts() {
    let srv = Server::start(&[]);
    std::fs::create_dir(srv.export.path().join("sub")).unwrap();
    std::fs::write(srv.export.path().join("sub/f"), "by hand\n").unwrap();
    let o = Command::new("timeout")
        .args(["60", "cat", "/data/f"])
        .env("LD_PRELOAD", library())
        .env("FERRY_MOUNTS", format!("/data={}", srv.url("/sub")))
        .env("FERRY_TOKEN_FILE", &srv.token_file)
        .output()
        .unwrap();
    assert_eq!(ok(&o), "by hand\n");
    // A malformed table disables remote paths with one clear line.
    let o = Command::new("true").env("LD_PRELOAD", library()).env("FERRY_MOUNTS", "data=nowhere").output().unwrap();
    assert!(o.status.success());
    assert!(
        stderr(&o)
            .contains("ferry: FERRY_MOUNTS: data: mount point must be an absolute path; remote paths are disabled"),
        "{}",
        stderr(&o)
    );
}

/// A server that does not watch its disk for changes outside ferry: the
/// timeout tests below change the export directly, and a watching
/// (`WATCHED`) server would break the lease for that change at some moment
/// the test cannot know, racing the stale answer they expect (that case is
/// `leases.rs`'s `ferry_run_keeps_answers_until_a_change_on_the_servers_disk_breaks_them`).
fn unwatched_server() -> Server {
    Server::start(&["--disable-caps", "watched"])
}

/// `python3 -c SCRIPT` under `ferry run --attr-timeout SECS`.
fn python_with_attr_timeout(srv: &Server, cwd: &Path, secs: &str, script: &str) -> Output {
    common::preload::run_cmd_with(srv, cwd, 60, &["--attr-timeout", secs], &["python3", "-c", script])
}

/// What a listing or a `stat` fetched answers later `stat`s for
/// `--attr-timeout` (1 s by default): this process's own changes show at
/// once, another client's after the timeout; 0 asks the server every time.
#[test]
fn attributes_are_cached_briefly_and_own_changes_show_at_once() {
    let srv = unwatched_server();
    let local = TempDir::new("local");
    let ex = srv.export.path();
    let script = format!(
        r#"
import os, time
exp = {ex:?}
os.listdir('/remote/d')
print(os.stat('/remote/d/a').st_size)
with open('/remote/d/a', 'a') as f: f.write('xx')
print(os.stat('/remote/d/a').st_size)
os.listdir('/remote/d')
with open(exp + '/d/a', 'a') as f: f.write('yyyyyyy')
print(os.stat('/remote/d/a').st_size)
time.sleep(1.3)
print(os.stat('/remote/d/a').st_size)
os.listdir('/remote/d')
os.rename('/remote/d/a', '/remote/d/b')
print(os.path.exists('/remote/d/a'), os.stat('/remote/d/b').st_size)
"#,
        ex = ex.to_str().unwrap()
    );
    for (timeout, want) in [("1", "1\n3\n3\n10\nFalse 10\n"), ("0", "1\n3\n10\n10\nFalse 10\n")] {
        std::fs::create_dir_all(ex.join("d")).unwrap();
        let _ = std::fs::remove_file(ex.join("d/b"));
        std::fs::write(ex.join("d/a"), "x").unwrap();
        let o = python_with_attr_timeout(&srv, local.path(), timeout, &script);
        assert_eq!(ok(&o), want, "--attr-timeout {timeout}");
    }
}

/// The end of a file read right after its open is the size the open saw,
/// for as long as attributes are cached: a program reading to the end asks
/// the server once (the open), not again for the end. Another client's
/// append shows after the timeout, or at once with `--attr-timeout 0`.
#[test]
fn the_end_of_a_freshly_opened_file_is_its_size_at_open_for_the_attribute_timeout() {
    let srv = unwatched_server();
    let local = TempDir::new("local");
    let ex = srv.export.path();
    let script = format!(
        r#"
import os, time
exp = {ex:?}
fd = os.open('/remote/g', os.O_RDONLY)
print(len(os.read(fd, 100)), len(os.read(fd, 100)))
with open(exp + '/g', 'a') as f: f.write('yyy')
print(len(os.read(fd, 100)))
time.sleep(1.3)
print(len(os.read(fd, 100)))
os.close(fd)
"#,
        ex = ex.to_str().unwrap()
    );
    for (timeout, want) in [("1", "5 0\n0\n3\n"), ("0", "5 0\n3\n0\n")] {
        std::fs::write(ex.join("g"), "12345").unwrap();
        let o = python_with_attr_timeout(&srv, local.path(), timeout, &script);
        assert_eq!(ok(&o), want, "--attr-timeout {timeout}");
    }
}

/// An `fstat` right after an open for reading (`std::fs::read`, `cat` and
/// `cp` ask one for the size) is the open's own answer for the attribute
/// timeout: another client's append shows after it (at once with 0), and
/// this process's own change, by any name, shows at once.
#[test]
fn fstat_after_an_open_is_the_opens_answer_for_the_attribute_timeout() {
    let srv = unwatched_server();
    let local = TempDir::new("local");
    let ex = srv.export.path();
    let script = format!(
        r#"
import os, time
exp = {ex:?}
fd = os.open('/remote/h', os.O_RDONLY)
print(os.fstat(fd).st_size)
with open(exp + '/h', 'a') as f: f.write('yy')
print(os.fstat(fd).st_size)
time.sleep(3.3)
print(os.fstat(fd).st_size)
fd2 = os.open('/remote/h', os.O_RDONLY)
os.chmod('/remote/h2', 0o600)
print(oct(os.fstat(fd2).st_mode & 0o777), os.fstat(fd2).st_nlink)
"#,
        ex = ex.to_str().unwrap()
    );
    // 3 s, not 1: a loaded machine once took over a second between the
    // open and the second `fstat`.
    for (timeout, want) in [("3", "1\n1\n3\n0o600 2\n"), ("0", "1\n3\n3\n0o600 2\n")] {
        let _ = std::fs::remove_file(ex.join("h2"));
        std::fs::write(ex.join("h"), "x").unwrap();
        std::fs::set_permissions(ex.join("h"), std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        std::fs::hard_link(ex.join("h"), ex.join("h2")).unwrap();
        let o = python_with_attr_timeout(&srv, local.path(), timeout, &script);
        assert_eq!(ok(&o), want, "--attr-timeout {timeout}");
    }
}

/// A directory stream's fd exists once the program asks for it
/// (`opendir` makes none until `dirfd`): it names the directory for
/// `fstat`, `*at` calls and `fchdir`, and goes with `closedir`; a stream
/// whose fd nobody asked for closes cleanly too.
#[test]
fn dirfd_of_a_remote_directory_stream_works_and_goes_with_closedir() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    std::fs::create_dir_all(srv.export.path().join("d/sub")).unwrap();
    std::fs::write(srv.export.path().join("d/f"), "12345").unwrap();
    let script = r#"
import ctypes, os, stat
libc = ctypes.CDLL(None, use_errno=True)
libc.opendir.restype = ctypes.c_void_p
libc.opendir.argtypes = [ctypes.c_char_p]
libc.dirfd.argtypes = [ctypes.c_void_p]
libc.closedir.argtypes = [ctypes.c_void_p]
d = libc.opendir(b'/remote/d')
fd = libc.dirfd(d)
print(fd >= 0, libc.dirfd(d) == fd, stat.S_ISDIR(os.fstat(fd).st_mode))
print(os.stat('f', dir_fd=fd).st_size, sorted(os.listdir(fd)))
os.fchdir(fd)
print(os.getcwd(), open('f').read())
print(libc.closedir(d))
try:
    os.fstat(fd)
    print('still open')
except OSError as e:
    print('closed', e.errno == 9)
e = libc.opendir(b'/remote/d/sub')
print(libc.closedir(e))
"#;
    let o = common::preload::run_cmd_with(&srv, local.path(), 60, &[], &["python3", "-c", script]);
    assert_eq!(ok(&o), "True True True\n5 ['f', 'sub']\n/remote/d 12345\n0\nclosed True\n0\n");
}

/// A parent sees at once what a child it waited for changed, with the
/// default attribute timeout (as `make` needs: the compiler child rewrites
/// an object, the parent then compares its mtime before relinking): a
/// `stat`, a listing's attributes and an open file's `fstat` answer, all
/// kept before the child ran, are asked again after `waitpid` (and after
/// `system`).
#[test]
fn a_parent_sees_what_a_child_it_waited_for_changed() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    std::fs::create_dir(srv.export.path().join("d")).unwrap();
    std::fs::write(srv.export.path().join("d/o"), "x").unwrap();
    let script = r#"
import os, subprocess
p = '/remote/d/o'
fd = os.open(p, os.O_RDONLY)
print(os.stat(p).st_size, [e.stat().st_size for e in os.scandir('/remote/d')], os.fstat(fd).st_size)
subprocess.run(['sh', '-c', 'echo rebuilt >> /remote/d/o'], check=True)
print(os.stat(p).st_size, [e.stat().st_size for e in os.scandir('/remote/d')], os.fstat(fd).st_size)
os.system('echo again >> /remote/d/o')
print(os.stat(p).st_size)
"#;
    let o = common::preload::run_cmd(&srv, local.path(), 60, &["python3", "-c", script]);
    assert_eq!(ok(&o), "1 [1] 1\n9 [9] 9\n15\n", "the parent's answers after its child's change");
}

/// A path longer than the wire carries (70,000 bytes under the mount) is
/// `ENAMETOOLONG` for every call, as Linux says it, never `EIO` (the
/// client's encoder was reached by an open before).
#[test]
fn a_path_past_every_limit_is_enametoolong() {
    let srv = Server::start(&[]);
    let local = TempDir::new("local");
    let script = r#"
import os
p = '/remote/' + 'a/' * 35000
calls = [os.stat, os.lstat, lambda p: os.open(p, os.O_RDONLY), lambda p: os.open(p, os.O_RDWR | os.O_CREAT, 0o644),
         os.mkdir, os.listdir, os.unlink, os.readlink, os.chdir, lambda p: os.symlink('x', p)]
out = []
for f in calls:
    try:
        f(p)
        out.append('ok')
    except OSError as e:
        out.append(str(e.errno))
print(' '.join(out))
"#;
    let o = common::preload::run_cmd(&srv, local.path(), 60, &["python3", "-c", script]);
    assert_eq!(ok(&o), format!("{}\n", vec![libc::ENAMETOOLONG.to_string(); 10].join(" ")));
}
