/**
 * Hybrid attention on the CUDA backend (KV store in pinned host memory, the native CPU stage,
 * copies on the copy stream): correctness, then speed. Usage:
 *   bun hybrid-bench.js [--context 32768] [--steps 32] [--window 4096] [--sinks 4] [--threads 15]
 *     [--ks 256,1024] [--modes exact,speculative] [--thread-variants 16,14] [--spin-us 0] [--spin-variants 200]
 *     [--probe-threads 16,15,14] [--block-variant 4096] [--row-paths auto,staged] [--skip-full] [--skip-bench]
 *     [--checks TEXT] (only the checks whose name holds TEXT, or one of TEXT's |-separated parts, e.g. "batch of" or
 *     "attnPartialRows|batch of 12": a device call's time goes to those)
 *
 * Checks (stories15M shape, random f32 weights, f32 KV; @hybridgen/runtime's createHybridAttention composes it):
 *   1. selector "all" + exact logits on CUDA equals full attention on CUDA within 1e-5 (relative
 *      to the largest logit) at every step, the same tokens fed to both;
 *   2. top-K greedy tokens on CUDA equal the CPU backend's hybrid run (exact and speculative);
 *   3. a prompt prefilled in several blocks with eviction during prefill (the offloaded rows come
 *      up per layer by KvCache.loadStore), "all" + exact, equals full attention within 1e-5;
 *   4. the store is host-only: no device store tensors while the runs hold the model;
 *   5. selected rows read by the device from the mapped host store against staged rows
 *      (cuda/mapped-rows-checks.ts: the gather op byte for byte, the same logits and tokens);
 *   6. the stage hand-off on the device: the device waits for a host-raised signal word and reads
 *      the stage's output from mapped memory, eager and replayed; the wait's timeout; gpuMs
 *      without the wait (cuda/stage-handoff-checks.ts);
 *   7. a batch of 3 (one HybridAttention a slot) equals each sequence alone, every batched step
 *      handed off and recorded a layer at a time (where every layer runs ahead on q̃: exact steps run
 *      eagerly), for each logits mode; a batch of 12 (its projections through cuBLAS) likewise; a batch
 *      of 3 with the page index ranked on the device (headDim 64) likewise, one indexRankRows a layer;
 *      indexRankRows of 3 indexes equals indexRank of each, eager and recorded; keepRows equals spec's
 *      keptColumns and a host gather, and batches of 3 and 12 that keep K of 4·K candidates equal each alone;
 *   8. cuBLAS matmuls recorded in a step equal eager ones bit for bit (cuda/recorded-gemm-checks.ts).
 * Bench (preset:llama-3.1-8b, dummy bf16 weights, bf16 KV): prefill `context` tokens in one
 * block, then `steps` greedy decode steps — full attention on the GPU, and hybrid with a GPU
 * window of `window` tokens (sinks included) and the CPU stage's top-K for each K, exact and
 * speculative logits, each row path asked for (auto: mapped where the store allows; staged): ms/token and per step T_gpu, T_cpu, T_tx from the hybrid stats, T_cpu split
 * into scoring / top-K / V gather / hand-offs; variants of the stage's thread count and idle spin.
 * Device memory: the arena's used/peak bytes with the store host-only, next to what the device
 * store took before (the same shapes). A stage probe runs the CPU stage alone over the pinned host
 * store's 32 layers (no GPU work meanwhile) per thread count, and over unpinned copies of 8
 * layers against 8 pinned ones (is cudaHostRegister'd memory slower to read?), with the
 * machine's transparent-huge-page setting. --block-variant B loads the hybrid model again with a
 * prefill block of B tokens (window = budget + B slots: the device memory hybrid saves), prefills
 * the prompt in blocks (blocks over offloaded rows: KvCache.loadContiguous + one causal kernel),
 * compares its logits with the one-block prefill's and decodes. Also the pinned host↔device
 * bandwidth of the copy path.
 */
import {
  BatchDecoder, STORIES15M_SHAPE, argmax, dummyModelFiles, loadModel, presetConfig, relError, seededRandom, type Backend, type CausalLM, type CpuStageJob, type DeviceIndexShape, type LlamaModel, type Tensor,
} from "@hybridgen/core";
import { HandOffBatch, IndexBatch, type LogitsMode, type RowPathRequest } from "@hybridgen/runtime";
import { createSelector } from "@hybridgen/selectors";
import { createBatchHybridAttention, createHybridAttention, type HybridRuntimeOptions } from "@hybridgen/runtime";
import { readFileSync } from "node:fs";
import { cpus } from "node:os";
import { createCpuBackend, createNativeRandomFill, NativeCpuStage } from "@hybridgen/kernels-cpu";
import { createCudaBackend, cudaAvailability, describeCudaAvailability, type CudaBackend, type CudaHostLink } from "@hybridgen/kernels-cuda";
import { cudaLab } from "@hybridgen/kernels-cuda/lab";
import { mappedRowChecks } from "./mapped-rows-checks.js";
import { recordedGemmChecks } from "./recorded-gemm-checks.js";
import { keepRowsChecks, stageHandoffChecks } from "./stage-handoff-checks.js";
import { windowRowsChecks } from "./window-rows-checks.js";
import { arg } from "../args.js";

