/**
 * Checks of the batched-decode kernels on a GPU (fresh random inputs, seeded):
 *
 * - skinny GEMM (path "skinny", 2..32 rows, f16/bf16 weights) against a TypeScript f64
 *   reference of x rounded to the weight dtype times the weights as stored, with and without
 *   bias, at n = 2, 3, 8, 9, 17, 32 and m, k that are not multiples of the tiles (k % 8 ≠ 0
 *   takes the fallback path: checked with the looser bound of f32 x), for each kernel variant
 *   (setSkinny: with and without the fused split reduction); every variant runs
 *   twice on NaN-filled outputs (the fused reduction's counters must be back at 0);
 * - matmulSplit (setSkinny({ split: true })): a fused weight into 3, 2 and 1 outputs whose
 *   widths cut through the 64-row blocks, with bias, overwriting and accumulating, per variant;
 * - argmaxRows against argmax row by row, on rows with planted ties and a maximum in the last
 *   column (the first index of equal maxima must win);
 * - attnDecodeBatch (batched kernels) against the per-row path (setBatchAttention(false)) on
 *   identical copies of the caches: the appended K/V rows bit for bit, the outputs within 1e-5
 *   (the split counts differ, so the merge order does), eager and inside recorded steps whose
 *   graph is replayed with new positions.
 *
 * Used by device/batch-bench.ts and test/batch-gpu.test.ts.
 */
import { roundTo, seededRandom, type BatchAttnRow, type DType, type Tensor } from "@hybridgen/spec";
import { relL2Error } from "@hybridgen/spec/kit";
import type { CudaBackend } from "../src/index.js";
import type { CheckResult } from "./op-checks.js";
import { cudaLab } from "../src/lab.js";

/** x (f32, rounded to the weight dtype) · wᵀ + bias in f64. */
function refMatmul(x: Float32Array, w: Float32Array, bias: Float32Array | null, n: number, k: number, m: number, dt: DType): Float32Array {
  const xr = x.map((v) => roundTo(dt, v));
  const out = new Float32Array(n * m);
  for (let r = 0; r < n; r++)
    for (let c = 0; c < m; c++) {
      let s = 0;
      for (let i = 0; i < k; i++) s += xr[r * k + i] * w[c * k + i];
      out[r * m + c] = s + (bias ? bias[c] : 0);
    }
  return out;
}

/** setSkinny variants the checks cover: who sums the k splits. */
export const SKINNY_VARIANTS: readonly { name: string; fusedReduce: boolean }[] = [
  { name: "reduce kernel", fusedReduce: false },
  { name: "fused reduce", fusedReduce: true },
];

export function runSkinnyChecks(cuda: CudaBackend, seed: number): CheckResult[] {
  const rnd = seededRandom(seed);
  const vals = (len: number) => Float32Array.from({ length: len }, () => rnd() * 2 - 1);
  const results: CheckResult[] = [];
  // [n, m, k, bias]: tails in m (not a multiple of 64) and k (not of 32); k splits (m small, k large).
  const shapes: [number, number, number, boolean][] = [
    [2, 37, 72, false], [3, 130, 264, true], [8, 64, 4096, false], [9, 1000, 520, true],
    [17, 77, 136, false], [32, 4096, 1024, true], [32, 200, 2056, false], [5, 96, 70, true],
  ];
  const saved = cudaLab(cuda).skinny();
  for (const dt of ["bf16", "f16"] as const) {
    for (const [n, m, k, hasBias] of shapes) {
      const x = cuda.alloc([n, k]), w = cuda.alloc([m, k], dt), out = cuda.alloc([n, m]);
      const b = hasBias ? cuda.alloc([m]) : null;
      try {
        const xv = vals(n * k);
        cuda.write(x, xv);
        cuda.write(w, vals(m * k));
        const bv = b ? vals(m) : null;
        if (b && bv) cuda.write(b, bv);
        const want = refMatmul(xv, cuda.read(w), bv, n, k, m, dt);
        cudaLab(cuda).setMatmulPath("skinny");
        // k % 8 ≠ 0 is not the kernel's case: the fallback keeps x in f32 (GEMV) or rounds it (cuBLAS).
        const fallback = k % 8 !== 0;
        const tol = fallback ? 1e-2 : 1e-5;
        for (const vr of fallback ? SKINNY_VARIANTS.slice(0, 1) : SKINNY_VARIANTS) {
          cudaLab(cuda).setSkinny({ fusedReduce: vr.fusedReduce });
          let err = 0;
          for (let rep = 0; rep < 2; rep++) {
            cuda.write(out, new Float32Array(n * m).fill(Number.NaN));
            cuda.matmul(out, x, w, n, b ?? undefined);
            err = Math.max(err, relL2Error(cuda.read(out), want));
          }
          const what = fallback ? ` (fallback: ${cudaLab(cuda).matmulPathFor(n)})` : `, ${vr.name}`;
          results.push({ name: `skinny ${dt} n=${n} m=${m} k=${k}${hasBias ? " +bias" : ""}${what}`, err, tol, ok: err <= tol });
        }
      } finally {
        cudaLab(cuda).setMatmulPath("auto");
        cudaLab(cuda).setSkinny(saved);
        for (const t of [x, w, out, b]) if (t) cuda.free(t);
      }
    }
  }
  return results;
}

