/* The hybrid CPU stage (paper §4.2): on threads of its own, score a query against a layer's
 * offloaded K, pick top-K per KV head, and stage the selected logits and V rows for the device.
 * JS submits jobs (a queue of up to HG_STAGE_QUEUE, run in order) and returns at once;
 * hg_stage_wait blocks until every submitted job is done. */
#ifndef HG_CPU_STAGE_H
#define HG_CPU_STAGE_H
#include <stdint.h>
#include "hgcpu.h"

enum {
    HG_STAGE_SCORE = 1,    /* all_logits[h, j] for j < n */
    HG_STAGE_TOPK = 2,     /* scores (as SCORE), then ids/counts: per KV head max over the group (or shared) */
    HG_STAGE_SELECTED = 4, /* sel_logits from K rows of ids only (pre-QKᵀ) */
    HG_STAGE_GATHER = 8,   /* sel_logits from all_logits at ids, and V rows -> vstage */
    HG_STAGE_SHARED = 16,  /* with TOPK: one list for every KV head (max over all heads) */
    HG_STAGE_KEYS = 32,    /* with SELECTED or GATHER: the K rows of ids -> kstage too (verified logits) */
    HG_STAGE_QUEST = 64,   /* with SELECTED: ids/counts first from Quest's page bounds (sel_quest.h) */
    HG_STAGE_NO_ROWS = 128, /* with SELECTED or GATHER: the device reads the rows itself; vstage/kstage untouched */
    HG_STAGE_DONE_IF_FAILED = 256, /* raise done only when the job fails (its outputs come from a later job) */
    HG_STAGE_STREAM = 512, /* with SELECTED: ids/counts first from StreamingLLM's sinks plus the newest slots */
    HG_STAGE_INDEX = 1024, /* with SELECTED: ids/counts first from the page index (sel_index.h) */
    HG_STAGE_CHOSEN = 2048, /* with INDEX: a device chose the best pages (int32 [kv_heads, want] after q's heads·head_dim
                             * floats, sel_index.h's want); the stage neither folds nor searches its own index */
};

/* Jobs submitted and not yet ended that the stage holds, a lane. */
#define HG_STAGE_QUEUE 64
/* The most lanes a stage has: the sequences of a batch that share it. */
#define HG_STAGE_LANES 64

/* Every field is 8 bytes so JS fills it through one BigInt64Array / Float64Array pair. */
typedef struct {
    int64_t flags;
    int64_t q;          /* const float [heads * head_dim] */
    int64_t k, ktype, kcap;  /* [kv_heads, kcap, head_dim] */
    int64_t v, vtype, vcap;
    int64_t n;          /* offloaded tokens: valid slots [0, n) */
    int64_t heads, kv_heads, head_dim;
    int64_t all_logits, lstride;  /* float [heads, lstride] */
    int64_t ids, counts;          /* int32 [kv_heads, kmax], int32 [kv_heads] */
    int64_t kmax, budget;
    int64_t sel_logits;           /* float [heads, kmax] */
    int64_t vstage;               /* vtype [kv_heads, kmax, head_dim] */
    int64_t kstage;               /* ktype [kv_heads, kmax, head_dim], with HG_STAGE_KEYS */
    double scale;
    /* Two-step top-K (TOPK with kq_form HG_KQ_INT8/INT4, kq.h): rows [kq_from, n) of the compressed
     * copy kq [kv_heads, kcap, row bytes] are encoded from K first; the approximate scores choose
     * `cand` candidates per list, rescored from K; the final top-K is taken among them. */
    int64_t kq, kq_form, kq_from, cand;
    /* Quest (QUEST): page summaries, min [kv_heads, page_cap, head_dim] bf16 bits (rounded down) then max (rounded up) of the same
     * shape, of pages of page_size rows; rows [pages_from, n) are folded in first; budget ids a list. */
    int64_t pages, page_size, page_cap, pages_from;
    /* When ready is not 0: the query is still on its way from a device, which writes a value of
     * ready_value or later (mod 2^32) into the uint32 at ready once it has landed; the job waits. */
    int64_t ready, ready_value;
    /* When done is not 0: once the job ended (success, failure or cancellation), after its outputs,
     * (uint32)done_value is stored into the uint32 at done, for a device that polls it. */
    int64_t done, done_value;
    /* StreamingLLM (STREAM): every KV head's list is [0, s) then [n - (k - s), n), k = min(budget, n),
     * s = min(sinks, k), written when the job runs (a queued job's slot may still be read before). */
    int64_t sinks;
    /* Page index (INDEX): pages/page_size/page_cap/pages_from as Quest's, pages holding the index's
     * bytes (sel_index.h's layout) of form index_form (1 int8, 2 int4) with super_pages pages a super-page. */
    int64_t index_form, super_pages;
    /* The job's lane, [0, lanes): one a sequence sharing the stage; its jobs run in order, its wait waits for them. */
    int64_t lane;
} hg_stage_job;

/* KV head g's rows of the job's K [kv_heads, kcap, head_dim] (the stage and its Quest kernel). */
static inline const char *hg_stage_k_head(const hg_stage_job *j, int64_t g) {
    return (const char *)(intptr_t)j->k + g * j->kcap * j->head_dim * (j->ktype == HG_F32 ? 4 : 2);
}

