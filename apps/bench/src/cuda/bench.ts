/**
 * Decode and prefill speed of the CUDA backend on preset:llama-3.1-8b with dummy bf16 weights
 * (batch 1), next to the floor measured in the same run: (weight bytes + KV bytes read per
 * step) ÷ device-to-device copy bandwidth. Prints one table. Usage:
 *   bun bench.js [--contexts 2048,8192,32768] [--steps 32] [--preset llama-3.1-8b] [--prefill-block 8192]
 *                [--diag off] [--variants 2,3]  (skip the kernel diagnostics; run only those first-context variants)
 *                [--variant-contexts all]  (run the variants at every context, not only the first)
 * The first context runs in several variants (graphs off, no fusions, the host round trip, an
 * sm_80 plan's one-warp GEMV); the rest: the defaults.
 */
import { dummyModelFiles, loadModel, presetConfig, type Backend, type MatvecFusion } from "@hybridgen/core";
import { CudaBackend, createCudaBackend, describeCudaAvailability, cudaAvailability } from "@hybridgen/kernels-cuda";
import { createNativeRandomFill } from "@hybridgen/kernels-cpu";
import { llamaBf16Sizes } from "../models.js";
import { inGraphUs } from "./in-graph.js";
import { writeRepeating } from "./fill.js";
import { layerGemvs } from "./layer-gemvs.js";
import { arg } from "../args.js";
import { cudaLab, DEFAULT_MATVEC_FUSION } from "@hybridgen/kernels-cuda/lab";

const contexts = arg("contexts", "2048,8192,32768").split(",").map(Number);
const prefillBlock = Number(arg("prefill-block", "8192"));
const steps = Number(arg("steps", "32"));
const preset = arg("preset", "llama-3.1-8b");

/** Counts the Backend calls of a region (how many launches a decode step makes from JS). */
function counting(be: Backend): { backend: Backend; calls: () => number; reset: () => void } {
  let n = 0;
  const backend = new Proxy(be, {
    get(target, prop, recv) {
      const v = Reflect.get(target, prop, recv);
      if (typeof v !== "function") return v;
      return (...args: unknown[]) => {
        n++;
        return (v as (...a: unknown[]) => unknown).apply(target, args);
      };
    },
  });
  return { backend, calls: () => n, reset: () => { n = 0; } };
}

const a = cudaAvailability();
console.log(describeCudaAvailability(a));
if (!a.available) process.exit(1);
const cuda = createCudaBackend({ arenaFraction: 0.92 });
const bw = cuda.copyBandwidth(2 ** 31, 10);
console.log(`D2D copy bandwidth (read + write): ${(bw / 1e12).toFixed(2)} TB/s; cuBLAS ${cuda.cublas}`);