const context = Number(arg("context", "32768"));
const steps = Number(arg("steps", "32"));
const window = Number(arg("window", "4096"));
const sinks = Number(arg("sinks", "4"));
const threads = Number(arg("threads", String(Math.max(1, cpus().length - 1))));
const ks = arg("ks", "256,1024").split(",").map(Number);
const list = (name: string, dflt: string) => arg(name, dflt).split(",").filter((x) => x !== "");
const modes = list("modes", "exact,speculative") as LogitsMode[];
const threadVariants = list("thread-variants", "").map(Number);
const spinUs = Number(arg("spin-us", "0"));
const spinVariants = list("spin-variants", "").map(Number);
const probeThreads = list("probe-threads", "").map(Number);
const blockVariant = Number(arg("block-variant", "0"));
const rowPaths = list("row-paths", "auto") as RowPathRequest[];

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
/** A hybrid run of the checks: the device window (sinks included), its sinks, and the runtime's options. */
type SmallHybrid = HybridRuntimeOptions & { gpuKvBudget: number; sinkTokens: number };

/** Prompt then greedy steps (or the given tokens), logits of every forward. */
async function runSmall(be: Backend, hybrid: SmallHybrid | null, feed?: number[], prefillBlock = 64): Promise<HybridRun> {
  using files = dummyModelFiles(SMALL_SHAPE, "f32", 7);
  using model = loadModel(files, be, { maxContext: SMALL_CONTEXT, prefillBlock, ...(hybrid ? { gpuKvBudget: hybrid.gpuKvBudget, sinkTokens: hybrid.sinkTokens } : {}) });
  const { gpuKvBudget: _b, sinkTokens: _s, ...runtime } = hybrid ?? { gpuKvBudget: 0, sinkTokens: 0 };
  using ha = hybrid ? await createHybridAttention(model, be, runtime) : null;
  if (ha && be.hostTransfers) {
    console.log(`  host link regions: ${JSON.stringify((be.hostTransfers() as CudaHostLink).pinCounts())}`);
    check(model.cache.storeInHost && model.cache.storeK.length + model.cache.storeV.length === 0, "the store is host-only: no device store tensors");
  }
  const logits = [model.forward(prompt, 0)];
  if (ha && be.hostTransfers && prefillBlock < PROMPT) console.log(`  after a prefill in blocks of ${prefillBlock}: ${model.cache.storeCount} offloaded, ${model.cache.storeScratchTensors} device scratch tensors (loadStore)`);
  const tokens: number[] = [];
  for (let s = 0; s < SMALL_STEPS; s++) {
    const tok = feed ? feed[s] : argmax(logits[logits.length - 1]);
    tokens.push(tok);
    logits.push(model.forward(Int32Array.of(tok), PROMPT + s));
  }
  return { logits, tokens, summary: ha ? ha.stats.summary() : "" };
}

/**
 * B prompts decoded together (BatchDecoder, one HybridAttention a slot) against each alone, the
 * alone run's tokens fed to both: logits within 1e-4 relative (B-row matmuls against fused
 * matvecs: summation order only), every batched step handed off on the device and recorded a
 * layer at a time (BatchRows' segments; at 9 or more rows the projections go through cuBLAS).
 */
