/* Where the offloaded KV store's memory lives: NUMA binding of anonymous regions (mbind,
 * checked with get_mempolicy and move_pages), file-backed regions for the disk tier (a
 * preallocated file mapped shared, so a full disk fails at creation and not as SIGBUS on a
 * later write), read-ahead of file ranges, and the disk tier's probes (bandwidth, read latency).
 * Raw syscalls: libnuma is not needed, and its absence must not stop the library loading. */
#define _GNU_SOURCE
#include "file_rows.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

static long page_bytes(void) {
  long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? p : 4096;
}

/* Anonymous, page-aligned, untouched memory (pages fault in under whatever policy is bound). */
EXPORT void *hg_tier_map_anon(uint64_t bytes) {
  if (bytes == 0) return NULL;
  void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
  madvise(p, (size_t)bytes, MADV_HUGEPAGE);
#endif
  return p;
}

EXPORT int hg_tier_unmap(void *p, uint64_t bytes) {
  return munmap(p, (size_t)bytes) == 0 ? 0 : -errno;
}

/* mbind(addr, bytes, mode, mask of `words` 64-bit words, flags): 0 or −errno. */
EXPORT int hg_tier_mbind(void *p, uint64_t bytes, int mode, const uint64_t *mask, int words, int flags) {
  long r = syscall(SYS_mbind, p, (unsigned long)bytes, mode, mask, (unsigned long)words * 64 + 1, (unsigned)flags);
  return r == 0 ? 0 : -errno;
}

/* The policy bound at `p` (get_mempolicy with MPOL_F_ADDR): mode, or −errno; mask written. */
EXPORT int hg_tier_policy(void *p, uint64_t *mask, int words) {
  int mode = -1;
  memset(mask, 0, (size_t)words * 8);
  long r = syscall(SYS_get_mempolicy, &mode, mask, (unsigned long)words * 64, p, 2 /* MPOL_F_ADDR */);
  return r == 0 ? mode : -errno;
}

/* The node of `count` pages sampled evenly over [p, p + bytes) (move_pages without moving):
 * out[i] = node, or −errno for a page not faulted in yet (−ENOENT). Returns 0 or −errno. */
EXPORT int hg_tier_page_nodes(void *p, uint64_t bytes, int count, int32_t *out) {
  if (count <= 0) return 0;
  void **pages = malloc(sizeof(void *) * (size_t)count);
  int *status = malloc(sizeof(int) * (size_t)count);
  if (!pages || !status) {
    free(pages);
    free(status);
    return -ENOMEM;
  }
  const uint64_t ps = (uint64_t)page_bytes(), npages = (bytes + ps - 1) / ps;
  for (int i = 0; i < count; i++) {
    uint64_t page = count == 1 ? 0 : (npages - 1) * (uint64_t)i / (uint64_t)(count - 1);
    pages[i] = (char *)p + page * ps;
  }
  long r = syscall(SYS_move_pages, 0, (unsigned long)count, pages, NULL, status, 0);
  int rc = r < 0 ? -errno : 0;
  for (int i = 0; i < count; i++) out[i] = rc ? rc : status[i];
  free(pages);
  free(status);
  return rc;
}

/* Writes one byte per page (pages fault in where the policy says). */
EXPORT void hg_tier_touch(void *p, uint64_t bytes) {
  const uint64_t ps = (uint64_t)page_bytes();
  volatile char *c = p;
  for (uint64_t o = 0; o < bytes; o += ps) c[o] = c[o];
}

/* A new file of `bytes` at `path` (must not exist), space reserved up front, mapped shared at
 * `at` (MAP_FIXED over memory the caller owns) or anywhere when `at` is NULL. `fail_errno` > 0
 * makes the reservation fail with that errno (tests inject ENOSPC). Returns the address, or
 * NULL with *err = errno; the file is removed on any failure. *fd_out keeps the descriptor. */
EXPORT void *hg_tier_map_file(const char *path, uint64_t bytes, void *at, int fail_errno, int *fd_out, int *err) {
  *err = 0;
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    *err = errno;
    return NULL;
  }
  int rc = fail_errno > 0 ? fail_errno : posix_fallocate(fd, 0, (off_t)bytes);
  if (rc == EOPNOTSUPP || rc == EINVAL) rc = ftruncate(fd, (off_t)bytes) == 0 ? 0 : errno; /* no fallocate on this file system */
  void *p = MAP_FAILED;
  if (rc == 0) {
    p = mmap(at, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED | (at ? MAP_FIXED : 0), fd, 0);
    if (p == MAP_FAILED) rc = errno;
  }
  if (rc != 0) {
    close(fd);
    unlink(path);
    *err = rc;
    return NULL;
  }
  *fd_out = fd;
  return p;
}

EXPORT int hg_tier_close_fd(int fd) {
  return close(fd) == 0 ? 0 : -errno;
}

/* Starts reading [offset, offset + bytes) of a mapped file into the page cache (the read-ahead
 * of the next layer's rows): madvise(WILLNEED) on the mapping. 0 or −errno. */