// ---- diagnostics: GEMV bandwidth on the 8B shapes, and the host cost of one op from JS ----
const diag: string[] = ["| what | result |", "| --- | --- |"];
if (arg("diag", "on") !== "off") {
  const chunk = new Float32Array(1 << 20);
  for (let i = 0; i < chunk.length; i++) chunk[i] = Math.sin(i * 12.9898) * 0.05;
  for (const [m, k] of [[6144, 4096], [4096, 4096], [28672, 4096], [4096, 14336], [128256, 4096]]) {
    const w = cuda.alloc([m, k], "bf16");
    writeRepeating(cuda, w, chunk, m * k);
    const x = cuda.alloc([1, k]), o = cuda.alloc([1, m]);
    cuda.write(x, chunk.subarray(0, k));
    cuda.matmul(o, x, w, 1);
    using t = cuda.timer();
    const reps = 30;
    t.mark();
    for (let r = 0; r < reps; r++) cuda.matmul(o, x, w, 1);
    t.mark();
    const ms = t.ms() / reps;
    diag.push(`| GEMV bf16 ${m}x${k} | ${(ms * 1e3).toFixed(1)} µs, ${((m * k * 2) / (ms / 1e3) / 1e12).toFixed(2)} TB/s |`);
    for (const tt of [w, x, o]) cuda.free(tt);
  }
  // The fused decode GEMVs (Backend.matvec) on the 8B shapes, as a decode step calls them.
  const xk = cuda.alloc([1, 14336]), nwv = cuda.alloc([4096], "bf16");
  cuda.write(xk, chunk.subarray(0, 14336));
  cuda.write(nwv, chunk.subarray(0, 4096).map((a) => 1 + a));
  const x4 = cuda.view(xk, 0, [1, 4096]);
  for (const [name, m, k, f] of [
    ["norm + qkv", 6144, 4096, { normWeight: nwv, normEps: 1e-5 }], ["o_proj, x +=", 4096, 4096, { accumulate: true }],
    ["norm + gate/up, SiLU·up", 28672, 4096, { normWeight: nwv, normEps: 1e-5, siluMul: true }], ["down_proj, x +=", 4096, 14336, { accumulate: true }],
    ["norm + lm_head", 128256, 4096, { normWeight: nwv, normEps: 1e-5 }],
  ] as [string, number, number, MatvecFusion][]) {
    const w = cuda.alloc([m, k], "bf16");
    writeRepeating(cuda, w, chunk, m * k);
    const o = cuda.alloc([1, f.siluMul ? m / 2 : m]);
    const xin = k === 4096 ? x4 : xk;
    cuda.matvec(o, xin, w, f);
    using t = cuda.timer();
    const reps = 30;
    t.mark();
    for (let r = 0; r < reps; r++) cuda.matvec(o, xin, w, f);
    t.mark();
    const ms = t.ms() / reps;
    diag.push(`| matvec bf16 ${m}x${k} (${name}; default fusion choice) | ${(ms * 1e3).toFixed(1)} µs, ${((m * k * 2) / (ms / 1e3) / 1e12).toFixed(2)} TB/s |`);
    for (const tt of [w, o]) cuda.free(tt);
  }
  // Decode attention of one row over 2K and 32K cached tokens (8B layout, one layer): split-K vs the stages.
  {
    const cap = 32768 + 1, kvH = 8, hdim = 128, nh = 32;
    const kc = cuda.alloc([kvH, cap, hdim], "bf16"), vc = cuda.alloc([kvH, cap, hdim], "bf16");
    for (const t of [kc, vc]) writeRepeating(cuda, t, chunk, kvH * cap * hdim);
    const q = cuda.alloc([1, nh * hdim]), o = cuda.alloc([1, nh * hdim]), sc = cuda.alloc([nh, cap]);
    cuda.write(q, chunk.subarray(0, nh * hdim));
    for (const len of [2048, 32768]) {
      const reps = 30;
      const time = (f: () => void) => {
        f();
        using t = cuda.timer();
        t.mark();
        for (let r = 0; r < reps; r++) f();
        t.mark();
        return t.ms() / reps;
      };
      const split = time(() => cuda.attnCausal(o, q, 1, kc, vc, 0, len - 1, 0.088));
      const stages = time(() => {
        cuda.attnLogits(sc, 0, q, 0, kc, 0, len, 0.088);
        cuda.softmax(sc, nh, len);
        cuda.attnAggregate(o, 0, sc, 0, vc, 0, len, false);
      });
      const kvB = 2 * kvH * len * hdim * 2;
      diag.push(`| decode attention, ${len} tokens, 32/8 heads d128 bf16 | split-K ${(split * 1e3).toFixed(1)} µs (${(kvB / (split / 1e3) / 1e12).toFixed(2)} TB/s), stages ${(stages * 1e3).toFixed(1)} µs (${(kvB / (stages / 1e3) / 1e12).toFixed(2)} TB/s) |`);
    }
    for (const t of [kc, vc, q, o, sc]) cuda.free(t);
  }
  // The decode kernels as a step graph runs them: 32 launches (one per layer, each on its own
  // weights or K/V, so L2 holds none of it) recorded and replayed; µs per launch including the
  // boundary to the next one, as this device's plan picks the kernels and as an sm_80 plan would.
  {
    const tunings: [string, number | null][] = [["this device's plan", null], ["sm_80 plan (one-warp GEMV)", Math.min(8, cuda.device.major)]];
    const L = 32, reps = 10;
    const inGraph = (key: string, body: (l: number) => void): number => inGraphUs(cuda, key, body, L, reps);
    const cells = (name: string, bytes: number, body: (l: number) => void) => {
      const out: string[] = [];
      for (const [tn, tu] of tunings) {
        cudaLab(cuda).setPlanMajor(tu);
        const us = inGraph(`diag-${name}`, body);
        out.push(`${tn} ${us.toFixed(1)} µs (${(bytes / (us / 1e6) / 1e12).toFixed(2)} TB/s)`);
      }
      diag.push(`| in a step graph, ${L} launches: ${name} | ${out.join("; ")} |`);
    };
    const xg = cuda.alloc([1, 14336]), yg = cuda.alloc([1, 28672]);
    cuda.write(xg, chunk.subarray(0, 14336));
    const xg4 = cuda.view(xg, 0, [1, 4096]);
    for (const [name, m, k, f] of [
      ["qkv 6144x4096", 6144, 4096, {}], ["o_proj 4096x4096, x +=", 4096, 4096, { accumulate: true }],
      ["gate/up 28672x4096, SiLU·up", 28672, 4096, { siluMul: true }], ["down 4096x14336, x +=", 4096, 14336, { accumulate: true }],
    ] as [string, number, number, MatvecFusion][]) {
      const ws = Array.from({ length: L }, () => {
        const w = cuda.alloc([m, k], "bf16");
        writeRepeating(cuda, w, chunk, m * k);
        return w;
      });
      const o = cuda.view(yg, 0, [1, f.siluMul ? m / 2 : m]);
      const xin = k === 4096 ? xg4 : xg;
      cells(`matvec ${name}`, m * k * 2, (l) => cuda.matvec(o, xin, ws[l], f));
      for (const w of ws) cuda.free(w);
      cuda.free(o);
    }
    {
      // A layer's four GEMVs as a decode step records them (o +=, norm + gate/up SiLU·up, down +=,
      // the next layer's norm + qkv): four launches (the weight stream takes the norms). 8 layers'
      // weights (3.5 GB) in turn.
      const layer = layerGemvs(cuda, chunk, 8);
      const out: string[] = [];
      const savedFuse = cudaLab(cuda).matvecFusion();
      for (const [tn, tu] of tunings) {
        cudaLab(cuda).setPlanMajor(tu);
        cudaLab(cuda).setMatvecFusion(DEFAULT_MATVEC_FUSION);
        const us = inGraph("diag-layer-gemvs", (l) => layer.run(l));
        out.push(`${tn} ${us.toFixed(1)} µs (${(layer.bytes / (us / 1e6) / 1e12).toFixed(2)} TB/s)`);
      }
      cudaLab(cuda).setMatvecFusion(savedFuse);
      diag.push(`| in a step graph, ${L} layers: o_proj +=, norm + gate/up, down +=, norm + qkv (${(layer.bytes / 1e6).toFixed(0)} MB a layer) | ${out.join("; ")} |`);
      layer.free();
    }
    {
      const kvH = 8, hdim = 128, nh = 32, len = 2048, cap = len + 1;
      const kv = Array.from({ length: 2 * L }, () => {
        const t = cuda.alloc([kvH, cap, hdim], "bf16");
        writeRepeating(cuda, t, chunk, kvH * cap * hdim);
        return t;
      });
      const q = cuda.alloc([1, nh * hdim]), o = cuda.alloc([1, nh * hdim]);
      cuda.write(q, chunk.subarray(0, nh * hdim));
      cells(`decode attention 2048 tokens (split-K + merge)`, 2 * kvH * len * hdim * 2, (l) => cuda.attnCausal(o, q, 1, kv[2 * l], kv[2 * l + 1], 0, len - 1, 0.088));
      {
        // 32K tokens: 4 caches of 67 MB each reused in turn (134 MB a launch: L2 holds none of it)
        const long = 32768;
        const kvl = Array.from({ length: 8 }, () => {
          const t = cuda.alloc([kvH, long, hdim], "bf16");
          writeRepeating(cuda, t, chunk, kvH * long * hdim);
          return t;
        });
        cells(`decode attention 32768 tokens`, 2 * kvH * long * hdim * 2, (l) => cuda.attnCausal(o, q, 1, kvl[2 * (l % 4)], kvl[2 * (l % 4) + 1], 0, long - 1, 0.088));
        for (const t of kvl) cuda.free(t);
      }
      const nw = cuda.alloc([4096], "bf16");
      cuda.write(nw, chunk.subarray(0, 4096).map((a) => 1 + a));
      cells(`rmsNorm 4096`, 4096 * 8, () => cuda.rmsNorm(o, xg4, nw, 1, 1e-5));
      for (const t of [...kv, q, o, nw]) cuda.free(t);
    }
    cudaLab(cuda).setPlanMajor(null);
    for (const t of [xg4, xg, yg]) cuda.free(t);
  }
  cuda.free(x4);
  cuda.free(xk);
  cuda.free(nwv);
  const x = cuda.alloc([1, 4096]);
  cuda.synchronize();
  const n = 5000;
  let t1 = performance.now();
  for (let i = 0; i < n; i++) cuda.add(x, x, x, 1);
  cuda.synchronize();
  diag.push(`| add of 4096 floats from JS, ${n}x | ${(((performance.now() - t1) / n) * 1e3).toFixed(2)} µs per op |`);
  const y = cuda.alloc([64, 128], "bf16"), z = cuda.alloc([64, 128]);
  for (const on of [true, false]) {
    cudaLab(cuda).setBatchCopies(on);
    cuda.synchronize();
    t1 = performance.now();
    for (let i = 0; i < n; i++) {
      cuda.copyRows(y, i % 64, z, (i * 7) % 64, 1);
      if (i % 16 === 15) cuda.add(x, x, x, 1);
    }
    cuda.synchronize();
    diag.push(`| copyRows of one bf16 row (batched ${on}), ${n}x, an add every 16 | ${(((performance.now() - t1) / n) * 1e3).toFixed(2)} µs per copy |`);
  }
  cudaLab(cuda).setBatchCopies(true);
  for (const tt of [x, y, z]) cuda.free(tt);
}
for (const r of diag) console.log(r);