async function batchChecks(be: Backend, hybrid: SmallHybrid, B: number, what = `top-K 8 ${hybrid.logits}`, shape: Record<string, unknown> = SMALL_SHAPE): Promise<void> {
  const prompts = Array.from({ length: B }, (_, p) => Int32Array.from({ length: 40 + ((p * 11) % 24) }, (_, i) => (i * 7919 + 13 * p + 11) % 32000));
  using files = dummyModelFiles(shape, "f32", 7);
  using model = loadModel(files, be, { maxContext: SMALL_CONTEXT, prefillBlock: 64, gpuKvBudget: hybrid.gpuKvBudget, sinkTokens: hybrid.sinkTokens }) as LlamaModel;
  const { gpuKvBudget: _b, sinkTokens: _s, ...runtime } = hybrid;
  const alone: { logits: Float32Array[]; tokens: number[] }[] = [];
  {
    using _ha = await createHybridAttention(model, be, runtime);
    for (const p of prompts) {
      model.reset();
      const logits = [Float32Array.from(model.forward(p, 0))], tokens: number[] = [];
      for (let s = 0; s < SMALL_STEPS / 2; s++) {
        tokens.push(argmax(logits[s]!));
        logits.push(Float32Array.from(model.forward(Int32Array.of(tokens[s]!), p.length + s)));
      }
      alone.push({ logits, tokens });
    }
  }
  model.reset();
  using batch = await createBatchHybridAttention(model, be, runtime, B);
  using dec = new BatchDecoder(model, B);
  const graphs0 = cudaLab(be as CudaBackend).graphStats(), rankCalls0 = IndexBatch.of(be).calls;
  const handOff = HandOffBatch.of(be.hostTransfers!()), calls0 = { handOffs: handOff.calls, partials: handOff.partialCalls, fetches: handOff.fetchCalls };
  let worst = 0;
  prompts.forEach((p, i) => {
    dec.prefill(i, p, 0);
    worst = Math.max(worst, relError(dec.logits(i), alone[i]!.logits[0]!));
  });
  for (let s = 0; s < SMALL_STEPS / 2; s++) {
    dec.step(Array.from({ length: B }, (_, i) => i), Int32Array.from(alone, (a) => a.tokens[s]!));
    for (let i = 0; i < B; i++) worst = Math.max(worst, relError(dec.logits(i), alone[i]!.logits[s + 1]!));
  }
  const handed = batch.all.map((ha) => `${ha.stats.handedOffSteps}/${ha.stats.steps}`);
  const g = cudaLab(be as CudaBackend).graphStats();
  const captured = g.captures - graphs0.captures, replayed = g.replays - graphs0.replays, drained = g.drained - graphs0.drained;
  check(worst < 1e-4, `batch of ${B}, ${what}: logits equal each sequence alone within ${worst.toExponential(2)} (< 1e-4), ${SMALL_STEPS / 2} steps`);
  check(batch.all.every((ha) => ha.stats.steps > 0 && ha.stats.handedOffSteps === ha.stats.steps), `batch of ${B}, ${what}: every batched step handed off (${handed.join(", ")})`);
  const records = batch.all.every((ha) => ha.batchRecordable);
  // One hand-off and one window-partial op a layer of each step for every row; where the layers run ahead, the rows of every layer after the first fetched ahead as one.
  const layers = Number(shape.num_hidden_layers ?? SMALL_SHAPE.num_hidden_layers), steps = SMALL_STEPS / 2;
  const made = { handOffs: handOff.calls - calls0.handOffs, partials: handOff.partialCalls - calls0.partials, fetches: handOff.fetchCalls - calls0.fetches };
  const wantFetches = records && handOff.fetchesAhead ? steps * (layers - 1) : 0;
  check(made.handOffs === steps * layers && made.partials === steps * layers && made.fetches === wantFetches,
    `batch of ${B}, ${what}: ${steps * layers} batched hand-offs and window-partial ops, ${wantFetches} fetches ahead (made ${made.handOffs}, ${made.partials}, ${made.fetches})`);
  if (records) {
    // The batched step is recorded a layer at a time (BatchRows): replays outnumber captures, nothing drained.
    check(drained === 0 && replayed > captured && captured > 0,
      `batch of ${B}, ${what}: the batched steps recorded per layer — ${captured} graphs captured, ${replayed} replayed, ${drained} drained (last drain: ${g.lastDrain || "none"})`);
  } else {
    console.log(`  batch of ${B}, ${what}: layers wait for their true query, so the steps run eagerly (${captured} captured, ${replayed} replayed)`);
  }
  if (batch.all[0]!.deviceIndex) {
    // Layers ahead on q̃ rank every row at once; a layer that waits for its true query ranks its row alone.
    const ranked = IndexBatch.of(be).calls - rankCalls0, want = records ? (SMALL_STEPS / 2) * SMALL_SHAPE.num_hidden_layers : 0;
    check(ranked === want, `batch of ${B}, ${what}: ${want} indexRankRows calls (one a layer a step for all ${B} rows where the layers run ahead), ${ranked} made`);
  }
}

