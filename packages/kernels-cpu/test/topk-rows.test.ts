/**
 * The stage's top-K over all lists at once (hg_topk_rows, through hg_sel_topk_rows) and the fused
 * scoring that feeds it, against a sort: the K largest per list, NaN below every number (-inf
 * included), -0 equal to +0, ties to the lower id, ids ascending, K clamped to n — at sizes off any
 * vector width, on every ISA path the CPU runs, with and without a pool.
 */
import { ptr as addressOf, FFIType, type Pointer } from "bun:ffi";
import { describe, expect, it } from "vitest";
import { cpuFeatures, createCpuBackend, NativeCpuStage, type Isa } from "../src/index.js";
import { openNativeSymbols } from "../src/native.js";
import { randn, rng, SEED } from "./helpers.js";

const { ptr, i32, i64, i64_fast, void: none } = FFIType;
const L = openNativeSymbols({
  hg_sel_topk_rows: { args: [ptr, i64, ptr, i64, i64, i64, ptr, i64, i32, ptr], returns: i64_fast },
  hg_stage_create: { args: [i32, i32], returns: ptr },
  hg_stage_destroy: { args: [ptr], returns: none },
});

/** Elementwise max of rows as the kernels take it: a NaN never wins, -inf where every value is NaN. */
function maxRows(rows: ArrayLike<number>[], n: number): Float32Array {
  const m = new Float32Array(n).fill(-Infinity);
  for (const x of rows) for (let i = 0; i < n; i++) if (x[i] > m[i]) m[i] = x[i];
  return m;
}

/** Equal bytes (NaN payloads and the sign of zero included). */
const sameBits = (a: Float32Array | Int32Array, b: Float32Array | Int32Array) =>
  Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));

/** Ids of the row ranked best first: larger values first, every NaN last, ties (±0 too) by lower id. */
function ranking(x: ArrayLike<number>): number[] {
  const ids = Array.from({ length: x.length }, (_, i) => i);
  return ids.sort((a, b) => {
    const va = x[a], vb = x[b], na = Number.isNaN(va), nb = Number.isNaN(vb);
    if (na || nb) return na && nb ? a - b : na ? 1 : -1;
    return va > vb ? -1 : va < vb ? 1 : a - b;
  });
}

/** The reference: the first min(k, n) of the ranking, ascending. */
const topFromRanking = (rank: number[], k: number) => Int32Array.from(rank.slice(0, Math.max(0, Math.min(k, rank.length)))).sort();

/** Rows with many ties, ±0, ±Infinity and NaN; some NaN-deep. */
function nasty(r: () => number, n: number): Float32Array {
  const x = new Float32Array(n);
  const pool = [0, -0, 1, -1, 0.5, Infinity, -Infinity, NaN, 3.25, -3.25];
  const spread = r() < 0.5;
  for (let i = 0; i < n; i++) {
    const u = r();
    x[i] = u < 0.3 ? pool[Math.floor(r() * pool.length)]! : spread ? (r() - 0.5) * 1e6 : Math.round((r() - 0.5) * 16) / 4;
  }
  if (r() < 0.3) x.fill(NaN, 0, Math.floor(n * 0.8));
  return x;
}

/** The kernel's sample positions hold the largest values: its threshold lands too high and the list is redone. */
function misjudging(n: number): Float32Array {
  const x = Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37));
  const S = Math.min(2048, Math.max(512, Math.floor(n / 64)));
  for (let j = 0; j < S; j++) x[Math.floor(((2 * j + 1) * n) / (2 * S))] = 10 + (j % 3);
  return x;
}

type Gen = (r: () => number, n: number) => Float32Array;
const GENS: [string, Gen][] = [
  ["nasty", nasty],
  ["distinct", (r, n) => randn(r, n, 100)],
  ["rising (the top all at the end)", (r, n) => Float32Array.from({ length: n }, (_, i) => i / n + r() * 1e-3)],
  ["misjudging sample", (_, n) => misjudging(n)],
];

const ISAS: { name: string; code: number }[] = cpuFeatures().avx2 ? [{ name: "generic", code: 0 }, { name: "avx2", code: 1 }] : [{ name: "generic", code: 0 }];

