/* Store rows in files of the disk tier, read with explicit reads (file_rows.h): the registry of
 * file segments, the queue of row copies, and the reads on the pool — io_uring rings (raw syscalls,
 * one per pool part) keep `depth` reads in flight each; without io_uring, pread one at a time.
 * A page fault on the mapping is one synchronous disk read; reads in flight overlap that latency. */
#define _GNU_SOURCE
#include "file_rows.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__has_include)
#if __has_include(<linux/io_uring.h>) && defined(__NR_io_uring_setup)
#include <linux/io_uring.h>
#define HG_URING 1
#endif
#endif

#define EXPORT __attribute__((visibility("default")))
#define MERGE_MAX ((uint64_t)1 << 20) /* a merged copy stays ≤ 1 MiB, so long runs still spread over the parts */

/* ---- the registry ---------------------------------------------------------------------- */
typedef struct {
    uintptr_t addr, end;
    uint64_t off;
    int fd, refs, dead;
    char path[];
} entry;

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static entry **reg;
static int nreg, capreg;

static void put(entry *e) { /* with reg_mu held */
    if (--e->refs == 0 && e->dead) {
        close(e->fd);
        free(e);
    }
}

/* A file segment of a store: [addr, addr + bytes) maps `path` from file offset `off`. The file is
 * opened again read-only for the stage's reads (random access: no read-ahead around a row).
 * 0 or −errno. */
EXPORT int hg_tier_register_file(void *addr, uint64_t bytes, const char *path, uint64_t off) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    size_t n = strlen(path);
    entry *e = malloc(sizeof *e + n + 1);
    if (!e) {
        close(fd);
        return -ENOMEM;
    }
    *e = (entry){.addr = (uintptr_t)addr, .end = (uintptr_t)addr + bytes, .off = off, .fd = fd, .refs = 1};
    memcpy(e->path, path, n + 1);
    pthread_mutex_lock(&reg_mu);
    if (nreg == capreg) {
        int c = capreg ? 2 * capreg : 16;
        entry **r = realloc(reg, sizeof *r * (size_t)c);
        if (!r) {
            pthread_mutex_unlock(&reg_mu);
            close(fd);
            free(e);
            return -ENOMEM;
        }
        reg = r;
        capreg = c;
    }
    reg[nreg++] = e;
    pthread_mutex_unlock(&reg_mu);
    return 0;
}

/* Forgets the segment at `addr` (its descriptor closes once no job holds it). 0 or −ENOENT. */
EXPORT int hg_tier_unregister_file(void *addr) {
    pthread_mutex_lock(&reg_mu);
    for (int i = 0; i < nreg; i++) {
        if (reg[i]->addr != (uintptr_t)addr) continue;
        entry *e = reg[i];
        reg[i] = reg[--nreg];
        e->dead = 1;
        put(e);
        pthread_mutex_unlock(&reg_mu);
        return 0;
    }
    pthread_mutex_unlock(&reg_mu);
    return -ENOENT;
}

/* Registered segments in total (tests). */
EXPORT int hg_tier_registered_files(void) {
    pthread_mutex_lock(&reg_mu);
    int n = nreg;
    pthread_mutex_unlock(&reg_mu);
    return n;
}

void hg_rows_begin(hg_rows_io *io) {
    io->nseg = io->last = 0;
    io->nreq = 0;
    atomic_store(&io->failed, 0);
    io->err = 0;
    atomic_store(&io->reads, 0);
    atomic_store(&io->bytes, 0);
}

void hg_rows_acquire(hg_rows_io *io, uintptr_t addr, uint64_t bytes) {
    pthread_mutex_lock(&reg_mu);
    for (int i = 0; i < nreg && io->nseg < HG_ROWS_MAX_SEGS; i++) {
        entry *e = reg[i];
        if (e->end <= addr || e->addr >= addr + bytes) continue;
        int at = io->nseg++;
        while (at > 0 && io->segs[at - 1].addr > e->addr) { /* kept sorted by address */
            io->segs[at] = io->segs[at - 1];
            at--;
        }
        io->segs[at] = (hg_fseg){e->addr, e->end, e->off, e->fd, e->path, e};
        e->refs++;
    }
    pthread_mutex_unlock(&reg_mu);
}