/** indexRankRows of 3 indexes (different counts and wants) equals indexRank of each, eager and recorded (twice: capture, then replay with other counts). */
function indexRankRowsChecks(be: CudaBackend): void {
  const kvHeads = 8, group = 4, headDim = 128, pages = 700, rnd = seededRandom(17);
  for (const form of [1, 2]) {
    const codeBytes = form === 1 ? 2 * headDim : headDim, scalesOffset = pages * kvHeads * codeBytes;
    const shape: DeviceIndexShape = { form, kvHeads, group, headDim, pageCapacity: pages, scalesOffset };
    const bytes = new Uint8Array(scalesOffset + pages * kvHeads * 4);
    const made: Tensor[] = [];
    const alloc = (n: number) => {
      const t = be.alloc([n]);
      made.push(t);
      return t;
    };
    try {
      const rows = [0, 1, 2].map(() => {
        for (let i = 0; i < scalesOffset; i++) bytes[i] = Math.floor(rnd() * 256);
        const scales = new Float32Array(bytes.buffer, scalesOffset, pages * kvHeads);
        for (let i = 0; i < scales.length; i++) scales[i] = 0.01 + rnd();
        const index = alloc(bytes.length / 4), q = alloc(kvHeads * group * headDim);
        be.write(index, new Float32Array(bytes.buffer.slice(0)));
        be.write(q, Float32Array.from({ length: kvHeads * group * headDim }, () => rnd() * 2 - 1));
        return { index, q, out: alloc(kvHeads * 64), alone: alloc(kvHeads * 64), scratch: alloc(Math.ceil(Math.max(...[9, 17, 33].map((w) => be.indexRankScratch(shape, w))) / 4)) };
      });
      const read = (t: Tensor, n: number) => {
        const f = be.read(t, 0, n);
        return new Int32Array(f.buffer.slice(f.byteOffset, f.byteOffset + 4 * n));
      };
      for (const [step, counts, wants] of [["eager", [700, 300, 77], [17, 9, 33]], ["recorded", [650, 699, 5], [33, 17, 3]], ["replayed", [700, 120, 64], [9, 33, 17]]] as const) {
        const recorded = step !== "eager";
        if (recorded) be.beginStep!("index-rank-rows-check");
        be.indexRankRows(rows.map((r, i) => ({ out: r.out, outOffset: 0, index: r.index, q: r.q, count: counts[i]!, want: wants[i]!, scratch: r.scratch })), shape);
        if (recorded) be.endStep!();
        rows.forEach((r, i) => be.indexRank(r.alone, 0, r.index, shape, r.q, counts[i]!, wants[i]!, r.scratch));
        const same = rows.every((r, i) => read(r.out, kvHeads * wants[i]!).every((p, j) => p === read(r.alone, kvHeads * wants[i]!)[j]));
        check(same, `indexRankRows, form ${form}, ${step}: 3 indexes (counts ${counts.join("/")}, wants ${wants.join("/")}) rank the pages indexRank ranks for each`);
      }
    } finally {
      for (const t of made) be.free(t);
    }
  }
}

