/* Quest's page choice inside a CPU stage job (HG_STAGE_QUEST, cpu_stage.c). */
#ifndef HG_SEL_QUEST_H
#define HG_SEL_QUEST_H
#include <stddef.h>
#include "cpu_stage.h"
#include "pool.h"

/* Folds rows [pages_from, n) of the job's K into its page summaries, then writes `budget` ids per
 * KV head (ascending) into ids / counts, as core's questSelection does with the query q. isa: the
 * stage's, passed to sel_prims.c's loops (0 scalar, 1 AVX2, 2 AVX-512 page bounds). *buf / *bytes:
 * scratch the caller keeps between jobs. Returns 0, or -2 when scratch memory failed. */
/* List g of a page choice (Quest's and the page index's): the best `want` pages (best first, reordered
 * in place) give their slots whole while they fit k, the page that does not fit its best tokens by
 * exact q·k (exact / pos: page_size scratch each); ids ascending into j->ids, the count into
 * j->counts. Returns 0, or -1 when the top-K's scratch failed. */
int hg_pages_to_list(const hg_stage_job *j, int64_t g, int32_t *best, int64_t want, int64_t k, int64_t group, float *exact, int32_t *pos, int isa);

int64_t hg_quest_select(hg_pool *pool, const hg_stage_job *j, int isa, char **buf, size_t *bytes);
#endif