void hg_rows_release(hg_rows_io *io) {
    if (!io->nseg) return;
    pthread_mutex_lock(&reg_mu);
    for (int i = 0; i < io->nseg; i++) put(io->segs[i].entry);
    pthread_mutex_unlock(&reg_mu);
    io->nseg = 0;
}

/* ---- the queue ------------------------------------------------------------------------- */
/* The segment holding `a` (or −1), and where that piece ends. */
static int seg_at(hg_rows_io *io, uintptr_t a, uintptr_t *piece_end) {
    if (io->last < io->nseg && io->segs[io->last].addr <= a && a < io->segs[io->last].end) {
        *piece_end = io->segs[io->last].end;
        return io->last;
    }
    uintptr_t next = UINTPTR_MAX;
    for (int i = 0; i < io->nseg; i++) {
        if (io->segs[i].addr <= a && a < io->segs[i].end) {
            *piece_end = io->segs[i].end;
            return io->last = i;
        }
        if (io->segs[i].addr > a && io->segs[i].addr < next) next = io->segs[i].addr;
    }
    *piece_end = next;
    return -1;
}

int hg_rows_add(hg_rows_io *io, char *dst, uintptr_t src, uint64_t len) {
    while (len) {
        uintptr_t end;
        int s = seg_at(io, src, &end);
        uint64_t n = end - src < len ? end - src : len;
        hg_rreq *q = io->nreq ? &io->reqs[io->nreq - 1] : NULL;
        if (q && q->seg == s && q->src + q->len == src && q->dst + q->len == dst && q->len + n <= MERGE_MAX) {
            q->len += n;
        } else {
            if (io->nreq == io->cap) {
                size_t c = io->cap ? 2 * io->cap : 1024;
                hg_rreq *r = realloc(io->reqs, sizeof *r * c);
                if (!r) return -1;
                io->reqs = r;
                io->cap = c;
            }
            io->reqs[io->nreq++] = (hg_rreq){dst, src, n, s};
        }
        dst += n;
        src += n;
        len -= n;
    }
    return 0;
}

/* ---- the reads ------------------------------------------------------------------------- */
static void fail_req(hg_rows_io *io, const hg_rreq *q, int err) {
    int no = 0;
    if (atomic_compare_exchange_strong(&io->failed, &no, 1)) {
        io->err = err;
        io->bad = *q;
    }
}

static uint64_t file_off(const hg_rows_io *io, const hg_rreq *q) {
    const hg_fseg *g = &io->segs[q->seg];
    return g->off + (q->src - g->addr);
}

