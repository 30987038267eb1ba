/* SMB through libsmbclient (which has no fsync: writes are timed to close).
 * TARGET: smb://127.0.0.1/SHARE; user and password from FERRY_SMB_USER and
 * FERRY_SMB_PASSWORD. */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <libsmbclient.h>

static char base[1024];

static void auth(const char *srv, const char *shr, char *wg, int wglen, char *un, int unlen, char *pw, int pwlen)
{
    (void)srv;
    (void)shr;
    (void)wg;
    (void)wglen;
    const char *u = getenv("FERRY_SMB_USER"), *p = getenv("FERRY_SMB_PASSWORD");
    snprintf(un, unlen, "%s", u ? u : "root");
    snprintf(pw, pwlen, "%s", p ? p : "");
}

static void url(char *out, size_t n, const char *path)
{
    snprintf(out, n, "%s%s", base, path);
}

static int init(const char *target)
{
    snprintf(base, sizeof base, "%s", target);
    size_t l = strlen(base);
    if (l > 1 && base[l - 1] == '/')
        base[l - 1] = 0;
    if (smbc_init(auth, 0) < 0)
        return -1;
    struct stat st;
    return smbc_stat(base, &st);
}

static void *open_(const char *path, int write)
{
    char u[4096];
    url(u, sizeof u, path);
    int fd = write ? smbc_open(u, O_WRONLY | O_CREAT | O_TRUNC, 0644) : smbc_open(u, O_RDONLY, 0);
    return fd < 0 ? NULL : (void *)(intptr_t)(fd + 1);
}

static int fd_of(void *fh)
{
    return (int)(intptr_t)fh - 1;
}

/* libsmbclient has no pread: seek, then read (both local bookkeeping). */
static ssize_t pread_(void *fh, void *buf, size_t n, uint64_t off)
{
    if (smbc_lseek(fd_of(fh), (off_t)off, SEEK_SET) < 0)
        return -1;
    return smbc_read(fd_of(fh), buf, n);
}

static ssize_t pwrite_(void *fh, const void *buf, size_t n, uint64_t off)
{
    if (smbc_lseek(fd_of(fh), (off_t)off, SEEK_SET) < 0)
        return -1;
    return smbc_write(fd_of(fh), buf, n);
}

static int close_(void *fh)
{
    return smbc_close(fd_of(fh));
}

static int stat_(const char *path, struct fattr *a)
{
    char u[4096];
    struct stat st;
    url(u, sizeof u, path);
    if (smbc_stat(u, &st) < 0)
        return -1;
    a->size = (uint64_t)st.st_size;
    a->is_dir = S_ISDIR(st.st_mode);
    return 0;
}

static int fstat_(void *fh, struct fattr *a)
{
    struct stat st;
    if (smbc_fstat(fd_of(fh), &st) < 0)
        return -1;
    a->size = (uint64_t)st.st_size;
    a->is_dir = S_ISDIR(st.st_mode);
    return 0;
}

/* readdirplus2: the listing carries each entry's attributes. */
static int list(const char *dir, entry_fn fn, void *ctx)
{
    char u[4096];
    url(u, sizeof u, dir);
    int d = smbc_opendir(u);
    if (d < 0)
        return -1;
    const struct libsmb_file_info *e;
    struct stat st;
    while ((e = smbc_readdirplus2(d, &st))) {
        if (!strcmp(e->name, ".") || !strcmp(e->name, ".."))
            continue;
        struct fattr a = {.size = (uint64_t)st.st_size, .is_dir = S_ISDIR(st.st_mode)};
        if (fn(ctx, e->name, 1, &a, a.is_dir) < 0) {
            smbc_closedir(d);
            return -1;
        }
    }
    smbc_closedir(d);
    return 0;
}

static const char *error(void)
{
    return strerror(errno);
}

const struct backend BACKEND = {"smb", init, open_, pread_, pwrite_, NULL, close_, stat_, fstat_, list, error};
