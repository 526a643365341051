/**
 * The CPU backend against the CUDA backend on the GPU machine: the same dummy-weight models (a
 * prompt, then greedy decode) on both — f32 shapes of Llama, Qwen2 and OPT with logits within 1e-4
 * and identical greedy tokens, and real presets in bf16 within 1e-2 (the prefill's cuBLAS GEMMs
 * round x to bf16; the CPU keeps it f32). The CUDA backend's own checks are its package's device
 * check. Exits non-zero if a model fails. Usage: bun cpu-vs-cuda.js
 * Env: HYBRIDGEN_KERNELS_CUDA_LIB, HYBRIDGEN_KERNELS_CPU_LIB (absolute paths; the bundle moves).
 */
import { STORIES15M_SHAPE, greedyDummyRun, presetConfig, relL2Error, type DType } from "@hybridgen/core";
import { createCpuBackend, createNativeRandomFill } from "@hybridgen/kernels-cpu";
import { createCudaBackend, cudaAvailability, describeCudaAvailability } from "@hybridgen/kernels-cuda";

const seed = Number(process.env.HG_TEST_SEED ?? Date.now() % 2 ** 31);

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
  ["qwen2 (1.5b family, small)", presetConfig("qwen2.5-1.5b", { hidden_size: 256, intermediate_size: 512, num_hidden_layers: 3, num_attention_heads: 8, num_key_value_heads: 2, vocab_size: 4096 }), "f32", 40, 32, 1e-4],
  ["opt (125m family, small)", presetConfig("opt-125m", { hidden_size: 256, ffn_dim: 1024, num_hidden_layers: 3, num_attention_heads: 4, vocab_size: 4096, word_embed_proj_dim: 256 }), "f32", 40, 32, 1e-4],
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
  const c = greedyDummyRun(cpu, json, dt, prompt, steps, fill);
  const tCpu = (performance.now() - t0) / 1e3;
  t0 = performance.now();
  const g = greedyDummyRun(cuda, json, dt, prompt, steps, fill);
  const tGpu = (performance.now() - t0) / 1e3;
  const pre = relL2Error(g.first, c.first);
  let dec = 0;
  // Decode logits compared while the token streams agree (after a divergence they differ by design).
  for (let s = 0; s < steps && g.tokens[s] === c.tokens[s]; s++) dec = Math.max(dec, relL2Error(g.logits[s], c.logits[s]));
  const same = g.tokens.every((t, i) => t === c.tokens[i]);
  const ok = pre <= tol && dec <= tol && (dt !== "f32" || same);
  if (!ok) failures++;
  console.log(`| ${name}${ok ? "" : " FAIL"} | ${dt} | ${fmt(pre)} | ${fmt(dec)} | ${same} (${steps}) | ${tCpu.toFixed(1)} | ${tGpu.toFixed(1)} |`);
}
console.log(`\n${failures === 0 ? "ALL PASS" : `${failures} FAILED`}`);
process.exitCode = failures === 0 ? 0 : 1;
