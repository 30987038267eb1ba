/* Measurement clients for `ferry compare`: one driver (common.c) running
 * the experiments' operations over a small file-access interface, which
 * each baseline's client library implements (posix.c, nfs.c, smb.c, p9.c).
 *
 *   PROG TARGET read   PATH BS LIMIT      sequential read, BS per call, up to LIMIT bytes
 *   PROG TARGET write  PATH SIZE BS       create, write SIZE in BS calls, fsync, close
 *   PROG TARGET stat   PATH N             N stats by path, then N on an open handle
 *   PROG TARGET scan   DIR READ           walk DIR: attributes of every entry (+ read each file if READ=1)
 *   PROG TARGET chunks PATH CHUNK T0 T1 IDX MIX
 *                                         from wall-clock T0 to T1, read CHUNK-sized pieces of PATH
 *                                         (odd IDX with MIX=1 write them to PATH.wIDX instead)
 *
 * Each prints one line, `ok key=value ...` (or `err message`), with the
 * process's own CPU time and context switches (getrusage). */
#ifndef FERRY_BENCH_H
#define FERRY_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct fattr {
    uint64_t size;
    int is_dir;
};

/* One callback per directory entry (not . or ..); have_attr says whether
 * `a` came with the listing (readdirplus) or must be fetched. */
typedef int (*entry_fn)(void *ctx, const char *name, int have_attr, const struct fattr *a, int is_dir);

struct backend {
    const char *name;
    int (*init)(const char *target);
    void *(*open)(const char *path, int write); /* write: create + truncate */
    ssize_t (*pread)(void *fh, void *buf, size_t n, uint64_t off);
    ssize_t (*pwrite)(void *fh, const void *buf, size_t n, uint64_t off);
    int (*fsync)(void *fh); /* NULL: the client library has none */
    int (*close)(void *fh);
    int (*stat)(const char *path, struct fattr *a);
    int (*fstat)(void *fh, struct fattr *a);
    int (*list)(const char *dir, entry_fn fn, void *ctx);
    const char *(*error)(void);
};

extern const struct backend BACKEND;

#endif
