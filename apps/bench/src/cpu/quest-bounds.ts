/**
 * Quest's page bounds on the AVX2 and the AVX-512 loops, in one run, against the floor of their
 * read: Llama-3.1-8B's offloaded store (32 query heads over 8 KV heads × 128 dims, bf16 K of random
 * values), pages of 16, `layers` stores rotating as a decode step's layers do:
 *   ./bun apps/bench/src/cpu/quest-bounds.ts [--tokens 28704,126976] [--budgets 256,1024] [--threads N] [--layers 4] [--rounds 9]
 * Per ISA a backend and a NativeCpuStage of `threads` threads. "bounds": the stage's primitives'
 * pageBounds over every page, on its pool (what quest's select() runs), layers rotating; "warm": the
 * same on one layer's summaries called back to back, so they stay in cache and the loop's arithmetic
 * shows; "pages phase": a quest job's selection phase (fold the new rows, bound every page, choose
 * the lists), the job beside it.
 * The floor is the summaries' bytes (bf16 min and max: KV heads × pages × 128 × 4) at the host's
 * streaming read bandwidth (a sum over buffers larger than any cache on `threads` threads, best of
 * 10 passes). Each round runs every layer on one ISA, then on the other, a pause between so neither
 * pool's spinning workers take the other's cores; cells are the median over rounds of the per-layer
 * mean, the best round in brackets (on a shared machine the best is the cleaner comparison). The
 * two ISAs' bounds and ids are checked equal bit for bit.
 */
import { cpus } from "node:os";
import { toArrayBuffer } from "bun:ffi";
import { pageSummaries, type PageSummaries } from "@hybridgen/core";
import { createCpuBackend, createNativeRandomFill, NativeCpuStage, storeKeys, type CpuBackend, type CpuTensor, type Isa } from "@hybridgen/kernels-cpu";

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : dflt;
}
const tokens = arg("tokens", "28704,126976").split(",").map(Number);
const budgets = arg("budgets", "256,1024").split(",").map(Number);
const threads = Number(arg("threads", String(cpus().length)));
const layers = Number(arg("layers", "4"));
const rounds = Number(arg("rounds", "9"));
const HEADS = 32, KV = 8, D = 128, G = HEADS / KV, PAGE = 16;
const ISA_PAIR: Isa[] = ["avx2", "avx512"];
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
const cell = (xs: number[]) => `${median(xs).toFixed(3)} (${Math.min(...xs).toFixed(3)})`;
const pause = () => Bun.sleepSync(5);

const fill = createNativeRandomFill(threads);
const backends = ISA_PAIR.map((isa) => createCpuBackend({ threads, isa }));
const bytesOf = (be: CpuBackend, t: CpuTensor, bytes: number) => new Uint8Array(toArrayBuffer(be.address(t), 0, bytes));

// The host's streaming read bandwidth: sums over 4 buffers of 256 MB, best of 10 passes.
let readGBs = 0;
{
  const be = backends[0];
  const buf = Array.from({ length: 4 }, () => be.alloc([64 << 20], "f32") as CpuTensor);
  for (const [i, t] of buf.entries()) fill(bytesOf(be, t, 256 << 20), "f32", { key: 77 + i, scale: 1, offset: 0 });
  for (let r = 0; r < 11; r++) {
    const t0 = Bun.nanoseconds();
    for (const t of buf) be.streamSum(t);
    if (r > 0) readGBs = Math.max(readGBs, (4 * (256 << 20)) / (Bun.nanoseconds() - t0));
  }
  for (const t of buf) be.free(t);
}

interface Row { n: number; budget: number; pages: number[][]; job: number[][] }
interface BoundsRow { n: number; cold: number[][]; warm: number[][] }
const rows: Row[] = [], boundsRows: BoundsRow[] = [];
const q = Float32Array.from({ length: HEADS * D }, (_, i) => Math.cos(i * 1.3) * 0.3);
const sameBits = (a: Float32Array | Int32Array, b: Float32Array | Int32Array) =>
  Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));