/**
 * matmulSplit on the skinny kernels: a fused [Σ widths, k] weight into separate outputs, with a
 * bias, against the f64 reference; accumulating cases start from random outputs.
 */
export function runMatmulSplitChecks(cuda: CudaBackend, seed: number): CheckResult[] {
  const rnd = seededRandom(seed);
  const vals = (len: number) => Float32Array.from({ length: len }, () => rnd() * 2 - 1);
  const results: CheckResult[] = [];
  // [n, widths, k, accumulate]: widths that cut through the 64-row blocks; k splits at small m.
  const cases: [number, number[], number, boolean][] = [
    [3, [200, 72, 40], 1024, false], [8, [96, 32, 32], 2048, false], [17, [130, 130], 520, false],
    [32, [64], 4096, true], [5, [300, 77], 264, true],
  ];
  const dt = "bf16";
  const saved = cudaLab(cuda).skinny();
  try {
    for (const [n, widths, k, accumulate] of cases) {
      const m = widths.reduce((a, b) => a + b, 0);
      const owned: Tensor[] = [];
      const alloc = (shape: number[], d: DType = "f32") => {
        const t = cuda.alloc(shape, d);
        owned.push(t);
        return t;
      };
      try {
        const x = alloc([n, k]), w = alloc([m, k], dt), bias = alloc([m]);
        const outs = widths.map((wd) => alloc([n, wd]));
        const xv = vals(n * k), bv = vals(m), start = widths.map((wd) => vals(n * wd));
        cuda.write(x, xv);
        cuda.write(w, vals(m * k));
        cuda.write(bias, bv);
        const full = refMatmul(xv, cuda.read(w), bv, n, k, m, dt);
        // The reference per output: its columns of the full product (+ the starting values).
        let off = 0;
        const want = widths.map((wd, j) => {
          const o = new Float32Array(n * wd);
          for (let r = 0; r < n; r++) for (let c = 0; c < wd; c++) o[r * wd + c] = full[r * m + off + c] + (accumulate ? start[j][r * wd + c] : 0);
          off += wd;
          return o;
        });
        for (const vr of SKINNY_VARIANTS) {
          // maxRows 32: the skinny kernel takes every n here (by default it stops at 8, cuBLAS above, and matmulSplit declines)
          cudaLab(cuda).setSkinny({ maxRows: 32, split: true, fusedReduce: vr.fusedReduce });
          outs.forEach((o, j) => cuda.write(o, accumulate ? start[j] : new Float32Array(n * widths[j]).fill(Number.NaN)));
          const taken = cuda.matmulSplit(outs, x, w, n, bias, accumulate);
          let err = taken ? 0 : Infinity;
          outs.forEach((o, j) => (err = Math.max(err, relL2Error(cuda.read(o), want[j]))));
          results.push({ name: `matmulSplit ${dt} n=${n} widths=${widths.join("+")} k=${k}${accumulate ? " accumulate" : ""} +bias, ${vr.name}${taken ? "" : " (declined)"}`, err, tol: 1e-5, ok: err <= 1e-5 });
        }
      } finally {
        for (const t of owned) cuda.free(t);
      }
    }
  } finally {
    cudaLab(cuda).setSkinny(saved);
  }
  return results;
}

/** argmaxRows = argmax of each row (n = 1, 8, 32; vocab-sized rows; ties planted). */
export function runArgmaxRowsChecks(cuda: CudaBackend, seed: number): CheckResult[] {
  const rnd = seededRandom(seed);
  const results: CheckResult[] = [];
  for (const [n, cols] of [[1, 1000], [8, 128256], [32, 32000]] as const) {
    const x = cuda.alloc([n, cols]);
    try {
      const v = Float32Array.from({ length: n * cols }, () => rnd() * 20 - 10);
      for (let r = 0; r < n; r++) {
        const at = (c: number) => r * cols + c;
        if (r % 3 === 0) v[at(cols - 1)] = 50; // the maximum in the last column
        if (r % 3 === 1) v[at(Math.floor(rnd() * cols))] = v[at(Math.floor(rnd() * cols))] = 40; // a planted tie
      }
      cuda.write(x, v);
      const got = new Int32Array(n).fill(-1);
      cuda.argmaxRows(x, n, got);
      let wrong = 0;
      for (let r = 0; r < n; r++) if (got[r] !== cuda.argmax(x, r)) wrong++;
      results.push({ name: `argmaxRows n=${n} cols=${cols}: rows unlike argmax`, err: wrong, tol: 0, ok: wrong === 0 });
    } finally {
      cuda.free(x);
    }
  }
  return results;
}