EXPORT int hg_tier_prefetch(void *p, uint64_t bytes) {
  const uintptr_t ps = (uintptr_t)page_bytes(), a = (uintptr_t)p & ~(ps - 1);
  return madvise((void *)a, (size_t)((uintptr_t)p + bytes - a), MADV_WILLNEED) == 0 ? 0 : -errno;
}

/* Read-ahead off the caller's thread. madvise(WILLNEED) on a file mapping submits the reads
 * before it returns (tens of µs a run on a cold file), and a decode step's driving thread would
 * wait for thousands of them a layer; so hg_tier_prefetch_runs copies the runs into a queue and one
 * background thread advises them. It is a hint: runs that do not fit the queue are dropped, and
 * hg_tier_prefetch_wait (before a mapping is unmapped) waits for the queue to empty. */
#define PF_CAP 65536
static pthread_mutex_t pf_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pf_work = PTHREAD_COND_INITIALIZER, pf_idle = PTHREAD_COND_INITIALIZER;
static uintptr_t pf_addr[PF_CAP];
static uint64_t pf_len[PF_CAP];
static int pf_head, pf_count, pf_busy, pf_started;

static void *pf_thread(void *unused) {
  (void)unused;
  pthread_mutex_lock(&pf_mu);
  for (;;) {
    while (pf_count == 0) {
      pf_busy = 0;
      pthread_cond_broadcast(&pf_idle);
      pthread_cond_wait(&pf_work, &pf_mu);
    }
    pf_busy = 1;
    const uintptr_t a = pf_addr[pf_head];
    const uint64_t n = pf_len[pf_head];
    pf_head = (pf_head + 1) % PF_CAP;
    pf_count--;
    pthread_mutex_unlock(&pf_mu);
    hg_tier_prefetch((void *)a, n);
    pthread_mutex_lock(&pf_mu);
  }
  return NULL;
}

/* A forked child has no background thread: it starts its own on first use, with an empty queue. */
static void pf_after_fork_child(void) {
  pthread_mutex_init(&pf_mu, NULL);
  pthread_cond_init(&pf_work, NULL);
  pthread_cond_init(&pf_idle, NULL);
  pf_head = pf_count = pf_busy = pf_started = 0;
}

/* Queues n runs (pairs of doubles: address, bytes) for the background thread; returns how many were
 * dropped because the queue was full, or −errno when the thread could not start. */
EXPORT int hg_tier_prefetch_runs(const double *runs, int n) {
  pthread_mutex_lock(&pf_mu);
  if (!pf_started) {
    static int registered;
    if (!registered) registered = pthread_atfork(NULL, NULL, pf_after_fork_child) == 0;
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    const int rc = pthread_create(&t, &at, pf_thread, NULL);
    pthread_attr_destroy(&at);
    if (rc != 0) {
      pthread_mutex_unlock(&pf_mu);
      return -rc;
    }
    pf_started = 1;
  }
  int dropped = 0;
  for (int i = 0; i < n; i++) {
    if (pf_count == PF_CAP) { dropped = n - i; break; }
    const int at = (pf_head + pf_count) % PF_CAP;
    pf_addr[at] = (uintptr_t)runs[2 * i];
    pf_len[at] = (uint64_t)runs[2 * i + 1];
    pf_count++;
  }
  pf_busy = pf_busy || pf_count > 0;
  pthread_cond_signal(&pf_work);
  pthread_mutex_unlock(&pf_mu);
  return dropped;
}

/* Waits until every queued run has been advised (the mappings they name may then be unmapped). */
EXPORT void hg_tier_prefetch_wait(void) {
  pthread_mutex_lock(&pf_mu);
  while (pf_started && (pf_count > 0 || pf_busy)) pthread_cond_wait(&pf_idle, &pf_mu);
  pthread_mutex_unlock(&pf_mu);
}

/* Drops [p, p + bytes) of a file mapping from the page cache (benches: cold reads): written back
 * (msync), unmapped from this process (madvise DONTNEED keeps the file's data), then evicted
 * (fadvise DONTNEED on `fd` from file offset `off`). 0 or −errno. */
EXPORT int hg_tier_drop_cache(void *p, uint64_t bytes, int fd, uint64_t off) {
  if (msync(p, (size_t)bytes, MS_SYNC) != 0 || madvise(p, (size_t)bytes, MADV_DONTNEED) != 0) return -errno;
  int rc = posix_fadvise(fd, (off_t)off, (off_t)bytes, POSIX_FADV_DONTNEED);
  return rc == 0 ? 0 : -rc;
}

/* Pages of [p, p + bytes) (page-aligned) in memory (mincore: for a file mapping, in the page cache),
 * or −errno. */
