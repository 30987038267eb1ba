/* NFS through libnfs's synchronous API (one call at a time; libnfs splits a
 * call larger than the server's maximum into several RPCs in flight).
 * TARGET: nfs://127.0.0.1/EXPORT for NFSv3, nfs://127.0.0.1/EXPORT?version=4. */
#include "bench.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <nfsc/libnfs.h>

static struct nfs_context *nfs;

static int init(const char *target)
{
    nfs = nfs_init_context();
    if (!nfs)
        return -1;
    struct nfs_url *u = nfs_parse_url_dir(nfs, target);
    if (!u)
        return -1;
    int r = nfs_mount(nfs, u->server, u->path);
    nfs_destroy_url(u);
    return r;
}

static void *open_(const char *path, int write)
{
    struct nfsfh *fh = NULL;
    int r = write ? nfs_open2(nfs, path, O_WRONLY | O_CREAT | O_TRUNC, 0644, &fh) : nfs_open(nfs, path, O_RDONLY, &fh);
    return r < 0 ? NULL : fh;
}

static ssize_t pread_(void *fh, void *buf, size_t n, uint64_t off)
{
    return nfs_pread(nfs, fh, off, n, buf);
}

static ssize_t pwrite_(void *fh, const void *buf, size_t n, uint64_t off)
{
    return nfs_pwrite(nfs, fh, off, n, buf);
}

static int fsync_(void *fh)
{
    return nfs_fsync(nfs, fh);
}

static int close_(void *fh)
{
    return nfs_close(nfs, fh);
}

static int stat_(const char *path, struct fattr *a)
{
    struct nfs_stat_64 st;
    if (nfs_stat64(nfs, path, &st) < 0)
        return -1;
    a->size = st.nfs_size;
    a->is_dir = S_ISDIR(st.nfs_mode);
    return 0;
}

static int fstat_(void *fh, struct fattr *a)
{
    struct nfs_stat_64 st;
    if (nfs_fstat64(nfs, fh, &st) < 0)
        return -1;
    a->size = st.nfs_size;
    a->is_dir = S_ISDIR(st.nfs_mode);
    return 0;
}

/* READDIRPLUS: entries come with their attributes. */
static int list(const char *dir, entry_fn fn, void *ctx)
{
    struct nfsdir *d;
    if (nfs_opendir(nfs, dir, &d) < 0)
        return -1;
    struct nfsdirent *e;
    while ((e = nfs_readdir(nfs, d))) {
        if (!strcmp(e->name, ".") || !strcmp(e->name, ".."))
            continue;
        struct fattr a = {.size = e->size, .is_dir = S_ISDIR(e->mode) || e->type == 2};
        if (fn(ctx, e->name, 1, &a, a.is_dir) < 0) {
            nfs_closedir(nfs, d);
            return -1;
        }
    }
    nfs_closedir(nfs, d);
    return 0;
}

static const char *error(void)
{
    return nfs ? nfs_get_error(nfs) : "no context";
}

const struct backend BACKEND = {"nfs", init, open_, pread_, pwrite_, fsync_, close_, stat_, fstat_, list, error};
