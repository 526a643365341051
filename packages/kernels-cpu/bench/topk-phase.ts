/**
 * The CPU stage's top-K phase, the earlier kernel against the fused one, on Llama-3.1-8B's
 * offloaded store (32 query heads over 8 KV heads × 128 dims, bf16 K of random values), one
 * top-K job per layer with `layers` stores rotating as a decode step's layers do:
 *   bun bench/topk-phase.ts [--tokens 28672,126928] [--budgets 256,1024] [--threads N] [--layers 4] [--rounds 7] [--shared]
 * "legacy" (NativeCpuStage topkKernel "legacy") takes each token's group max in a pass over the
 * [32, n] f32 logits inside the top-K phase, then selects a list per thread; "fused" takes the group
 * max inside the scoring pass and selects all lists in one pass over the pool. Each round runs the
 * layers back to back on one kernel, then on the other (a pause between, so neither pool's spinning
 * workers take the cores of the other); the table gives medians over rounds of the per-layer mean,
 * and checks both chose the same ids. Floors: the bytes the earlier kernel's group-max pass reads
 * (heads × n × 4), and those the fused top-K phase reads (the group-max rows, KV heads × n × 4),
 * over the host's streaming read bandwidth (a sum over buffers larger than any cache, on the
 * stage's thread count, best of 10 passes).
 */
import { cpus } from "node:os";
import { toArrayBuffer } from "bun:ffi";
import type { Tensor } from "@hybridgen/core";
import { createCpuBackend, createNativeRandomFill, NativeCpuStage } from "../src/index.js";

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : dflt;
}
const tokens = arg("tokens", "28672,126928").split(",").map(Number);
const budgets = arg("budgets", "256,1024").split(",").map(Number);
const threads = Number(arg("threads", String(cpus().length)));
const layers = Number(arg("layers", "4"));
const rounds = Number(arg("rounds", "7"));
const shared = process.argv.includes("--shared");
const HEADS = 32, KV = 8, D = 128;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
const sleep = (ms: number) => Bun.sleepSync(ms);

using be = createCpuBackend({ threads });
const fill = createNativeRandomFill(threads);
const bytesOf = (t: Tensor, bytes: number) => new Uint8Array(toArrayBuffer(be.address(t), 0, bytes));

// The host's streaming read bandwidth: sums over 4 buffers of 256 MB, best of 10 passes.
let readGBs = 0;
{
  const buf = Array.from({ length: 4 }, () => be.alloc([64 << 20], "f32"));
  for (const [i, t] of buf.entries()) fill(bytesOf(t, 256 << 20), "f32", { key: 77 + i, scale: 1, offset: 0 });
  for (let r = 0; r < 11; r++) {
    const t0 = Bun.nanoseconds();
    for (const t of buf) be.streamSum(t);
    if (r > 0) readGBs = Math.max(readGBs, (4 * (256 << 20)) / (Bun.nanoseconds() - t0));
  }
  for (const t of buf) be.free(t);
}

interface Row { n: number; budget: number; score: [number, number]; topk: [number, number]; job: [number, number]; same: boolean }
const rows: Row[] = [];
const q = Float32Array.from({ length: HEADS * D }, (_, i) => Math.cos(i * 1.3) * 0.3);

for (const n of tokens) {
  const K: Tensor[] = [], V: Tensor[] = [];
  for (let l = 0; l < layers; l++) {
    K.push(be.alloc([KV, n, D], "bf16"));
    V.push(be.alloc([KV, n, D], "bf16"));
    fill(bytesOf(K[l], KV * n * D * 2), "bf16", { key: 1000 + l, scale: 1, offset: 0 });
  }
  const stages = (["legacy", "fused"] as const).map((topkKernel) => {
    const s = new NativeCpuStage(be, { threads, topkKernel });
    s.prepare({ heads: HEADS, kvHeads: KV, headDim: D, storeCapacity: n, dtype: "bf16" });
    s.query(0).set(q);
    return s;
  });
  for (const budget of budgets) {
    const per = stages.map(() => ({ score: [] as number[], topk: [] as number[], job: [] as number[] }));
    let same = true;
    for (let r = 0; r < rounds + 1; r++) {
      const ids: Int32Array[][] = [[], []];
      for (const [si, s] of stages.entries()) {
        sleep(5);
        let score = 0, topk = 0, job = 0;
        for (let l = 0; l < layers; l++) {
          s.submit({ slot: 0, k: K[l], v: V[l], offloaded: n, kmax: budget, scale: 1 / Math.sqrt(D), work: { kind: "topk", budget, shared } });
          job += s.wait();
          const sp = s.lastSplit();
          score += sp.scoreMs;
          topk += sp.selectMs;
          if (r === 0) ids[si].push(s.output(0).ids.slice(0, KV * budget));
        }
        if (r > 0) { // round 0 warms up
          per[si].score.push(score / layers);
          per[si].topk.push(topk / layers);
          per[si].job.push(job / layers);
        }
      }
      if (r === 0) same = ids[0].every((a, l) => a.every((x, i) => x === ids[1][l][i]));
    }
    const pick = (f: (p: (typeof per)[number]) => number[]) => per.map((p) => median(f(p))) as [number, number];
    rows.push({ n, budget, score: pick((p) => p.score), topk: pick((p) => p.topk), job: pick((p) => p.job), same });
  }
  for (const s of stages) s.close();
  for (const t of [...K, ...V]) be.free(t);
}

console.log(`CPU stage top-K phase: ${HEADS} heads / ${KV} KV heads × ${D} bf16, ${shared ? "one shared list" : "a list per KV head"}, ${threads} stage threads, ${cpus().length} CPUs (${cpus()[0]?.model ?? "?"}), ${layers} layers rotating, median of ${rounds} rounds`);
console.log(`streaming read: ${readGBs.toFixed(1)} GB/s`);
console.log("| n | budget | threads | top-K ms, legacy | top-K ms, fused | speed-up | legacy group-max read: MB, floor ms | fused top-K read: MB, floor ms | score ms, legacy → fused | job ms, legacy → fused | same ids |");
console.log("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
for (const r of rows) {
  const logits = HEADS * r.n * 4, gm = KV * r.n * 4, floor = (bytes: number) => `${(bytes / 1e6).toFixed(2)}, ${(bytes / readGBs / 1e6).toFixed(3)}`;
  console.log(`| ${r.n} | ${r.budget} | ${threads} | ${r.topk[0].toFixed(3)} | ${r.topk[1].toFixed(3)} | ${(r.topk[0] / r.topk[1]).toFixed(1)}× | ${floor(logits)} | ${floor(gm)} | ${r.score[0].toFixed(3)} → ${r.score[1].toFixed(3)} | ${r.job[0].toFixed(3)} → ${r.job[1].toFixed(3)} | ${r.same ? "yes" : "NO"} |`);
}
if (rows.some((r) => !r.same)) process.exit(1);