interface Case { what: string; n: number; lists: number; nsrc: number; src: Float32Array; values: Float32Array[]; ranks: number[][] }
let cases: Case[] | null = null;
/** The rows and their sorts, made once for every ISA and pool. */
function allCases(): Case[] {
  if (cases) return cases;
  const r = rng(701);
  cases = [];
  for (const n of [1, 7, 13, 100, 4097, 5003, 20011, 70001]) {
    for (const [lists, nsrc] of [[1, 1], [3, 1], [8, 1], [1, 4], [2, 3]] as const) {
      if (n > 20011 && lists * nsrc !== 8 && lists * nsrc !== 4) continue; // enough of the largest size
      for (const [gname, gen] of GENS) {
        if ((n < 100 || n > 20011) && gname !== "nasty" && gname !== "misjudging sample") continue;
        const src = new Float32Array(lists * nsrc * n);
        for (let s = 0; s < lists * nsrc; s++) src.set(gen(r, n), s * n);
        const values = Array.from({ length: lists }, (_, l) =>
          nsrc === 1 ? src.subarray(l * n, (l + 1) * n) : maxRows(Array.from({ length: nsrc }, (_, q) => src.subarray((l * nsrc + q) * n, (l * nsrc + q + 1) * n)), n));
        cases.push({ what: `${gname} n=${n} lists=${lists} nsrc=${nsrc}`, n, lists, nsrc, src, values, ranks: values.map(ranking) });
      }
    }
  }
  return cases;
}

describe(`hg_sel_topk_rows against a sort (seed ${SEED})`, () => {
  for (const isa of ISAS) {
    for (const pooled of [false, true]) {
      it(`${isa.name}, ${pooled ? "a 3-thread stage's pool" : "the calling thread"}: per-list and max-of-rows lists, awkward n, K = 0, 1, n/16, n/4 ± 1, n - 1, n, > n`, () => {
        const stage = pooled ? (L.hg_stage_create(3, isa.code) as Pointer) : null;
        try {
          for (const { what, n, lists, nsrc, src, values, ranks } of allCases()) {
            const q4 = Math.floor(n / 4);
            for (const k of new Set([0, 1, 2, 37, Math.floor(n / 16), q4 - 1, q4, q4 + 1, n - 1, n, n + 5].filter((k) => k >= 0))) {
              const ostride = Math.max(k, 1) + 3, maxrow = new Float32Array(lists * n).fill(12345);
              const out = new Int32Array(lists * ostride).fill(-7);
              const rc = Number(L.hg_sel_topk_rows(addressOf(src), nsrc, addressOf(maxrow), lists, n, k, addressOf(out), ostride, isa.code, stage));
              expect(rc).toBe(0);
              const count = Math.min(k, n);
              for (let l = 0; l < lists; l++) {
                const got = out.subarray(l * ostride, l * ostride + count), want = topFromRanking(ranks[l], k);
                if (got.some((v, i) => v !== want[i])) throw new Error(`${isa.name} ${what} k=${k} list ${l}: ${got.slice(0, 8)} vs ${want.slice(0, 8)} (seed ${SEED})`);
                expect(out.subarray(l * ostride + count, (l + 1) * ostride).every((v) => v === -7)).toBe(true); // nothing past the count
                if (nsrc > 1 && k > 0 && k < n) expect(sameBits(maxrow.subarray(l * n, (l + 1) * n), values[l]), `${what} max row ${l}`).toBe(true);
              }
            }
          }
        } finally {
          if (stage) L.hg_stage_destroy(stage);
        }
      });
    }
  }
});

