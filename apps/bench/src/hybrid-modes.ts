/**
 * Hybrid decode on one machine, every configuration from the same prefilled context: full
 * attention on the device, then hybrid attention in each logits mode × timing with a fixed K,
 * and the feedback scheduler — ms/token, the stage times per step, how the scheduler settled,
 * and each step's timings as a trace (the scheduler package replays those in its tests).
 *
 *   bun apps/bench/src/hybrid-modes.ts [--backend cuda|cpu] [--preset llama-3.1-8b] [--contexts 32768,131000]
 *     [--steps 64] [--window 4096] [--sinks 4] [--k 256] [--threads N] [--configs full,post-exact,…]
 *     [--trace-dir DIR] [--source TEXT]
 *
 * Configs: full; post-exact, post-speculative, post-verified (top-K in the stage, fixed K);
 * pre-streaming, pre-quest, pre-infinigen (verified, fixed K), pre-streaming-speculative; feedback
 * (verified, kMin = K, topk under post and streaming under pre), feedback-quest (topk+quest),
 * feedback-infinigen (topk+infinigen). Dummy weights (bf16),
 * bf16 KV. One prefill per context (in blocks of at most 32 768 tokens); every hybrid config
 * starts from a KvCache checkpoint of it.
 */
import { writeFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { cpus } from "node:os";
import { loadModel, presetConfig, type Backend, type CausalLM, type HybridStepRecord } from "@hybridgen/core";
import { createCpuBackend, createNativeRandomFill } from "@hybridgen/kernels-cpu";
import { createHybridAttention, type HybridRuntimeOptions } from "@hybridgen/runtime";
import { timingTraceFromRuns, type RecordedRun } from "@hybridgen/scheduler";
import { arg, list } from "./args.js";
import { dummyFiles } from "./dummy-files.js";

const backendName = arg("backend", "cuda");
const preset = arg("preset", "llama-3.1-8b");
const contexts = list("contexts", "32768,131000").map(Number);
const steps = Number(arg("steps", "64"));
const window = Number(arg("window", "4096"));
const sinks = Number(arg("sinks", "4"));
const K = Number(arg("k", "256"));
const threads = Number(arg("threads", String(Math.max(1, cpus().length - 1))));
const configs = list("configs", "full,post-exact,post-speculative,post-verified,pre-streaming,pre-quest,feedback,feedback-quest");
const traceDir = arg("trace-dir", "");
const source = arg("source", `apps/bench hybrid-modes on ${backendName}, ${new Date().toISOString().slice(0, 10)}`);
/** Steps left out of the means: the first hybrid step captures and warms up. */
const WARM = 4;

const HYBRID: Record<string, HybridRuntimeOptions> = {
  "post-exact": { scheduler: "fixed", selector: "topk", k: K, timing: "post", logits: "exact" },
  "post-speculative": { scheduler: "fixed", selector: "topk", k: K, timing: "post", logits: "speculative" },
  "post-verified": { scheduler: "fixed", selector: "topk", k: K, timing: "post", logits: "verified" },
  "pre-streaming": { scheduler: "fixed", selector: "streaming", k: K, timing: "pre", logits: "verified" },
  "pre-quest": { scheduler: "fixed", selector: "quest", k: K, timing: "pre", logits: "verified" },
  "pre-infinigen": { scheduler: "fixed", selector: "infinigen", k: K, timing: "pre", logits: "verified" },
  feedback: { scheduler: "feedback", selector: "topk+streaming", kMin: K, logits: "verified" },
  "feedback-quest": { scheduler: "feedback", selector: "topk+quest", kMin: K, logits: "verified" },
  "feedback-infinigen": { scheduler: "feedback", selector: "topk+infinigen", kMin: K, logits: "verified" },
  "pre-streaming-speculative": { scheduler: "fixed", selector: "streaming", k: K, timing: "pre", logits: "speculative" },
};
for (const c of configs) if (c !== "full" && !HYBRID[c]) throw new Error(`unknown config ${c} (configs: full, ${Object.keys(HYBRID).join(", ")})`);

async function openBackend(): Promise<Backend> {
  if (backendName === "cpu") return createCpuBackend({});
  const { createCudaBackend, cudaAvailability, describeCudaAvailability } = await import("@hybridgen/kernels-cuda");
  const avail = cudaAvailability();
  if (!avail.available) throw new Error(describeCudaAvailability(avail));
  return createCudaBackend();
}

/** Greedy decode of `steps` tokens from position `first`; wall ms of each step (step + pick). */
function decode(model: CausalLM, first: number): number[] {
  const walls: number[] = [];
  let tok = model.argmaxLogits();
  for (let s = 0; s < steps; s++) {
    const t0 = performance.now();
    model.step(Int32Array.of(tok), first + s);
    tok = model.argmaxLogits();
    walls.push(performance.now() - t0);
  }
  return walls;
}

const mean = (xs: readonly number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);

/** First step from which the timing never changes and K stays within ±10% of its last value. */
function settleStep(trace: readonly HybridStepRecord[]): number {
  const last = trace[trace.length - 1];
  if (!last) return 0;
  let s = trace.length;
  while (s > 0) {
    const t = trace[s - 1]!;
    if (t.timing !== last.timing || Math.abs(t.k - last.k) > 0.1 * last.k) break;
    s--;
  }
  return s;
}

function switches(trace: readonly HybridStepRecord[]): number {
  let n = 0;
  for (let i = 1; i < trace.length; i++) if (trace[i]!.timing !== trace[i - 1]!.timing) n++;
  return n;
}

using backend = await openBackend();
/** "tiny": a 4-layer Llama for a dry run on the CPU backend. */
const TINY = {
  architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 256, intermediate_size: 768, num_hidden_layers: 4,
  num_attention_heads: 8, num_key_value_heads: 2, vocab_size: 1024, max_position_embeddings: 1 << 20, rms_norm_eps: 1e-5, rope_theta: 1e6,
};
const json: Record<string, unknown> = preset === "tiny" ? TINY : presetConfig(preset);
const rows = [
  "| context | config | ms/token | × full | T_gpu ms/step | T_cpu ms/step | T_tx ms/step | final K / timing | switches | settled at step | CPU stage hidden |",
  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
];
const recorded: Record<number, RecordedRun[]> = {};

for (const context of contexts) {
  const maxContext = context + steps + 8;
  const prompt = Int32Array.from({ length: context }, (_, i) => (i * 7919 + 13) % (json.vocab_size as number));
  const prefillBlock = Math.min(context, 32768);
  let fullMs = 0;
  if (configs.includes("full")) {
    using files = dummyFiles(json, "bf16", 1, createNativeRandomFill(), `preset:${preset}`);
    using model = loadModel(files, backend, { maxContext, prefillBlock, kvDtype: "bf16" });
    model.step(prompt, 0);
    const walls = decode(model, context);
    fullMs = mean(walls.slice(WARM));
    rows.push(`| ${context} | full attention on the device | ${fullMs.toFixed(2)} | 1.00 | – | – | – | – | – | – | – |`);
    console.log(rows[rows.length - 1]);
  }
  const hybridConfigs = configs.filter((c) => c !== "full");
  if (hybridConfigs.length === 0) continue;
  using files = dummyFiles(json, "bf16", 1, createNativeRandomFill(), `preset:${preset}`);
  using model = loadModel(files, backend, { maxContext, prefillBlock, kvDtype: "bf16", kvWindow: window, kvSinks: sinks });
  if (backend.hostTransfers) model.cache.attachHostStore(createCpuBackend({ threads: 1 }), backend.hostTransfers(), true);
  const t0 = performance.now();
  model.step(prompt, 0);
  console.log(`context ${context}: prefilled in ${((performance.now() - t0) / 1e3).toFixed(1)} s; ${model.cache.storeCount} tokens offloaded, window ${window} with ${sinks} sinks`);
  using cp = model.cache.checkpoint();
  recorded[context] = [];
  for (const name of hybridConfigs) {
    using ha = await createHybridAttention(model, backend, { cpuStageThreads: threads, ...HYBRID[name] });
    try {
      const walls = decode(model, context);
      const trace = ha.stats.trace.slice();
      const tail = trace.slice(WARM);
      const ms = mean(walls.slice(WARM)), last = trace[trace.length - 1];
      rows.push(`| ${context} | ${name} | ${ms.toFixed(2)} | ${fullMs ? (ms / fullMs).toFixed(2) : "–"} | ${mean(tail.map((t) => t.tGpuMs)).toFixed(2)} | ` +
        `${mean(tail.map((t) => t.tCpuMs)).toFixed(2)} | ${mean(tail.map((t) => t.tTxMs)).toFixed(2)} | ${last ? `${last.k} / ${last.timing}` : "–"} | ` +
        `${switches(trace)} | ${settleStep(trace)} | ${Math.round(ha.stats.hiddenFraction * 100)}% |`);
      console.log(rows[rows.length - 1]);
      console.log(`  ${ha.stats.summary()}`);
      recorded[context]!.push({ label: name, scheduler: HYBRID[name]!.scheduler as string, steps: trace });
    } finally {
      ha.close();
      model.cache.restore(cp);
    }
  }
  if (traceDir) {
    mkdirSync(traceDir, { recursive: true });
    const file = join(traceDir, `trace-${preset}-${context}.json`);
    writeFileSync(file, `${JSON.stringify(timingTraceFromRuns(recorded[context]!, {
      source, setup: { preset, context, window, sinks, k: K, steps, threads, backend: backend.name, cores: cpus().length },
    }), null, 1)}\n`);
    console.log(`trace: ${file}`);
  }
}

console.log(`\n## ${preset}, dummy bf16 weights, bf16 KV, batch 1; window ${window} with ${sinks} sinks, K ${K}, ${threads} stage threads, ${steps} steps (means skip the first ${WARM}); ${backend.name}`);
for (const r of rows) console.log(r);
