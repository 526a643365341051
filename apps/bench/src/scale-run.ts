/**
 * Issue 22's scale run: hybrid decode at contexts whose KV exceeds the GPU — the window sized by
 * memtier's planner from the device's free memory, the rest of the store placed on the host
 * tiers (and the disk tier with --kv-disk) by a TieredStore — with the planner's bytes per tier
 * and predicted ms/token printed beside the measurement. --batch B decodes B sequences of the
 * context at once (BatchDecoder), each with its own tiered store laid out on a B-th of every
 * tier and of the host budget; ms are per batched step, bytes summed over the sequences, and the
 * planner plans the batch.
 *
 *   ./bun apps/bench/src/scale-run.ts --contexts 1500000,2000000 --synthetic-kv [--kv-disk DIR]
 *     [--host-kv-budget 88G] [--preset llama-3.1-8b] [--backend cuda|cpu] [--steps 24] [--k 256]
 *     [--sinks 4] [--window auto|least|N] [--placement semantic] [--config post-verified|pre-index|…] [--index-form int4] [--threads N] [--batch B]
 *
 * --synthetic-kv (never the default): no prefill; the window is filled with seeded random rows,
 * then the cache grows through its own append and evict path without computing any row, so
 * every eviction's device → host copy carries those rows into the store (disk tier included). Without
 * it the prompt is prefilled for real in blocks of 32 768 tokens (the ≥ 256K proof of the path).
 * Dummy bf16 weights, bf16 KV; one config per context (a checkpoint of a 100 GB window
 * would not fit anywhere). --window least: the planner's smallest window the host tiers leave (the
 * page index on the device: an offloaded token costs the device its index bytes, a window token its
 * K and V). Each row is followed by its bytes a step per side and their floor at the run's bandwidths.
 */
import { cpus } from "node:os";
import { BatchDecoder, dummyModelFiles, linkBandwidth, LlamaModel, loadModel, modelInfo, presetConfig, type HybridStepRecord, isFileTier } from "@hybridgen/core";
import { createNativeRandomFill, DEFAULT_READ_DEPTH, probeFileReadBandwidth, probeMemoryReadBandwidth, TieredStore } from "@hybridgen/kernels-cpu";
import { discoverTiers, formatBytes, layoutStore, placeKv, planRun, tierShares, type RunPlan, type RunPlanInput } from "@hybridgen/memtier";
import { createBatchHybridAttention, createHybridAttention, defaultStageThreads, fillSyntheticKv, HYBRID_DEFAULTS, indexRankCharge, KSpill, probeDiskGather, type HybridAttention, type HybridRuntimeOptions } from "@hybridgen/runtime";
import { PageIndexOptionsSchema } from "@hybridgen/selectors";
import { arg, hybridArg, list } from "./args.js";
import { openBackend } from "./open-backend.js";
import { greedyWalls, mean } from "./greedy-walls.js";

const backendName = arg("backend", "cuda");
const preset = arg("preset", "llama-3.1-8b");
const contexts = list("contexts", "1500000").map(Number);
const steps = Number(arg("steps", "24"));
const K = hybridArg("k", 256);
const sinks = Number(arg("sinks", "4"));
const windowArg = arg("window", "auto");
if (!["auto", "least"].includes(windowArg) && !(Number.isInteger(Number(windowArg)) && Number(windowArg) > 0)) {
  process.stderr.write(`error: invalid value for --window: must be auto, least or a positive token count (got ${windowArg})\n`);
  process.exit(2);
}
const autoWindow = windowArg === "auto" || windowArg === "least";
const policy = arg("placement", "semantic") as "semantic" | "interleave" | "local" | "dram-only";
const kvDisk = arg("kv-disk", "");
const hostBudgetArg = arg("host-kv-budget", "");
const threads = Number(arg("threads", String(defaultStageThreads(true))));
const config = arg("config", "post-verified");
const indexForm = arg("index-form", "int4") as "int8" | "int4";
const batch = Number(arg("batch", "1"));
if (!(Number.isInteger(batch) && batch >= 1)) throw new Error(`--batch must be a positive integer (got ${arg("batch", "1")})`);
/** Tokens a prefill block appends at once (the window keeps that many slots past its budget). */
const PREFILL_BLOCK = 32768;
const synthetic = process.argv.includes("--synthetic-kv");
const WARM = 4;
/** "tiny": a 4-layer Llama for a dry run of the script on the CPU backend. */
const TINY = {
  architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 256, intermediate_size: 768, num_hidden_layers: 4,
  num_attention_heads: 8, num_key_value_heads: 2, vocab_size: 1024, max_position_embeddings: 1 << 20, rms_norm_eps: 1e-5, rope_theta: 1e6,
};

