/* The driver shared by every measurement client; see bench.h. */
#include "bench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static double wall(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static struct rusage ru0;

static void fail(const char *what, const char *path)
{
    const char *e = BACKEND.error ? BACKEND.error() : strerror(errno);
    printf("err %s %s: %s\n", what, path, e ? e : "unknown error");
    fflush(stdout);
    exit(1);
}

static void report(const char *extra)
{
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    double ut = (r.ru_utime.tv_sec - ru0.ru_utime.tv_sec) + (r.ru_utime.tv_usec - ru0.ru_utime.tv_usec) / 1e6;
    double st = (r.ru_stime.tv_sec - ru0.ru_stime.tv_sec) + (r.ru_stime.tv_usec - ru0.ru_stime.tv_usec) / 1e6;
    printf("ok %s utime=%.6f stime=%.6f nvcsw=%ld nivcsw=%ld\n", extra, ut, st, r.ru_nvcsw - ru0.ru_nvcsw,
           r.ru_nivcsw - ru0.ru_nivcsw);
    fflush(stdout);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        printf("err out of memory\n");
        exit(1);
    }
    memset(p, 0x5a, n);
    return p;
}

/* A page-aligned buffer, as ferry's worker reads into: the kernel's receive
 * copy costs about twice as much on this machine's CPUs into a buffer 16
 * bytes past a page (where malloc puts a fresh 1 MiB block), so read
 * buffers of all clients are placed alike (docs/benchmarks.md, issue 34). */
static void *xmalloc_aligned(size_t n)
{
    size_t size = (n + 4095) / 4096 * 4096;
    void *p = aligned_alloc(4096, size ? size : 4096);
    if (!p) {
        printf("err out of memory\n");
        exit(1);
    }
    memset(p, 0x5a, n);
    return p;
}

static int do_read(const char *path, size_t bs, uint64_t limit)
{
    char *buf = xmalloc_aligned(bs);
    getrusage(RUSAGE_SELF, &ru0);
    double t = now();
    void *f = BACKEND.open(path, 0);
    if (!f)
        fail("open", path);
    uint64_t off = 0;
    while (off < limit) {
        size_t want = limit - off < bs ? (size_t)(limit - off) : bs;
        ssize_t n = BACKEND.pread(f, buf, want, off);
        if (n < 0)
            fail("read", path);
        if (n == 0)
            break;
        off += (uint64_t)n;
    }
    BACKEND.close(f);
    double secs = now() - t;
    char line[256];
    snprintf(line, sizeof line, "bytes=%llu secs=%.6f", (unsigned long long)off, secs);
    report(line);
    return 0;
}

