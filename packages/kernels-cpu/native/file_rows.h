/* Store rows that live in files of the disk tier, read with explicit reads instead of page faults.
 * TieredStore registers each file segment once (address range -> file); a stage job looks up the
 * segments under the rows it gathers, lists the row copies (rows adjacent in the source and the
 * destination become one read), and runs them on its pool: each part its share, with up to `depth`
 * reads in flight (io_uring where the kernel allows it, else pread one at a time). */
#ifndef HG_FILE_ROWS_H
#define HG_FILE_ROWS_H
#include "pool.h"
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define HG_ROWS_MAX_SEGS 64

typedef struct {
    uintptr_t addr, end; /* [addr, end) of the store's address space */
    uint64_t off;        /* file offset of addr */
    int fd;
    const char *path;    /* for error messages */
    void *entry;         /* the registry's entry (held until release) */
} hg_fseg;

typedef struct {
    char *dst;
    uintptr_t src;
    uint64_t len;
    int seg; /* index in segs, or -1: memory (memcpy) */
} hg_rreq;

typedef struct hg_readers hg_readers; /* a stage's io_uring rings, one per pool part */

typedef struct {
    hg_fseg segs[HG_ROWS_MAX_SEGS];
    int nseg, last;
    hg_rreq *reqs;
    size_t nreq, cap;
    atomic_int failed;
    int err;          /* errno of the failed read; 0 with failed: the file ended early */
    hg_rreq bad;      /* the request that failed */
    atomic_llong reads, bytes; /* file reads issued and their bytes (the last job's) */
} hg_rows_io;

/* Empties the queue and the last job's failure and counters. */
void hg_rows_begin(hg_rows_io *io);
/* Adds the registered file segments overlapping [addr, addr + bytes) (each held until hg_rows_release). */
void hg_rows_acquire(hg_rows_io *io, uintptr_t addr, uint64_t bytes);
void hg_rows_release(hg_rows_io *io);
/* Queues a copy of [src, src + len) to dst, split at segment edges and merged with the previous copy
 * when both continue it. 0, or -1 out of memory. */
int hg_rows_add(hg_rows_io *io, char *dst, uintptr_t src, uint64_t len);
/* Runs the queued copies on the pool (parts = pool threads), depth reads in flight per part.
 * 0, or 1 when a read failed (hg_rows_error says which file). The queue is emptied. */
int hg_rows_run(hg_rows_io *io, hg_pool *pool, hg_readers **readers, int depth);
/* "disk tier: reading N bytes at offset X of PATH failed: REASON" for the last failure. */
void hg_rows_error(const hg_rows_io *io, char *buf, size_t cap);
void hg_readers_destroy(hg_readers *r);

#endif
