/**
 * Decode attention on the GPU machine, the split-K kernels + merge against the clustered kernel
 * (DecodeTuning.attnCluster): its checks (device/attn-checks.ts), then µs a layer in a step graph
 * (32 launches on their own K/V, so L2 holds none of it) for attention alone and for the layer's
 * attention part as core runs it (RoPE, the K/V append, attention), then preset:llama-3.1-8b
 * decode (dummy bf16 weights, bf16 KV) with the switch off and on. Usage:
 *   bun attn-bench.js [--contexts 2048,32768] [--steps 32] [--log file] [--skip-model]
 *   bun attn-bench.js --profile   (two eager launches of each kernel at 2K and 32K tokens, for ncu)
 * Lines go to --log as they are made (a timeout keeps what was measured).
 */
import { appendFileSync } from "node:fs";
import { dlopen, FFIType } from "bun:ffi";
import { loadModel, presetConfig, type Tensor } from "@hybridgen/core";
import { createCudaBackend, cudaAvailability, describeCudaAvailability, type DecodeTuning } from "../src/index.js";
import { createNativeRandomFill } from "../../kernels-cpu/src/index.js";
import { clusterAttnChecks } from "./attn-checks.js";
import { dummyFiles, llamaBf16Sizes } from "./models.js";
import { inGraphUs } from "./in-graph.js";
import { writeRepeating } from "./fill.js";
import { arg } from "./args.js";

const logFile = arg("log", "");
const line = (s: string) => {
  console.log(s);
  if (logFile) appendFileSync(logFile, s + "\n");
};

const a = cudaAvailability();
line(describeCudaAvailability(a));
if (!a.available) process.exit(1);
// --profile: a 2 GiB arena (Nsight Compute backs the whole arena up on every replay).
const cuda = createCudaBackend(process.argv.includes("--profile") ? { arenaBytes: 2 ** 32 } : { arenaFraction: 0.92 });
const bw = cuda.copyBandwidth(process.argv.includes("--profile") ? 2 ** 26 : 2 ** 31, 10);
line(`D2D copy bandwidth (read + write): ${(bw / 1e12).toFixed(2)} TB/s`);
{
  // The clustered kernel's blocks a cluster on this GPU (a diagnostic export of the library).
  const lib = dlopen(process.env.HYBRIDGEN_KERNELS_CUDA_LIB ?? "", { hg_cu_attn_cluster_size: { args: [FFIType.i32, FFIType.i32, FFIType.i32], returns: FFIType.i32 } });
  const sizes = [[2, 128, 8], [2, 128, 16], [0, 128, 8], [2, 64, 8]].map(([dt, hd, n]) => `dtype ${dt} d${hd} ${n} clusters: ${lib.symbols.hg_cu_attn_cluster_size(dt, hd, n)}`);
  line(`clustered attention, blocks a cluster: ${sizes.join("; ")}`);
  lib.close();
}

// --profile: only a few eager launches of each kernel (split-K + merge, clustered) at 2K and 32K
// tokens, for Nsight Compute (which flushes the caches before each profiled kernel).
if (process.argv.includes("--profile")) {
  const kvH = 8, hd = 128, nh = 32;
  const q = cuda.alloc([1, nh * hd]), o = cuda.alloc([1, nh * hd]);
  cuda.write(q, Float32Array.from({ length: nh * hd }, (_, i) => Math.sin(i)));
  for (const len of [2048, 32768]) {
    const k = cuda.alloc([kvH, len + 1, hd], "bf16"), v = cuda.alloc([kvH, len + 1, hd], "bf16");
    for (const t of [{ attnMma: 0 }, { attnMma: 0, attnGroup: false }, { attnMma: 0, attnGroup: false, attnCluster: true }, { attnMma: 1 }, { attnMma: 3 }] as Partial<DecodeTuning>[]) {
      cuda.setDecodeTuning(t);
      for (let r = 0; r < 2; r++) cuda.attnCausal(o, q, 1, k, v, 0, len - 1, 0.088);
    }
    cuda.synchronize();
    cuda.free(k);
    cuda.free(v);
  }
  cuda.close();
  process.exit(0);
}

