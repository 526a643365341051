/**
 * The CPU stage's top-K phase against the floor of its read, on Llama-3.1-8B's offloaded store
 * (32 query heads over 8 KV heads × 128 dims, bf16 K of random values), one top-K job per layer
 * with `layers` stores rotating as a decode step's layers do:
 *   ./bun apps/bench/src/cpu/topk-phase.ts [--tokens 28672,126928] [--budgets 256,1024] [--threads N] [--layers 4] [--rounds 7] [--shared]
 * The scoring pass takes each token's group max as it writes the logits, so the top-K phase reads
 * only the group-max rows (KV heads × n × 4 bytes); the floor is that read at the host's streaming
 * read bandwidth (a sum over buffers larger than any cache, on the stage's thread count, best of 10
 * passes). Medians over rounds of the per-layer mean; the score and whole-job times beside it.
 */
import { cpus } from "node:os";
import { toArrayBuffer } from "bun:ffi";
import type { Tensor } from "@hybridgen/core";
import { createCpuBackend, createNativeRandomFill, NativeCpuStage } from "@hybridgen/kernels-cpu";

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

interface Row { n: number; budget: number; score: number; topk: number; job: number }
const rows: Row[] = [];
const q = Float32Array.from({ length: HEADS * D }, (_, i) => Math.cos(i * 1.3) * 0.3);

for (const n of tokens) {
  using stage = new NativeCpuStage(be, { threads });
  stage.prepare({ heads: HEADS, kvHeads: KV, headDim: D, storeCapacity: n, dtype: "bf16" });
  stage.query(0).set(q);
  const K: Tensor[] = [], V: Tensor[] = [];
  for (let l = 0; l < layers; l++) {
    K.push(be.alloc([KV, n, D], "bf16"));
    V.push(be.alloc([KV, n, D], "bf16"));
    fill(bytesOf(K[l], KV * n * D * 2), "bf16", { key: 1000 + l, scale: 1, offset: 0 });
  }
  for (const budget of budgets) {
    const per = { score: [] as number[], topk: [] as number[], job: [] as number[] };
    for (let r = 0; r < rounds + 1; r++) {
      let score = 0, topk = 0, job = 0;
      for (let l = 0; l < layers; l++) {
        stage.submit({ slot: 0, k: K[l], v: V[l], offloaded: n, kmax: budget, scale: 1 / Math.sqrt(D), work: { kind: "topk", budget, shared } });
        job += stage.wait();
        const sp = stage.lastSplit();
        score += sp.scoreMs;
        topk += sp.selectMs;
      }
      if (r > 0) { // round 0 warms up
        per.score.push(score / layers);
        per.topk.push(topk / layers);
        per.job.push(job / layers);
      }
    }
    rows.push({ n, budget, score: median(per.score), topk: median(per.topk), job: median(per.job) });
  }
  for (const t of [...K, ...V]) be.free(t);
}

console.log(`CPU stage top-K phase: ${HEADS} heads / ${KV} KV heads × ${D} bf16, ${shared ? "one shared list" : "a list per KV head"}, ${threads} stage threads, ${cpus().length} CPUs (${cpus()[0]?.model ?? "?"}), ${layers} layers rotating, median of ${rounds} rounds`);
console.log(`streaming read: ${readGBs.toFixed(1)} GB/s`);
console.log("| n | budget | threads | top-K ms | group-max read MB | floor ms | top-K / floor | score ms | job ms |");
console.log("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
for (const r of rows) {
  const bytes = KV * r.n * 4, floor = bytes / readGBs / 1e6;
  console.log(`| ${r.n} | ${r.budget} | ${threads} | ${r.topk.toFixed(3)} | ${(bytes / 1e6).toFixed(2)} | ${floor.toFixed(3)} | ${(r.topk / floor).toFixed(1)}× | ${r.score.toFixed(3)} | ${r.job.toFixed(3)} |`);
}