{
  using cuda = createCudaBackend({ arenaBytes: 2 ** 32 });
  using cpu = createCpuBackend({ threads: 4 });
  const base: SmallHybrid = { gpuKvBudget: 32, sinkTokens: 4, cpuStageThreads: 4, scheduler: "fixed" };
  const only = arg("checks", "").split("|");
  const wanted = (what: string) => only.some((o) => what.includes(o));
  const attempt = async (what: string, f: () => Promise<void>) => {
    if (!wanted(what)) return;
    try {
      await f();
    } catch (e) {
      check(false, `${what}: ${(e as Error).message}`);
    }
  };
  await attempt("all + exact", async () => {
    const full = await runSmall(cuda, null);
    const all = await runSmall(cuda, { ...base, selector: "all", logits: "exact" }, full.tokens);
    const worst = Math.max(...all.logits.map((l, i) => relError(l, full.logits[i])));
    check(worst < 1e-5, `CUDA hybrid "all" + exact vs CUDA full attention, ${SMALL_STEPS + 1} forwards: worst max|Δ|/max|logit| ${worst.toExponential(2)} (< 1e-5)`);
    console.log(`  ${all.summary}`);
  });
  await attempt("multi-block prefill, all + exact", async () => {
    // 40 prompt tokens in blocks of 8, window 16 (4 sinks): evictions from block 3 on, so blocks 4
    // and 5 attend over offloaded rows on the device (loadStore), then decode steps go hybrid.
    const full = await runSmall(cuda, null);
    const all = await runSmall(cuda, { ...base, gpuKvBudget: 16, selector: "all", logits: "exact" }, full.tokens, 8);
    const worst = Math.max(...all.logits.map((l, i) => relError(l, full.logits[i])));
    check(worst < 1e-5, `CUDA hybrid, prompt in blocks of 8 with eviction during prefill, "all" + exact vs CUDA full attention: worst ${worst.toExponential(2)} (< 1e-5)`);
  });
  await attempt("all + verified", async () => {
    const full = await runSmall(cuda, null);
    const all = await runSmall(cuda, { ...base, selector: "all", logits: "verified" }, full.tokens);
    const worst = Math.max(...all.logits.map((l, i) => relError(l, full.logits[i])));
    check(worst < 1e-5, `CUDA hybrid "all" + verified (K rows staged, scored on the device) vs CUDA full attention: worst max|Δ|/max|logit| ${worst.toExponential(2)} (< 1e-5)`);
  });
  for (const logits of ["exact", "speculative", "verified"] as LogitsMode[]) {
    await attempt(`top-K ${logits}`, async () => {
      const opts = { ...base, k: 8, logits };
      const onCuda = await runSmall(cuda, opts);
      const onCpu = await runSmall(cpu, opts);
      const same = onCuda.tokens.filter((t, i) => t === onCpu.tokens[i]).length;
      const worstL = Math.max(...onCuda.logits.map((l, i) => relError(l, onCpu.logits[i])));
      check(same === SMALL_STEPS, `top-K 8 ${logits}: CUDA greedy tokens equal the CPU backend's hybrid run (${same}/${SMALL_STEPS}; logits within ${worstL.toExponential(2)} relative)`);
      console.log(`  cuda: ${onCuda.summary}`);
    });
  }
  for (const logits of ["exact", "speculative", "verified"] as LogitsMode[]) {
    for (const B of [3, 12]) await attempt(`batch of ${B}, top-K ${logits}`, () => batchChecks(cuda, { ...base, k: 8, logits }, B));
  }
  await attempt("keepRows against keptColumns", async () => keepRowsChecks(cuda, check));
  await attempt("attnPartialRows and appendKvRows", async () => windowRowsChecks(cuda, check));
  // Verified layers that keep K of their 4·K candidates: the device scores the K rows first, then brings up the kept V rows alone.
  for (const B of [3, 12]) await attempt(`batch of ${B}, top-K verified keep 1`, () => batchChecks(cuda, { ...base, k: 8, logits: "verified", keep: 1 }, B, "top-K 8 verified keep 1"));
  await attempt("indexRankRows", async () => indexRankRowsChecks(cuda));
  for (const logits of ["exact", "verified"] as LogitsMode[]) {
    // headDim 64 (8 heads of 512): the device ranks headDim 64/128/256; 4 KV heads keep the query + pages send a multiple of 16 bytes.
    const index = { ...base, k: 8, logits, timing: "pre" as const, selector: createSelector("index", { pageSize: 4, placement: "device" }) };
    const shape = { ...SMALL_SHAPE, hidden_size: 512, num_attention_heads: 8, num_key_value_heads: 4 };
    await attempt(`batch of 3, page index on the device, ${logits}`, () => batchChecks(cuda, index, 3, `page index on the device ${logits}`, shape));
  }
  await attempt("recorded cuBLAS matmuls", async () => recordedGemmChecks(cuda, check));
  if (wanted("mapped rows")) await mappedRowChecks(cuda, check);
  if (wanted("stage hand-off")) await stageHandoffChecks(cuda, check);
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
  "| attention | K | logits | stage threads | ms/token | T_gpu ms/step | T_cpu ms/step | score / top-K / gather / hand-offs ms/step | T_tx ms/step | wait ms/step | CPU stage hidden | prefill s |",
  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
];
const memRows: string[] = [];
let oneBlockLogits: Float32Array | null = null;
/** A memory-table row, printed at once too (a run cut short keeps it). */
function pushMem(row: string): void {
  memRows.push(row);
  console.log(`memory: ${row}`);
}
const GB = (b: number) => (b / 1e9).toFixed(2);

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

if (!process.argv.includes("--skip-full")) {
  let t0 = performance.now();
  using files = dummyModelFiles(json, "bf16", 1, createNativeRandomFill(), "preset:llama-3.1-8b");
  using model = loadModel(files, cuda, { maxContext, prefillBlock: 8192, kvDtype: "bf16" });
  console.log(`full-attention model loaded in ${((performance.now() - t0) / 1e3).toFixed(1)} s`);
  t0 = performance.now();
  model.step(longPrompt, 0);
  model.argmaxLogits();
  const prefill = (performance.now() - t0) / 1e3;
  const { ms } = decode(model, context);
  rows.push(`| full (GPU) | – | – | – | ${ms.toFixed(2)} | – | – | – | – | – | – | ${prefill.toFixed(2)} |`);
  console.log(rows[rows.length - 1]);
  const m = cuda.memory();
  pushMem(`| full attention (window = context) | ${GB(kvBytes(model.cache, model.cache.windowCapacity))} | – | ${GB(m.usedBytes)} | ${GB(m.peakBytes)} |`);
}