// ---- checks ----
const seed = Number(process.env.HG_TEST_SEED ?? Date.now() % 2 ** 31);
const checks = clusterAttnChecks(cuda, seed);
let failed = 0;
line(`\n## clustered decode attention checks (seed ${seed})`);
for (const r of checks) {
  if (!r.ok) failed++;
  line(`| ${r.ok ? "ok" : "FAIL"} | ${r.name} | ${r.err === 0 ? "0" : r.err.toExponential(2)} | tol ${r.tol} |`);
}
line(`checks: ${checks.length - failed} passed, ${failed} failed`);

// ---- in a step graph: µs a layer ----
const chunk = new Float32Array(1 << 20);
for (let i = 0; i < chunk.length; i++) chunk[i] = Math.sin(i * 12.9898) * 0.5;
const fill = (t: Tensor, n: number) => {
  writeRepeating(cuda, t, chunk, n);
};
const L = 32, reps = 10;
const inGraph = (key: string, body: (l: number) => void): number => inGraphUs(cuda, key, body, L, reps);
const saved = cuda.decodeTuning;
line("\n## in a step graph, 32 launches a step (8B layout: 32/8 heads, d128, bf16 K/V), µs a layer");
// The attention forms compared: the default split-K kernels, the clustered kernel (attnCluster).
const FORMS: [string, Partial<DecodeTuning>][] = [["split-K + merge (default: tensor cores a tile ahead, 3's grid with 4's chunks, programmatic launches)", {}], ["FMA block (attnMma 0)", { attnMma: 0 }], ["split-K, plain launches (attnPdl 0)", { attnPdl: 0 }], ["attention kernels programmatic only (attnPdl 1)", { attnPdl: 1 }], ["FMA block, rows one at a time (attnGroup off)", { attnMma: 0, attnGroup: false }], ["clustered", { attnMma: 0, attnCluster: true }], ["tensor cores, twice the splits (attnMma 2)", { attnMma: 2 }], ["K/V append apart (ropeAppend off)", { ropeAppend: false }], ["tensor cores, no tile ahead (attnMma 1)", { attnMma: 1 }], ["a tile ahead, the grid and chunks of 4 blocks an SM (attnMma 3)", { attnMma: 3 }], ["a tile ahead, one wave of blocks (attnMma 4)", { attnMma: 4 }]];
line(`| what | tokens | ${FORMS.map(([n]) => n).join(" | ")} | K/V bytes at the best time |`);
line(`| --- | --- | ${FORMS.map(() => "---").join(" | ")} | --- |`);
{
  const kvH = 8, hd = 128, nh = 32, width = (nh + 2 * kvH) * hd;
  const qkv = cuda.alloc([1, width]), o = cuda.alloc([1, nh * hd]);
  cuda.write(qkv, chunk.subarray(0, width));
  const q = cuda.view(qkv, 0, [1, nh * hd]), qk = cuda.view(qkv, 0, [1, (nh + kvH) * hd]);
  const kRows = cuda.view(qkv, nh * hd, [kvH, hd]), vRows = cuda.view(qkv, (nh + kvH) * hd, [kvH, hd]);
  for (const len of [2048, 8192, 32768]) {
    const cap = len + 1, pairs = len >= 32768 ? 4 : L;
    const kv = Array.from({ length: 2 * pairs }, () => {
      const t = cuda.alloc([kvH, cap, hd], "bf16");
      fill(t, kvH * cap * hd);
      return t;
    });
    const cosT = cuda.alloc([cap, hd / 2]), sinT = cuda.alloc([cap, hd / 2]);
    const ang = new Float32Array(cap * (hd / 2)).map((_, i) => (i * 0.37) % 6.283);
    cuda.write(cosT, ang.map(Math.cos));
    cuda.write(sinT, ang.map(Math.sin));
    const bytes = 2 * kvH * len * hd * 2;
    const pos = Int32Array.of(len - 1);
    const attnOnly = (l: number) => cuda.attnCausal(o, q, 1, kv[2 * (l % pairs)], kv[2 * (l % pairs) + 1], 0, len - 1, 0.088);
    const layer = (l: number) => {
      const kc = kv[2 * (l % pairs)], vc = kv[2 * (l % pairs) + 1];
      cuda.rope(qk, 1, pos, nh + kvH, hd, cosT, sinT);
      for (let g = 0; g < kvH; g++) {
        cuda.copyRows(kc, g * cap + len - 1, kRows, g, 1);
        cuda.copyRows(vc, g * cap + len - 1, vRows, g, 1);
      }
      cuda.attnCausal(o, q, 1, kc, vc, 0, len - 1, 0.088);
    };
    for (const [name, body] of [["attention", attnOnly], ["RoPE + K/V append + attention", layer]] as const) {
      const us: number[] = [];
      for (const [, t] of FORMS) {
        cuda.setDecodeTuning({ ...saved, ...t });
        cuda.write(qkv, chunk.subarray(0, width));
        us.push(inGraph(`attn-bench-${name}-${len}`, body));
      }
      line(`| ${name} | ${len} | ${us.map((u) => u.toFixed(1)).join(" | ")} | ${(bytes / (Math.min(...us) / 1e6) / 1e12).toFixed(2)} TB/s |`);
    }
    for (const t of [...kv, cosT, sinT]) cuda.free(t);
  }
  cuda.setDecodeTuning(saved);
  for (const t of [q, qk, kRows, vRows, qkv, o]) cuda.free(t);
}

