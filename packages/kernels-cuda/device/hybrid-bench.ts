/**
 * Hybrid attention on the CUDA backend (KV store in pinned host memory, the native CPU stage,
 * copies on the copy stream): correctness, then speed. Usage:
 *   bun hybrid-bench.js [--context 32768] [--steps 32] [--window 4096] [--sinks 4] [--threads 16] [--ks 256,1024] [--skip-bench]
 *
 * Checks (stories15M shape, random f32 weights, f32 KV; the CLI's attachHybrid composes it):
 *   1. selector "all" + exact logits on CUDA equals full attention on CUDA within 1e-5 (relative
 *      to the largest logit) at every step, the same tokens fed to both;
 *   2. top-K greedy tokens on CUDA equal the CPU backend's hybrid run (exact and speculative).
 * Bench (preset:llama-3.1-8b, dummy bf16 weights, bf16 KV): prefill `context` tokens in one
 * block, then `steps` greedy decode steps — full attention on the GPU, and hybrid with a GPU
 * window of `window` tokens (sinks included) and the CPU stage's top-K for each K, exact and
 * speculative logits: ms/token and per step T_gpu, T_cpu, T_tx from the hybrid stats. Also the
 * pinned host↔device bandwidth of the copy path.
 */
import {
  HybridAttention, loadModel, presetConfig, type Backend, type CausalLM, type LogitsMode,
} from "@hybridgen/core";
import { createSelector } from "../../selectors/src/index.js";
import { FixedScheduler } from "../../scheduler/src/index.js";
import { createCpuBackend, createNativeRandomFill, NativeCpuStage } from "../../kernels-cpu/dist/index.js"; // the dist the CLI code uses too (one CpuBackend class)
import { attachHybrid, HybridCliOptionsSchema } from "../../../apps/cli/src/hybrid-options.js";
import { createCudaBackend, cudaAvailability, describeCudaAvailability, type CudaBackend, type CudaHostLink } from "../src/index.js";
import { dummyFiles, STORIES15M_SHAPE } from "./models.js";

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : dflt;
}
const context = Number(arg("context", "32768"));
const steps = Number(arg("steps", "32"));
const window = Number(arg("window", "4096"));
const sinks = Number(arg("sinks", "4"));
const threads = Number(arg("threads", "16"));
const ks = arg("ks", "256,1024").split(",").map(Number);

const avail = cudaAvailability();
console.log(describeCudaAvailability(avail));
if (!avail.available) process.exit(1);

// ---- checks ------------------------------------------------------------------------------------

const failures: string[] = [];
function check(ok: boolean, what: string): void {
  console.log(`${ok ? "PASS" : "FAIL"} ${what}`);
  if (!ok) failures.push(what);
}

// A 2400-token cache (max_position_embeddings raised) so the host store and the stage's V
// buffer are blocks of over 2 MiB, which the host link pins: the checks cover the DMA path.
const SMALL_CONTEXT = 2400, PROMPT = 40, SMALL_STEPS = 60;
const SMALL_SHAPE = { ...STORIES15M_SHAPE, max_position_embeddings: 4096 };
const prompt = Int32Array.from({ length: PROMPT }, (_, i) => (i * 7919 + 11) % 32000);

interface HybridRun { logits: Float32Array[]; tokens: number[]; summary: string }

/** Prompt then greedy steps (or the given tokens), logits of every forward. */
async function runSmall(be: Backend, hybrid: Record<string, unknown> | null, feed?: number[]): Promise<HybridRun> {
  using files = dummyFiles(SMALL_SHAPE, "f32", 7);
  const h = HybridCliOptionsSchema.parse(hybrid ?? {});
  using model = loadModel(files, be, { maxContext: SMALL_CONTEXT, prefillBlock: 64, ...(hybrid ? { kvWindow: h.gpuKvBudget!, kvSinks: h.sinkTokens } : {}) });
  using ha = await attachHybrid(model, be, h);
  if (ha && be.hostTransfers) console.log(`  host link regions: ${JSON.stringify((be.hostTransfers() as CudaHostLink).pinCounts())}`);
  const logits = [model.forward(prompt, 0)];
  const tokens: number[] = [];
  for (let s = 0; s < SMALL_STEPS; s++) {
    const tok = feed ? feed[s] : argmax(logits[logits.length - 1]);
    tokens.push(tok);
    logits.push(model.forward(Int32Array.of(tok), PROMPT + s));
  }
  return { logits, tokens, summary: ha ? ha.stats.summary() : "" };
}

