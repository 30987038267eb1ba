/* A minimal 9P2000.L client (no 9P client library is packaged on Debian 12):
 * version, attach, walk, lopen, lcreate, read, write, fsync, getattr,
 * readdir, clunk. One request outstanding at a time; a call larger than
 * the negotiated msize goes as several requests one after the other.
 * TARGET: HOST:PORT:ANAME, e.g. 127.0.0.1:5640:/srv/export. */
#include "bench.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum {
    Tlerror = 6, Rlerror, Tlopen = 12, Rlopen, Tlcreate = 14, Rlcreate,
    Tgetattr = 24, Rgetattr, Treaddir = 40, Rreaddir, Tfsync = 50, Rfsync,
    Tversion = 100, Rversion, Tattach = 104, Rattach, Twalk = 110, Rwalk,
    Tread = 116, Rread, Twrite = 118, Rwrite, Tclunk = 120, Rclunk,
};
#define NOFID 0xffffffffu
#define ROOT 0u

static int sock = -1;
static uint32_t msize = 1024 * 1024 + 24;
static uint8_t *tx, *rx;
static size_t txlen, rxpos, rxlen;
static uint32_t next_fid = 1;
static int err9;

/* Encoding. */
static void put1(uint8_t v) { tx[txlen++] = v; }
static void put2(uint16_t v) { put1(v & 0xff); put1(v >> 8); }
static void put4(uint32_t v) { put2(v & 0xffff); put2(v >> 16); }
static void put8(uint64_t v) { put4(v & 0xffffffffu); put4(v >> 32); }
static void puts_(const char *s)
{
    size_t n = strlen(s);
    put2((uint16_t)n);
    memcpy(tx + txlen, s, n);
    txlen += n;
}
static void begin(uint8_t type)
{
    txlen = 4;
    put1(type);
    put2(1); /* tag: one request at a time */
}

/* Decoding. */
static uint8_t get1(void) { return rxpos < rxlen ? rx[rxpos++] : 0; }
static uint16_t get2(void) { uint16_t a = get1(); return a | (uint16_t)get1() << 8; }
static uint32_t get4(void) { uint32_t a = get2(); return a | (uint32_t)get2() << 16; }
static uint64_t get8(void) { uint64_t a = get4(); return a | (uint64_t)get4() << 32; }