typedef struct hg_stage hg_stage;

#pragma GCC visibility push(default)
/* threads: 1 coordinator + threads-1 helpers; isa < 0 picks the best. NULL on failure. One lane. */
hg_stage *hg_stage_create(int threads, int isa);
/* A stage that `lanes` sequences share (1..HG_STAGE_LANES): each submits its jobs with its lane, waits
 * for and cancels them by it; a group of jobs of different lanes (hg_stage_submit_group) runs as one op
 * over the pool, a job a thread. */
hg_stage *hg_stage_create_lanes(int threads, int isa, int lanes);
int hg_stage_lanes(const hg_stage *s);
/* Groups of two jobs or more so far: out[0] run at once (a job a thread), out[1] one after another on the whole pool. */
void hg_stage_group_counts(const hg_stage *s, int64_t *out);
void hg_stage_destroy(hg_stage *s);
int hg_stage_threads(const hg_stage *s);
/* Copies the job into the queue; the coordinator runs queued jobs in order. Returns 0, or -1
 * when HG_STAGE_QUEUE jobs have not ended yet. After a failed job (or hg_stage_cancel), the
 * jobs up to the next wait are skipped: they fail with the same error and still raise done. */
int hg_stage_submit(hg_stage *s, const hg_stage_job *job);
/* n jobs as one group (0, or -1 when the queue or a lane's share of it is full, -2 for a lane out of
 * range): with helper threads and distinct lanes they run at once, each on one thread of the pool,
 * and each raises its done as it ends; otherwise one after another. */
int hg_stage_submit_group(hg_stage *s, const hg_stage_job *jobs, int n);
/* The queue's capacity (HG_STAGE_QUEUE). */
int hg_stage_queue_depth(const hg_stage *s);
/* Runs the job on the calling thread (same checks and results as submit + wait); -1 unless
 * every submitted job (on a stage of several lanes: of the job's lane) has ended. */
int64_t hg_stage_run(hg_stage *s, const hg_stage_job *job);
/* Waits for every job submitted since the last wait. Returns the first failure: 0 on success, -1 if
 * none was submitted, -2 when scratch memory failed, -(3 + i) when a selected id at index i is out
 * of range or not ascending, 1 when a read of disk-tier rows failed, the ready signal never came or
 * the jobs were cancelled (hg_stage_error says which). */
int64_t hg_stage_wait(hg_stage *s);
/* hg_stage_wait for one lane's jobs (hg_stage_wait is lane 0's). */
int64_t hg_stage_wait_lane(hg_stage *s, int lane);
/* Jobs since the last wait that have not started fail ("cpu stage: cancelled"; each still raises its
 * done), a job waiting for its ready signal stops; a job past that runs to its end. With jobs
 * submitted since the last wait, that wait returns a failure (the first one, else the cancellation). */
void hg_stage_cancel(hg_stage *s);
/* hg_stage_cancel for one lane's jobs (hg_stage_cancel is lane 0's). */
void hg_stage_cancel_lane(hg_stage *s, int lane);
/* The failure of the last wait (or run) as one line (NUL-terminated, at most cap bytes). */
void hg_stage_error(const hg_stage *s, char *buf, int64_t cap);
/* Rows in registered disk-tier files (file_rows.h) are read with explicit reads, `depth` in flight
 * per pool thread (io_uring; 1: pread); 0 reads them through the mapping (page faults). Default 8. */
void hg_stage_set_read_depth(hg_stage *s, int depth);
/* "Last" below: the jobs of the last wait, summed (or the job of the last run). */
/* Their disk-tier reads: out[0] reads issued (adjacent rows are one), out[1] their bytes. */
void hg_stage_last_reads(const hg_stage *s, int64_t *out);
/* Nanoseconds they ran (each from its start on the stage's thread, after its ready signal, to its end). */
int64_t hg_stage_last_ns(const hg_stage *s);
/* Their phases in ns: out[0] query pack, [1] scoring (a top-K job's includes each token's group max,
 * taken from the logits as they are written), [2] top-K (the
 * selection over the group-max rows) or Quest's pages,
 * [3] selected logits and V gather, [4] each job's later of (submit, the previous job's end) -> its
 * start on the stage thread (0 for run), [5] from the later of (last job's end, the wait call) to
 * wait's return (0 for run). */
void hg_stage_last_split(const hg_stage *s, double *out);
/* How long the idle stage thread spins for the next job, and hg_stage_wait for the jobs'
 * end, before sleeping (default 0: sleep at once). */
void hg_stage_set_idle_spin(hg_stage *s, int64_t ns);
/* How long a job waits for its ready signal before it fails (default 10 s). */
void hg_stage_set_ready_timeout(hg_stage *s, int64_t ns);
/* The job's layout, for JS to check its own declaration against at load: sizeof(hg_stage_job), a
 * field's byte offset by its name here, a flag's value by its name less HG_STAGE_ (-1: no such name). */
int64_t hg_stage_job_size(void);
int64_t hg_stage_job_offset(const char *name);
int64_t hg_stage_job_flag(const char *name);
#pragma GCC visibility pop
#endif
