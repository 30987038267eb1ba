/* Plain POSIX file I/O under a root directory: sshfs through its FUSE
 * mount, ferry through `ferry mount`, and the local page-cache limit. */
#include "bench.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[4096];

static void full(char *out, size_t n, const char *path)
{
    snprintf(out, n, "%s%s", root, path);
}

static int init(const char *target)
{
    snprintf(root, sizeof root, "%s", target);
    size_t l = strlen(root);
    if (l > 1 && root[l - 1] == '/')
        root[l - 1] = 0;
    return access(root, F_OK);
}

static void *open_(const char *path, int write)
{
    char p[4096];
    full(p, sizeof p, path);
    int fd = write ? open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644) : open(p, O_RDONLY);
    if (fd < 0)
        return NULL;
    return (void *)(intptr_t)(fd + 1);
}

static int fd_of(void *fh)
{
    return (int)(intptr_t)fh - 1;
}

static ssize_t pread_(void *fh, void *buf, size_t n, uint64_t off)
{
    return pread(fd_of(fh), buf, n, (off_t)off);
}

static ssize_t pwrite_(void *fh, const void *buf, size_t n, uint64_t off)
{
    return pwrite(fd_of(fh), buf, n, (off_t)off);
}

static int fsync_(void *fh)
{
    return fsync(fd_of(fh));
}

static int close_(void *fh)
{
    return close(fd_of(fh));
}

static void conv(const struct stat *st, struct fattr *a)
{
    a->size = (uint64_t)st->st_size;
    a->is_dir = S_ISDIR(st->st_mode);
}

static int stat_(const char *path, struct fattr *a)
{
    char p[4096];
    struct stat st;
    full(p, sizeof p, path);
    if (lstat(p, &st) < 0)
        return -1;
    conv(&st, a);
    return 0;
}

static int fstat_(void *fh, struct fattr *a)
{
    struct stat st;
    if (fstat(fd_of(fh), &st) < 0)
        return -1;
    conv(&st, a);
    return 0;
}

/* readdir gives no attributes: the driver stats each entry, as `ls -l` does. */
static int list(const char *dir, entry_fn fn, void *ctx)
{
    char p[4096];
    full(p, sizeof p, dir);
    DIR *d = opendir(p);
    if (!d)
        return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (fn(ctx, e->d_name, 0, NULL, 0) < 0) {
            closedir(d);
            return -1;
        }
    }
    closedir(d);
    return 0;
}

static const char *error(void)
{
    return strerror(errno);
}

const struct backend BACKEND = {"posix", init, open_, pread_, pwrite_, fsync_, close_, stat_, fstat_, list, error};
