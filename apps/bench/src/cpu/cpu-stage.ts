/**
 * The hybrid CPU stage's speed (./bun apps/bench/src/cpu/cpu-stage.ts [--quick]):
 *
 * 1. Logits calculator throughput in GB/s of K read, for 1K … 256K offloaded tokens × 8 KV heads
 *    × 128 dims (32 query heads, Llama-3.1-8B's layout), f32 and bf16 storage, next to the read
 *    bandwidth of a plain streaming sum over as many bytes. The two are measured in alternating
 *    rounds (ROUNDS, default 7; 3 with --quick) and reported as medians, with the median of the
 *    per-round ratios: on a machine shared with other work the DRAM bandwidth moves by 2x within
 *    a minute, so only side-by-side measurements compare.
 * 2. The full stage (logits + top-K 64 per KV head + V gather) at the same sizes.
 * 3. Overlap: the stage on its own thread while JS drives "device" work on the backend's pool:
 *    how much of the stage's time the device work hides.
 */
import type { CpuStageJob, DType, Tensor } from "@hybridgen/spec";
import { cpus } from "node:os";
import { createCpuBackend, NativeCpuStage } from "@hybridgen/kernels-cpu";
import { bestSeconds, filledTensor } from "./measure.js";

const quick = process.argv.includes("--quick");
const threads = Number(process.env.HYBRIDGEN_THREADS ?? cpus().length);
const KV = 8, HEADS = 32, D = 128;
const SIZES = quick ? [1024, 16384, 65536] : [1024, 4096, 16384, 65536, 262144];
const ROUNDS = Number(process.env.ROUNDS ?? (quick ? 3 : 7));
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];

function time(fn: () => void, budget = quick ? 0.1 : 0.4): number {
  return bestSeconds(fn, budget, 2);
}

const be = createCpuBackend({ threads });
function filled(shape: number[], dtype: DType): Tensor {
  return filledTensor(be, shape, dtype, 0.37);
}

function table(title: string, head: string[], rows: string[][]): void {
  const w = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  console.log(`\n${title}`);
  console.log(head.map((h, i) => h.padStart(w[i])).join("  "));
  for (const r of rows) console.log(r.map((c, i) => c.padStart(w[i])).join("  "));
}

const fmtN = (n: number) => (n >= 1024 ? `${n / 1024}K` : `${n}`);
const stageRows: string[][] = [], fullRows: string[][] = [];
const overlapRows: string[][] = [];