const json = presetConfig(preset);
const { hidden, layers, heads, kvHeads, inter, vocab, hd, weightBytes, kvBytesPerToken } = llamaBf16Sizes(json);

const maxContext = Math.max(...contexts) + steps + 1;
const counter = counting(cuda);
let t0 = performance.now();
using files = dummyModelFiles(json, "bf16", 1, createNativeRandomFill(), `preset:${preset}`);
using model = loadModel(files, counter.backend, { maxContext, prefillBlock, kvDtype: "bf16" });
console.log(`loaded ${preset} (bf16 dummy weights, ${(weightBytes / 1e9).toFixed(2)} GB read per step) in ${((performance.now() - t0) / 1e3).toFixed(1)} s; arena used ${(cuda.memory().usedBytes / 1e9).toFixed(1)} GB`);

/** Hides a Backend method from core (an own property shadowing the class's), or restores it. */
function hide(name: "matvec" | "attnCausal", hidden: boolean): void {
  if (hidden) Object.defineProperty(cuda, name, { value: undefined, configurable: true, writable: true });
  else delete (cuda as unknown as Record<string, unknown>)[name];
}
interface Variant { name: string; graphs: boolean; matvec: boolean; splitK: boolean; planMajor?: number; fed?: boolean }
const ALL: Variant = {
  name: `default (the kernels planned for sm_${cuda.device.major}x, split-K attention, fed on the device as generate runs it)`,
  graphs: true, matvec: true, splitK: true, fed: true,
};
// The default against: core's fast paths off (matvec, split-K attention), graphs off, the host round
// trip per token, and the one-warp GEMV an sm_80 plan picks.
const allVariants: Variant[] = [
  { name: "no fusions (core's matvec and split-K attention off)", graphs: true, matvec: false, splitK: false },
  { name: "default, graphs off", graphs: false, matvec: true, splitK: true },
  { name: "default, host round trip per token (step, then argmax read back)", graphs: true, matvec: true, splitK: true },
  { name: "one-warp GEMV (an sm_80 plan), fed on the device", graphs: true, matvec: true, splitK: true, planMajor: Math.min(8, cuda.device.major), fed: true },
];
// --variants 2,3: only those (indices into allVariants); the default is always run last.
const picked = arg("variants", "");
const variants: Variant[] = [...(picked ? picked.split(",").map((i) => allVariants[Number(i)]) : allVariants).filter((v): v is Variant => v !== undefined), ALL];