// ---- the 8B model's decode steps, switch off and on ----
if (!process.argv.includes("--skip-model")) {
  const contexts = arg("contexts", "2048,32768").split(",").map(Number);
  const steps = Number(arg("steps", "32"));
  const json = presetConfig("llama-3.1-8b");
  const { vocab, weightBytes, kvBytesPerToken } = llamaBf16Sizes(json);
  const t0 = performance.now();
  using files = dummyFiles(json, "bf16", 1, createNativeRandomFill(), "preset:llama-3.1-8b");
  using model = loadModel(files, cuda, { maxContext: Math.max(...contexts) + 2 * steps + 8, prefillBlock: 8192, kvDtype: "bf16" });
  line(`\nloaded llama-3.1-8b (bf16 dummy weights) in ${((performance.now() - t0) / 1e3).toFixed(1)} s`);
  line("| context | attention | decode ms/token | floor ms | ratio | graphs captured/replayed/drained |");
  line("| --- | --- | --- | --- | --- | --- |");
  for (const ctx of contexts) {
    model.reset();
    const prompt = Int32Array.from({ length: ctx }, (_, i) => (i * 7919 + 13) % vocab);
    model.step(prompt, 0);
    let tok = model.argmaxLogits();
    let pos = ctx;
    for (const [form, t] of [...FORMS, ...FORMS]) {
      cuda.setDecodeTuning({ ...saved, ...t });
      model.step(Int32Array.of(tok), pos++); // warm-up (captures)
      tok = model.argmaxLogits();
      const g0 = cuda.graphStats();
      const t1 = performance.now();
      const n = steps / 2;
      for (let s = 0; s < n; s++) {
        model.step(Int32Array.of(tok), pos++);
        tok = model.argmaxLogits();
      }
      const ms = (performance.now() - t1) / n;
      const g1 = cuda.graphStats();
      const floorMs = ((weightBytes + kvBytesPerToken * pos) / bw) * 1e3;
      line(`| ${ctx} | ${form} | ${ms.toFixed(3)} | ${floorMs.toFixed(2)} | ${(ms / floorMs).toFixed(3)} | ${g1.captures - g0.captures}/${g1.replays - g0.replays}/${g1.drained - g0.drained} |`);
    }
  }
  cuda.setDecodeTuning(saved);
  model.close();
}
cuda.close();
process.exit(failed ? 1 : 0);