for (const n of tokens) {
  const count = Math.ceil(n / PAGE);
  // Per ISA its own stores (a stage reads its backend's tensors only), the same values.
  const K = backends.map((be) => Array.from({ length: layers }, (_, l) => {
    const t = be.alloc([KV, n, D], "bf16") as CpuTensor;
    fill(bytesOf(be, t, KV * n * D * 2), "bf16", { key: 1000 + l, scale: 1, offset: 0 });
    return t;
  }));
  const V = backends.map((be) => Array.from({ length: layers }, () => be.alloc([KV, n, D], "bf16") as CpuTensor)); // never filled: gathered rows only
  const stages = backends.map((be) => {
    const s = new NativeCpuStage(be, { threads });
    s.prepare({ heads: HEADS, kvHeads: KV, headDim: D, storeCapacity: n, dtype: "bf16" });
    s.query(0).set(q);
    return s;
  });
  // The primitives' summaries, made once (their bits do not depend on the ISA) and bounded by each ISA.
  const pages: PageSummaries[] = K[0].map((k) => {
    const p = pageSummaries(KV, D, n, PAGE);
    stages[0].primitives.summarizePages(storeKeys(k), 0, n, p);
    return p;
  });
  const out = ISA_PAIR.map(() => new Float32Array(KV * count));
  const boundsMs = ISA_PAIR.map(() => [] as number[]);
  for (let r = 0; r < rounds + 1; r++) {
    for (const [i, s] of stages.entries()) {
      pause();
      let ms = 0;
      for (let l = 0; l < layers; l++) {
        const t0 = Bun.nanoseconds();
        s.primitives.pageBounds(q, G, pages[l], count, out[i]);
        ms += (Bun.nanoseconds() - t0) / 1e6;
      }
      if (r > 0) boundsMs[i].push(ms / layers);
    }
    if (r === 0 && !sameBits(out[0], out[1])) throw new Error(`n ${n}: the AVX-512 bounds differ from the AVX2 bounds`);
  }
  const warmMs = stages.map((s, i) => {
    pause();
    s.primitives.pageBounds(q, G, pages[0], count, out[i]);
    return Array.from({ length: rounds }, () => {
      const t0 = Bun.nanoseconds();
      s.primitives.pageBounds(q, G, pages[0], count, out[i]);
      return (Bun.nanoseconds() - t0) / 1e6;
    });
  });
  boundsRows.push({ n, cold: boundsMs, warm: warmMs });
  for (const budget of budgets) {
    const per = ISA_PAIR.map(() => ({ pages: [] as number[], job: [] as number[] }));
    for (let r = 0; r < rounds + 2; r++) { // round 0 makes every layer's summaries, round 1 warms up
      const ids: Int32Array[][] = ISA_PAIR.map(() => []);
      for (const [i, s] of stages.entries()) {
        pause();
        let pg = 0, job = 0;
        for (let l = 0; l < layers; l++) {
          s.submit({ slot: 0, k: K[i][l], v: V[i][l], offloaded: n, kmax: budget, scale: 1 / Math.sqrt(D), work: { kind: "quest", budget, pageSize: PAGE } });
          job += s.wait();
          pg += s.lastSplit().selectMs;
          if (r === 1) ids[i].push(s.output(0).ids.slice(0, KV * budget));
        }
        if (r > 1) {
          per[i].pages.push(pg / layers);
          per[i].job.push(job / layers);
        }
      }
      if (r === 1 && !ids[0].every((a, l) => sameBits(a, ids[1][l]))) throw new Error(`n ${n} K ${budget}: the AVX-512 stage chose other ids than the AVX2 stage`);
    }
    rows.push({ n, budget, pages: per.map((p) => p.pages), job: per.map((p) => p.job) });
  }
  for (const s of stages) s.close();
  for (const [i, be] of backends.entries()) for (const t of [...K[i], ...V[i]]) be.free(t);
}
for (const be of backends) be.close();

console.log(`Quest page bounds, AVX2 → AVX-512: ${HEADS} heads / ${KV} KV heads × ${D} bf16, pages of ${PAGE}, ${threads} stage threads, ${cpus().length} CPUs (${cpus()[0]?.model ?? "?"}), ${layers} layers rotating, median of ${rounds} rounds, ms a layer`);
console.log(`streaming read: ${readGBs.toFixed(1)} GB/s`);
const ratio = (x: number[][]) => `${(median(x[0]) / median(x[1])).toFixed(2)} (${(Math.min(...x[0]) / Math.min(...x[1])).toFixed(2)})`;
console.log("| n | summaries MB | floor ms | bounds avx2 | bounds avx512 | × | avx512 / floor | warm avx2 | warm avx512 | × |");
console.log("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
for (const r of boundsRows) {
  const bytes = KV * Math.ceil(r.n / PAGE) * D * 4, floor = bytes / readGBs / 1e6;
  const over = (x: number[]) => `${(median(x) / floor).toFixed(1)} (${(Math.min(...x) / floor).toFixed(1)})`;
  console.log(`| ${r.n} | ${(bytes / 1e6).toFixed(2)} | ${floor.toFixed(3)} | ${cell(r.cold[0])} | ${cell(r.cold[1])} | ${ratio(r.cold)} | ${over(r.cold[1])} | ${cell(r.warm[0])} | ${cell(r.warm[1])} | ${ratio(r.warm)} |`);
}
console.log("");
console.log("| n | K | pages phase avx2 | pages phase avx512 | × | job avx2 | job avx512 |");
console.log("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
for (const r of rows) console.log(`| ${r.n} | ${r.budget} | ${cell(r.pages[0])} | ${cell(r.pages[1])} | ${ratio(r.pages)} | ${cell(r.job[0])} | ${cell(r.job[1])} |`);
