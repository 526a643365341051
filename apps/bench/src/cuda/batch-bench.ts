/**
 * Batched decode on the CUDA backend. Two parts, one table each (the batched kernels' own checks
 * are part of the package's device check, packages/kernels-cuda/device/device-check.ts):
 *
 * 1. Batched = alone (stories15M's shape): B sequences with different prompt lengths decoded
 *    together against each decoded alone (the batched steps are fed the tokens each sequence
 *    picked alone, so a bf16 near-tie cannot make them diverge): f32 weights (GEMV at B = 4,
 *    cuBLAS at B = 12; tokens equal, logits ≤ 1e-4), bf16 weights (skinny GEMM; logits ≤ 1e-2),
 *    and bf16 with every setSkinny switch on (fused reduce, matmulSplit).
 * 2. Bench: preset:llama-3.1-8b, dummy bf16 weights, bf16 KV; max(B) sequences prefilled with
 *    random lengths in [1536, 2560]; then for each B (slots 0..B−1) one warm-up step and `steps`
 *    timed steps (each: one batched forward pass + a greedy pick per row, as generateBatch does)
 *    for the skinny GEMM without its switches, with them (also with the step's greedy picks as one
 *    argmaxRows call), and cuBLAS, all with batched attention, in the same run, next to the floor of a step: (weight bytes + the B caches' KV
 *    bytes) ÷ the device-to-device bandwidth measured in the run.
 *
 *   bun batch-bench.js [--steps 32] [--batches 1,8,16,24,32] [--preset llama-3.1-8b] [--log FILE]
 *
 * --log appends every printed line to FILE as it is printed (synchronously), so a run killed by
 * a timeout still leaves what it measured (stdout piped to `tee` may be lost with the process).
 */
import { appendFileSync } from "node:fs";
import { BatchDecoder, STORIES15M_SHAPE, argmax, dummyModelFiles, loadModel, presetConfig, seededRandom, type CausalLM } from "@hybridgen/core";
import { createNativeRandomFill } from "@hybridgen/kernels-cpu";
import { createCudaBackend, cudaAvailability, describeCudaAvailability, type CudaBackend, type SkinnyOptions } from "@hybridgen/kernels-cuda";
import { llamaBf16Sizes } from "../models.js";
import { arg } from "../args.js";
import { cudaLab } from "@hybridgen/kernels-cuda/lab";

const steps = Number(arg("steps", "32"));
const batches = arg("batches", "1,8,16,32").split(",").map(Number);
const preset = arg("preset", "llama-3.1-8b");
const logPath = process.argv.includes("--log") ? arg("log", "") : "";

function say(line: string): void {
  console.log(line);
  if (logPath) appendFileSync(logPath, `${line}\n`);
}

function prompts(seed: number, lengths: number[], vocab: number): Int32Array[] {
  const r = seededRandom(seed);
  return lengths.map((n) => Int32Array.from({ length: n }, () => 3 + Math.floor(r() * (vocab - 3))));
}

const a = cudaAvailability();
say(describeCudaAvailability(a));
if (!a.available) process.exit(1);
const cuda: CudaBackend = createCudaBackend({ arenaFraction: 0.92 });
const bw = cuda.copyBandwidth(2 ** 31, 10);
say(`D2D copy bandwidth (read + write): ${(bw / 1e12).toFixed(2)} TB/s; cuBLAS ${cuda.cublas}`);

let failures = 0;

