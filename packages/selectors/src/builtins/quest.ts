/**
 * Quest-style page selection, pre-QKᵀ: per page of `pageSize` offloaded tokens and KV head, the
 * per-channel min and max of K (kept as pages fill, never recomputed); a page's upper bound of
 * q·k is Σ_c max(q_c·min_c, q_c·max_c), max over the group's query heads. Per KV head the pages
 * with the highest bounds give their tokens, whole, while they fit K; the page that
 * does not fit gives its best tokens by exact q·k (at most pageSize rows read), so every list
 * holds exactly K ids.
 */
import { pageSummaries, type OffloadedKeys, type PageSummaries } from "@hybridgen/core";
import { z } from "zod";
import { defineSelector } from "../define-selector.js";
import { BUILTIN } from "../builtin-mark.js";
import { layerKeys } from "./layer-keys.js";
import { newScratch, scratchView, type Scratch } from "./scratch.js";

export const QuestOptionsSchema = z.object({
  /** Offloaded tokens per page (Quest uses 16). */
  pageSize: z.number().int().min(1).max(4096).default(16),
}).strict();

export interface QuestState {
  pages: PageSummaries | null;
  /** Offloaded rows folded into the summaries so far. */
  summarized: number;
  bounds: Scratch;
}

export const quest = defineSelector<z.output<typeof QuestOptionsSchema>, QuestState>({
  name: "quest",
  description: "pre-QKᵀ pages (Quest): per-page min/max of K bound q·k; the best pages' tokens, K per KV head",
  timings: ["pre"],
  needsKeys: true,
  options: QuestOptionsSchema,
  initState: () => ({ pages: null, summarized: 0, bounds: newScratch() }),
  select(input, { pageSize }) {
    const { offloaded: n, k, layout, primitives: P, state, query } = input;
    const keys = layerKeys(input);
    if (!state.pages || state.pages.pageCapacity * pageSize < keys.capacity || n < state.summarized) {
      state.pages = pageSummaries(layout.kvHeads, layout.headDim, keys.capacity, pageSize);
      state.summarized = 0;
    }
    const pages = state.pages;
    P.summarizePages(keys, state.summarized, n, pages);
    state.summarized = n;
    if (k === 0) return { kind: "shared", ids: new Int32Array(0) };
    const count = Math.ceil(n / pageSize), G = layout.groupSize, d = layout.headDim;
    const bounds = P.pageBounds(query, G, pages, count, scratchView(state.bounds, layout.kvHeads * count));
    // Only the trailing page can be short, so one page past ⌈K/page⌉ always covers K tokens.
    const want = Math.min(count, Math.ceil(k / pageSize) + 1);
    const ids: Int32Array[] = [];
    for (let g = 0; g < layout.kvHeads; g++) {
      const row = bounds.subarray(g * count, (g + 1) * count);
      const best = byBoundDesc(P.topK(row, want, count), row);
      const list = new Int32Array(k);
      let taken = 0;
      for (const p of best) {
        const from = p * pageSize, to = Math.min(n, from + pageSize), left = k - taken;
        if (to - from <= left) {
          for (let s = from; s < to; s++) list[taken++] = s;
        } else {
          // The page that does not fit: its best `left` tokens by exact q·k of this KV head.
          const exact = P.keyScores(query.subarray(g * G * d, (g + 1) * G * d), G, headKeys(keys, g), from, to);
          for (const i of P.topK(exact, left)) list[taken++] = from + i;
        }
        if (taken === k) break;
      }
      ids.push(list);
    }
    return { kind: "perKvHead", ids };
  },
}, BUILTIN);

/** Pages by bound, highest first, ties by page index (in place: a few dozen pages, no comparator calls). */
function byBoundDesc(pages: Int32Array, bound: Float32Array): Int32Array {
  for (let i = 1; i < pages.length; i++) {
    const p = pages[i]!, b = bound[p]!;
    let j = i - 1;
    for (; j >= 0; j--) {
      const q = pages[j]!, c = bound[q]!;
      if (c > b || (c === b && q < p)) break;
      pages[j + 1] = q;
    }
    pages[j + 1] = p;
  }
  return pages;
}

/** KV head g's rows alone, as a one-head view (no copy). */
function headKeys(keys: OffloadedKeys, g: number): OffloadedKeys {
  const span = keys.capacity * keys.headDim;
  return { ...keys, kvHeads: 1, data: keys.data.subarray(g * span, (g + 1) * span) };
}