/** Device bytes of a K+V region of `slots` tokens (every layer). */
function kvBytes(c: { layers: number; kvHeads: number; headDim: number; dtype: string }, slots: number): number {
  return 2 * c.layers * c.kvHeads * slots * c.headDim * (c.dtype === "f32" ? 4 : 2);
}

function thp(): string {
  const read = (p: string) => { try { return readFileSync(p, "utf8").trim(); } catch { return "?"; } };
  const anon = (read("/proc/meminfo").match(/AnonHugePages:\s+(\d+ kB)/) ?? [])[1] ?? "?";
  return `THP enabled: ${read("/sys/kernel/mm/transparent_hugepage/enabled")}; defrag: ${read("/sys/kernel/mm/transparent_hugepage/defrag")}; AnonHugePages ${anon}`;
}
console.log(thp());

{
  let t0 = performance.now();
  using files = dummyModelFiles(json, "bf16", 1, createNativeRandomFill(), "preset:llama-3.1-8b");
  // The whole prompt in one block: sinks + ring stay one run of slots, so it prefills by attnCausal.
  const before = cuda.memory().usedBytes;
  using model = loadModel(files, cuda, { maxContext, prefillBlock: context, kvDtype: "bf16", gpuKvBudget: window, sinkTokens: sinks });
  const withStore = cuda.memory().usedBytes;
  const host = createCpuBackend({ threads: 1 });
  model.cache.attachHostStore(host, link, true);
  const c = model.cache;
  console.log(`hybrid model loaded, host store (${GB(c.storeBytes)} GB pinned) in ${((performance.now() - t0) / 1e3).toFixed(1)} s; device store freed: ${GB(withStore - cuda.memory().usedBytes)} GB (weights etc. ${GB(before)} GB before the model)`);
  console.log(thp());
  let memDone = false;

  const variant = async (k: number, logits: LogitsMode, stageThreads: number, spin: number, rowPath: RowPathRequest = rowPaths[0]!) => {
    try {
      using ha = await createHybridAttention(model, cuda, {
        selector: "topk", scheduler: "fixed", k, timing: "post", logits, rowPath, cpuStageThreads: stageThreads, idleSpinUs: spin,
      });
      model.reset();
      t0 = performance.now();
      model.step(longPrompt, 0);
      model.argmaxLogits();
      const prefill = (performance.now() - t0) / 1e3;
      if (!memDone) {
        memDone = true;
        oneBlockLogits = model.readLogits();
        const m = cuda.memory(), win = kvBytes(c, c.windowCapacity);
        pushMem(`| hybrid, store host-only (this run) | ${GB(win)} | 0 (${GB(c.storeBytes)} in pinned host memory) | ${GB(m.usedBytes)} | ${GB(m.peakBytes)} |`);
        pushMem(`| hybrid, device store as before (same shapes, computed) | ${GB(win)} | ${GB(c.storeBytes)} | ${GB(m.usedBytes + c.storeBytes)} | ${GB(m.peakBytes + c.storeBytes)} |`);
        // With a prefill block of B tokens the window would be budget + B slots.
        pushMem(`| hybrid, prefill blocks of 4096 (computed: window ${window} + 4096 slots) | ${GB(kvBytes(c, window + 4096))} | 0 | ${GB(m.usedBytes - win + kvBytes(c, window + 4096) + 2 * kvBytes({ ...c, layers: 1 }, c.maxContext))} (with loadContiguous's two scratch pairs) | – |`);
      }
      ha.stats.reset();
      const { ms } = decode(model, context);
      const st = ha.stats, n = Math.max(1, st.steps);
      const split = [st.cpuScoreMs, st.cpuSelectMs, st.cpuGatherMs, st.handoffMs].map((x) => (x / n).toFixed(2)).join(" / ");
      // The warm-up step is in the stats too: per-step figures are means over every hybrid step.
      rows.push(`| hybrid (window ${window}, ${st.offloaded} offloaded)${spin ? `, spin ${spin} µs` : ""}, rows ${ha.rowPaths.includes("staged") ? "staged" : "mapped"} | ${k} | ${logits} | ${stageThreads} | ${ms.toFixed(2)} | ${(st.deviceMs / n).toFixed(2)} | ${((st.cpuStageMs + st.cpuJsMs) / n).toFixed(2)} | ${split} | ${(st.txMs / n).toFixed(2)} | ${(st.waitMs / n).toFixed(2)} | ${Math.round(st.hiddenFraction * 100)}% | ${prefill.toFixed(2)} |`);
      console.log(rows[rows.length - 1]);
      console.log(`  ${st.summary()}`);
      model.attention.setDecodeAttention(null);
    } catch (e) {
      check(false, `hybrid K ${k} ${logits} threads ${stageThreads}: ${(e as Error).message}`);
      model.attention.setDecodeAttention(null);
    }
  };
  for (const k of ks) for (const logits of modes) for (const rp of rowPaths) await variant(k, logits, threads, spinUs, rp);
  for (const tv of threadVariants) await variant(ks[0], "speculative", tv, spinUs);
  for (const sv of spinVariants) await variant(ks[0], "speculative", threads, sv);

  // The stage alone over the host store (after the last prefill every layer holds c.storeCount rows).
  if (probeThreads.length > 0 && c.storeCount > 0) {
    const q = Float32Array.from({ length: 32 * 128 }, (_, i) => Math.cos(i * 1.3) * 0.3);
    const probe = (stageThreads: number, K: (l: number) => Tensor, V: (l: number) => Tensor, layers: number, work: CpuStageJob["work"], kmax: number) => {
      using stage = new NativeCpuStage(host, { threads: stageThreads });
      stage.prepare({ heads: 32, kvHeads: c.kvHeads, headDim: c.headDim, storeCapacity: c.storeCapacity, dtype: c.dtype });
      stage.query(0).set(q);
      const best = { ms: Infinity, score: 0, select: 0, gather: 0, handoff: 0 };
      for (let round = 0; round < 3; round++) {
        let ms = 0, score = 0, select = 0, gather = 0, handoff = 0;
        for (let l = 0; l < layers; l++) {
          stage.submit({ slot: 0, k: K(l), v: V(l), offloaded: c.storeCount, kmax, scale: 1 / Math.sqrt(c.headDim), work });
          ms += stage.wait();
          const sp = stage.lastSplit();
          score += sp.scoreMs; select += sp.selectMs; gather += sp.gatherMs; handoff += sp.handoffMs;
        }
        if (round > 0 && ms < best.ms) Object.assign(best, { ms, score, select, gather, handoff });
      }
      const per = (x: number) => (x / layers).toFixed(3);
      const kb = c.kvHeads * c.storeCount * c.headDim * 2;
      return `${per(best.ms)} | ${(kb * layers / best.ms / 1e6).toFixed(1)} | ${per(best.score)} | ${(kb * layers / best.score / 1e6).toFixed(1)} | ${per(best.select)} | ${per(best.gather)} | ${per(best.handoff)}`;
    };
    const probeRows = ["| store | layers | stage threads | job | ms/layer | K GB/s | score ms | score GB/s | top-K ms | gather ms | hand-offs ms |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"];
    const topk = { kind: "topk" as const, budget: ks[0], shared: false };
    for (const pt of probeThreads) {
      probeRows.push(`| pinned | 32 | ${pt} | top-${ks[0]} | ${probe(pt, (l) => c.stageStoreK(l), (l) => c.stageStoreV(l), c.layers, topk, ks[0])} |`);
      console.log(probeRows[probeRows.length - 1]);
    }
    probeRows.push(`| pinned | 32 | ${probeThreads[0]} | score only | ${probe(probeThreads[0], (l) => c.stageStoreK(l), (l) => c.stageStoreV(l), c.layers, { kind: "score" }, 0)} |`);
    // Unpinned copies of layers 0..7 (fresh mmap'd blocks, MADV_HUGEPAGE) against pinned layers 0..7.
    const shape = [c.kvHeads, c.storeCapacity, c.headDim];
    const plainK: Tensor[] = [], plainV: Tensor[] = [];
    for (let l = 0; l < 8; l++) {
      plainK.push(host.alloc(shape, c.dtype));
      plainV.push(host.alloc(shape, c.dtype));
      for (const [dst, src] of [[plainK[l], c.stageStoreK(l)], [plainV[l], c.stageStoreV(l)]] as const) host.copyRows(dst, 0, src, 0, c.kvHeads * c.storeCapacity);
    }
    console.log(`after the unpinned copies: ${thp()}`);
    const pt = probeThreads[0];
    for (let rep = 0; rep < 2; rep++) {
      probeRows.push(`| pinned | 8 | ${pt} | score only | ${probe(pt, (l) => c.stageStoreK(l), (l) => c.stageStoreV(l), 8, { kind: "score" }, 0)} |`);
      probeRows.push(`| unpinned | 8 | ${pt} | score only | ${probe(pt, (l) => plainK[l], (l) => plainV[l], 8, { kind: "score" }, 0)} |`);
    }
    for (const t of [...plainK, ...plainV]) host.free(t);
    console.log(`\n## CPU stage alone over the host store (${c.storeCount} offloaded tokens a layer, no GPU work meanwhile; best of 2 rounds)`);
    for (const r of probeRows) console.log(r);
  }
}