// ---- 1. batched = alone -----------------------------------------------------------------------------
const checks: string[] = [
  "| weights | B | matmul path | attention | prompt lengths | tokens equal | max rel. logit diff | bound | graphs captured/replayed/drained | result |",
  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
];
/** Every batched-GEMM switch on (setSkinny): the defaults. */
const ALL_NEW: Partial<SkinnyOptions> = { fusedReduce: true, split: true };
const SKINNY_OFF: SkinnyOptions = { maxRows: 32, fusedReduce: false, split: false };
const skinnyLabel = (o: Partial<SkinnyOptions>) => (o.split || o.fusedReduce ? ` (${[o.fusedReduce && "fused reduce", o.split && "matmulSplit"].filter(Boolean).join(", ")})` : "");
for (const [dtype, skinny] of [["f32", {}], ["bf16", {}], ["bf16", ALL_NEW]] as const) {
  cudaLab(cuda).setSkinny({ ...SKINNY_OFF, ...skinny });
  using files = dummyModelFiles(STORIES15M_SHAPE, dtype, 7, createNativeRandomFill(), `stories15M-shape ${dtype}`);
  using model = loadModel(files, cuda, { maxContext: 256, kvDtype: dtype });
  const vocab = files.shape.vocabSize, STEPS = 8, bound = dtype === "f32" ? 1e-4 : 1e-2;
  for (const lengths of [[5, 40, 17, 90], [3, 60, 11, 25, 7, 100, 31, 2, 48, 19, 77, 9]]) {
    const ps = prompts(lengths.length, lengths, vocab);
    const alone = ps.map((p) => {
      model.reset();
      let logits = model.forward(p, 0);
      const toks: number[] = [], all: Float32Array[] = [];
      for (let s = 0; s < STEPS; s++) {
        all.push(logits);
        toks.push(argmax(logits));
        logits = model.forward(Int32Array.of(toks[s]), p.length + s);
      }
      return { toks, all };
    });
    const B = ps.length;
    const g0 = cudaLab(cuda).graphStats();
    let equal = true, worst = 0;
    {
      using dec = new BatchDecoder(model, B);
      const next = new Int32Array(B), slots = ps.map((_, i) => i);
      const compare = (i: number, s: number) => {
        const got = dec.logits(i), want = alone[i].all[s];
        let d = 0, m = 0;
        for (let j = 0; j < vocab; j++) {
          d = Math.max(d, Math.abs(got[j] - want[j]));
          m = Math.max(m, Math.abs(want[j]));
        }
        worst = Math.max(worst, d / m);
        equal &&= dec.argmax(i) === alone[i].toks[s];
        next[i] = alone[i].toks[s]; // teacher-forced: the token this sequence picked alone
      };
      ps.forEach((p, i) => {
        dec.prefill(i, p, 0);
        compare(i, 0);
      });
      for (let s = 1; s < STEPS; s++) {
        dec.step(slots, next);
        for (let i = 0; i < B; i++) compare(i, s);
      }
    }
    const g1 = cudaLab(cuda).graphStats();
    const ok = (dtype === "bf16" || equal) && worst <= bound;
    if (!ok) failures++;
    checks.push(
      `| ${dtype} | ${B} | ${cudaLab(cuda).matmulPathFor(B, dtype, files.shape.hiddenSize)}${skinnyLabel(skinny)} | batched | ${lengths.join(", ")} | ${equal} | ${worst.toExponential(2)} | ${bound} | ` +
        `${g1.captures - g0.captures}/${g1.replays - g0.replays}/${g1.drained - g0.drained} ${g1.lastDrain} | ${ok ? "PASS" : "FAIL"} |`,
    );
    say(checks[checks.length - 1]);
  }
}
cudaLab(cuda).setSkinny(SKINNY_OFF);

// ---- 2. throughput on the 8B preset ---------------------------------------------------------------
const json = presetConfig(preset);
const { hidden, layers, heads, kvHeads, inter, vocab, hd, weightBytes, kvBytesPerToken } = llamaBf16Sizes(json);
const maxB = Math.max(...batches);
const r = seededRandom(2026);
const lengths = Array.from({ length: maxB }, () => 1536 + Math.floor(r() * 1025));
interface Variant {
  B: number; name: string; graphs: boolean; path: "auto" | "gemv" | "cublas"; batchedAttention: boolean; skinny: Partial<SkinnyOptions>;
  /** Greedy picks: one argmaxRows call for the step (BatchDecoder.argmaxSlots), else argmax per row. */
  batchedPicks?: boolean;
}
const variants: Variant[] = [];
// Batched attention everywhere (measured better at 17:20); the GEMM side compared per B: the
// skinny kernel without and with its switches, and cuBLAS (whose crossing with the skinny GEMM
// gives setSkinny's maxRows). The pipelined kernel and programmatic launch are gone (slower).
for (const B of batches) {
  const base = { B, graphs: true, path: "auto" as const, batchedAttention: true, skinny: {} };
  if (B === 1) {
    variants.push({ ...base, name: "default (the ordinary fused decode step)" });
    continue;
  }
  variants.push({ ...base, name: "skinny GEMM, switches off + batched attention" });
  variants.push({ ...base, name: "skinny + fused reduce + matmulSplit (the defaults)", skinny: ALL_NEW });
  variants.push({ ...base, name: "the defaults + one argmaxRows pick a step", skinny: ALL_NEW, batchedPicks: true });
  variants.push({ ...base, name: "cuBLAS + batched attention", path: "cublas" });
  if (B === Math.max(...batches)) variants.push({ ...base, name: "skinny defaults, graphs off", graphs: false, skinny: ALL_NEW });
}
// Every variant appends warm-up + timed steps to the slots it runs.
const maxContext = Math.max(...lengths) + variants.length * (steps + 1) + 8;