interface AttnCase {
  name: string;
  dtype: DType;
  heads: number;
  kvHeads: number;
  headDim: number;
  /** Per row: cache capacity, span start, first position (the new token's). */
  rows: [number, number, number][];
}

export function runBatchAttnChecks(cuda: CudaBackend, seed: number): CheckResult[] {
  const rnd = seededRandom(seed);
  const vals = (len: number) => Float32Array.from({ length: len }, () => rnd() * 2 - 1);
  const results: CheckResult[] = [];
  const cases: AttnCase[] = [
    { name: "bf16 GQA 32/8 x 128", dtype: "bf16", heads: 32, kvHeads: 8, headDim: 128, rows: [[2600, 0, 2047], [2600, 0, 0], [2600, 3, 700], [3000, 0, 2999], [2600, 100, 64], [2600, 0, 1536]] },
    { name: "f32 MHA 4/4 x 64", dtype: "f32", heads: 4, kvHeads: 4, headDim: 64, rows: [[300, 0, 5], [300, 7, 290], [128, 0, 127]] },
    { name: "f16 GQA 12/2 x 48", dtype: "f16", heads: 12, kvHeads: 2, headDim: 48, rows: [[90, 0, 17], [90, 2, 80], [90, 0, 1], [90, 0, 64], [90, 1, 33]] },
  ];
  for (const c of cases) {
    const B = c.rows.length, qw = c.heads * c.headDim, kvw = c.kvHeads * c.headDim;
    const owned: Tensor[] = [];
    const alloc = (shape: number[], dt: DType = "f32") => {
      const t = cuda.alloc(shape, dt);
      owned.push(t);
      return t;
    };
    try {
      const q = alloc([B, qw]), k = alloc([B, kvw]), v = alloc([B, kvw]);
      const outA = alloc([B, qw]), outB = alloc([B, qw]);
      // Two identical cache sets: A for the per-row path, B for the batched kernels.
      const sets = [0, 1].map(() => c.rows.map(([cap]) => ({ k: alloc([c.kvHeads, cap, c.headDim], c.dtype), v: alloc([c.kvHeads, cap, c.headDim], c.dtype) })));
      c.rows.forEach(([cap], i) => {
        const kv = vals(c.kvHeads * cap * c.headDim), vv = vals(c.kvHeads * cap * c.headDim);
        for (const s of sets) {
          cuda.write(s[i].k, kv);
          cuda.write(s[i].v, vv);
        }
      });
      const tableOf = (set: number, shift: number): BatchAttnRow[] =>
        c.rows.map(([cap, start, pos], i) => {
          const p = Math.min(pos + shift, cap - 1 - start);
          return { kCache: sets[set][i].k, vCache: sets[set][i].v, start, firstPos: p, slot: start + p };
        });
      // Three rounds: eager, then two recorded steps (capture, replay) with positions moved on.
      for (let round = 0; round < 3; round++) {
        cuda.write(q, vals(B * qw));
        cuda.write(k, vals(B * kvw));
        cuda.write(v, vals(B * kvw));
        cuda.write(outA, new Float32Array(B * qw).fill(Number.NaN));
        cuda.write(outB, new Float32Array(B * qw).fill(Number.NaN));
        const scale = 1 / Math.sqrt(c.headDim);
        cudaLab(cuda).setBatchAttention(false);
        cuda.attnDecodeBatch(outA, q, k, v, tableOf(0, round), scale);
        cudaLab(cuda).setBatchAttention(true);
        const g0 = cudaLab(cuda).graphStats();
        if (round > 0) cuda.beginStep(`batch-attn-check-${c.name}`);
        cuda.attnDecodeBatch(outB, q, k, v, tableOf(1, round), scale);
        if (round > 0) cuda.endStep();
        const g1 = cudaLab(cuda).graphStats();
        const mode = round === 0 ? "eager" : `recorded (graphs captured/replayed ${g1.captures - g0.captures}/${g1.replays - g0.replays})`;
        const err = relL2Error(cuda.read(outB), cuda.read(outA));
        results.push({ name: `attnDecodeBatch ${c.name}, ${B} rows, ${mode}: out vs per-row`, err, tol: 1e-5, ok: err <= 1e-5 });
        let cacheDiff = 0;
        c.rows.forEach((_, i) => {
          for (const kind of ["k", "v"] as const) {
            const a = cuda.read(sets[0][i][kind]), b = cuda.read(sets[1][i][kind]);
            for (let j = 0; j < a.length; j++) cacheDiff = Math.max(cacheDiff, Math.abs(a[j] - b[j]));
          }
        });
        results.push({ name: `attnDecodeBatch ${c.name}, ${mode}: appended caches vs per-row (max |Δ|)`, err: cacheDiff, tol: 0, ok: cacheDiff === 0 });
      }
    } finally {
      cudaLab(cuda).setBatchAttention(true);
      for (const t of owned) cuda.free(t);
    }
  }
  return results;
}
