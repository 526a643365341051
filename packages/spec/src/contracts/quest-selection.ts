/**
 * Quest's page choice (pre-QKᵀ), the one definition behind the quest selector's select() and a
 * CpuStage's "quest" work: per page of `pageSize` offloaded tokens and KV head, the per-channel
 * min and max of K (kept as pages fill, never recomputed; bf16 rounded outward, min toward −∞ and
 * max toward +∞, so the bounds read half f32's bytes and still hold); a page's upper bound of q·k is
 * Σ_c max(q_c·min_c, q_c·max_c), max over the group's query heads. Per KV head the pages with
 * the highest bounds (ties to the lower page) give their tokens, whole, while they fit K; the
 * page that does not fit gives its best tokens by exact q·k (ties to the lower slot, at most
 * pageSize rows read), so every list holds exactly K ids.
 */
import { pageSummaries } from "./selector-primitives.js";
import type { OffloadedKeys, PageSummaries, Selection, SelectorPrimitives } from "./selector.js";

/** Page summaries of one layer's store and how far they reach. */
export interface QuestPageState {
  pages: PageSummaries | null;
  /** Offloaded rows folded into the summaries so far. */
  summarized: number;
}

/**
 * The summaries of rows [0, n) of `keys`: the rows added since the last call are folded in; they
 * are made afresh when they do not cover the store or n shrank (a new sequence).
 */
export function questPages(P: SelectorPrimitives, state: QuestPageState, keys: OffloadedKeys, n: number, pageSize: number): PageSummaries {
  const old = state.pages;
  if (!old || old.pageSize !== pageSize || old.pageCapacity * pageSize < keys.capacity || n < state.summarized) {
    state.pages = pageSummaries(keys.kvHeads, keys.headDim, keys.capacity, pageSize);
    state.summarized = 0;
  }
  const pages = state.pages!;
  P.summarizePages(keys, state.summarized, n, pages);
  state.summarized = n;
  return pages;
}

/**
 * K ids per KV head (ascending) of rows [0, n) from their summaries `pages`; query is
 * [kvHeads · groupSize, headDim] (unscaled scores: the scale does not change the order). `bounds`
 * is scratch of at least kvHeads · ⌈n / pageSize⌉ values (made when absent).
 */
export function questSelection(P: SelectorPrimitives, query: Float32Array, groupSize: number, keys: OffloadedKeys, pages: PageSummaries,
  n: number, k: number, bounds?: Float32Array): Selection {
  if (k === 0) return { kind: "shared", ids: new Int32Array(0) };
  const pageSize = pages.pageSize, count = Math.ceil(n / pageSize), G = groupSize, d = keys.headDim;
  const all = P.pageBounds(query, G, pages, count, bounds);
  // Only the trailing page can be short, so one page past ⌈K/page⌉ always covers K tokens.
  const want = Math.min(count, Math.ceil(k / pageSize) + 1);
  const ids: Int32Array[] = [];
  for (let g = 0; g < keys.kvHeads; g++) {
    const row = all.subarray(g * count, (g + 1) * count);
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
    ids.push(list.sort());
  }
  return { kind: "perKvHead", ids };
}

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
