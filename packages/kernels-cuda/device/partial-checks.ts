/**
 * Hybrid attention's window kernels on a GPU (native/span_attn.cu) against ReferenceBackend:
 * attnPartial (the partial rows: normalised output, max, sum) and attnMerge (one softmax over the
 * partial's tokens ∪ given columns, some −∞) on fresh random inputs, for f32/f16/bf16 K/V, GQA
 * 1/3/4/8, head dims that take the tensor-core block (64, 128), the FMA block (48, 256, f32) and the
 * plain warp block (36 in f16/bf16, a cache view off 16 bytes), spans of a wrapped ring with odd
 * lengths, long windows (many chunks), no spans, no columns; eager and in recorded steps whose
 * graph is replayed with other spans and column counts (1 capture, the rest replays, none
 * drained). timeWindow measures the partial over a scale-run window against the materialised path.
 * Used by device/device-check.ts.
 */
import { seededRandom, type Backend, type DType, type Tensor } from "@hybridgen/spec";
import { ReferenceBackend, relL2Error } from "@hybridgen/spec/kit";
import type { CudaBackend } from "../src/index.js";
import { pairedAlloc, type CheckResult } from "./op-checks.js";
import { cudaLab } from "../src/lab.js";

const DTYPES: readonly DType[] = ["f32", "f16", "bf16"];

interface Shape {
  heads: number;
  kvHeads: number;
  headDim: number;
  cap: number;
  /** start, count pairs per recorded step (the first one also runs eagerly). */
  steps: number[][];
  /** Selected columns per step. */
  selected: number[];
  /** K/V as a view one element past a 16-byte boundary (the plain block's case). */
  offset?: boolean;
}

const SHAPES: readonly Shape[] = [
  { heads: 32, kvHeads: 8, headDim: 128, cap: 5000, steps: [[0, 4, 3001, 1999, 4, 1303], [0, 4, 3002, 1998, 4, 1304], [0, 4, 4, 4996]], selected: [1024, 1000, 7] },
  { heads: 8, kvHeads: 2, headDim: 64, cap: 700, steps: [[0, 3, 500, 199, 3, 77], [0, 3, 3, 697], [0, 3, 600, 100, 3, 21]], selected: [37, 0, 64] },
  { heads: 4, kvHeads: 1, headDim: 128, cap: 40000, steps: [[0, 4, 4, 39990], [0, 4, 20000, 20000, 4, 11], [0, 4, 30000, 10000, 4, 19996]], selected: [256, 255, 1] },
  { heads: 12, kvHeads: 12, headDim: 48, cap: 300, steps: [[5, 111], [7, 291], [0, 1]], selected: [13, 2, 299] },
  { heads: 6, kvHeads: 2, headDim: 36, cap: 200, steps: [[0, 2, 150, 50, 2, 17], [0, 2, 2, 198], [0, 2, 151, 49, 2, 18]], selected: [9, 9, 30] },
  { heads: 8, kvHeads: 8, headDim: 256, cap: 300, steps: [[0, 4, 200, 100, 4, 81], [0, 4, 4, 296], [100, 1, 0, 0, 7, 2, 299, 1]], selected: [17, 5, 0] },
  { heads: 28, kvHeads: 4, headDim: 128, cap: 3000, steps: [[0, 4, 2000, 996, 4, 1000], [0, 4, 4, 2996], [0, 4, 2001, 995, 4, 1001]], selected: [1024, 300, 1] },
  { heads: 24, kvHeads: 8, headDim: 128, cap: 900, steps: [[0, 4, 700, 200, 4, 333], [0, 4, 4, 896], [0, 4, 701, 199, 4, 334]], selected: [40, 41, 42] },
  { heads: 4, kvHeads: 2, headDim: 64, cap: 64, steps: [[], [0, 10], []], selected: [5, 0, 3] },
  { heads: 8, kvHeads: 2, headDim: 64, cap: 500, steps: [[0, 2, 300, 200, 2, 51], [0, 2, 2, 498], [0, 2, 301, 199, 2, 52]], selected: [33, 1, 0], offset: true },
];

