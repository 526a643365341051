/**
 * Decode and prefill speed of the CUDA backend on preset:llama-3.1-8b with dummy bf16 weights
 * (batch 1), next to the floor measured in the same run: (weight bytes + KV bytes read per
 * step) ÷ device-to-device copy bandwidth. Prints one table. Usage:
 *   bun bench.js [--contexts 2048,8192] [--steps 32] [--preset llama-3.1-8b]
 */
import { loadModel, presetConfig, type Backend } from "@hybridgen/core";
import { createCudaBackend, describeCudaAvailability, cudaAvailability } from "../src/index.js";
import { createNativeRandomFill } from "../../kernels-cpu/src/index.js";
import { dummyFiles } from "./models.js";

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : dflt;
}

const contexts = arg("contexts", "2048,8192").split(",").map(Number);
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

const json = presetConfig(preset);
const hidden = json.hidden_size as number, layers = json.num_hidden_layers as number, heads = json.num_attention_heads as number;
const kvHeads = (json.num_key_value_heads as number) ?? heads, inter = json.intermediate_size as number, vocab = json.vocab_size as number;
const hd = (json.head_dim as number) ?? hidden / heads;
const weightBytes = 2 * (layers * (hidden * (heads + 2 * kvHeads) * hd + heads * hd * hidden + 3 * hidden * inter) + vocab * hidden);
const kvBytesPerToken = 2 * layers * 2 * kvHeads * hd;

const maxContext = Math.max(...contexts) + steps + 1;
const counter = counting(cuda);
let t0 = performance.now();
using files = dummyFiles(json, "bf16", 1, createNativeRandomFill(), `preset:${preset}`);
using model = loadModel(files, counter.backend, { maxContext, prefillBlock: 512, kvDtype: "bf16" });
console.log(`loaded ${preset} (bf16 dummy weights, ${(weightBytes / 1e9).toFixed(2)} GB read per step) in ${((performance.now() - t0) / 1e3).toFixed(1)} s; arena used ${(cuda.memory().usedBytes / 1e9).toFixed(1)} GB`);

const rows: string[] = ["| context | prefill s | prefill tok/s | decode ms/token | floor ms | ratio | backend calls/step |", "| --- | --- | --- | --- | --- | --- | --- |"];
for (const ctx of contexts) {
  model.reset();
  const prompt = Int32Array.from({ length: ctx }, (_, i) => (i * 7919 + 13) % vocab);
  t0 = performance.now();
  model.step(prompt, 0);
  let tok = model.argmaxLogits(); // waits for the prefill
  const prefillS = (performance.now() - t0) / 1e3;
  // warm-up step, then the timed steps (argmax waits for each step's last kernel)
  model.step(Int32Array.of(tok), ctx);
  tok = model.argmaxLogits();
  counter.reset();
  t0 = performance.now();
  for (let s = 1; s < steps; s++) {
    model.step(Int32Array.of(tok), ctx + s);
    tok = model.argmaxLogits();
  }
  const ms = (performance.now() - t0) / (steps - 1);
  const calls = counter.calls() / (steps - 1);
  const floorMs = ((weightBytes + kvBytesPerToken * (ctx + steps / 2)) / (bw / 2)) * 1e3; // bw counts read + write; a step only reads
  rows.push(`| ${ctx} | ${prefillS.toFixed(2)} | ${(ctx / prefillS).toFixed(0)} | ${ms.toFixed(2)} | ${floorMs.toFixed(2)} | ${(ms / floorMs).toFixed(2)} | ${calls.toFixed(0)} |`);
  console.log(rows[rows.length - 1]);
}
console.log(`\n## decode, ${preset} bf16 dummy weights, batch 1, ${steps - 1} timed steps; floor = (weights + KV) bytes ÷ (D2D copy bandwidth ÷ 2)`);
for (const r of rows) console.log(r);
model.close();
cuda.close();