if (blockVariant > 0) {
  try {
    let t0 = performance.now();
    using files = dummyModelFiles(json, "bf16", 1, createNativeRandomFill(), "preset:llama-3.1-8b");
    const before = cuda.memory().usedBytes;
    using model = loadModel(files, cuda, { maxContext, prefillBlock: blockVariant, kvDtype: "bf16", gpuKvBudget: window, sinkTokens: sinks });
    const host = createCpuBackend({ threads: 1 });
    model.cache.attachHostStore(host, link, true);
    const c = model.cache;
    console.log(`hybrid model with prefill blocks of ${blockVariant} loaded in ${((performance.now() - t0) / 1e3).toFixed(1)} s`);
    using ha = await createHybridAttention(model, cuda, {
      selector: "topk", scheduler: "fixed", k: ks[0], timing: "post", logits: "speculative", cpuStageThreads: threads, idleSpinUs: spinUs,
    });
    t0 = performance.now();
    model.step(longPrompt, 0);
    const logits = model.readLogits();
    const prefill = (performance.now() - t0) / 1e3;
    const m = cuda.memory(), scratch = (c.storeScratchTensors / 2) * kvBytes({ ...c, layers: 1 }, c.maxContext);
    pushMem(`| hybrid, prefill blocks of ${blockVariant} (this run; + loadContiguous scratch ${GB(scratch)} GB) | ${GB(kvBytes(c, c.windowCapacity))} | 0 | ${GB(m.usedBytes)} (this model: ${GB(m.usedBytes - before)}) | ${GB(m.peakBytes)} (over the whole run) |`);
    if (oneBlockLogits) {
      const d = relError(logits, oneBlockLogits);
      check(d < 5e-2, `prefill in blocks of ${blockVariant} (loadContiguous + attnCausal over offloaded rows) vs one block: max|Δ|/max|logit| ${d.toExponential(2)} (< 5e-2; bf16 KV, different block splits)`);
    }
    ha.stats.reset();
    const { ms } = decode(model, context);
    const st = ha.stats, n = Math.max(1, st.steps);
    rows.push(`| hybrid, prefill blocks of ${blockVariant} (window ${window}, ${st.offloaded} offloaded) | ${ks[0]} | speculative | ${threads} | ${ms.toFixed(2)} | ${(st.deviceMs / n).toFixed(2)} | ${((st.cpuStageMs + st.cpuJsMs) / n).toFixed(2)} | ${[st.cpuScoreMs, st.cpuSelectMs, st.cpuGatherMs, st.handoffMs].map((x) => (x / n).toFixed(2)).join(" / ")} | ${(st.txMs / n).toFixed(2)} | ${(st.waitMs / n).toFixed(2)} | ${Math.round(st.hiddenFraction * 100)}% | ${prefill.toFixed(2)} |`);
    console.log(rows[rows.length - 1]);
    model.attention.setDecodeAttention(null);
  } catch (e) {
    check(false, `prefill blocks of ${blockVariant}: ${(e as Error).message}`);
  }
}

console.log(`host link: ${JSON.stringify({ ...(link as CudaHostLink).diagnostics(), ...(link as CudaHostLink).pinCounts() })}`);
console.log(`\n## Device memory (arena; KV bf16, ${json.num_hidden_layers} layers; GB = 1e9 bytes)`);
console.log("| case | window K+V GB | device store K+V GB | arena used GB | arena peak GB |");
console.log("| --- | --- | --- | --- | --- |");
for (const r of memRows) console.log(r);
console.log(`\n## preset:llama-3.1-8b, dummy bf16 weights, bf16 KV, batch 1, context ${context} + ${steps} steps; CPU stage top-K per KV head (post-QKᵀ, in the stage); ${sinks} sinks; ${cpus().length} cores`);
console.log(`pinned copy path: H2D ${(bw.h2d / 1e9).toFixed(1)} GB/s, D2H ${(bw.d2h / 1e9).toFixed(1)} GB/s`);
for (const r of rows) console.log(r);
console.log(failures.length ? `${failures.length} FAILED` : "ALL PASS");
process.exit(failures.length ? 1 : 0);