function argmax(x: Float32Array): number {
  let b = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[b]) b = i;
  return b;
}

function relDiff(a: Float32Array, b: Float32Array): number {
  let m = 0, r = 0;
  for (let i = 0; i < a.length; i++) {
    m = Math.max(m, Math.abs(a[i] - b[i]));
    r = Math.max(r, Math.abs(b[i]));
  }
  return m / Math.max(r, 1e-30);
}

{
  using cuda = createCudaBackend({ arenaBytes: 2 ** 32 });
  using cpu = createCpuBackend({ threads: 4 });
  const base = { attention: "hybrid", gpuKvBudget: 32, sinkTokens: 4, cpuStageThreads: 4 };
  const attempt = async (what: string, f: () => Promise<void>) => {
    try {
      await f();
    } catch (e) {
      check(false, `${what}: ${(e as Error).message}`);
    }
  };
  await attempt("all + exact", async () => {
    const full = await runSmall(cuda, null);
    const all = await runSmall(cuda, { ...base, selector: "all", logits: "exact" }, full.tokens);
    const worst = Math.max(...all.logits.map((l, i) => relDiff(l, full.logits[i])));
    check(worst < 1e-5, `CUDA hybrid "all" + exact vs CUDA full attention, ${SMALL_STEPS + 1} forwards: worst max|Δ|/max|logit| ${worst.toExponential(2)} (< 1e-5)`);
    console.log(`  ${all.summary}`);
  });
  for (const logits of ["exact", "speculative"] as LogitsMode[]) {
    await attempt(`top-K ${logits}`, async () => {
      const opts = { ...base, k: 8, logits };
      const onCuda = await runSmall(cuda, opts);
      const onCpu = await runSmall(cpu, opts);
      const same = onCuda.tokens.filter((t, i) => t === onCpu.tokens[i]).length;
      const worstL = Math.max(...onCuda.logits.map((l, i) => relDiff(l, onCpu.logits[i])));
      check(same === SMALL_STEPS, `top-K 8 ${logits}: CUDA greedy tokens equal the CPU backend's hybrid run (${same}/${SMALL_STEPS}; logits within ${worstL.toExponential(2)} relative)`);
      console.log(`  cuda: ${onCuda.summary}`);
    });
  }
  console.log(`host link diagnostics: ${JSON.stringify((cuda.hostTransfers() as CudaHostLink).diagnostics())}`);
  // The backend keeps one tensor of its own once a decode step ran (the unfused matvec parts'
  // scratch, CudaBackend.matvecScratch); the hybrid runs must leave nothing beyond it.
  check(cuda.liveTensors <= 1, `device tensors left after the checks: ${cuda.liveTensors} (≤ 1: the backend's matvec scratch)`);
}

if (process.argv.includes("--skip-bench")) {
  console.log(failures.length ? `${failures.length} FAILED` : "ALL PASS");
  process.exit(failures.length ? 1 : 0);
}

// ---- bench -------------------------------------------------------------------------------------

const json = presetConfig("llama-3.1-8b");
const maxContext = context + steps + 2;
const longPrompt = Int32Array.from({ length: context }, (_, i) => (i * 7919 + 13) % (json.vocab_size as number));
const rows: string[] = [
  "| attention | K | logits | ms/token | T_gpu ms/step | T_cpu ms/step | T_tx ms/step | wait ms/step | CPU stage hidden | prefill s |",
  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
];

function decode(model: CausalLM, first: number): { ms: number; tok: number } {
  let tok = model.argmaxLogits();
  model.step(Int32Array.of(tok), first); // warm-up step (first hybrid step, graph capture)
  tok = model.argmaxLogits();
  const t0 = performance.now();
  for (let s = 1; s < steps; s++) {
    model.step(Int32Array.of(tok), first + s);
    tok = model.argmaxLogits();
  }
  return { ms: (performance.now() - t0) / (steps - 1), tok };
}