for (const dtype of ["f32", "bf16"] as DType[]) {
  for (const n of SIZES) {
    const bytes = KV * n * D * (dtype === "f32" ? 4 : 2);
    const K = filled([KV, n, D], dtype), V = filled([KV, n, D], dtype);
    const stage = new NativeCpuStage(be, { threads });
    stage.prepare({ heads: HEADS, kvHeads: KV, headDim: D, storeCapacity: n, dtype });
    stage.query(0).set(Float32Array.from({ length: HEADS * D }, (_, i) => Math.cos(i) * 0.1));
    const job = (work: CpuStageJob["work"], kmax: number): CpuStageJob => ({ slot: 0, k: K, v: V, offloaded: n, kmax, scale: 1 / Math.sqrt(D), work });
    const score = job({ kind: "score" }, 0), full = job({ kind: "topk", budget: 64, shared: false }, 64);
    const run = (j: CpuStageJob) => { stage.submit(j); stage.wait(); };
    const sum = filled([bytes / 4], "f32"); // same byte count, streamed as floats (written: untouched pages would all map the zero page)
    const scoreGBs: number[] = [], streamGBs: number[] = [], ratios: number[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      const a = bytes / time(() => run(score), 0.1) / 1e9, b = bytes / time(() => be.streamSum(sum), 0.1) / 1e9;
      scoreGBs.push(a);
      streamGBs.push(b);
      ratios.push(a / b);
    }
    be.free(sum);
    const tFull = time(() => run(full));
    const gbs = median(scoreGBs), stream = median(streamGBs), tScore = bytes / gbs / 1e9;
    stageRows.push([fmtN(n), dtype, (bytes / 2 ** 20).toFixed(0), (tScore * 1e3).toFixed(3), gbs.toFixed(1), stream.toFixed(1),
      `${Math.round(median(ratios) * 100)}%`, `${Math.round(Math.min(...ratios) * 100)}–${Math.round(Math.max(...ratios) * 100)}%`]);
    fullRows.push([fmtN(n), dtype, (tFull * 1e3).toFixed(3), (bytes / tFull / 1e9).toFixed(1)]);

    if (n === 65536) {
      // Overlap: a 1-thread stage scores while JS drives matmuls on a 1-thread backend (the
      // "device" stage), sized to take about as long; on 2 cores each side has its own core.
      const dev = createCpuBackend({ threads: 1 });
      const one = new NativeCpuStage(be, { threads: 1 });
      one.prepare({ heads: HEADS, kvHeads: KV, headDim: D, storeCapacity: n, dtype });
      one.query(0).set(stage.query(0));
      const run1 = () => { one.submit(score); one.wait(); };
      const x = dev.alloc([1, 2048]), w = dev.alloc([2048, 2048], "bf16"), y = dev.alloc([1, 2048]);
      const tStage = time(run1);
      const tMat = time(() => dev.matmul(y, x, w, 1));
      const reps = Math.max(1, Math.round(tStage / tMat));
      const device = () => { for (let i = 0; i < reps; i++) dev.matmul(y, x, w, 1); };
      // A compute-bound "device" (JS arithmetic in registers) for contrast: the GEMV above
      // streams memory like the stage does, and one core nearly saturates this VM's DRAM.
      let sink = 0;
      const tSpin = time(() => { let a = 0; for (let i = 0; i < 1e5; i++) a += Math.sqrt(i); sink += a; });
      const spinReps = Math.max(1, Math.round(tStage / tSpin));
      const compute = () => { let a = 0; for (let i = 0; i < 1e5 * spinReps; i++) a += Math.sqrt(i); sink += a; };
      for (const [label, fn] of [["GEMV (memory)", device], ["JS math (compute)", compute]] as const) {
        const tD = time(fn);
        const tBoth = time(() => { one.submit(score); fn(); one.wait(); });
        const hidden = Math.max(0, Math.min(1, (tStage + tD - tBoth) / Math.min(tStage, tD)));
        overlapRows.push([fmtN(n), dtype, label, (tStage * 1e3).toFixed(3), (tD * 1e3).toFixed(3), (tBoth * 1e3).toFixed(3),
          ((tStage + tD) * 1e3).toFixed(3), `${Math.round(hidden * 100)}%`]);
      }
      if (sink === 42) console.log("");
      one.close();
      for (const t of [x, w, y]) dev.free(t);
      dev.close();
    }
    stage.close();
    be.free(K);
    be.free(V);
  }
}

console.log(`CPU stage on ${threads} cores (${be.isa}); ${KV} KV heads × ${D} dims, ${HEADS} query heads; stage threads = ${threads}`);
table(`logits calculator (q·Kᵀ over all offloaded K) vs a streaming sum over as many bytes: medians of ${ROUNDS} alternating rounds`,
  ["tokens", "dtype", "K MiB", "ms", "GB/s", "stream GB/s", "of stream", "range"], stageRows);
table("full stage: logits + top-64 per KV head + V gather (GB/s of K read)", ["tokens", "dtype", "ms", "GB/s"], fullRows);
table("overlap: 1-thread stage while JS drives 1-thread backend matmuls; hidden = (stage + device − both) / min(stage, device)",
  ["tokens", "dtype", "device work", "stage ms", "device ms", "both ms", "serial ms", "hidden"], overlapRows);
be.close();
