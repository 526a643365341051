/**
 * The decode-kernel switches (CudaBackend.setDecodeTuning) on the GPU machine:
 *  1. every op check (device/op-checks.ts) with the default switches, and with the attention's 4
 *     rows a round too (--quick: the default only);
 *  2. a bf16 llama-3.2-1b-shaped model of 4 layers (dummy weights), prompt then greedy decode steps recorded
 *     as CUDA graphs: logits and tokens with every combination must equal the default switches'
 *      bit for bit where the arithmetic is the same; attnUnroll 4, the clustered attention and the
 *     tensor-core attention (attnMma) change the attention's rounding, so they get a rounding bound.
 * Exits non-zero if anything failed. Usage: bun decode-tuning-check.js
 */
import { loadModel, type Backend } from "@hybridgen/core";
import { createCudaBackend, cudaAvailability, describeCudaAvailability, type CudaBackend, type DecodeTuning } from "../src/index.js";
import { createNativeRandomFill } from "../../kernels-cpu/src/index.js";
import { relErr, runOpChecks, type CheckResult } from "./op-checks.js";
import { streamGemvChecks } from "./stream-checks.js";
import { dummyFiles, shrunkPreset } from "./models.js";

const seed = Number(process.env.HG_TEST_SEED ?? Date.now() % 2 ** 31);
const PLAIN: DecodeTuning = {
  attnUnroll: 2, gemvStream: 0, attnCluster: false, attnPdl: 0, attnGroup: false, gemvSlotKb: 0, gemvNormFold: false, gemvFillRing: false, attnMma: 0, ropeAppend: false, argmaxVec: false, argmaxSplit: false, feedSide: false, gemvGrid: false,
};
const DEFAULTS: DecodeTuning = { ...PLAIN, gemvStream: 128, attnUnroll: 4, attnPdl: 2, attnGroup: true, gemvNormFold: true, gemvFillRing: true, attnMma: 5, ropeAppend: true, argmaxVec: true, argmaxSplit: true, feedSide: true, gemvGrid: true };
const COMBOS: DecodeTuning[] = [
  { ...PLAIN, attnUnroll: 4, attnGroup: true },
  { ...PLAIN, attnUnroll: 4, attnGroup: true, attnPdl: 2, gemvStream: 128 },
  { ...PLAIN, attnPdl: 1 },
  { ...PLAIN, attnPdl: 2 },
  { ...PLAIN, gemvStream: 128, attnUnroll: 4, attnPdl: 2 },
  { ...PLAIN, gemvStream: 128, attnUnroll: 4, attnPdl: 2, attnGroup: true, gemvSlotKb: 8 },
  { ...PLAIN, gemvStream: 128, attnUnroll: 4, attnPdl: 2, attnGroup: true, gemvSlotKb: 16 },
  { ...PLAIN, attnUnroll: 4 },
  { ...PLAIN, attnCluster: true },
  { ...PLAIN, attnUnroll: 4, attnCluster: true },
  DEFAULTS,
  { ...DEFAULTS, gemvNormFold: false },
  { ...DEFAULTS, gemvFillRing: false },
  { ...PLAIN, ropeAppend: true },
  { ...PLAIN, attnPdl: 2, ropeAppend: true },
  { ...DEFAULTS, ropeAppend: false },
  { ...DEFAULTS, attnMma: 1 },
  { ...DEFAULTS, attnMma: 3 },
  { ...DEFAULTS, attnMma: 0 },
  { ...DEFAULTS, attnMma: 2 },
  { ...DEFAULTS, attnMma: 4 },
  { ...DEFAULTS, argmaxVec: false },
  { ...PLAIN, argmaxVec: true },
  { ...DEFAULTS, argmaxSplit: false, feedSide: false },
  { ...PLAIN, argmaxSplit: true, feedSide: true },
  { ...DEFAULTS, gemvGrid: false },
  { ...PLAIN, gemvStream: 128, gemvGrid: true },
];
const label = (t: DecodeTuning) => {
  const changed = Object.entries(t).filter(([key, v]) => PLAIN[key as keyof DecodeTuning] !== v).map(([key, v]) => `${key} ${String(v)}`);
  return changed.length ? changed.join(", ") : "plain (every switch at its default)";
};
let failures = 0;

/** One line of passes, then each failure; counts the failures. */
function report(what: string, results: CheckResult[], tail = ""): void {
  const bad = results.filter((r) => !r.ok);
  failures += bad.length;
  console.log(`${what}: ${results.length - bad.length}/${results.length} pass${tail}`);
  for (const r of bad) console.log(`  FAIL ${r.name}: ${r.err} (tol ${r.tol})`);
}