/* The rest of request q from byte `done` on, with pread (a short read continues; end of file fails). */
static void pread_rest(hg_rows_io *io, const hg_rreq *q, uint64_t done) {
    const int fd = io->segs[q->seg].fd;
    const uint64_t off = file_off(io, q);
    while (done < q->len) {
        ssize_t r = pread(fd, q->dst + done, (size_t)(q->len - done), (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            fail_req(io, q, r < 0 ? errno : 0);
            return;
        }
        done += (uint64_t)r;
    }
}

static void sync_reads(hg_rows_io *io, size_t b, size_t e) {
    for (size_t i = b; i < e && !atomic_load_explicit(&io->failed, memory_order_relaxed); i++) {
        const hg_rreq *q = &io->reqs[i];
        if (q->seg < 0) memcpy(q->dst, (const void *)q->src, (size_t)q->len);
        else pread_rest(io, q, 0);
    }
}

#ifdef HG_URING
typedef struct {
    int fd;
    unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
    void *sq_map, *cq_map, *sqe_map;
    size_t sq_len, cq_len, sqe_len;
} ring;

static void ring_close(ring *R) {
    if (R->sqe_map) munmap(R->sqe_map, R->sqe_len);
    if (R->cq_map && R->cq_map != R->sq_map) munmap(R->cq_map, R->cq_len);
    if (R->sq_map) munmap(R->sq_map, R->sq_len);
    if (R->fd > 0) close(R->fd);
    memset(R, 0, sizeof *R);
}

static int ring_open(ring *R, unsigned depth) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    memset(R, 0, sizeof *R);
    int fd = (int)syscall(__NR_io_uring_setup, depth, &p);
    if (fd < 0) return -1; /* no io_uring here (old kernel, seccomp, io_uring_disabled) */
    R->fd = fd;
    R->sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    R->cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    const int single = (p.features & IORING_FEAT_SINGLE_MMAP) != 0;
    if (single) R->sq_len = R->cq_len = R->sq_len > R->cq_len ? R->sq_len : R->cq_len;
    R->sq_map = mmap(NULL, R->sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQ_RING);
    if (R->sq_map == MAP_FAILED) { R->sq_map = NULL; ring_close(R); return -1; }
    R->cq_map = single ? R->sq_map : mmap(NULL, R->cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_CQ_RING);
    if (R->cq_map == MAP_FAILED) { R->cq_map = NULL; ring_close(R); return -1; }
    R->sqe_len = p.sq_entries * sizeof(struct io_uring_sqe);
    R->sqe_map = mmap(NULL, R->sqe_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQES);
    if (R->sqe_map == MAP_FAILED) { R->sqe_map = NULL; ring_close(R); return -1; }
    char *sq = R->sq_map, *cq = R->cq_map;
    R->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    R->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    R->sq_array = (unsigned *)(sq + p.sq_off.array);
    R->cq_head = (unsigned *)(cq + p.cq_off.head);
    R->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    R->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    R->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    R->sqes = R->sqe_map;
    return 0;
}

/* Requests [b, e) with up to `depth` reads in flight on R. A completion that is short, or an op the
 * kernel refuses (EINVAL before 5.6), finishes with pread. After any failure nothing new is issued,
 * and what is in flight is reaped before returning. Returns −1 if the ring itself broke. */
static int ring_reads(ring *R, hg_rows_io *io, size_t b, size_t e, unsigned depth) {
    size_t next = b;
    unsigned inflight = 0, queued = 0;
    for (;;) {
        while (inflight + queued < depth && next < e && !atomic_load_explicit(&io->failed, memory_order_relaxed)) {
            const hg_rreq *q = &io->reqs[next];
            if (q->seg < 0) {
                memcpy(q->dst, (const void *)q->src, (size_t)q->len);
                next++;
                continue;
            }
            unsigned tail = *R->sq_tail, idx = tail & *R->sq_mask;
            struct io_uring_sqe *sqe = &R->sqes[idx];
            memset(sqe, 0, sizeof *sqe);
            sqe->opcode = IORING_OP_READ;
            sqe->fd = io->segs[q->seg].fd;
            sqe->off = file_off(io, q);
            sqe->addr = (uint64_t)(uintptr_t)q->dst;
            sqe->len = (unsigned)q->len;
            sqe->user_data = next++;
            R->sq_array[idx] = idx;
            __atomic_store_n(R->sq_tail, tail + 1, __ATOMIC_RELEASE);
            queued++;
        }
        if (!inflight && !queued) return 0;
        int r = (int)syscall(__NR_io_uring_enter, R->fd, queued, 1, IORING_ENTER_GETEVENTS, NULL, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            if ((errno == EAGAIN || errno == EBUSY) && inflight) r = 0; /* reap first, then submit again */
            else {
                fail_req(io, &io->reqs[next - 1], errno);
                return -1;
            }
        }
        if (r == 0 && queued && !inflight) { /* nothing taken and nothing to wait for: never block on it */
            fail_req(io, &io->reqs[next - 1], EIO);
            return -1;
        }
        queued -= (unsigned)r;
        inflight += (unsigned)r;
        unsigned head = *R->cq_head, tail = __atomic_load_n(R->cq_tail, __ATOMIC_ACQUIRE);
        for (; head != tail; head++, inflight--) {
            const struct io_uring_cqe *c = &R->cqes[head & *R->cq_mask];
            const hg_rreq *q = &io->reqs[c->user_data];
            if (c->res == (int)q->len) continue;
            if (c->res > 0) pread_rest(io, q, (uint64_t)c->res);
            else if (c->res == 0) fail_req(io, q, 0);
            else if (c->res == -EINVAL || c->res == -EOPNOTSUPP || c->res == -EAGAIN || c->res == -EINTR || c->res == -ECANCELED) pread_rest(io, q, 0);
            else fail_req(io, q, -c->res);
        }
        __atomic_store_n(R->cq_head, head, __ATOMIC_RELEASE);
    }
}
#else
typedef struct { int fd; } ring;
static void ring_close(ring *R) { (void)R; }
static int ring_open(ring *R, unsigned depth) { (void)R; (void)depth; return -1; }
static int ring_reads(ring *R, hg_rows_io *io, size_t b, size_t e, unsigned depth) { (void)R; (void)depth; sync_reads(io, b, e); return 0; }
#endif