const CONFIGS: Record<string, HybridRuntimeOptions> = {
  "post-verified": { scheduler: "fixed", selector: "topk", k: K, timing: "post", logits: "verified" },
  "post-speculative": { scheduler: "fixed", selector: "topk", k: K, timing: "post", logits: "speculative" },
  "post-exact": { scheduler: "fixed", selector: "topk", k: K, timing: "post", logits: "exact" },
  "pre-streaming": { scheduler: "fixed", selector: "streaming", k: K, timing: "pre", logits: "verified" },
  "pre-index": { scheduler: "fixed", selector: "index", selectorOptions: { form: indexForm, placement: "device" }, k: K, timing: "pre", logits: "verified" },
  "pre-index-host": { scheduler: "fixed", selector: "index", selectorOptions: { form: indexForm, placement: "host" }, k: K, timing: "pre", logits: "verified" },
};
/** The page index's configs, as the planner charges them. */
const INDEX: Record<string, { form: "int8" | "int4"; placement: "device" | "host" }> = {
  "pre-index": { form: indexForm, placement: "device" }, "pre-index-host": { form: indexForm, placement: "host" },
};
if (!CONFIGS[config]) throw new Error(`unknown config ${config} (${Object.keys(CONFIGS).join(", ")})`);

const size = (s: string) => {
  const m = /^(\d+(?:\.\d+)?)([KMGT]?)$/i.exec(s);
  if (!m) throw new Error(`bad size ${s}`);
  return Math.floor(Number(m[1]) * 1024 ** " KMGT".indexOf((m[2] || " ").toUpperCase()));
};
const hostBudget = hostBudgetArg ? size(hostBudgetArg) : undefined;


using backend = await openBackend(backendName, { arenaFraction: 0.95 });
const GiB = 2 ** 30;
const copyBw = (backend as { copyBandwidth?: (b: number, i: number) => number }).copyBandwidth?.call(backend, GiB, 10);
const link = linkBandwidth(backend.hostTransfers?.(), 256 * 2 ** 20, 10);
const baseTiers = discoverTiers({ fileTiers: kvDisk ? [{ path: kvDisk }] : [] }).map((t) => ({
  ...t,
  readBandwidthGBs: t.readBandwidthGBs ?? (isFileTier(t) ? probeFileReadBandwidth(t.path!, 256 * 2 ** 20, 4 * 2 ** 20) : probeMemoryReadBandwidth(256 * 2 ** 20, t.numaNode, threads)) / 1e9,
}));
// Disk rows: a read's latency in the stage's own gather at its depth (its threads × reads in flight each), and a page fault's (K spilled).
for (const [i, t] of baseTiers.entries()) {
  if (!isFileTier(t)) continue;
  const [gather, faults] = await probeDiskGather(t.path!, { threads, readDepths: [DEFAULT_READ_DEPTH, 0] });
  baseTiers[i] = { ...t, readLatencyUs: gather!.latencyUs, readDepth: gather!.readDepth, faultLatencyUs: faults!.latencyUs, faultDepth: faults!.readDepth };
}
console.log(`tiers: ${baseTiers.map((t) => `${t.id} ${t.kind} ${formatBytes(t.capacityBytes)} ${t.readBandwidthGBs!.toFixed(1)} GB/s` +
  (t.readLatencyUs ? `, 4 KiB reads ${t.readLatencyUs.toFixed(0)} µs at ${t.readDepth} in flight` : "")).join("; ")}`);
if (copyBw) console.log(`device: copy ${(copyBw / 1e9).toFixed(0)} GB/s, host→device ${link ? (link.h2d / 1e9).toFixed(1) : "–"} GB/s`);
const seqTiers = tierShares(baseTiers, batch); // each sequence of a batch lays its store out on its share
const seqHostBudget = hostBudget === undefined ? undefined : Math.floor(hostBudget / batch);
const rows = [
  "| context | batch | window (GPU) | offloaded | K host / disk | V host / disk | predicted ms/step (GPU / CPU / V) | measured ms/step | tokens/s | × predicted | T_gpu | T_cpu | T_tx | placement checked |",
  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
];