static int do_write(const char *path, uint64_t size, size_t bs)
{
    char *buf = xmalloc(bs);
    getrusage(RUSAGE_SELF, &ru0);
    double t = now();
    void *f = BACKEND.open(path, 1);
    if (!f)
        fail("create", path);
    uint64_t off = 0;
    while (off < size) {
        size_t want = size - off < bs ? (size_t)(size - off) : bs;
        ssize_t n = BACKEND.pwrite(f, buf, want, off);
        if (n <= 0)
            fail("write", path);
        off += (uint64_t)n;
    }
    int synced = 0;
    if (BACKEND.fsync) {
        if (BACKEND.fsync(f) < 0)
            fail("fsync", path);
        synced = 1;
    }
    if (BACKEND.close(f) < 0)
        fail("close", path);
    double secs = now() - t;
    char line[256];
    snprintf(line, sizeof line, "bytes=%llu secs=%.6f fsync=%d", (unsigned long long)off, secs, synced);
    report(line);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double quantile(double *v, size_t n, double q)
{
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

static int do_stat(const char *path, size_t n)
{
    double *a = xmalloc(n * sizeof(double)), *b = xmalloc(n * sizeof(double));
    struct fattr at;
    getrusage(RUSAGE_SELF, &ru0);
    for (size_t i = 0; i < n; i++) {
        double t = now();
        if (BACKEND.stat(path, &at) < 0)
            fail("stat", path);
        a[i] = (now() - t) * 1e6;
    }
    void *f = BACKEND.open(path, 0);
    if (!f)
        fail("open", path);
    for (size_t i = 0; i < n; i++) {
        double t = now();
        if (BACKEND.fstat(f, &at) < 0)
            fail("fstat", path);
        b[i] = (now() - t) * 1e6;
    }
    BACKEND.close(f);
    char line[256];
    snprintf(line, sizeof line, "stat_p50=%.3f stat_p99=%.3f fstat_p50=%.3f fstat_p99=%.3f n=%zu", quantile(a, n, 0.5),
             quantile(a, n, 0.99), quantile(b, n, 0.5), quantile(b, n, 0.99), n);
    report(line);
    return 0;
}

struct scan {
    const char *dir;
    int read;
    uint64_t files, dirs, bytes;
    char **subdirs;
    size_t nsub, capsub;
    char *buf;
};

static void scan_dir(const char *dir, int rd, struct scan *total);

static int scan_entry(void *ctx, const char *name, int have_attr, const struct fattr *a, int is_dir)
{
    struct scan *s = ctx;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", strcmp(s->dir, "/") ? s->dir : "", name);
    struct fattr got;
    if (!have_attr) {
        if (BACKEND.stat(path, &got) < 0)
            fail("stat", path);
        a = &got;
    }
    if (a->is_dir || is_dir) {
        s->dirs++;
        if (s->nsub == s->capsub) {
            s->capsub = s->capsub ? 2 * s->capsub : 16;
            s->subdirs = realloc(s->subdirs, s->capsub * sizeof(char *));
        }
        s->subdirs[s->nsub++] = strdup(path);
        return 0;
    }
    s->files++;
    if (s->read) {
        void *f = BACKEND.open(path, 0);
        if (!f)
            fail("open", path);
        ssize_t n;
        uint64_t off = 0;
        while ((n = BACKEND.pread(f, s->buf, 65536, off)) > 0)
            off += (uint64_t)n;
        if (n < 0)
            fail("read", path);
        BACKEND.close(f);
        s->bytes += off;
    }
    return 0;
}

static void scan_dir(const char *dir, int rd, struct scan *total)
{
    struct scan s = {.dir = dir, .read = rd, .buf = total->buf};
    if (BACKEND.list(dir, scan_entry, &s) < 0)
        fail("readdir", dir);
    total->files += s.files;
    total->dirs += s.dirs;
    total->bytes += s.bytes;
    for (size_t i = 0; i < s.nsub; i++) {
        scan_dir(s.subdirs[i], rd, total);
        free(s.subdirs[i]);
    }
    free(s.subdirs);
}

static int do_scan(const char *dir, int rd)
{
    struct scan total = {.buf = xmalloc(65536)};
    getrusage(RUSAGE_SELF, &ru0);
    double t = now();
    scan_dir(dir, rd, &total);
    double secs = now() - t;
    char line[256];
    snprintf(line, sizeof line, "files=%llu dirs=%llu bytes=%llu secs=%.6f", (unsigned long long)total.files,
             (unsigned long long)total.dirs, (unsigned long long)total.bytes, secs);
    report(line);
    return 0;
}

static int do_chunks(const char *path, size_t chunk, double t0, double t1, int idx, int mix)
{
    char *buf = xmalloc(chunk);
    int writer = mix && (idx % 2 == 1);
    char wpath[4096];
    snprintf(wpath, sizeof wpath, "%s.w%d", path, idx);
    struct fattr a;
    if (BACKEND.stat(path, &a) < 0)
        fail("stat", path);
    uint64_t size = a.size / chunk * chunk;
    if (size == 0) {
        printf("err %s is smaller than one chunk\n", path);
        return 1;
    }
    void *f = BACKEND.open(writer ? wpath : path, writer);
    if (!f)
        fail("open", writer ? wpath : path);
    uint64_t wsize = 16u << 20;
    /* Readers start at different places of the file. */
    uint64_t off = ((uint64_t)idx * 7919u * chunk) % size;
    uint64_t ops = 0, bytes = 0, errors = 0;
    double w = wall();
    if (w < t0)
        usleep((useconds_t)((t0 - w) * 1e6));
    getrusage(RUSAGE_SELF, &ru0);
    while (wall() < t1) {
        ssize_t n;
        if (writer) {
            n = BACKEND.pwrite(f, buf, chunk, off % wsize);
        } else {
            n = BACKEND.pread(f, buf, chunk, off);
        }
        if (n != (ssize_t)chunk) {
            errors++;
            if (errors > 1000)
                break;
        } else {
            ops++;
            bytes += (uint64_t)n;
        }
        off += chunk;
        if (!writer && off >= size)
            off = 0;
    }
    BACKEND.close(f);
    char line[256];
    snprintf(line, sizeof line, "ops=%llu bytes=%llu errors=%llu writer=%d", (unsigned long long)ops,
             (unsigned long long)bytes, (unsigned long long)errors, writer);
    report(line);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s TARGET read|write|stat|scan|chunks ARGS...\n", argv[0]);
        return 2;
    }
    if (BACKEND.init(argv[1]) < 0) {
        printf("err connect %s: %s\n", argv[1], BACKEND.error ? BACKEND.error() : strerror(errno));
        return 1;
    }
    const char *op = argv[2], *path = argv[3];
    if (!strcmp(op, "read") && argc == 6)
        return do_read(path, strtoull(argv[4], 0, 10), strtoull(argv[5], 0, 10));
    if (!strcmp(op, "write") && argc == 6)
        return do_write(path, strtoull(argv[4], 0, 10), strtoull(argv[5], 0, 10));
    if (!strcmp(op, "stat") && argc == 5)
        return do_stat(path, strtoull(argv[4], 0, 10));
    if (!strcmp(op, "scan") && argc == 5)
        return do_scan(path, atoi(argv[4]));
    if (!strcmp(op, "chunks") && argc == 9)
        return do_chunks(path, strtoull(argv[4], 0, 10), atof(argv[5]), atof(argv[6]), atoi(argv[7]), atoi(argv[8]));
    fprintf(stderr, "%s: bad arguments\n", argv[0]);
    return 2;
}
