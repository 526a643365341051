/** Minimal selectors and a fixed scheduler for the hybrid tests (core cannot import the
 * selectors/scheduler packages, which depend on it). */
import { questPages, questSelection, validateSelection, type Backend, type QuestPageState, type ReferenceBackend, type Scheduler, type SelectionInput, type SelectionTiming, type SelectorKernel, type Tensor, type TokenSelector } from "@hybridgen/core";
import { type LogitsMode } from "../src/index.js";
import { withMethods } from "@hybridgen/core/testing";

/** How a hybrid test runs its model: KV window (`budget`), sinks, eviction block, prompt length,
 * and the selector/scheduler/logits mode (no selector: the plain model). */
export interface HybridRunOptions {
  budget?: number;
  sinks?: number;
  block?: number;
  prompt: number;
  selector?: TokenSelector;
  scheduler?: Scheduler;
  logits?: LogitsMode;
  candidates?: number;
  exactLayers?: number[];
}

function selector(name: string, timings: SelectionTiming[], usesBudget: boolean, kernel: SelectorKernel | undefined,
  pick: (input: SelectionInput) => unknown): TokenSelector {
  return {
    name, timings, needsScores: false, usesBudget, kernel,
    initState: () => undefined,
    select: (input) => validateSelection(pick(input), {
      offloaded: input.offloaded, kvHeads: input.layout.kvHeads, k: usesBudget ? input.k : undefined, source: name,
    }),
  };
}

/** Every offloaded token. `kernel` lets the stage run it natively. */
export const allSelector = (kernel: boolean) =>
  selector("all", ["pre", "post"], false, kernel ? "all" : undefined, (i) => ({ kind: "shared", ids: i.primitives.range(0, i.offloaded) }));

/** Exact top-K per KV head (max over the group); `kernel` runs it in the stage. */
export const topKSelector = (kernel: boolean) =>
  selector("topk", ["post"], true, kernel ? "topk" : undefined, (i) => {
    if (i.timing !== "post") throw new Error("post only");
    const { layout: L, offloaded: n, primitives: P } = i;
    const ids = [];
    for (let g = 0; g < L.kvHeads; g++) {
      const best = P.maxRows(i.logits.slice(g * L.groupSize, (g + 1) * L.groupSize), n);
      ids.push(P.topK(best, i.k, n));
    }
    return { kind: "perKvHead", ids };
  });

/** StreamingLLM positional, pre-QKᵀ; `kernel` lets the stage run it ("streaming"). */
export const streamingSelector = (sinks: number, kernel = false) =>
  selector("streaming", ["pre"], true, kernel ? { name: "streaming", sinks } : undefined, (i) => {
    const k = i.k, n = i.offloaded, s = Math.min(sinks, k);
    return { kind: "shared", ids: Int32Array.from([...i.primitives.range(0, s), ...i.primitives.range(n - (k - s), k - s)]) };
  });

/** Pre-QKᵀ in JS, reading the query: K consecutive slots from an offset the query's first value picks (stale queries pick others). */
export const queryPreSelector = () =>
  selector("query-pre", ["pre"], true, undefined, (i) => {
    const k = Math.min(i.k, i.offloaded), from = Math.floor(Math.abs(i.query[0]!) * 9973) % (i.offloaded - k + 1);
    return { kind: "shared", ids: i.primitives.range(from, k) };
  });

/** Returns whatever `bad` gives, unvalidated (for bad-input tests). */
export const rawSelector = (bad: (i: SelectionInput) => unknown): TokenSelector => ({
  name: "raw", timings: ["pre", "post"], needsScores: false, usesBudget: true,
  initState: () => undefined,
  select: (i) => bad(i) as never,
});

export function fixedScheduler(k: number, timing: SelectionTiming): Scheduler {
  return { name: "fixed", initial: () => ({ k, timing }), next: () => ({ k, timing }), reset() {} };
}

/** `inner` with an attnCausal built from the stage ops, one query row at a time (a [heads, cap]
 * scores scratch); each call is logged as "n@firstPos:start". */
export function withCausal(inner: ReferenceBackend, calls: string[]): Backend {
  const attnCausal = (out: Tensor, q: Tensor, n: number, k: Tensor, v: Tensor, start: number, firstPos: number, scale: number) => {
    calls.push(`${n}@${firstPos}:${start}`);
    const heads = q.shape[q.shape.length - 1] / k.shape[2];
    const scores = inner.alloc([heads, k.shape[1]]);
    for (let i = 0; i < n; i++) {
      inner.attnLogits(scores, 0, q, i, k, start, firstPos + i + 1, scale);
      inner.softmax(scores, heads, firstPos + i + 1);
      inner.attnAggregate(out, i, scores, 0, v, start, firstPos + i + 1, false);
    }
    inner.free(scores);
  };
  return withMethods<Backend>(inner, { attnCausal });
}

/** Quest as a plugin would write it on core's questSelection; `kernel` lets the stage run it. */
export function questSelector(pageSize: number, kernel: boolean): TokenSelector<QuestPageState> {
  return {
    name: "quest", timings: ["pre"], needsScores: false, usesBudget: true, needsKeys: true,
    ...(kernel ? { kernel: { name: "quest" as const, pageSize } } : {}),
    initState: () => ({ pages: null, summarized: 0 }),
    select(i) {
      if (i.timing !== "pre" || !i.keys) throw new Error("pre with keys only");
      const pages = questPages(i.primitives, i.state, i.keys, i.offloaded, pageSize);
      const sel = questSelection(i.primitives, i.query, i.layout.groupSize, i.keys, pages, i.offloaded, i.k);
      return validateSelection(sel, { offloaded: i.offloaded, kvHeads: i.layout.kvHeads, k: i.k, source: "quest" });
    },
  };
}

/** A stage kernel, its timing, K and a logits mode: the hand-off tests' cases. */
export interface KernelCase {
  logits: LogitsMode;
  selector: () => TokenSelector;
  timing: SelectionTiming;
  k: number;
}

/** Top-K (post), Quest and streaming (pre) stage kernels in every logits mode. */
export const KERNEL_CASES: KernelCase[] = (["exact", "speculative", "verified"] as const).flatMap((logits) => [
  { logits, selector: () => topKSelector(true), timing: "post" as const, k: 3 },
  { logits, selector: () => questSelector(2, true) as TokenSelector, timing: "pre" as const, k: 4 },
  { logits, selector: () => streamingSelector(2, true), timing: "pre" as const, k: 4 },
]);