using cuda: CudaBackend = createCudaBackend();
const link = cuda.hostTransfers();
const bw = link.bandwidth!(256 * 2 ** 20, 10);
console.log(`pinned copy path (copy stream, 256 MiB): host→device ${(bw.h2d / 1e9).toFixed(1)} GB/s, device→host ${(bw.d2h / 1e9).toFixed(1)} GB/s`);

{
  let t0 = performance.now();
  using files = dummyFiles(json, "bf16", 1, createNativeRandomFill(), "preset:llama-3.1-8b");
  using model = loadModel(files, cuda, { maxContext, prefillBlock: 8192, kvDtype: "bf16" });
  console.log(`full-attention model loaded in ${((performance.now() - t0) / 1e3).toFixed(1)} s`);
  t0 = performance.now();
  model.step(longPrompt, 0);
  model.argmaxLogits();
  const prefill = (performance.now() - t0) / 1e3;
  const { ms } = decode(model, context);
  rows.push(`| full (GPU) | – | – | ${ms.toFixed(2)} | – | – | – | – | – | ${prefill.toFixed(2)} |`);
  console.log(rows[rows.length - 1]);
}

{
  let t0 = performance.now();
  using files = dummyFiles(json, "bf16", 1, createNativeRandomFill(), "preset:llama-3.1-8b");
  // The whole prompt in one block: sinks + ring stay one run of slots, so it prefills by attnCausal.
  using model = loadModel(files, cuda, { maxContext, prefillBlock: context, kvDtype: "bf16", kvWindow: window, kvSinks: sinks });
  const host = createCpuBackend({ threads: 1 });
  model.cache.attachHostStore(host, link, true);
  console.log(`hybrid model loaded, host store (${(model.cache.storeCapacity * model.cache.layers * 2 * model.cache.kvHeads * model.cache.headDim * 2 / 1e9).toFixed(2)} GB pinned) in ${((performance.now() - t0) / 1e3).toFixed(1)} s`);
  for (const k of ks) {
    for (const logits of ["exact", "speculative"] as LogitsMode[]) try {
      const stage = new NativeCpuStage(host, { threads });
      using ha = HybridAttention.attach(
        { attention: model.attention, projector: model, stage, selector: createSelector("topk"), scheduler: new FixedScheduler({ k, timing: "post" }) },
        { logits },
      );
      model.reset();
      t0 = performance.now();
      model.step(longPrompt, 0);
      model.argmaxLogits();
      const prefill = (performance.now() - t0) / 1e3;
      ha.stats.reset();
      const { ms } = decode(model, context);
      const st = ha.stats, n = Math.max(1, st.steps);
      // The warm-up step is in the stats too: per-step figures are means over every hybrid step.
      rows.push(`| hybrid (window ${window}, ${st.offloaded} offloaded) | ${k} | ${logits} | ${ms.toFixed(2)} | ${(st.deviceMs / n).toFixed(2)} | ${((st.cpuStageMs + st.cpuJsMs) / n).toFixed(2)} | ${(st.txMs / n).toFixed(2)} | ${(st.waitMs / n).toFixed(2)} | ${Math.round(st.hiddenFraction * 100)}% | ${prefill.toFixed(2)} |`);
      console.log(rows[rows.length - 1]);
      console.log(`  ${st.summary()}`);
      model.attention.setDecodeAttention(null);
    } catch (e) {
      check(false, `hybrid K ${k} ${logits}: ${(e as Error).message}`);
      model.attention.setDecodeAttention(null);
    }
  }
}

console.log(`host link: ${JSON.stringify({ ...(link as CudaHostLink).diagnostics(), ...(link as CudaHostLink).pinCounts() })}`);
console.log(`\n## preset:llama-3.1-8b, dummy bf16 weights, bf16 KV, batch 1, context ${context} + ${steps} steps; CPU stage ${threads} threads, top-K per KV head (post-QKᵀ, in the stage); ${sinks} sinks`);
console.log(`pinned copy path: H2D ${(bw.h2d / 1e9).toFixed(1)} GB/s, D2H ${(bw.d2h / 1e9).toFixed(1)} GB/s`);
for (const r of rows) console.log(r);
console.log(failures.length ? `${failures.length} FAILED` : "ALL PASS");
process.exit(failures.length ? 1 : 0);