/**
 * The planner's prediction with a device index's ranking as measured (indexRankCharge at the index's
 * shape and the verified layers' want), else the plan's own; a failure to time it is said and the plan's kept.
 */
function rankedPrediction(a: HybridAttention, input: RunPlanInput, plan: RunPlan): RunPlan["predicted"] {
  if (!a.deviceIndex || !input.gpu) return plan.predicted;
  try {
    const { want, indexRankMs } = indexRankCharge(backend, a.deviceIndex.shape, {
      k: K, candidates: HYBRID_DEFAULTS.candidates, offloaded: plan.offloadedTokens, pageSize: PageIndexOptionsSchema.parse({}).pageSize, layers: input.model.layers,
    });
    console.log(`  the device index ranks a layer in ${(indexRankMs * 1e3).toFixed(1)} µs (want ${want}): the prediction charges it${batch === 1 && backend.beginSide ? " beside the layer (a side stream)" : ""}`);
    return planRun({ ...input, gpu: { ...input.gpu, indexRankMs, indexRankBeside: batch === 1 && backend.beginSide !== undefined } }).predicted;
  } catch (e) {
    console.log(`  the device index's ranking not timed (${(e as Error).message}): the prediction charges its bytes`);
    return plan.predicted;
  }
}

/**
 * A step's bytes per side as the planner counts them (the device: weights, windows, a device index;
 * each tier: what the stage reads and gathers there; the link: the rows sent up) and their floor at this
 * run's bandwidths (the sides overlap: the floor is the slowest), against the measured ms a step.
 */
function floorLine(plan: RunPlan, bytes: RunPlan["predicted"]["bytes"], measured: number): string {
  const at = (b: number, gbs: number | undefined) => (gbs ? (b / (gbs * 1e9)) * 1e3 : null);
  const device = at(bytes.gpu, copyBw ? copyBw / 1e9 : undefined), linkMs = at(bytes.link, link ? link.h2d / 1e9 : undefined);
  let host: number | null = 0;
  for (const [id, b] of Object.entries(bytes.tiers)) {
    const m = at(b, plan.tiers.find((t) => t.id === id)?.readBandwidthGBs);
    host = host === null || m === null ? null : host + m;
  }
  const sides = [device, host, linkMs];
  const floor = sides.some((x) => x === null) ? null : Math.max(...(sides as number[]));
  const f = (x: number | null) => (x === null ? "–" : x.toFixed(2));
  return `bytes a step: device ${formatBytes(bytes.gpu)}, host ${formatBytes(Object.values(bytes.tiers).reduce((a, b) => a + b, 0))}, link ${formatBytes(bytes.link)}; ` +
    `floor ms (device / host / link) ${f(device)} / ${f(host)} / ${f(linkMs)}: ${f(floor)}, measured ${measured.toFixed(2)} (${floor ? (measured / floor).toFixed(2) : "–"}× the floor)`;
}

/** Greedy batched decode of `steps` tokens, every slot a step; wall ms of each step (step + picks). */
function batchWalls(dec: BatchDecoder, slots: number[], first: Int32Array): number[] {
  const walls: number[] = [];
  const tok = Int32Array.from(first);
  for (let s = 0; s < steps; s++) {
    const t0 = performance.now();
    dec.step(slots, tok);
    dec.argmaxSlots(slots, tok);
    walls.push(performance.now() - t0);
  }
  return walls;
}