/** ‖a − b‖ / ‖b‖ where infinities must match exactly (a partial's max is −∞ with no token). */
function partialErr(a: Float32Array, b: Float32Array): number {
  const fa = a.map((x, i) => (x === b[i] && !Number.isFinite(x) ? 0 : x));
  const fb = b.map((x, i) => (x === a[i] && !Number.isFinite(x) ? 0 : x));
  return relL2Error(fa, fb);
}

export function runPartialChecks(cuda: CudaBackend, seed: number): CheckResult[] {
  const ref = new ReferenceBackend();
  const rnd = seededRandom(seed);
  const results: CheckResult[] = [];
  const record = (name: string, err: number, tol: number) => results.push({ name, err, tol, ok: err <= tol });
  const values = (n: number, scale = 1) => Float32Array.from({ length: n }, () => (rnd() * 2 - 1) * scale);
  let key = 0;
  for (const dt of DTYPES) {
    for (const s of SHAPES) {
      const { heads, kvHeads, headDim: hd, cap } = s;
      const owned: [Backend, Tensor][] = [];
      const both = pairedAlloc(cuda, ref, owned);
      try {
        const maxSel = Math.max(...s.selected), width = maxSel + 5, scale = 1 / Math.sqrt(hd);
        const q = both([2, heads * hd], "f32", values(2 * heads * hd, 2));
        const kvn = kvHeads * cap * hd;
        const kFull = both([kvn + 1], dt, values(kvn + 1)), vFull = both([kvn + 1], dt, values(kvn + 1));
        const at = s.offset ? 1 : 0;
        const k = { c: cuda.view(kFull.c, at, [kvHeads, cap, hd]), r: ref.view(kFull.r, at, [kvHeads, cap, hd]) };
        const v = { c: cuda.view(vFull.c, at, [kvHeads, cap, hd]), r: ref.view(vFull.r, at, [kvHeads, cap, hd]) };
        owned.push([cuda, k.c], [ref, k.r], [cuda, v.c], [ref, v.r]);
        const selV = both([kvHeads, maxSel + 3, hd], dt, values(kvHeads * (maxSel + 3) * hd));
        const logits = both([heads, width]);
        const part = both([heads, hd + 2]), out = both([2, heads * hd]);
        const tag = `${dt} h${heads}/${kvHeads} d${hd}${s.offset ? " off 16 B" : ""}`;
        // One step: fresh logits (a few −∞ per head), then partial + merge on both backends.
        const step = (i: number, recorded: boolean): [number, number] => {
          const sel = s.selected[i], lv = values(heads * width, 3);
          for (let h = 0; h < heads; h++) for (let j = 0; j < sel; j += 7) lv[h * width + 2 + j] = -Infinity;
          cuda.write(logits.c, lv);
          ref.write(logits.r, lv);
          cuda.write(out.c, new Float32Array(2 * heads * hd).fill(Number.NaN));
          cuda.write(part.c, new Float32Array(heads * (hd + 2)).fill(Number.NaN));
          const spans = Int32Array.from(s.steps[i]);
          if (recorded) cuda.beginStep(`partial-checks-${key}`);
          cuda.attnPartial(part.c, q.c, 1, k.c, v.c, spans, scale);
          cuda.attnMerge(out.c, 1, part.c, logits.c, 2, selV.c, 1, sel);
          if (recorded) cuda.endStep();
          ref.attnPartial(part.r, q.r, 1, k.r, v.r, spans, scale);
          ref.attnMerge(out.r, 1, part.r, logits.r, 2, selV.r, 1, sel);
          const o = heads * hd;
          return [partialErr(cuda.read(part.c), ref.read(part.r)), relL2Error(cuda.read(out.c, o, o), ref.read(out.r, o, o))];
        };
        const [pe, oe] = step(0, false);
        record(`attnPartial ${tag} spans [${s.steps[0].join(",")}]`, pe, 1e-5);
        record(`attnMerge ${tag} +${s.selected[0]} columns`, oe, 1e-5);
        const before = cudaLab(cuda).graphStats();
        let worst = 0;
        for (let i = 0; i < s.steps.length; i++) worst = Math.max(worst, ...step(i, true));
        const after = cudaLab(cuda).graphStats();
        record(`attnPartial + attnMerge ${tag}, ${s.steps.length} recorded steps (other spans and columns)`, worst, 1e-5);
        const replays = after.replays - before.replays, captures = after.captures - before.captures, drained = after.drained - before.drained;
        record(`attnPartial + attnMerge ${tag} recorded: 1 capture, ${s.steps.length - 1} replays, none drained (${captures}, ${replays}, ${drained})`,
          Math.abs(captures - 1) + Math.abs(replays - (s.steps.length - 1)) + drained, 0);
        key++;
      } catch (e) {
        record(`attnPartial ${dt} h${heads}/${kvHeads} d${hd}: threw ${e instanceof Error ? e.message : String(e)}`, 1, 0);
      } finally {
        for (const [be, t] of owned.reverse()) be.free(t);
      }
    }
  }
  ref.close();
  return results;
}

