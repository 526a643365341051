/**
 * The baselines on a device backend against full attention: the same prompt prefilled, then
 * teacher-forced decode steps fed with full attention's greedy tokens; per configuration the
 * worst max|Δ logits| / max|logits| over the steps. flexgen (AoG: the store streamed up from host
 * memory) and all-tokens must match full attention to rounding; moe-lightning (AoC: the host's
 * f32 attention over the bf16 store, merged by log-sum-exp) to a little more; the selective
 * configurations only run (their error is printed, not checked).
 *
 *   ./bun apps/bench/src/baseline-parity.ts [--backend cuda|cpu] [--preset llama-3.2-1b] [--context 2048]
 *     [--window 512] [--steps 16] [--k 64] [--configs flexgen,moe-lightning,all-tokens,h2o,keyformer,…]
 *
 * Prints one line per configuration and PASS / FAIL; exits 1 on a failure.
 */
import { DEFAULT_K, dummyModelFiles, loadModel, presetConfig, relError, type CausalLM } from "@hybridgen/core";
import { createNativeRandomFill } from "@hybridgen/kernels-cpu";
import { attachAttentionConfig, attentionConfig, prepareHostStore } from "@hybridgen/runtime";
import { arg, hybridArg, list } from "./args.js";
import { openBackend } from "./open-backend.js";

const backendName = arg("backend", "cuda");
const preset = arg("preset", "llama-3.2-1b");
const context = Number(arg("context", "2048")), window = Number(arg("window", "512")), steps = Number(arg("steps", "16")), K = hybridArg("k", DEFAULT_K);
const configs = list("configs", "flexgen,moe-lightning,all-tokens,h2o,keyformer,streamingllm,infinigen,hybridgen-post,hybridgen-pre,hybridgen-adaptive,hybridgen");
/** Worst relative error allowed: exact methods vs one that sums in another order and precision. */
const TOLERANCE: Record<string, number> = { flexgen: 1e-3, "all-tokens": 1e-3, "moe-lightning": 2e-2 };

using backend = await openBackend(backendName);
const json = presetConfig(preset);
const prompt = Int32Array.from({ length: context - steps - 1 }, (_, i) => (i * 7919 + 13) % (json.vocab_size as number));
const load = (windowed: boolean): CausalLM => loadModel(dummyModelFiles(json, "bf16", 1, createNativeRandomFill(), `preset:${preset}`), backend, {
  maxContext: context, prefillBlock: 512, kvDtype: "bf16", ...(windowed ? { gpuKvBudget: window, sinkTokens: 4 } : {}),
});

/** The prompt, then `steps` steps fed with `feed` (greedy when absent): every step's logits. */
function decode(model: CausalLM, feed?: number[]): { logits: Float32Array[]; tokens: number[] } {
  model.reset();
  let l = Float32Array.from(model.forward(prompt, 0));
  const logits: Float32Array[] = [], tokens: number[] = [];
  for (let s = 0; s < steps; s++) {
    const tok = feed ? feed[s]! : l.indexOf(Math.max(...l));
    tokens.push(tok);
    l = Float32Array.from(model.forward(Int32Array.of(tok), prompt.length + s));
    logits.push(l);
  }
  return { logits, tokens };
}

let want: { logits: Float32Array[]; tokens: number[] };
{
  using full = load(false);
  want = decode(full);
}
using model = load(true);
await prepareHostStore(model, backend, 8);
let failed = false;
console.log(`${preset} on ${backend.name}: context ${context}, window ${window} + store, ${steps} teacher-forced steps, K ${K}`);
for (const name of configs) {
  const t0 = performance.now();
  using a = await attachAttentionConfig(model, backend, attentionConfig(name, K));
  const got = decode(model, want.tokens);
  const err = Math.max(...got.logits.map((l, i) => relError(l, want.logits[i]!)));
  const tol = TOLERANCE[name];
  const verdict = tol === undefined ? "ran" : err <= tol ? "PASS" : "FAIL";
  if (verdict === "FAIL") failed = true;
  console.log(`${verdict} ${name}: worst rel. error ${err.toExponential(2)}${tol === undefined ? "" : ` (≤ ${tol})`}; ${((performance.now() - t0) / 1e3).toFixed(1)} s; ${a.summary()}`);
}
process.exitCode = failed ? 1 : 0;
