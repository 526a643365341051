/**
 * One case of Backend.attnPartial + attnMerge against the materialised path hybrid attention
 * takes without them (window logits at their columns, the selected logits beside them, one
 * softmax, attnAggregate span by span), on any backend: random q, K, V and selected rows and
 * logits, spans of a ring-buffer window, some selected columns −∞ (a short per-head list).
 * Shared by core's and kernels-cpu's tests (`@hybridgen/core/testing`).
 */
import type { Backend, DType, Tensor } from "@hybridgen/spec";
import { makeRng, randomArray } from "./engine-helpers.js";

export interface PartialCase {
  heads: number;
  kvHeads: number;
  headDim: number;
  dtype: DType;
  /** Cache capacity of K/V. */
  cap: number;
  /** start, count pairs over the cache. */
  spans: number[];
  /** Selected tokens merged in (their logits given). */
  selected: number;
  /** Selected columns left −∞ at the end of every head of KV head 0's group. */
  padded?: number;
  seed: number;
  /** Logit scale of q (larger: sharper softmax). */
  qScale?: number;
}

export interface PartialResult {
  /** attnPartial then attnMerge: [heads·headDim]. */
  flash: Float32Array;
  /** Logits, softmax and attnAggregate over the materialised row. */
  materialized: Float32Array;
  /** The partial itself [heads, headDim + 2]. */
  part: Float32Array;
}

export function runPartialCase(be: Backend, c: PartialCase): PartialResult {
  const { heads, kvHeads, headDim, dtype, cap, spans, selected } = c;
  const rng = makeRng(c.seed);
  const group = heads / kvHeads, scale = 1 / Math.sqrt(headDim);
  const window = spans.filter((_, i) => i % 2 === 1).reduce((a, b) => a + b, 0);
  const width = window + selected + 3;
  const owned: Tensor[] = [];
  const tensor = (shape: number[], dt: DType = "f32", values?: Float32Array) => {
    const t = be.alloc(shape, dt);
    owned.push(t);
    if (values) be.write(t, values);
    return t;
  };
  try {
    const q = tensor([2, heads * headDim], "f32", randomArray(rng, 2 * heads * headDim, c.qScale ?? 2));
    const k = tensor([kvHeads, cap, headDim], dtype, randomArray(rng, kvHeads * cap * headDim));
    const v = tensor([kvHeads, cap, headDim], dtype, randomArray(rng, kvHeads * cap * headDim));
    const selV = tensor([kvHeads, Math.max(1, selected) + 2, headDim], dtype, randomArray(rng, kvHeads * (Math.max(1, selected) + 2) * headDim));
    const selLogits = randomArray(rng, heads * selected, 3);
    for (let h = 0; h < group; h++) for (let j = selected - (c.padded ?? 0); j < selected; j++) selLogits[h * selected + j] = -Infinity;
    // The selected logits sit at column 1 of a wider row (as the store's columns do).
    const scores = tensor([heads, width]);
    const row = new Float32Array(heads * width).fill(Number.NaN);
    for (let h = 0; h < heads; h++) row.set(selLogits.subarray(h * selected, (h + 1) * selected), h * width + 1);
    be.write(scores, row);
    const qRow = 1, selStart = 2;

    const part = tensor([heads, headDim + 2]);
    const out = tensor([3, heads * headDim], "f32", new Float32Array(3 * heads * headDim).fill(Number.NaN));
    be.attnPartial!(part, q, qRow, k, v, Int32Array.from(spans), scale);
    be.attnMerge!(out, 2, part, scores, 1, selV, selStart, selected);
    const flash = be.read(out, 2 * heads * headDim, heads * headDim);

    // Materialised: [selected | window spans] columns of a fresh row, softmax, aggregate.
    const mat = tensor([heads, width]);
    const mrow = new Float32Array(heads * width);
    for (let h = 0; h < heads; h++) mrow.set(selLogits.subarray(h * selected, (h + 1) * selected), h * width);
    be.write(mat, mrow);
    let col = selected;
    for (let s = 0; s < spans.length; s += 2) {
      be.attnLogits(mat, col, q, qRow, k, spans[s], spans[s + 1], scale);
      col += spans[s + 1];
    }
    be.softmax(mat, heads, col);
    const mout = tensor([3, heads * headDim]);
    be.attnAggregate(mout, 0, mat, 0, selV, selStart, selected, false);
    col = selected;
    for (let s = 0; s < spans.length; s += 2) {
      be.attnAggregate(mout, 0, mat, col, v, spans[s], spans[s + 1], true);
      col += spans[s + 1];
    }
    return { flash, materialized: be.read(mout, 0, heads * headDim), part: be.read(part) };
  } finally {
    for (const t of owned) be.free(t);
  }
}

/** ‖a − b‖ / ‖b‖ over the finite values (equal infinities match; ∞ when anything else is not finite). */
export function relativeError(a: Float32Array, b: Float32Array): number {
  let num = 0, den = 0;
  for (let i = 0; i < a.length; i++) {
    if (a[i] === b[i] && !Number.isFinite(b[i])) continue;
    num += (a[i] - b[i]) ** 2;
    den += b[i] ** 2;
  }
  return Number.isFinite(num) ? Math.sqrt(num / Math.max(den, 1e-30)) : Infinity;
}

/** The cases both test files run: GQA 1/4/8, f32 and bf16 K/V, odd span lengths, a ring's wrap. */
export function partialCases(seed: number): PartialCase[] {
  const cases: PartialCase[] = [];
  let i = 0;
  for (const dtype of ["f32", "bf16"] as const)
    for (const [heads, kvHeads] of [[4, 4], [8, 2], [16, 2]] as const)
      for (const headDim of [16, 24])
        cases.push({
          heads, kvHeads, headDim, dtype, cap: 300,
          // sinks, then a ring wrapped in two runs; lengths odd
          spans: [0, 3, 201, 99 - (i % 3) * 10, 3, 137 + i], selected: 13 + i, padded: 5, seed: seed + i++,
        });
  return cases;
}