static int full_io(int write, uint8_t *p, size_t n)
{
    while (n) {
        ssize_t k = write ? send(sock, p, n, MSG_NOSIGNAL) : recv(sock, p, n, 0);
        if (k <= 0) {
            if (k == 0)
                errno = ECONNRESET;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Sends the message in tx (with `data` appended), waits for the reply;
 * a reply's data larger than the header lands in `dst` if given. */
static int rpc(uint8_t want, const void *data, size_t dlen)
{
    uint32_t size = (uint32_t)(txlen + dlen);
    tx[0] = size & 0xff;
    tx[1] = size >> 8 & 0xff;
    tx[2] = size >> 16 & 0xff;
    tx[3] = size >> 24;
    if (dlen) {
        struct iovec v[2] = {{tx, txlen}, {(void *)data, dlen}};
        struct msghdr m = {.msg_iov = v, .msg_iovlen = 2};
        size_t total = txlen + dlen;
        while (total) {
            ssize_t k = sendmsg(sock, &m, MSG_NOSIGNAL);
            if (k <= 0)
                return -1;
            total -= (size_t)k;
            while (k && m.msg_iovlen) {
                size_t take = (size_t)k < m.msg_iov->iov_len ? (size_t)k : m.msg_iov->iov_len;
                m.msg_iov->iov_base = (char *)m.msg_iov->iov_base + take;
                m.msg_iov->iov_len -= take;
                k -= (ssize_t)take;
                if (!m.msg_iov->iov_len) {
                    m.msg_iov++;
                    m.msg_iovlen--;
                }
            }
        }
    } else if (full_io(1, tx, txlen) < 0) {
        return -1;
    }
    uint8_t h[4];
    if (full_io(0, h, 4) < 0)
        return -1;
    uint32_t n = h[0] | h[1] << 8 | h[2] << 16 | (uint32_t)h[3] << 24;
    if (n < 7 || n > msize) {
        errno = EPROTO;
        return -1;
    }
    if (full_io(0, rx, n - 4) < 0)
        return -1;
    rxlen = n - 4;
    rxpos = 0;
    uint8_t type = get1();
    get2();
    if (type == Rlerror) {
        errno = err9 = (int)get4();
        return -1;
    }
    if (type != want) {
        errno = EPROTO;
        return -1;
    }
    return 0;
}

static int clunk(uint32_t fid)
{
    begin(Tclunk);
    put4(fid);
    return rpc(Rclunk, NULL, 0);
}

/* Walks from the root to `path` into a new fid (`skip_last`: to its parent). */
static int walk(const char *path, int skip_last, uint32_t *out)
{
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", path);
    char *names[64];
    int n = 0;
    for (char *s = strtok(copy, "/"); s && n < 64; s = strtok(NULL, "/"))
        names[n++] = s;
    if (skip_last && n)
        n--;
    uint32_t fid = next_fid++;
    uint32_t from = ROOT;
    int done = 0;
    do {
        int k = n - done > 16 ? 16 : n - done;
        begin(Twalk);
        put4(from);
        put4(fid);
        put2((uint16_t)k);
        for (int i = 0; i < k; i++)
            puts_(names[done + i]);
        if (rpc(Rwalk, NULL, 0) < 0)
            return -1;
        if (get2() != k) {
            if (from != ROOT)
                clunk(fid);
            errno = ENOENT;
            return -1;
        }
        from = fid;
        done += k;
    } while (done < n);
    *out = fid;
    return 0;
}

struct p9file {
    uint32_t fid;
    uint32_t iounit;
};

static int init(const char *target)
{
    char host[256];
    int port;
    char aname[4096];
    if (sscanf(target, "%255[^:]:%d:%4095s", host, &port, aname) != 3) {
        errno = EINVAL;
        return -1;
    }
    sock = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    if (connect(sock, (struct sockaddr *)&a, sizeof a) < 0)
        return -1;
    int one = 1;
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    tx = malloc(msize);
    rx = malloc(msize);
    begin(Tversion);
    tx[5] = 0xff; /* NOTAG */
    tx[6] = 0xff;
    put4(msize);
    puts_("9P2000.L");
    if (rpc(Rversion, NULL, 0) < 0)
        return -1;
    uint32_t m = get4();
    if (m < msize)
        msize = m;
    begin(Tattach);
    put4(ROOT);
    put4(NOFID);
    puts_("root");
    puts_(aname);
    put4(0);
    return rpc(Rattach, NULL, 0);
}

static void *open_(const char *path, int write)
{
    struct p9file *f = calloc(1, sizeof *f);
    if (!write) {
        if (walk(path, 0, &f->fid) < 0)
            goto fail;
        begin(Tlopen);
        put4(f->fid);
        put4(0); /* O_RDONLY */
        if (rpc(Rlopen, NULL, 0) < 0) {
            clunk(f->fid);
            goto fail;
        }
    } else {
        if (walk(path, 1, &f->fid) < 0)
            goto fail;
        const char *name = strrchr(path, '/');
        name = name ? name + 1 : path;
        begin(Tlcreate);
        put4(f->fid);
        puts_(name);
        put4(01 | 0100 | 01000); /* O_WRONLY | O_CREAT | O_TRUNC */
        put4(0644);
        put4(0);
        if (rpc(Rlcreate, NULL, 0) < 0) {
            clunk(f->fid);
            goto fail;
        }
    }
    rxpos += 13; /* qid */
    f->iounit = get4();
    return f;
fail:
    free(f);
    return NULL;
}

static uint32_t max_io(struct p9file *f, uint32_t hdr)
{
    uint32_t m = msize - hdr;
    return f->iounit && f->iounit < m ? f->iounit : m;
}

static ssize_t pread_(void *fh, void *buf, size_t n, uint64_t off)
{
    struct p9file *f = fh;
    size_t done = 0;
    while (done < n) {
        uint32_t want = (uint32_t)(n - done < max_io(f, 24) ? n - done : max_io(f, 24));
        begin(Tread);
        put4(f->fid);
        put8(off + done);
        put4(want);
        if (rpc(Rread, NULL, 0) < 0)
            return -1;
        uint32_t got = get4();
        if (got > want || got > rxlen - rxpos) {
            errno = EPROTO;
            return -1;
        }
        memcpy((char *)buf + done, rx + rxpos, got);
        done += got;
        if (got < want)
            break;
    }
    return (ssize_t)done;
}

static ssize_t pwrite_(void *fh, const void *buf, size_t n, uint64_t off)
{
    struct p9file *f = fh;
    size_t done = 0;
    while (done < n) {
        uint32_t want = (uint32_t)(n - done < max_io(f, 24) ? n - done : max_io(f, 24));
        begin(Twrite);
        put4(f->fid);
        put8(off + done);
        put4(want);
        if (rpc(Rwrite, (const char *)buf + done, want) < 0)
            return -1;
        uint32_t got = get4();
        done += got;
        if (got == 0)
            break;
    }
    return (ssize_t)done;
}

static int fsync_(void *fh)
{
    begin(Tfsync);
    put4(((struct p9file *)fh)->fid);
    put4(0); /* datasync */
    return rpc(Rfsync, NULL, 0);
}

static int close_(void *fh)
{
    struct p9file *f = fh;
    int r = clunk(f->fid);
    free(f);
    return r;
}

static int getattr(uint32_t fid, struct fattr *a)
{
    begin(Tgetattr);
    put4(fid);
    put8(0x7ff); /* P9_GETATTR_BASIC */
    if (rpc(Rgetattr, NULL, 0) < 0)
        return -1;
    get8();         /* valid */
    rxpos += 13;    /* qid */
    uint32_t mode = get4();
    get4();         /* uid */
    get4();         /* gid */
    get8();         /* nlink */
    get8();         /* rdev */
    a->size = get8();
    a->is_dir = (mode & 0170000) == 0040000;
    return 0;
}

/* By path: walk, getattr, clunk (three round trips). */
static int stat_(const char *path, struct fattr *a)
{
    uint32_t fid;
    if (walk(path, 0, &fid) < 0)
        return -1;
    int r = getattr(fid, a);
    clunk(fid);
    return r;
}

static int fstat_(void *fh, struct fattr *a)
{
    return getattr(((struct p9file *)fh)->fid, a);
}

/* Treaddir gives names and types only: the driver stats each entry. */
static int list(const char *dir, entry_fn fn, void *ctx)
{
    uint32_t fid;
    if (walk(dir, 0, &fid) < 0)
        return -1;
    begin(Tlopen);
    put4(fid);
    put4(0200000); /* O_RDONLY | O_DIRECTORY */
    if (rpc(Rlopen, NULL, 0) < 0) {
        clunk(fid);
        return -1;
    }
    /* Collect the names first: the callback makes its own calls. */
    size_t cap = 1024, len = 0;
    char *names = malloc(cap);
    uint8_t *types = malloc(cap);
    size_t count = 0;
    uint64_t off = 0;
    for (;;) {
        begin(Treaddir);
        put4(fid);
        put8(off);
        put4(msize - 24);
        if (rpc(Rreaddir, NULL, 0) < 0) {
            clunk(fid);
            return -1;
        }
        uint32_t n = get4();
        if (n == 0)
            break;
        size_t end = rxpos + n;
        while (rxpos < end) {
            rxpos += 13;
            off = get8();
            uint8_t type = get1();
            uint16_t l = get2();
            if (len + l + 1 > cap || count + 1 > cap) {
                cap = 2 * (cap + l);
                names = realloc(names, cap);
                types = realloc(types, cap);
            }
            memcpy(names + len, rx + rxpos, l);
            names[len + l] = 0;
            len += l + 1;
            types[count++] = type;
            rxpos += l;
        }
    }
    clunk(fid);
    char *p = names;
    int r = 0;
    for (size_t i = 0; i < count; i++, p += strlen(p) + 1) {
        if (!strcmp(p, ".") || !strcmp(p, ".."))
            continue;
        if (fn(ctx, p, 0, NULL, types[i] == 4 /* DT_DIR */) < 0) {
            r = -1;
            break;
        }
    }
    free(names);
    free(types);
    return r;
}

static const char *error(void)
{
    return strerror(errno);
}

const struct backend BACKEND = {"9p", init, open_, pread_, pwrite_, fsync_, close_, stat_, fstat_, list, error};