for (const context of contexts) {
  const maxContext = context + steps + 8;
  const json = { ...(preset === "tiny" ? TINY : presetConfig(preset)), max_position_embeddings: maxContext };
  using files = dummyModelFiles(json, "bf16", 1, createNativeRandomFill(), `preset:${preset}`);
  const weightsBytes = Object.values(modelInfo(files.config, files.shape, files.weights).weightBytes).reduce((a, b) => a + (b ?? 0), 0);
  const freeBytes = backend.memory?.().freeBytes;
  const planInput: RunPlanInput = {
    model: {
      layers: files.shape.layers, heads: files.shape.heads, kvHeads: files.shape.kvHeads, headDim: files.shape.headDim, weightsBytes,
      queryProjectionBytes: files.shape.hiddenSize * files.shape.heads * files.shape.headDim * 2,
      activationBytes: LlamaModel.activationBytes(files.shape, PREFILL_BLOCK),
    },
    kvElementBytes: 2, contextTokens: maxContext, batch, k: K, policy, prefill: !synthetic, appendTokens: PREFILL_BLOCK, hostBudgetBytes: hostBudget, tiers: baseTiers,
    gpuKvBudget: autoWindow ? ("auto" as const) : Number(windowArg), leastWindow: windowArg === "least", index: INDEX[config],
    gpu: freeBytes === undefined ? undefined : { freeBytes, readBandwidthGBs: copyBw ? copyBw / 1e9 : undefined, linkBandwidthGBs: link ? link.h2d / 1e9 : undefined },
  };
  const plan = planRun(planInput);
  const window = plan.gpu?.windowTokens ?? (autoWindow ? Math.min(maxContext, 65536) : Number(windowArg));
  console.log(`context ${context} × batch ${batch}: plan window ${window}, offloaded ${plan.offloadedTokens} a sequence, predicted ${plan.predicted.msPerToken?.toFixed(2) ?? "–"} ms/step`);
  if (plan.refusal) {
    console.log(`  refused by the planner: ${plan.refusal}`);
    rows.push(`| ${context} | ${batch} | – | – | – | – | refused: ${plan.refusal} | – | – | – | – | – | – | – |`);
    continue;
  }
  const t0 = performance.now();
  using model = loadModel(files, backend, { maxContext, prefillBlock: PREFILL_BLOCK, kvDtype: "bf16", gpuKvBudget: window, sinkTokens: sinks });
  const tModel = performance.now();
  const cache = model.cache;
  const regionBytes = cache.kvHeads * cache.storeCapacity * cache.headDim * 2;
  const layout = layoutStore({ tiers: seqTiers, placement: placeKv(policy, seqTiers), layers: cache.layers, regionBytes, hostBudgetBytes: seqHostBudget });
  if (!layout.fits) throw new Error(`a sequence's store does not fit its share of the tiers: short by ${formatBytes(layout.shortfallBytes)}`);
  const stores: (TieredStore | KSpill)[] = [];
  const place = () => {
    const store = layout.layout.kSpill ? new KSpill(new TieredStore(layout.layout)) : new TieredStore(layout.layout);
    stores.push(store);
    return store;
  };
  // The batch's stages are lanes of one native stage: it takes the machine's threads.
  const options = { cpuStageThreads: threads, storeAllocator: place, ...CONFIGS[config] };
  using hybrid = batch > 1 ? await createBatchHybridAttention(model, backend, options, batch) : null;
  using single = hybrid ? null : await createHybridAttention(model, backend, options);
  using dec = batch > 1 ? new BatchDecoder(model, batch) : null;
  const attentions: HybridAttention[] = hybrid ? [...hybrid.all] : [single!];
  const slots = Array.from({ length: batch }, (_, i) => i);
  const caches = dec ? slots.map((i) => dec.sequence(i).cache) : [cache];
  const diskBytes = stores.reduce((n, s) => n + s.diskBytes, 0), diskFiles = stores.reduce((n, s) => n + s.files.length, 0);
  // Each set-up phase's seconds: a run cut by its time limit still says where the time went.
  const secs = (a: number, b: number) => ((b - a) / 1e3).toFixed(1);
  console.log(`  loaded in ${secs(t0, performance.now())} s (weights and window ${secs(t0, tModel)} s, hybrid attention with its store(s) placed and pinned ${secs(tModel, performance.now())} s); ` +
    `${batch} store(s) of ${formatBytes(2 * cache.layers * layout.layout.regionBytes)}, disk ${formatBytes(diskBytes)} in ${diskFiles} files`);
  const t1 = performance.now();
  const firstTokens = new Int32Array(batch).fill(1);
  if (synthetic) {
    for (const c of caches) {
      fillSyntheticKv(backend, c, context); // every eviction copies the window's random rows into the store
    }
    const tFill = performance.now();
    // The step at `context` gives the picks a row (a device index folds and uploads the whole store in it).
    if (dec) {
      dec.step(slots, firstTokens);
      dec.argmaxSlots(slots, firstTokens);
    } else model.step(Int32Array.of(1), context);
    console.log(`  synthetic KV: ${context} positions × ${batch} (${caches.reduce((n, c) => n + c.storeCount, 0)} offloaded) in ${secs(t1, performance.now())} s ` +
      `(filled and evicted ${secs(t1, tFill)} s, the first step ${secs(tFill, performance.now())} s)`);
  } else {
    const prompt = (seq: number) => Int32Array.from({ length: context }, (_, i) => (i * 7919 + 13 + seq * 104729) % files.shape.vocabSize);
    if (dec) {
      for (const i of slots) {
        dec.prefill(i, prompt(i), 0);
        firstTokens[i] = dec.argmax(i);
      }
    } else model.step(prompt(0), 0);
    console.log(`  prefilled ${context} tokens × ${batch} in ${((performance.now() - t1) / 1e3).toFixed(1)} s (${caches.reduce((n, c) => n + c.storeCount, 0)} offloaded)`);
  }
  const walls = dec ? batchWalls(dec, slots, firstTokens) : greedyWalls(model, synthetic ? context + 1 : context, steps);
  // After the steps: the ranking is timed on an idle device.
  const predicted = rankedPrediction(attentions[0]!, planInput, plan);
  const checks = stores.flatMap((s) => s.verify(16));
  const trace: readonly HybridStepRecord[] = attentions.flatMap((a) => a.stats.trace.slice(WARM));
  const ms = mean(walls.slice(WARM));
  const tier = (pool: "kBytes" | "vBytes", file: boolean) =>
    formatBytes(batch * layout.tiers.filter((t) => (isFileTier(t)) === file).reduce((n, t) => n + t[pool], 0));
  const p = predicted;
  rows.push(`| ${context} | ${batch} | ${window} | ${cache.storeCount} × ${batch} | ${tier("kBytes", false)} / ${tier("kBytes", true)} | ${tier("vBytes", false)} / ${tier("vBytes", true)} | ` +
    `${p.msPerToken?.toFixed(2) ?? "–"} (${p.gpuMs?.toFixed(2) ?? "–"} / ${p.cpuMs?.toFixed(2) ?? "–"} / ${((p.vGatherMs ?? 0) + (p.vTransferMs ?? 0)).toFixed(2)}) | ${ms.toFixed(2)} | ` +
    `${((batch * 1000) / ms).toFixed(1)} | ${p.msPerToken ? (ms / p.msPerToken).toFixed(2) : "–"} | ` +
    `${mean(trace.map((t) => t.tGpuMs)).toFixed(2)} | ${mean(trace.map((t) => t.tCpuMs)).toFixed(2)} | ${mean(trace.map((t) => t.tTxMs)).toFixed(2)} | ` +
    `${checks.filter((c) => c.ok).length}/${checks.length} |`);
  console.log(rows[rows.length - 1]);
  console.log(`  ${floorLine(plan, p.bytes, ms)}`);
  const spills = stores.filter((s): s is KSpill => s instanceof KSpill);
  if (spills.length > 0) {
    const sum = (f: (s: KSpill) => number) => spills.reduce((n, s) => n + f(s), 0);
    console.log(`  K spill: ${sum((s) => s.stats.units)} units of ${formatBytes(spills[0]!.unitBytes)} (${formatBytes(sum((s) => s.stats.bytes))}) moved to disk in ${sum((s) => s.stats.passes)} passes, over ${spills.length} sequence(s)`);
  }
  for (const [i, a] of attentions.entries()) {
    console.log(`  ${batch > 1 ? `sequence ${i}: ` : ""}${a.stats.summary()}`);
    for (const n of a.stats.notes) console.log(`  ${n}`);
  }
  const bad = checks.filter((c) => !c.ok).slice(0, 3);
  for (const c of bad) console.log(`  placement mismatch: ${JSON.stringify(c)}`);
}

console.log(`\n## ${preset} shape, dummy bf16 weights, bf16 KV, batch ${batch}, ${config} K ${K}, ${sinks} sinks, placement ${policy}, ${threads} stage threads, ` +
  `${steps} steps (means skip the first ${WARM}); ${synthetic ? "synthetic KV (--synthetic-kv)" : "real prefill"}; ${backend.name}`);
for (const r of rows) console.log(r);