let t0 = performance.now();
using files = dummyModelFiles(json, "bf16", 1, createNativeRandomFill(), `preset:${preset}`);
using model: CausalLM = loadModel(files, cuda, { maxContext, prefillBlock: 2048, kvDtype: "bf16" });
using dec = new BatchDecoder(model, maxB);
say(`loaded ${preset} (bf16 dummy weights, ${(weightBytes / 1e9).toFixed(2)} GB) and ${maxB} slots of ${maxContext} positions in ${((performance.now() - t0) / 1e3).toFixed(1)} s; arena used ${(cuda.memory().usedBytes / 1e9).toFixed(1)} GB`);
t0 = performance.now();
const ps = prompts(99, lengths, vocab);
const next = new Int32Array(maxB);
ps.forEach((p, i) => {
  dec.prefill(i, p, 0);
  next[i] = dec.argmax(i);
});
const prefillS = (performance.now() - t0) / 1e3;
say(`prefilled ${maxB} sequences (${lengths.reduce((x, y) => x + y, 0)} tokens, lengths ${Math.min(...lengths)}–${Math.max(...lengths)}) in ${prefillS.toFixed(1)} s`);

const rows = ["| B | variant | matmul path | step ms | tokens/s | floor step ms | floor tokens/s | ratio | graphs captured/replayed/drained |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"];
for (const v of variants) {
  cudaLab(cuda).setCudaGraphs(v.graphs);
  cudaLab(cuda).setMatmulPath(v.path);
  cudaLab(cuda).setBatchAttention(v.batchedAttention);
  cudaLab(cuda).setSkinny({ ...SKINNY_OFF, ...v.skinny });
  cudaLab(cuda).resetGraphs(); // a variant starts clean: no graph or drained-step counter of the one before
  const slots = Array.from({ length: v.B }, (_, i) => i);
  const run = () => {
    const ids = next.subarray(0, v.B);
    dec.step(slots, ids);
    if (v.batchedPicks) dec.argmaxSlots(slots, ids);
    else for (let i = 0; i < v.B; i++) next[i] = dec.argmax(i);
  };
  run(); // warm-up (captures the step's graph)
  const g0 = cudaLab(cuda).graphStats();
  const kvTokens = slots.reduce((acc, s) => acc + dec.length(s), 0) + (v.B * steps) / 2;
  t0 = performance.now();
  for (let s = 0; s < steps; s++) run();
  const ms = (performance.now() - t0) / steps;
  const g1 = cudaLab(cuda).graphStats();
  const floorMs = ((weightBytes + kvBytesPerToken * kvTokens) / bw) * 1e3;
  rows.push(
    `| ${v.B} | ${v.name} | ${v.path === "auto" ? cudaLab(cuda).matmulPathFor(v.B, "bf16", hidden) : v.path}${skinnyLabel(v.skinny)} | ${ms.toFixed(2)} | ${((v.B * 1000) / ms).toFixed(0)} | ${floorMs.toFixed(2)} | ` +
      `${((v.B * 1000) / floorMs).toFixed(0)} | ${(ms / floorMs).toFixed(2)} | ${g1.captures - g0.captures}/${g1.replays - g0.replays}/${g1.drained - g0.drained} ${g1.lastDrain} |`,
  );
  say(rows[rows.length - 1]);
}
cudaLab(cuda).setCudaGraphs(true);
cudaLab(cuda).setMatmulPath("auto");
cudaLab(cuda).setBatchAttention(true);
cudaLab(cuda).setSkinny(SKINNY_OFF);

say(`\n## Batched = alone: ${failures === 0 ? "ALL PASS" : `${failures} FAILED`}`);
for (const c of checks) say(c);
say(`\n## ${preset} bf16 dummy weights, bf16 KV, ${maxB} sequences of ${Math.min(...lengths)}–${Math.max(...lengths)} prompt tokens (prefill ${prefillS.toFixed(1)} s); ${steps} timed steps per row after one warm-up; floor = (weights + the B caches' KV) bytes ÷ D2D copy bandwidth ${(bw / 1e12).toFixed(2)} TB/s`);
for (const row of rows) say(row);
process.exitCode = failures === 0 ? 0 : 1;
