#include "pool.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sched.h>

/* Spin this many pause iterations (roughly 100-300 us) before sleeping: back-to-back ops
 * of a decode step then never pay a wake-up, an idle pool costs no CPU. */
#define HG_SPIN 30000

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void cpu_relax(void) { _mm_pause(); }
#else
static inline void cpu_relax(void) { }
#endif

typedef struct { float *p; size_t bytes; char pad[48]; } scratch_t; /* one cache line each */

struct hg_pool {
    int n;
    pthread_t *tids;
    scratch_t *scratch;
    hg_task_fn fn;
    void *arg;
    _Alignas(64) atomic_uint gen;      /* bumped once per op */
    _Alignas(64) atomic_int pending;   /* workers still running the current op */
    _Alignas(64) atomic_int sleepers;
    atomic_int stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

typedef struct { hg_pool *p; int ith; } worker_arg;

static void *worker(void *v) {
    worker_arg wa = *(worker_arg *)v;
    free(v);
    hg_pool *p = wa.p;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (++spins < HG_SPIN) { cpu_relax(); continue; }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((g = atomic_load(&p->gen)) == seen) pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            break;
        }
        seen = g;
        if (atomic_load(&p->stop)) return NULL;
        p->fn(p->arg, wa.ith, p->n);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
}

hg_pool *hg_pool_create(int threads) {
    if (threads < 1) threads = 1;
    hg_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = threads;
    p->tids = calloc((size_t)threads, sizeof *p->tids);
    p->scratch = calloc((size_t)threads, sizeof *p->scratch);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    for (int i = 1; i < threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        wa->p = p;
        wa->ith = i;
        if (pthread_create(&p->tids[i], NULL, worker, wa) != 0) { free(wa); p->n = i; break; }
    }
    return p;
}

static void publish(hg_pool *p) {
    atomic_fetch_add(&p->gen, 1); /* seq_cst: pairs with the sleepers check in worker() */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

void hg_pool_run(hg_pool *p, hg_task_fn fn, void *arg) {
    if (p->n == 1) { fn(arg, 0, 1); return; }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    publish(p);
    fn(arg, 0, p->n);
    unsigned spins = 0;
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0)
        if (++spins > 100000) sched_yield(); else cpu_relax();
}

void hg_pool_destroy(hg_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    if (p->n > 1) publish(p);
    for (int i = 1; i < p->n; i++) pthread_join(p->tids[i], NULL);
    for (int i = 0; i < p->n; i++) free(p->scratch[i].p);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->scratch);
    free(p->tids);
    free(p);
}

int hg_pool_threads(const hg_pool *p) { return p->n; }

int hg_pool_reserve(hg_pool *p, size_t bytes) {
    size_t size = (bytes + 4095) & ~(size_t)4095;
    for (int i = 0; i < p->n; i++) {
        scratch_t *s = &p->scratch[i];
        if (s->bytes >= bytes) continue;
        free(s->p);
        s->p = aligned_alloc(64, size);
        s->bytes = s->p ? size : 0;
        if (!s->p) return 0;
    }
    return 1;
}

float *hg_pool_scratch(hg_pool *p, int ith) { return p->scratch[ith].p; }