/** Prompt, then `steps` greedy decode steps (recorded as graphs): every step's logits and tokens. */
function decodeRun(be: Backend, prompt: Int32Array, steps: number): { logits: Float32Array[]; tokens: number[] } {
  const json = shrunkPreset("llama-3.2-1b", { num_hidden_layers: 4 });
  using files = dummyFiles(json, "bf16", 11, createNativeRandomFill());
  using model = loadModel(files, be, { maxContext: prompt.length + steps + 1, prefillBlock: 64, kvDtype: "bf16" });
  model.forward(prompt, 0);
  let tok = model.argmaxLogits();
  const logits: Float32Array[] = [];
  const tokens: number[] = [];
  for (let s = 0; s < steps; s++) {
    tokens.push(tok);
    logits.push(model.forward(Int32Array.of(tok), prompt.length + s).slice());
    tok = model.argmaxLogits();
  }
  return { logits, tokens };
}

function main(): void {
  const a = cudaAvailability();
  console.log(`# decode tuning check (seed ${seed})\n${describeCudaAvailability(a)}`);
  if (!a.available) process.exit(1);
  const cuda: CudaBackend = createCudaBackend({ arenaBytes: 24 * 2 ** 30 });
  console.log(`default switches: ${label(cuda.decodeTuning)}`);
  for (const t of [PLAIN, COMBOS[0]].slice(0, process.argv.includes("--quick") ? 1 : 2)) {
    cuda.setDecodeTuning(t);
    const t0 = performance.now();
    const ops = runOpChecks(cuda, seed);
    report(`ops vs ReferenceBackend (${label(t)})`, ops, ` (${((performance.now() - t0) / 1e3).toFixed(1)} s)`);
  }
  report("stream GEMV chains, every slot size", streamGemvChecks(cuda, seed + 2));
  const prompt = Int32Array.from({ length: 100 }, (_, i) => (i * 7919 + seed) % 128256);
  const steps = 16;
  cuda.setDecodeTuning(PLAIN);
  const g0 = cuda.graphStats();
  const ref = decodeRun(cuda, prompt, steps);
  const g1 = cuda.graphStats();
  console.log(`llama-3.2-1b shape bf16, plain launches: ${g1.captures - g0.captures} captured / ${g1.replays - g0.replays} replayed / ${g1.drained - g0.drained} drained; tokens ${ref.tokens.slice(0, 8).join(",")}…`);
  for (const t of COMBOS) {
    let r: { logits: Float32Array[]; tokens: number[] };
    const s0 = cuda.graphStats();
    try {
      cuda.setDecodeTuning(t);
      r = decodeRun(cuda, prompt, steps);
    } catch (e) {
      failures++;
      console.log(`llama-3.2-1b shape bf16, ${label(t)}: threw ${e instanceof Error ? e.message : String(e)} FAIL`);
      continue;
    }
    const s1 = cuda.graphStats();
    // 4 attention rows a round, the clustered attention and the tensor-core attention change the
    // order (and, for the last, the rounding of q and p) of f32 sums: those logits are held to 1e-4
    // relative while the tokens agree.
    const exact = t.attnUnroll === PLAIN.attnUnroll && t.attnCluster === PLAIN.attnCluster && t.gemvStream === PLAIN.gemvStream && !t.attnGroup && t.attnMma === PLAIN.attnMma;
    let worst = 0;
    for (let s = 0; s < steps && r.tokens[s] === ref.tokens[s]; s++)
      worst = Math.max(worst, exact ? r.logits[s].reduce((m, v, i) => Math.max(m, Math.abs(v - ref.logits[s][i])), 0) : relErr(r.logits[s], ref.logits[s]));
    const same = r.tokens.every((x, i) => x === ref.tokens[i]);
    const replayed = s1.replays - s0.replays;
    const ok = (exact ? worst === 0 && same : worst <= 1e-4) && replayed >= steps - 2 && s1.drained === s0.drained;
    if (!ok) failures++;
    console.log(`llama-3.2-1b shape bf16, ${label(t)}: ${exact ? "largest logit difference" : "worst relative logit error"} vs plain ${worst}, tokens ${same ? "identical" : "differ"}, ${s1.captures - s0.captures} captured / ${replayed} replayed / ${s1.drained - s0.drained} drained ${s1.lastDrain}${ok ? "" : " FAIL"}`);
  }
  cuda.close();
  console.log(failures ? `FAILED: ${failures}` : "ALL PASS");
  process.exit(failures ? 1 : 0);
}

main();