describe(`the stage's fused top-K equals a sort of its logits (seed ${SEED})`, () => {
  // 32 query heads over 8 KV heads as Llama-3.1-8B; f32 rows of 8 dims keep the test quick.
  const heads = 32, kvHeads = 8, group = heads / kvHeads, d = 8, cap = 20011;
  const f = cpuFeatures(), isas = ["generic", ...(f.avx2 ? ["avx2"] : []), ...(f.avx512 ? ["avx512"] : [])] as Isa[];
  for (const isa of isas) it(`${isa}: ties, ±0, ±inf and NaN logits, every n and K, shared and per KV head; the logits bit for bit`, () => {
    const r = rng(731 + isa.length);
    // K rows repeat with period 7 (ties far apart), every 5th is zero (±0 logits), every 97th holds
    // +inf in dim 0 (±inf, or NaN where a head's q[0] is 0), every 131st a NaN in dim 1 (NaN in every head).
    const base = randn(r, kvHeads * 7 * d), k = new Float32Array(kvHeads * cap * d);
    for (let g = 0; g < kvHeads; g++)
      for (let t = 0; t < cap; t++) {
        const row = (g * cap + t) * d;
        if (t % 5 !== 0) k.set(base.subarray((g * 7 + (t % 7)) * d, (g * 7 + (t % 7) + 1) * d), row);
        if (t % 97 === 3) k[row] = Infinity;
        if (t % 131 === 5) k[row + 1] = NaN;
      }
    const mixed = randn(r, heads * d);
    for (let h = 0; h < heads; h++) {
      const g = Math.floor(h / group);
      if (g === 1) mixed[h * d] = 0; // inf rows: NaN in all of the group (its group max -inf)
      if (g === 2) mixed[h * d] = -Math.abs(mixed[h * d]) - 0.1; // inf rows: -inf in all of the group
      if (g === 3 && h % 2 === 0) mixed[h * d] = 0; // NaN in half the group, ±inf in the rest
    }
    const queries = [randn(r, heads * d), mixed, new Float32Array(heads * d)];
    using cpu = createCpuBackend({ threads: 2, isa });
    using stage = new NativeCpuStage(cpu, { threads: 3 });
    stage.prepare({ heads, kvHeads, headDim: d, storeCapacity: cap, dtype: "f32" });
    const K = cpu.alloc([kvHeads, cap, d]), V = cpu.alloc([kvHeads, cap, d]);
    cpu.write(K, k);
    cpu.write(V, randn(r, kvHeads * cap * d));
    try {
      for (const n of [37, 613, 4099, 9001, cap]) {
        for (const q of queries) {
          // A score job's plain pass over the tokens: the fused scoring's blocks must leave the same logits.
          stage.query(0).set(q);
          stage.submit({ slot: 0, k: K, v: V, offloaded: n, kmax: 0, scale: 0.25, work: { kind: "score" } });
          stage.wait();
          const plain = stage.allLogits().map((row) => row.slice(0, n));
          let logits: Float32Array[] | null = null, ranks: { shared: number[]; lists: number[][] } | null = null;
          const q4 = Math.floor(n / 4);
          for (const budget of new Set([0, 1, 37, q4 - 1, q4, q4 + 1, n - 1, n].filter((b) => b >= 0 && b <= n))) {
            for (const shared of [false, true]) {
              const job = { slot: 0 as const, k: K, v: V, offloaded: n, kmax: budget, scale: 0.25, work: { kind: "topk" as const, budget, shared } };
              stage.query(0).set(q);
              stage.submit(job);
              stage.wait();
              expect(stage.lastSplit().selectMs).toBeGreaterThan(0);
              if (!logits) {
                logits = stage.allLogits().map((row) => row.slice(0, n));
                for (let h = 0; h < heads; h++) expect(sameBits(logits[h], plain[h]), `head ${h} n ${n}`).toBe(true);
                const gmax = Array.from({ length: kvHeads }, (_, g) => maxRows(logits!.slice(g * group, (g + 1) * group), n));
                const all = maxRows(gmax, n);
                ranks = { shared: ranking(all), lists: gmax.map(ranking) };
              }
              const a = stage.output(0);
              for (let g = 0; g < kvHeads; g++) {
                const want = topFromRanking(shared ? ranks!.shared : ranks!.lists[g], budget);
                expect(a.counts[g]).toBe(budget);
                const got = a.ids.subarray(g * budget, (g + 1) * budget);
                if (got.some((v, i) => v !== want[i])) throw new Error(`${isa} n=${n} budget=${budget} shared=${shared} list ${g}: ${got.slice(0, 8)} vs ${want.slice(0, 8)} (seed ${SEED})`);
              }
            }
          }
        }
      }
    } finally {
      cpu.free(K);
      cpu.free(V);
    }
  });
});
