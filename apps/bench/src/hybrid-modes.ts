/**
 * Hybrid decode on one machine, every configuration from the same prefilled context: full
 * attention on the device, then hybrid attention in each logits mode × timing with a fixed K,
 * and the feedback scheduler — ms/token, the stage times per step, how the scheduler settled,
 * and each step's timings as a trace (the scheduler package replays those in its tests).
 *
 *   ./bun apps/bench/src/hybrid-modes.ts [--backend cuda|cpu] [--preset llama-3.1-8b] [--contexts 32768,131000]
 *     [--steps 64] [--window 4096] [--sinks 4] [--k 256] [--threads N] [--configs full,post-exact,…]
 *     [--trace-dir DIR] [--source TEXT] [--row-path auto|mapped|staged] [--profile-step S] [--synthetic-kv]
 *
 * --synthetic-kv (never the default): no prefill; each cache is filled with seeded random rows through
 * its own append and evict path (runtime's fillSyntheticKv, as scale-run's), so a 131K context costs a
 * second instead of a prefill: the decode steps read and move the same bytes, the keys are random.
 * --profile-step S: decode step S of every config runs inside a profiler's capture range (run
 * under `ncu --profile-from-start off …` or nsys likewise: one step's kernels, nothing else).
 * Configs: full; post-exact, post-speculative, post-verified (top-K in the stage, fixed K);
 * pre-exact, pre-speculative, pre-verified (Quest pages, fixed K), pre-index, pre-index-int4, pre-index-exact
 * (the page index ranked on the device; verified — the stage fills its tables from the device's pages —, or exact),
 * pre-index-keep (verified, keeping K of the 4·K candidates), pre-index-inline (pre-index with each ranking in line, not on the
 * backend's side stream), pre-index-host (ranked by the stage), pre-streaming, pre-infinigen
 * (verified), pre-streaming-speculative; feedback (the default pair topk+quest, verified, kMin = K), feedback-streaming
 * (topk+streaming), feedback-infinigen (topk+infinigen). Dummy weights (bf16), bf16 KV. One
 * prefill per context (in blocks of at most 32 768 tokens); every hybrid config starts from a
 * KvCache checkpoint of it; a context no larger than the window runs full attention only.
 *
 * Each row has its floor (hybrid-floors.ts) from bandwidths measured in the same run: HBM (a
 * D2D copy), the host's read rate (bf16 K scanned by the CPU attention-logits kernel on the
 * stage's thread count) and the pinned host → device copy rate.
 */
import { writeFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { cpus, totalmem } from "node:os";
import { dummyModelFiles, linkBandwidth, loadModel, presetConfig, type Backend, type DeviceIndexShape, type HybridStepRecord } from "@hybridgen/core";
import { planRun } from "@hybridgen/memtier";
import { PageIndexOptionsSchema } from "@hybridgen/selectors";
import { HYBRID_DEFAULTS } from "@hybridgen/runtime";
import { createCpuBackend, createNativeRandomFill } from "@hybridgen/kernels-cpu";
import type { CudaBackend } from "@hybridgen/kernels-cuda";
import { createHybridAttention, defaultStageThreads, fillSyntheticKv, indexRankCharge, type HybridRuntimeOptions } from "@hybridgen/runtime";
import { timingTraceFromRuns, type RecordedRun } from "@hybridgen/scheduler";
import { arg, hybridArg, hybridValue, list } from "./args.js";
import { openBackend } from "./open-backend.js";
import { greedyWalls, mean } from "./greedy-walls.js";
import { fullFloorMs, llamaModelBytes, stepBytes, stepFloor, type Bandwidths, type FloorSelector } from "./hybrid-floors.js";

const backendName = arg("backend", "cuda");
const preset = arg("preset", "llama-3.1-8b");
const contexts = list("contexts", "32768,131000").map(Number);
const steps = Number(arg("steps", "64"));
const window = Number(arg("window", "4096"));
const sinks = Number(arg("sinks", "4"));
const K = hybridArg("k", 256);
const threads = Number(arg("threads", String(defaultStageThreads(backendName !== "cpu"))));
const configs = list("configs", "full,post-exact,post-speculative,post-verified,pre-exact,pre-speculative,pre-verified,pre-streaming,feedback,feedback-streaming");
const traceDir = arg("trace-dir", "");
/** Where the device gets the selected rows, for every hybrid config (HybridOptions.rowPath). */
const rowPath = hybridValue("row-path", "auto") as "auto" | "mapped" | "staged";
const profileStep = arg("profile-step", "");
const synthetic = process.argv.includes("--synthetic-kv");
const source = arg("source", `apps/bench hybrid-modes on ${backendName}, ${new Date().toISOString().slice(0, 10)}`);
/** Steps left out of the means: the first hybrid step captures and warms up. */
const WARM = 4;
/** The index selector's page size (its default: the configs here set none). */
const INDEX_PAGE = PageIndexOptionsSchema.parse({}).pageSize;
/** The engine's candidate multiplier (verified logits): every config here runs the default. */
const CANDIDATES = HYBRID_DEFAULTS.candidates;

const HYBRID: Record<string, HybridRuntimeOptions> = {
  "post-exact": { scheduler: "fixed", selector: "topk", k: K, timing: "post", logits: "exact" },
  "post-speculative": { scheduler: "fixed", selector: "topk", k: K, timing: "post", logits: "speculative" },
  "post-verified": { scheduler: "fixed", selector: "topk", k: K, timing: "post", logits: "verified" },
  "pre-exact": { scheduler: "fixed", selector: "quest", k: K, timing: "pre", logits: "exact" },
  "pre-speculative": { scheduler: "fixed", selector: "quest", k: K, timing: "pre", logits: "speculative" },
  "pre-verified": { scheduler: "fixed", selector: "quest", k: K, timing: "pre", logits: "verified" },
  "pre-streaming": { scheduler: "fixed", selector: "streaming", k: K, timing: "pre", logits: "verified" },
  "pre-streaming-speculative": { scheduler: "fixed", selector: "streaming", k: K, timing: "pre", logits: "speculative" },
  "pre-infinigen": { scheduler: "fixed", selector: "infinigen", k: K, timing: "pre", logits: "verified" },
  "pre-index": { scheduler: "fixed", selector: "index", selectorOptions: { placement: "device" }, k: K, timing: "pre", logits: "verified" },
  "pre-index-int4": { scheduler: "fixed", selector: "index", selectorOptions: { form: "int4", placement: "device" }, k: K, timing: "pre", logits: "verified" },
  "pre-index-exact": { scheduler: "fixed", selector: "index", selectorOptions: { placement: "device" }, k: K, timing: "pre", logits: "exact" },
  "pre-index-keep": { scheduler: "fixed", selector: "index", selectorOptions: { placement: "device" }, k: K, timing: "pre", logits: "verified", keep: 1 },
  "pre-index-inline": { scheduler: "fixed", selector: "index", selectorOptions: { placement: "device" }, k: K, timing: "pre", logits: "verified" },
  "pre-index-host": { scheduler: "fixed", selector: "index", selectorOptions: { placement: "host" }, k: K, timing: "pre", logits: "verified" },
  feedback: { scheduler: "feedback", selector: "topk+quest", kMin: K, logits: "verified" },
  "feedback-streaming": { scheduler: "feedback", selector: "topk+streaming", kMin: K, logits: "verified" },
  "feedback-infinigen": { scheduler: "feedback", selector: "topk+infinigen", kMin: K, logits: "verified" },
};
/** The selector a step of `name` runs at `timing` (a pair's half), for its floor. */
function floorSelector(name: string, timing: "post" | "pre"): FloorSelector {
  const sel = HYBRID[name]!.selector as string;
  const [post, pre] = sel.includes("+") ? sel.split("+") : [sel, sel];
  return (timing === "post" ? post : pre) as FloorSelector;
}
for (const c of configs) if (c !== "full" && !HYBRID[c]) throw new Error(`unknown config ${c} (configs: full, ${Object.keys(HYBRID).join(", ")})`);

/**
 * The host's read rate: bf16 K of 8 KV heads × 262 144 tokens × 128 (537 MB, past any cache)
 * scanned by the CPU attention-logits kernel — the stage's scoring kernel — on `threads` threads.
 */
function hostReadRate(threads: number): number {
  using cpu = createCpuBackend({ threads });
  const kvHeads = 8, n = 262144, hd = 128, heads = 32;
  const k = cpu.alloc([kvHeads, n, hd], "bf16"), q = cpu.alloc([1, heads * hd]), logits = cpu.alloc([heads, n]);
  try {
    const chunk = Float32Array.from({ length: 1 << 20 }, (_, i) => Math.sin(i) * 0.1);
    for (let at = 0; at < kvHeads * n * hd; at += chunk.length) cpu.write(k, chunk, at);
    cpu.write(q, chunk.subarray(0, heads * hd));
    let best = Infinity;
    for (let r = 0; r < 5; r++) {
      const t0 = performance.now();
      cpu.attnLogits(logits, 0, q, 0, k, 0, n, 0.088);
      cpu.read(logits, 0, 1); // the op has finished
      best = Math.min(best, performance.now() - t0);
    }
    return (kvHeads * n * hd * 2) / (best / 1e3);
  } finally {
    cpu.free(k);
    cpu.free(q);
    cpu.free(logits);
  }
}

/** HBM, host read and pinned upload rates, measured now (the CPU backend: its memory throughout). */
async function bandwidths(be: Backend): Promise<Bandwidths> {
  const hostRead = hostReadRate(threads);
  const link = linkBandwidth(be.hostTransfers?.(), 256 * 2 ** 20, 10);
  const copy = (be as { copyBandwidth?: (bytes: number, iters: number) => number }).copyBandwidth;
  const hbm = copy ? copy.call(be, 2 ** 31, 10) : hostRead;
  return { hbm, hostRead, h2d: link?.h2d ?? hostRead };
}


/**
 * `hybridgen plan`'s prediction for a step with the index ranked on the device, from this run's
 * bandwidths (the device's at full attention's decode rate when full attention ran at this
 * context), the ranking's measured time a layer (indexRankCharge at the run's index shape and widest want) and, for layers whose job waits for the true query (exact logits), the hand-off
 * measured at the start (handOff), against the measured ms/token.
 */
function plannerLine(shape: DeviceIndexShape, form: "int8" | "int4", logits: string, keep: number | undefined, context: number, offloaded: number, measured: number, decodeRate: number | undefined): string {
  const candidates = logits === "verified" ? CANDIDATES : 1;
  const { want, indexRankMs } = indexRankCharge(backend, shape, { k: K, candidates, offloaded, pageSize: INDEX_PAGE, layers: modelBytes.layers });
  const plan = planRun({
    model: { layers: modelBytes.layers, heads: modelBytes.heads, kvHeads: modelBytes.kvHeads, headDim: modelBytes.headDim, weightsBytes: modelBytes.weightBytes, queryProjectionBytes },
    kvElementBytes: 2, contextTokens: context, gpuKvBudget: window, k: K, candidates, ...(keep === undefined ? {} : { keep }), prefill: false, serialLayers: logits === "exact" ? modelBytes.layers : 0,
    tiers: [{ id: "host", kind: "dram", capacityBytes: totalmem(), readBandwidthGBs: bw.hostRead / 1e9 }],
    gpu: { freeBytes: deviceBytes, readBandwidthGBs: (decodeRate ?? bw.hbm) / 1e9, linkBandwidthGBs: bw.h2d / 1e9, indexRankMs, indexRankBeside: backend.beginSide !== undefined, ...(handOff === undefined ? {} : { handOffMs: handOff }) },
    index: { form, placement: "device" },
  });
  const p = plan.predicted, f = (x: number | null) => (x === null ? "–" : x.toFixed(2));
  const rate = decodeRate === undefined ? "the D2D copy rate" : `full attention's decode rate here, ${(decodeRate / 1e9).toFixed(0)} GB/s`;
  return `planner: ${f(p.msPerToken)} ms/token predicted (GPU ${f(p.gpuMs)} at ${rate}, with q̃'s W_q reads and the ranking ${(indexRankMs * 1e3).toFixed(1)} µs a layer at want ${want}${backend.beginSide ? " beside it" : ""}, CPU ${f(p.cpuMs)}, ` +
    `gather ${f(p.vGatherMs)}, link ${f(p.vTransferMs)}, hand-offs ${f(p.handOffMs)}); measured ${measured.toFixed(2)}: ${p.msPerToken ? `${(((measured - p.msPerToken) / p.msPerToken) * 100).toFixed(0)}% off` : "–"}`;
}

/**
 * One hand-off's round trip on this machine (the planner's gpu.handOffMs): the 4-layer model with
 * exact logits and the index ranked on the device — jobs of a few rows, so the device's wait for
 * each is the trip itself (the query's send, the stage's wake and job, its done word) — decoded
 * 24 steps after a 2 048-token prompt; the device's wait a layer, mean of the steps after the first 8.
 * Undefined on a backend without a host link.
 */
async function measureHandOff(): Promise<number | undefined> {
  if (!backend.hostTransfers) return undefined;
  const context = 2048, probeSteps = 24;
  using files = dummyModelFiles(PROBE, "bf16", 1, createNativeRandomFill(), "preset:hand-off probe");
  using model = loadModel(files, backend, { maxContext: context + probeSteps + 8, prefillBlock: context, kvDtype: "bf16", gpuKvBudget: 256, sinkTokens: 4 });
  model.cache.attachHostStore(createCpuBackend({ threads: 1 }), backend.hostTransfers(), true);
  model.step(Int32Array.from({ length: context }, (_, i) => (i * 7919 + 13) % PROBE.vocab_size), 0);
  using ha = await createHybridAttention(model, backend, { cpuStageThreads: threads, rowPath, scheduler: "fixed", selector: "index", selectorOptions: { placement: "device" }, k: 32, timing: "pre", logits: "exact" });
  greedyWalls(model, context, probeSteps);
  const tail = ha.stats.trace.slice(8);
  return tail.length ? mean(tail.map((t) => t.tWaitMs ?? 0)) / PROBE.num_hidden_layers : undefined;
}
/** The hand-off probe's model: 4 layers of the 8B's head shape (headDim 128, 4 query heads a KV head: what the device index ranks). */
const PROBE = {
  architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 1024, intermediate_size: 2048, num_hidden_layers: 4,
  num_attention_heads: 8, num_key_value_heads: 2, vocab_size: 1024, max_position_embeddings: 1 << 20, rms_norm_eps: 1e-5, rope_theta: 1e6,
};

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

using backend = await openBackend(backendName);
/** The device memory the backend took (its arena), for the planner's line; the window is fixed here, so only a refusal would read it. */
const deviceBytes = (backend as { memory?: () => { arenaBytes?: number; freeBytes: number } }).memory?.().arenaBytes ?? totalmem();
type GraphStats = { captures: number; replays: number; drained: number; eagerSteps: number; lastDrain: string };
/** The CUDA backend's graph counters (hybrid steps replay one recorded segment per layer). */
const lab = backendName === "cpu" ? undefined : (await import("@hybridgen/kernels-cuda/lab")).cudaLab(backend as CudaBackend);
const graphStats = (): GraphStats | undefined => lab?.graphStats();
/** "tiny": a 4-layer Llama for a dry run on the CPU backend. */
const TINY = {
  architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 256, intermediate_size: 768, num_hidden_layers: 4,
  num_attention_heads: 8, num_key_value_heads: 2, vocab_size: 1024, max_position_embeddings: 1 << 20, rms_norm_eps: 1e-5, rope_theta: 1e6,
};
const json: Record<string, unknown> = preset === "tiny" ? TINY : presetConfig(preset);
const modelBytes = llamaModelBytes(json);
/** One layer's W_q (bf16): a layer ahead on q̃ reads it once more a step. */
const queryProjectionBytes = (json.hidden_size as number) * modelBytes.heads * modelBytes.headDim * 2;
const bw = await bandwidths(backend);
const GBs = (x: number) => (x / 1e9).toFixed(1);
console.log(`bandwidths: HBM ${GBs(bw.hbm)} GB/s (D2D copy), host read ${GBs(bw.hostRead)} GB/s (${threads} threads), pinned upload ${GBs(bw.h2d)} GB/s`);
/** A layer's hand-off round trip (ms), for the planner's exact-logits rows; measured once when a config ranks the index on the device. */
let handOff: number | undefined;
if (configs.some((c) => HYBRID[c]?.selector === "index" && HYBRID[c]?.logits === "exact")) {
  // A line beside the measurements: a failure to measure it must not end the run.
  try {
    handOff = await measureHandOff();
  } catch (e) {
    console.log(`hand-off: not measured (${(e as Error).message}): the planner charges none`);
  }
}
if (handOff !== undefined) console.log(`hand-off: the device waits ${(handOff * 1e3).toFixed(1)} µs a layer for a job of a few rows (the planner charges it to layers that wait for their true query)`);
const rows = [
  "| context | config | ms/token | × full | floor ms (device / CPU / link) | × floor | T_gpu ms/step | T_cpu ms/step | T_tx ms/step | final K / timing | switches | settled at step | CPU stage hidden |",
  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
];
const recorded: Record<number, RecordedRun[]> = {};
const results: { context: number; config: string; ms: number; floorMs: number }[] = [];

/** The profiler's range around step --profile-step (a CUDA backend's profilerRange), else nothing. */
function profiled(): { step: number; range: (on: boolean) => void } | undefined {
  if (profileStep === "") return undefined;
  if (!lab) throw new Error(`--profile-step needs a backend with a profiler range (cuda), not ${backend.name}`);
  return { step: Number(profileStep), range: (on) => lab.profilerRange(on) };
}

/** The cache at `context` positions: the prompt prefilled (its logits pick the first token), or synthetic KV (the first token is 1). */
function start(model: ReturnType<typeof loadModel>, context: number, prompt: Int32Array): number | undefined {
  if (!synthetic) {
    model.step(prompt, 0);
    return undefined;
  }
  fillSyntheticKv(backend, model.cache, context);
  return 1;
}

for (const context of contexts) {
  const maxContext = context + steps + 8;
  const prompt = Int32Array.from({ length: context }, (_, i) => (i * 7919 + 13) % (json.vocab_size as number));
  const prefillBlock = Math.min(context, 32768);
  let fullMs = 0;
  /** The device's read rate in a decode step, from full attention at this context (its floor's bytes over its ms): the planner's GPU stage streams at it. */
  let decodeRate: number | undefined;
  if (configs.includes("full")) {
    using files = dummyModelFiles(json, "bf16", 1, createNativeRandomFill(), `preset:${preset}`);
    using model = loadModel(files, backend, { maxContext, prefillBlock, kvDtype: "bf16" });
    const first = start(model, context, prompt);
    const walls = greedyWalls(model, context, steps, profiled(), first);
    fullMs = mean(walls.slice(WARM));
    const floor = fullFloorMs(modelBytes, context, bw.hbm);
    decodeRate = (bw.hbm * floor) / fullMs;
    results.push({ context, config: "full", ms: fullMs, floorMs: floor });
    rows.push(`| ${context} | full attention on the device | ${fullMs.toFixed(2)} | 1.00 | ${floor.toFixed(2)} | ${(fullMs / floor).toFixed(2)} | – | – | – | – | – | – | – |`);
    console.log(rows[rows.length - 1]);
  }
  const hybridConfigs = configs.filter((c) => c !== "full");
  if (hybridConfigs.length === 0 || context <= window) continue;
  using files = dummyModelFiles(json, "bf16", 1, createNativeRandomFill(), `preset:${preset}`);
  using model = loadModel(files, backend, { maxContext, prefillBlock, kvDtype: "bf16", gpuKvBudget: window, sinkTokens: sinks });
  if (backend.hostTransfers) model.cache.attachHostStore(createCpuBackend({ threads: 1 }), backend.hostTransfers(), true);
  const t0 = performance.now();
  const first = start(model, context, prompt);
  console.log(`context ${context}: ${synthetic ? "synthetic KV" : "prefilled"} in ${((performance.now() - t0) / 1e3).toFixed(1)} s; ${model.cache.storeCount} tokens offloaded, window ${window} with ${sinks} sinks`);
  using cp = model.cache.checkpoint();
  recorded[context] = [];
  for (const name of hybridConfigs) {
    using ha = await createHybridAttention(model, backend, { cpuStageThreads: threads, rowPath, ...HYBRID[name] });
    // pre-index-inline: pre-index with the backend's side stream hidden, so each ranking and its send run in line (the side stream's A/B in one run).
    const side = backend as { beginSide?: Backend["beginSide"] };
    if (name === "pre-index-inline") side.beginSide = undefined;
    try {
      const g0 = graphStats();
      const walls = greedyWalls(model, context, steps, profiled(), first);
      const g1 = graphStats();
      const trace = ha.stats.trace.slice();
      const tail = trace.slice(WARM);
      const ms = mean(walls.slice(WARM)), last = trace[trace.length - 1];
      const logits = (HYBRID[name]!.logits ?? "verified") as "exact" | "speculative" | "verified";
      const opts = (HYBRID[name]!.selectorOptions ?? {}) as { form?: "int8" | "int4"; placement?: string };
      const index = { form: opts.form ?? "int8", onDevice: ha.deviceIndex !== null }, keep = HYBRID[name]!.keep;
      const floors = tail.map((t) => stepFloor(stepBytes(modelBytes, {
        window, offloaded: t.offloaded, k: t.k, timing: t.timing, logits, candidates: CANDIDATES, keep, selector: floorSelector(name, t.timing), index,
      }), bw));
      const f = { device: mean(floors.map((x) => x.deviceMs)), cpu: mean(floors.map((x) => x.cpuMs)), link: mean(floors.map((x) => x.linkMs)), step: mean(floors.map((x) => x.floorMs)) };
      results.push({ context, config: name, ms, floorMs: f.step });
      rows.push(`| ${context} | ${name} | ${ms.toFixed(2)} | ${fullMs ? (ms / fullMs).toFixed(2) : "–"} | ` +
        `${f.step.toFixed(2)} (${f.device.toFixed(2)} / ${f.cpu.toFixed(2)} / ${f.link.toFixed(2)}) | ${(ms / f.step).toFixed(2)} | ${mean(tail.map((t) => t.tGpuMs)).toFixed(2)} | ` +
        `${mean(tail.map((t) => t.tCpuMs)).toFixed(2)} | ${mean(tail.map((t) => t.tTxMs)).toFixed(2)} | ${last ? `${last.k} / ${last.timing}` : "–"} | ` +
        `${switches(trace)} | ${settleStep(trace)} | ${Math.round(ha.stats.hiddenFraction * 100)}% |`);
      console.log(rows[rows.length - 1]);
      console.log(`  ${ha.stats.summary()}`);
      const b = stepBytes(modelBytes, { window, offloaded: tail[0]?.offloaded ?? 0, k: tail[0]?.k ?? K, timing: tail[0]?.timing ?? "pre", logits, candidates: CANDIDATES, keep, selector: floorSelector(name, tail[0]?.timing ?? "pre"), index });
      console.log(`  bytes a step: device ${(b.device / 1e9).toFixed(3)} GB, host ${(b.cpu / 1e6).toFixed(1)} MB, link ${(b.link / 1e6).toFixed(2)} MB`);
      if (ha.deviceIndex) {
        // The prediction is a line beside the measurement: a failure to make it (the ranking's scratch past the arena) must not end the run.
        try {
          console.log(`  ${plannerLine(ha.deviceIndex.shape, index.form, logits, keep, context, tail[0]?.offloaded ?? 0, ms, decodeRate)}`);
        } catch (e) {
          console.log(`  planner: not predicted (${(e as Error).message})`);
        }
      }
      if (g0 && g1) console.log(`  graphs: ${g1.captures - g0.captures} captured, ${g1.replays - g0.replays} replayed, ${g1.drained - g0.drained} drained (last: ${g1.lastDrain}), ${g1.eagerSteps - g0.eagerSteps} eager`);
      recorded[context]!.push({ label: name, scheduler: HYBRID[name]!.scheduler as string, steps: trace });
    } finally {
      ha.close();
      model.cache.restore(cp);
      if (name === "pre-index-inline") delete side.beginSide;
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

/** Issue 20's targets, from this run: feedback (verified) ≤ 1.5× full at 32K and ≤ 2.5× at 128K, within 1.25× of its floor; pre at 32K ≤ 1.15× full at the window's size. */
const targets: string[] = [];
const verdict = (ok: boolean) => (ok ? "met" : "not met");
for (const r of results) {
  if (r.config !== "feedback") continue;
  const full = results.find((x) => x.config === "full" && x.context === r.context);
  const limit = r.context <= 32768 ? 1.5 : 2.5;
  if (full) targets.push(`- ${r.context}: feedback ${r.ms.toFixed(2)} ms = ${(r.ms / full.ms).toFixed(2)}× full (target ≤ ${limit}×: ${verdict(r.ms / full.ms <= limit)}), ${(r.ms / r.floorMs).toFixed(2)}× its floor (target ≤ 1.25×: ${verdict(r.ms / r.floorMs <= 1.25)})`);
}
const fullAtWindow = results.find((x) => x.config === "full" && x.context === window);
for (const r of results) {
  if (!fullAtWindow || r.context !== 32768 || !r.config.startsWith("pre-")) continue;
  targets.push(`- 32768 ${r.config}: ${r.ms.toFixed(2)} ms = ${(r.ms / fullAtWindow.ms).toFixed(2)}× full attention at a ${window}-token context (target ≤ 1.15×: ${verdict(r.ms / fullAtWindow.ms <= 1.15)})`);
}

console.log(`\n## ${preset}, dummy bf16 weights, bf16 KV, batch 1; window ${window} with ${sinks} sinks, K ${K}, ${threads} stage threads, ${steps} steps (means skip the first ${WARM}); ${synthetic ? "synthetic KV (--synthetic-kv)" : "prefilled"}; ${backend.name}`);
for (const r of rows) console.log(r);
if (targets.length) console.log(`\nTargets:\n${targets.join("\n")}`);
