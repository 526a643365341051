#include "pool.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sched.h>

/* Pause iterations (roughly 0.5 ms) a worker spins before sleeping: back-to-back ops of a
 * decode step never pay a wake-up, and an idle pool costs no CPU. */
#define HG_SPIN 20000
/* The ticket packs the op's generation (high 32 bits) and the next unclaimed piece. A closed
 * op has next = CLOSED, so no stale worker can claim from it once the caller moves on. */
#define CLOSED 0xffffffffu

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void cpu_relax(void) { _mm_pause(); }
#else
static inline void cpu_relax(void) { }
#endif

struct hg_pool {
    int n;
    pthread_t *tids;
    _Atomic(hg_task_fn) fn;
    _Atomic(void *) arg;
    atomic_int parts;
    _Alignas(64) _Atomic uint64_t ticket;
    _Alignas(64) atomic_int done;       /* pieces finished in the current op */
    _Alignas(64) atomic_int sleepers;
    atomic_int stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static inline uint32_t gen_of(uint64_t t) { return (uint32_t)(t >> 32); }

/* Claims and runs pieces of generation g until none is left. */
static void work(hg_pool *p, uint32_t g) {
    hg_task_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
    void *arg = atomic_load_explicit(&p->arg, memory_order_relaxed);
    int parts = atomic_load_explicit(&p->parts, memory_order_relaxed);
    uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
    for (;;) {
        uint32_t next = (uint32_t)t;
        if (gen_of(t) != g || next >= (uint32_t)parts) return; /* also covers CLOSED */
        if (!atomic_compare_exchange_weak_explicit(&p->ticket, &t, t + 1, memory_order_acq_rel, memory_order_acquire))
            continue;
        /* fn/arg/parts were read before a successful claim of generation g, and the caller
         * only rewrites them after every piece of g is done: they belong to g. */
        fn(arg, (int)next, parts);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        t = atomic_load_explicit(&p->ticket, memory_order_acquire);
    }
}

static void *worker(void *v) {
    hg_pool *p = v;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = gen_of(atomic_load_explicit(&p->ticket, memory_order_acquire))) == seen) {
            if (++spins < HG_SPIN) { cpu_relax(); continue; }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((g = gen_of(atomic_load(&p->ticket))) == seen) pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            break;
        }
        seen = g;
        if (atomic_load(&p->stop)) return NULL;
        work(p, g);
    }
}

hg_pool *hg_pool_create(int threads) {
    if (threads < 1) threads = 1;
    hg_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = threads;
    p->tids = calloc((size_t)threads, sizeof *p->tids);
    if (!p->tids) { free(p); return NULL; }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_store(&p->ticket, (uint64_t)CLOSED);
    for (int i = 1; i < threads; i++)
        if (pthread_create(&p->tids[i], NULL, worker, p) != 0) { p->n = i; break; }
    return p;
}

/* Publishes generation g+1 with `next` = first; wakes sleepers. */
static uint32_t publish(hg_pool *p, uint32_t first) {
    uint32_t g = gen_of(atomic_load(&p->ticket)) + 1;
    atomic_store(&p->ticket, ((uint64_t)g << 32) | first); /* seq_cst: pairs with the sleepers check */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    return g;
}

void hg_pool_run(hg_pool *p, hg_task_fn fn, void *arg, int parts) {
    if (parts <= 0) return;
    if (p->n == 1 || parts == 1) {
        for (int i = 0; i < parts; i++) fn(arg, i, parts);
        return;
    }
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->arg, arg, memory_order_relaxed);
    atomic_store_explicit(&p->parts, parts, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    uint32_t g = publish(p, 0);
    work(p, g);
    unsigned spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) < parts)
        if (++spins > 2000) sched_yield(); else cpu_relax(); /* a claimed piece is still running */
    atomic_store(&p->ticket, ((uint64_t)g << 32) | CLOSED);
}

void hg_pool_destroy(hg_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    if (p->n > 1) publish(p, CLOSED);
    for (int i = 1; i < p->n; i++) pthread_join(p->tids[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->tids);
    free(p);
}

int hg_pool_threads(const hg_pool *p) { return p->n; }