EXPORT int64_t hg_tier_resident(void *p, uint64_t bytes) {
  const uint64_t ps = (uint64_t)page_bytes(), n = (bytes + ps - 1) / ps;
  unsigned char *vec = malloc((size_t)n);
  if (!vec) return -ENOMEM;
  int64_t got = 0;
  if (mincore(p, (size_t)bytes, vec) != 0) got = -errno;
  else
    for (uint64_t i = 0; i < n; i++) got += vec[i] & 1;
  free(vec);
  return got;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Writes `bytes` to a new file at `path`, then reads it back with `block`-byte aligned reads,
 * O_DIRECT where the file system allows (else the page cache is dropped first with
 * fadvise(DONTNEED)): read bytes/s, or −errno. The file is removed. */
EXPORT double hg_tier_file_read_bw(const char *path, uint64_t bytes, uint64_t block) {
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return -errno;
  void *buf = NULL;
  double result;
  if (posix_memalign(&buf, 4096, (size_t)block) != 0) {
    result = -ENOMEM;
    goto out;
  }
  memset(buf, 0x5a, (size_t)block);
  for (uint64_t o = 0; o < bytes; o += block) {
    if (pwrite(fd, buf, (size_t)block, (off_t)o) != (ssize_t)block) {
      result = -(errno ? errno : EIO);
      goto out;
    }
  }
  fdatasync(fd);
  posix_fadvise(fd, 0, (off_t)bytes, POSIX_FADV_DONTNEED);
  int rfd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (rfd < 0) rfd = open(path, O_RDONLY | O_CLOEXEC);
  if (rfd < 0) {
    result = -errno;
    goto out;
  }
  double t0 = now_s();
  uint64_t got = 0;
  for (uint64_t o = 0; o < bytes; o += block) {
    ssize_t r = pread(rfd, buf, (size_t)block, (off_t)o);
    if (r <= 0) break;
    got += (uint64_t)r;
  }
  double dt = now_s() - t0;
  close(rfd);
  result = got == bytes && dt > 0 ? (double)bytes / dt : -EIO;
out:
  free(buf);
  close(fd);
  unlink(path);
  return result;
}

/* Random 4 KiB reads of a new `bytes` file at `path` (written, synced, dropped from the page cache),
 * as the CPU stage reads disk-tier rows (file_rows.c): for each config i, `reads` distinct random pages
 * on a pool of threads[i] with depths[i] reads in flight each (pread at 1, io_uring above). out_us[i]:
 * one read's latency in µs at that many in flight (elapsed × in flight / reads). 0 or −errno. */
EXPORT int hg_tier_file_read_latency(const char *path, uint64_t bytes, int reads, const int32_t *threads, const int32_t *depths, int n, double *out_us) {
  const uint64_t pages = bytes / 4096;
  if (reads < 1 || pages < 2 * (uint64_t)reads) return -EINVAL;
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600), rc = 0;
  if (fd < 0) return -errno;
  char *buf = NULL, *dst = NULL;
  uint8_t *taken = calloc((size_t)pages, 1);
  hg_rows_io *io = calloc(1, sizeof *io);
  if (posix_memalign((void **)&buf, 4096, 1 << 20) || posix_memalign((void **)&dst, 4096, (size_t)reads * 8192) || !taken || !io) {
    rc = -ENOMEM;
    goto out;
  }
  memset(buf, 0x5a, 1 << 20);
  for (uint64_t o = 0; o < bytes; o += 1 << 20) {
    size_t len = bytes - o < (1 << 20) ? (size_t)(bytes - o) : (size_t)1 << 20;
    if (pwrite(fd, buf, len, (off_t)o) != (ssize_t)len) {
      rc = -(errno ? errno : EIO);
      goto out;
    }
  }
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  uint64_t seed = 88172645463325252ull;
  for (int c = 0; c < n && !rc; c++) {
    posix_fadvise(fd, 0, (off_t)bytes, POSIX_FADV_DONTNEED); /* cold: the disk, not the page cache */
    hg_rows_begin(io);
    io->segs[0] = (hg_fseg){4096, 4096 + bytes, 0, fd, path, NULL}; /* a stand-in address range for the file */
    io->nseg = 1;
    for (int i = 0; i < reads; i++) { /* distinct pages, ascending as a stage's rows are; dst apart so none merge */
      uint64_t pg;
      do {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        pg = seed % pages;
      } while (taken[pg] == c + 1);
      taken[pg] = (uint8_t)(c + 1);
    }
    for (uint64_t pg = 0, i = 0; pg < pages; pg++)
      if (taken[pg] == c + 1 && hg_rows_add(io, dst + (i++) * 8192, 4096 + pg * 4096, 4096)) rc = -ENOMEM;
    hg_pool *pool = rc ? NULL : hg_pool_create(threads[c]);
    hg_readers *rd = NULL;
    if (!rc && !pool) rc = -ENOMEM;
    if (!rc) {
      double t0 = now_s();
      if (hg_rows_run(io, pool, &rd, depths[c])) rc = -(io->err ? io->err : EIO);
      out_us[c] = (now_s() - t0) * 1e6 * (double)threads[c] * (depths[c] > 1 ? depths[c] : 1) / reads;
    }
    hg_readers_destroy(rd);
    hg_pool_destroy(pool);
    io->nseg = 0; /* the stand-in segment is not the registry's */
  }
out:
  if (io) free(io->reqs);
  free(io);
  free(taken);
  free(buf);
  free(dst);
  close(fd);
  unlink(path);
  return rc;
}
