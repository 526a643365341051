/**
 * The CPU backend against the CUDA backend on the GPU machine: the same dummy-weight models (a
 * prompt, then greedy decode) on both — f32 shapes of Llama, Qwen2 and OPT with logits within 1e-4
 * and identical greedy tokens, and real presets in bf16 within 1e-2 (the prefill's cuBLAS GEMMs
 * round x to bf16; the CPU keeps it f32). The CUDA backend's own checks are its package's device
 * check. Exits non-zero if a model fails. Usage: bun cpu-vs-cuda.js
 * Env: HYBRIDGEN_KERNELS_CUDA_LIB, HYBRIDGEN_KERNELS_CPU_LIB (absolute paths; the bundle moves).
 */
import { loadModel, presetConfig, type Backend, type DType, type RandomFill } from "@hybridgen/core";
import { createCpuBackend, createNativeRandomFill } from "@hybridgen/kernels-cpu";
import { createCudaBackend, cudaAvailability, describeCudaAvailability } from "@hybridgen/kernels-cuda";
import { dummyFiles } from "../dummy-files.js";
import { STORIES15M_SHAPE } from "../models.js";

const seed = Number(process.env.HG_TEST_SEED ?? Date.now() % 2 ** 31);
const shrunk = (name: string, overrides: Record<string, unknown>) => ({ ...presetConfig(name), ...overrides });

/** ‖a − b‖ / ‖b‖ (L2 over the row): the bounds above are of this measure. */
function relErr(a: Float32Array, b: Float32Array): number {
  if (a.length !== b.length) return Infinity;
  let num = 0, den = 0;
  for (let i = 0; i < a.length; i++) {
    num += (a[i] - b[i]) ** 2;
    den += b[i] * b[i];
  }
  return Math.sqrt(num / (den || 1));
}

/** Prefill a prompt, then greedy decode `steps`: last-prompt logits, decode logits, tokens. */
function run(backend: Backend, json: Record<string, unknown>, dtype: DType, prompt: Int32Array, steps: number, fill: RandomFill) {
  using files = dummyFiles(json, dtype, 7, fill);
  using model = loadModel(files, backend, { maxContext: prompt.length + steps + 1, prefillBlock: 64, kvDtype: dtype === "f32" ? "f32" : "bf16" });
  const first = model.forward(prompt, 0);
  const tokens: number[] = [];
  const logits: Float32Array[] = [];
  let tok = model.argmaxLogits();
  for (let s = 0; s < steps; s++) {
    tokens.push(tok);
    logits.push(model.forward(Int32Array.of(tok), prompt.length + s));
    tok = model.argmaxLogits();
  }
  return { first, tokens, logits };
}

const a = cudaAvailability();
console.log(`# CPU vs CUDA (seed ${seed})\n${describeCudaAvailability(a)}`);
if (!a.available) process.exit(1);
using cuda = createCudaBackend({ arenaBytes: 40 * 2 ** 30 });
using cpu = createCpuBackend();
const fill = createNativeRandomFill();
const rnd = (n: number, vocab: number) => Int32Array.from({ length: n }, (_, i) => (i * 7919 + seed) % vocab);
// name, config, dtype, prompt, steps, tolerance
const models: [string, Record<string, unknown>, DType, number, number, number][] = [
  ["stories15M shape", STORIES15M_SHAPE, "f32", 40, 32, 1e-4],
  ["qwen2 (1.5b family, small)", shrunk("qwen2.5-1.5b", { hidden_size: 256, intermediate_size: 512, num_hidden_layers: 3, num_attention_heads: 8, num_key_value_heads: 2, vocab_size: 4096 }), "f32", 40, 32, 1e-4],
  ["opt (125m family, small)", shrunk("opt-125m", { hidden_size: 256, ffn_dim: 1024, num_hidden_layers: 3, num_attention_heads: 4, vocab_size: 4096, word_embed_proj_dim: 256 }), "f32", 40, 32, 1e-4],
  ["preset llama-3.2-1b", presetConfig("llama-3.2-1b"), "bf16", 100, 4, 1e-2],
  ["preset qwen2.5-1.5b", presetConfig("qwen2.5-1.5b"), "bf16", 100, 4, 1e-2],
  ["preset opt-125m", presetConfig("opt-125m"), "bf16", 100, 4, 1e-2],
];
let failures = 0;
const fmt = (x: number) => (x === 0 ? "0" : x.toExponential(2));
console.log("| model | dtype | prefill logits | worst decode logits | greedy tokens equal | cpu s | cuda s |\n| --- | --- | --- | --- | --- | --- | --- |");
for (const [name, json, dt, plen, steps, tol] of models) {
  const prompt = rnd(plen, json.vocab_size as number);
  let t0 = performance.now();
  const c = run(cpu, json, dt, prompt, steps, fill);
  const tCpu = (performance.now() - t0) / 1e3;
  t0 = performance.now();
  const g = run(cuda, json, dt, prompt, steps, fill);
  const tGpu = (performance.now() - t0) / 1e3;
  const pre = relErr(g.first, c.first);
  let dec = 0;
  // Decode logits compared while the token streams agree (after a divergence they differ by design).
  for (let s = 0; s < steps && g.tokens[s] === c.tokens[s]; s++) dec = Math.max(dec, relErr(g.logits[s], c.logits[s]));
  const same = g.tokens.every((t, i) => t === c.tokens[i]);
  const ok = pre <= tol && dec <= tol && (dt !== "f32" || same);
  if (!ok) failures++;
  console.log(`| ${name}${ok ? "" : " FAIL"} | ${dt} | ${fmt(pre)} | ${fmt(dec)} | ${same} (${steps}) | ${tCpu.toFixed(1)} | ${tGpu.toFixed(1)} |`);
}
console.log(`\n${failures === 0 ? "ALL PASS" : `${failures} FAILED`}`);
process.exitCode = failures === 0 ? 0 : 1;