const rows: string[] = ["| context | variant | prefill s | prefill tok/s | decode ms/token | floor ms | ratio | host ms in step() | backend calls/step | graphs captured/replayed/drained | arena peak GB |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"];
for (const [ctx, v] of contexts.flatMap((c, i) => (i === 0 || arg("variant-contexts", "first") === "all" ? variants.map((x) => [c, x]) : [[c, ALL]])) as [number, Variant][]) {
  const graphs = v.graphs;
  cudaLab(cuda).setCudaGraphs(graphs);
  hide("matvec", !v.matvec);
  cudaLab(cuda).setMatvecFusion(DEFAULT_MATVEC_FUSION);
  cudaLab(cuda).setPlanMajor(v.planMajor ?? null);
  hide("attnCausal", false); // prefill always through attnCausal
  model.reset();
  const prompt = Int32Array.from({ length: ctx }, (_, i) => (i * 7919 + 13) % vocab);
  t0 = performance.now();
  model.step(prompt, 0);
  let tok = model.argmaxLogits(); // waits for the prefill
  const prefillS = (performance.now() - t0) / 1e3;
  hide("attnCausal", !v.splitK); // decode steps: split-K kernel, or the logits/softmax/aggregate stages
  // warm-up step, then the timed steps (argmax waits for each step's last kernel). Fed on the
  // device: step s embeds the device's pick s and is launched before the host reads token s.
  if (v.fed) {
    model.pickToFeed(0);
    model.stepFed(ctx);
    model.pickToFeed(1);
    tok = model.fedToken(0);
  } else {
    model.step(Int32Array.of(tok), ctx);
    tok = model.argmaxLogits();
  }
  counter.reset();
  const g0 = cudaLab(cuda).graphStats();
  t0 = performance.now();
  let hostMs = 0; // time in step(): recording the step and launching its graph (the GPU waits for it unless fed)
  for (let s = 1; s < steps; s++) {
    const th = performance.now();
    if (v.fed) model.stepFed(ctx + s);
    else model.step(Int32Array.of(tok), ctx + s);
    hostMs += performance.now() - th;
    if (v.fed) {
      model.pickToFeed((s + 1) & 1);
      tok = model.fedToken(s & 1);
    } else {
      tok = model.argmaxLogits();
    }
  }
  const ms = (performance.now() - t0) / (steps - 1);
  hostMs /= steps - 1;
  const calls = counter.calls() / (steps - 1);
  const g1 = cudaLab(cuda).graphStats();
  const gs = `${g1.captures - g0.captures}/${g1.replays - g0.replays}/${g1.drained - g0.drained} ${g1.lastDrain}`;
  // bw counts bytes read + written by a copy: the memory's throughput, which a read-only step can use whole.
  const floorMs = ((weightBytes + kvBytesPerToken * (ctx + steps / 2)) / bw) * 1e3;
  rows.push(`| ${ctx} | ${v.name} | ${prefillS.toFixed(2)} | ${(ctx / prefillS).toFixed(0)} | ${ms.toFixed(3)} | ${floorMs.toFixed(3)} | ${(ms / floorMs).toFixed(3)} | ${hostMs.toFixed(3)} | ${calls.toFixed(0)} | ${gs} | ${(cuda.memory().peakBytes / 1e9).toFixed(1)} |`);
  console.log(rows[rows.length - 1]);
}
hide("matvec", false);
hide("attnCausal", false);
console.log(`\n## ${preset} bf16 dummy weights, bf16 KV, batch 1, prefill blocks of ${prefillBlock} (attnCausal, tensor cores: ${cudaLab(cuda).attnCausalUsesTensorCores("bf16", hd)}), ${steps - 1} timed decode steps; floor = (weights + KV) bytes ÷ D2D copy bandwidth (read + write)`);
for (const r of diag) console.log(r);
for (const r of rows) console.log(r);
model.close();
cuda.close();