struct hg_readers {
    int n, depth, broken; /* broken: no io_uring here, every part reads with pread */
    ring r[];
};

void hg_readers_destroy(hg_readers *rd) {
    if (!rd) return;
    for (int i = 0; i < rd->n; i++) ring_close(&rd->r[i]);
    free(rd);
}

static hg_readers *readers_for(hg_readers **slot, int n, int depth) {
    hg_readers *rd = *slot;
    if (rd && (rd->broken || (rd->n >= n && rd->depth == depth))) return rd; /* no io_uring: never asked again */
    hg_readers_destroy(rd);
    *slot = rd = calloc(1, sizeof *rd + sizeof(ring) * (size_t)n);
    if (!rd) return NULL;
    rd->depth = depth;
    for (; rd->n < n; rd->n++) {
        if (ring_open(&rd->r[rd->n], (unsigned)depth) != 0) {
            rd->broken = 1;
            break;
        }
    }
    return rd;
}

typedef struct {
    hg_rows_io *io;
    hg_readers *rd;
    int depth;
} run_args;

static void rows_task(void *v, int part, int parts) {
    run_args *a = v;
    int64_t b, e;
    hg_split((int64_t)a->io->nreq, 1, part, parts, &b, &e);
    long long reads = 0, bytes = 0;
    for (int64_t i = b; i < e; i++)
        if (a->io->reqs[i].seg >= 0) reads++, bytes += (long long)a->io->reqs[i].len;
    atomic_fetch_add(&a->io->reads, reads);
    atomic_fetch_add(&a->io->bytes, bytes);
    if (a->rd && !a->rd->broken) {
        if (ring_reads(&a->rd->r[part], a->io, (size_t)b, (size_t)e, (unsigned)a->depth) != 0) a->rd->broken = 1;
    } else {
        sync_reads(a->io, (size_t)b, (size_t)e);
    }
}

int hg_rows_run(hg_rows_io *io, hg_pool *pool, hg_readers **readers, int depth) {
    if (io->nreq == 0) return 0;
    int parts = hg_pool_threads(pool);
    if ((size_t)parts > io->nreq) parts = (int)io->nreq;
    run_args a = {io, depth > 1 ? readers_for(readers, hg_pool_threads(pool), depth) : NULL, depth};
    hg_pool_run(pool, rows_task, &a, parts);
    io->nreq = 0;
    return atomic_load(&io->failed) ? 1 : 0;
}

void hg_rows_error(const hg_rows_io *io, char *buf, size_t cap) {
    if (!atomic_load(&io->failed)) {
        snprintf(buf, cap, "no read failed");
        return;
    }
    const hg_rreq *q = &io->bad;
    const hg_fseg *g = q->seg >= 0 ? &io->segs[q->seg] : NULL;
    char why[128];
    const char *reason = io->err ? strerror_r(io->err, why, sizeof why) : "the file ends before it";
    snprintf(buf, cap, "disk tier: reading %llu bytes at offset %llu of %s failed: %s", (unsigned long long)q->len,
             (unsigned long long)(g ? file_off(io, q) : 0), g ? g->path : "(memory)", reason);
}
