/* Tensor memory: 64-byte aligned and zero-filled. Big blocks come straight from mmap,
 * whose pages are zero and only become resident when touched (KV caches are large), and
 * ask for transparent huge pages: a gather over a 1 GiB K cache otherwise misses the TLB
 * on nearly every row. */
#include "hgcpu.h"
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HG_MMAP_MIN (1u << 21)

void *hg_alloc(uint64_t bytes) {
    if (bytes == 0) bytes = 64;
    if (bytes >= HG_MMAP_MIN) {
        void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
        madvise(p, (size_t)bytes, MADV_HUGEPAGE); /* a hint: failure is harmless */
#endif
        return p;
    }
    size_t size = ((size_t)bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, size);
    if (p) memset(p, 0, size);
    return p;
}

void hg_free(void *p, uint64_t bytes) {
    if (!p) return;
    if (bytes == 0) bytes = 64;
    if (bytes >= HG_MMAP_MIN) munmap(p, (size_t)bytes);
    else free(p);
}