/**
 * Times hybrid attention's window on this device: attnPartial over `tokens` tokens of a bf16
 * cache (sinks and a wrapped ring) against the materialised path (attnLogits per span, softmax,
 * attnAggregate per span), mean of `iters` eager runs each; and the rate the partial reads K and V at.
 */
export function timeWindow(cuda: CudaBackend, tokens = 817_371, heads = 32, kvHeads = 8, hd = 128, iters = 20) {
  const cap = tokens + 16, scale = 1 / Math.sqrt(hd);
  const k = cuda.alloc([kvHeads, cap, hd], "bf16"), v = cuda.alloc([kvHeads, cap, hd], "bf16");
  const q = cuda.alloc([1, heads * hd]), part = cuda.alloc([heads, hd + 2]), out = cuda.alloc([1, heads * hd]);
  const scores = cuda.alloc([heads, tokens + 256]), sel = cuda.alloc([kvHeads, 256, hd], "bf16");
  try {
    const rnd = seededRandom(tokens), block = Float32Array.from({ length: 1 << 22 }, () => rnd() * 2 - 1);
    const fill = (t: Tensor, n: number) => {
      for (let o = 0; o < n; o += block.length) cuda.write(t, block.subarray(0, Math.min(block.length, n - o)), o);
    };
    fill(k, kvHeads * cap * hd);
    fill(v, kvHeads * cap * hd);
    fill(q, heads * hd);
    const ring = tokens - 4, cut = Math.floor(ring / 3);
    const spans = Int32Array.of(0, 4, 4 + cut, ring - cut, 4, cut);
    const time = (run: () => void) => {
      run();
      cuda.synchronize();
      const t0 = performance.now();
      for (let i = 0; i < iters; i++) run();
      cuda.synchronize();
      return (performance.now() - t0) / iters;
    };
    const partialMs = time(() => {
      cuda.attnPartial(part, q, 0, k, v, spans, scale);
      cuda.attnMerge(out, 0, part, scores, 0, sel, 0, 256);
    });
    const materializedMs = time(() => {
      let col = 256;
      for (let s = 0; s < spans.length; s += 2) {
        cuda.attnLogits(scores, col, q, 0, k, spans[s], spans[s + 1], scale);
        col += spans[s + 1];
      }
      cuda.softmax(scores, heads, col);
      cuda.attnAggregate(out, 0, scores, 0, sel, 0, 256, false);
      col = 256;
      for (let s = 0; s < spans.length; s += 2) {
        cuda.attnAggregate(out, 0, scores, col, v, spans[s], spans[s + 1], true);
        col += spans[s + 1];
      }
    });
    const bytes = 2 * kvHeads * tokens * hd * 2;
    return { tokens, partialMs, materializedMs, gbPerS: bytes / (partialMs * 1e6) };
  } finally {
    for (const t of [k, v, q, part, out, scores, sel]) cuda.free(t);
  }
}
