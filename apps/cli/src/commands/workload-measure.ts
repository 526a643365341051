/**
 * The measurements of `hybridgen bench --workload NxC`: N sequences of C context tokens, each
 * decoding --steps tokens, on a backend whose device memory is capped (--gpu-mem). Full
 * attention runs the largest batch whose KV fits (found by trying: a fresh model a try, so one
 * that failed leaves nothing behind), in waves until all N are done; each offloading
 * configuration runs all N at once, every sequence with the window memtier's planner sizes for
 * the batch (a hybrid one the least the host's memory leaves) and the rest of its KV in host
 * memory. Prefill is not timed; a step's wall time is
 * the ms/token of every sequence in it. With --synthetic-kv nothing is prefilled: each context's KV
 * is seeded random rows (runtime's fillSyntheticKv), which is what a decode step's speed depends on.
 */
import { BatchDecoder, DTYPE_BYTES, HybridgenError, loadModel, modelInfo, type Backend, type CausalLM, type MemoryTier, type ModelFiles } from "@hybridgen/core";
import type { RunPlan } from "@hybridgen/memtier";
import { attachAttentionConfigs, attentionConfig, deviceIndexShape, fillSyntheticKv, indexRankCharge, planSelection, prepareHostStore, sequenceModel, type AttachedAttention, type AttentionConfig } from "@hybridgen/runtime";
import { PageIndexOptionsSchema } from "@hybridgen/selectors";
import type { BenchOptions } from "./bench-args.js";
import { decodeSteps, syntheticTokens, type ConfigOutcome } from "./bench-measure.js";
import type { Workload } from "./workload-args.js";

export interface WorkloadRow extends ConfigOutcome {
  /** Sequences decoded at once, and the waves that took to decode all N. */
  readonly batch?: number;
  readonly waves?: number;
  /** Window tokens a sequence keeps on the device (offloading configurations). */
  readonly window?: number;
  /** Decode tokens/s of the whole workload: every sequence's measured tokens over the summed step times. */
  readonly tokensPerSec?: number;
  /** Per-sequence ms/token over every sequence's measured steps. */
  readonly p50Ms?: number;
  readonly p99Ms?: number;
  /** Median wall ms of one batched step (the full batch; the last wave of full attention may be smaller). */
  readonly msPerStep?: number;
  /** The planner's ms/step for this batch and window (hybrid configurations; null where a bandwidth is unknown). */
  readonly predictedMsPerStep?: number | null;
  /** What one step must read, by where (the planner's bytes for the batch and window the row ran): the device, each host tier, the link. */
  readonly bytesPerStep?: RunPlan["predicted"]["bytes"];
  /** Those bytes at the measured bandwidths: the step's floor (null where a bandwidth is unknown). */
  readonly floorMsPerStep?: number | null;
}

export interface WorkloadResult {
  readonly model: string;
  readonly workload: Workload;
  readonly steps: number;
  readonly warmup: number;
  /** The cap on device memory (null: none). */
  readonly gpuMemBytes: number | null;
  /** Device bytes a loaded model holds besides its KV (weights, activations). */
  readonly residentBytes: number;
  readonly kvBytesPerToken: number;
  readonly plan: Pick<RunPlan, "fits" | "refusal" | "offloadedTokens"> & { readonly windowTokens: number; readonly predicted: RunPlan["predicted"] };
  readonly rows: WorkloadRow[];
}

export interface WorkloadContext {
  readonly backend: Backend;
  /** The tiers the offloaded KV goes to, with their measured read bandwidths. */
  readonly tiers: readonly MemoryTier[];
  /** The device's read and host → device bandwidths (the CPU backend: host memory's). */
  readonly gpuReadGBs?: number;
  readonly linkGBs?: number;
  readonly progress: (line: string) => void;
  readonly signal?: AbortSignal;
}

const PREFILL_BLOCK = 4096;
/** The prefill block: every window's ring keeps this many slots past its budget, so a short context takes a small one. */
const prefillBlock = (r: { o: { workload: Workload; steps: number } }) => Math.min(PREFILL_BLOCK, r.o.workload.context + r.o.steps, Math.max(16, Math.ceil(r.o.workload.context / 16)));
const message = (e: unknown) => (e instanceof Error ? e.message : String(e)).split("\n")[0]!;
const isOom = (e: unknown) => /out of (device )?memory/i.test(message(e));
const quantile = (sorted: readonly number[], q: number) => sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]!;
const median = (xs: readonly number[]) => quantile([...xs].sort((a, b) => a - b), 0.5);
const fmtMiB = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;
const secs = (ms: number) => `${(ms / 1000).toFixed(1)} s`;

/** Device bytes in use: the CPU backend's capped memory or the CUDA arena's. */
export function deviceBytesInUse(backend: Backend): number {
  const b = backend as { memoryInUseBytes?: number; memory?: () => { usedBytes: number } };
  if (typeof b.memoryInUseBytes === "number") return b.memoryInUseBytes;
  if (typeof b.memory === "function") return b.memory().usedBytes;
  throw new HybridgenError(`--workload: backend ${backend.name} does not report its device memory`);
}

/** Bytes of the model's weights as loaded (at `dtype` where given). */
export function weightBytes(files: ModelFiles, dtype?: keyof typeof DTYPE_BYTES): number {
  let total = 0;
  for (const n of files.weights.names()) {
    const w = files.weights.get(n)!;
    total += dtype === undefined ? w.bytes.byteLength : (w.bytes.byteLength / DTYPE_BYTES[w.dtype]) * DTYPE_BYTES[dtype];
  }
  return total;
}

/** Per-sequence ms/token samples and the workload's tokens/s from each wave's measured step walls. */
export function workloadSpeed(waves: readonly { readonly sequences: number; readonly walls: readonly number[] }[]): { tokensPerSec: number; p50Ms: number; p99Ms: number } {
  const samples: number[] = [];
  let tokens = 0, ms = 0;
  for (const w of waves) {
    for (const t of w.walls) for (let i = 0; i < w.sequences; i++) samples.push(t);
    tokens += w.sequences * w.walls.length;
    ms += w.walls.reduce((a, b) => a + b, 0);
  }
  samples.sort((a, b) => a - b);
  return { tokensPerSec: (1000 * tokens) / ms, p50Ms: quantile(samples, 0.5), p99Ms: quantile(samples, 0.99) };
}

/**
 * The largest batch in [1, max] for which `fits` holds (fits is monotone: fewer sequences need less memory); 0 when none does.
 * A `guess` (the batch the device's free bytes hold by arithmetic) is tried first with the batch above it: two tries where it is right.
 */
export function largestFeasible(max: number, fits: (b: number) => boolean, guess?: number): number {
  let lo = 0, hi = max; // lo fits (0 trivially), everything above hi is known not to
  if (guess !== undefined && guess >= 1 && guess <= max) {
    if (!fits(guess)) hi = guess - 1;
    else if (guess === max || !fits(guess + 1)) return guess;
    else lo = guess + 1;
  }
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

interface Run {
  readonly files: ModelFiles;
  readonly name: string;
  readonly o: BenchOptions & { readonly workload: Workload };
  readonly cx: WorkloadContext;
}

const loadFor = (r: Run, window?: number): CausalLM => {
  const maxContext = r.o.workload.context + r.o.steps;
  return loadModel(r.files, r.cx.backend, {
    maxContext, prefillBlock: prefillBlock(r), kvDtype: r.o.kvDtype,
    ...(r.o.dtype === undefined ? {} : { weightDtype: r.o.dtype }),
    ...(window === undefined ? {} : { gpuKvBudget: window, sinkTokens: r.o.sinkTokens }),
  });
};

/**
 * Slot `s` at the workload's context, its first decode token returned: the prompt prefilled (the
 * token its logits pick), or with --synthetic-kv a fresh sequence of seeded random KV rows (the
 * prompt's last token).
 */
function fillSlot(r: Run, dec: BatchDecoder, s: number, prompt: Int32Array): number {
  if (!r.o.syntheticKv) {
    dec.prefill(s, prompt, 0);
    return dec.argmax(s);
  }
  const seq = dec.sequence(s);
  dec.model.withSequence(seq, () => dec.model.reset()); // a wave reuses the slot
  fillSyntheticKv(r.cx.backend, seq.cache, r.o.workload.context, r.o.seed + s);
  return prompt[prompt.length - 1]!;
}

/** Whether `batch` sequences of full attention fit: a fresh model, its batch decoder, every slot's prefill and one step. */
function fullFits(r: Run, batch: number, prompt: Int32Array): boolean {
  let model: CausalLM | null = null;
  try {
    model = loadFor(r);
    using dec = new BatchDecoder(model, batch);
    const slots = Array.from({ length: batch }, (_, i) => i);
    for (const s of slots) fillSlot(r, dec, s, prompt);
    dec.step(slots, new Int32Array(batch).fill(3));
    return true;
  } catch (e) {
    if (isOom(e)) return false;
    throw e;
  } finally {
    model?.close();
  }
}

/** Full attention: the largest batch that fits, in waves until all N sequences are done (the search starts where the cap's bytes less the model's hold whole sequences' KV). */
function measureFull(r: Run, c: AttentionConfig, prompt: Int32Array, residentBytes: number): WorkloadRow {
  const { sequences, context } = r.o.workload;
  const base = { config: c.name, family: c.family, kind: c.kind };
  let batch: number;
  if (r.o.fullBatch !== undefined) {
    batch = Math.min(r.o.fullBatch, sequences);
    r.cx.progress(`full attention: batches of ${batch} of ${sequences} sequences (--full-batch, not searched)`);
  } else {
    const guess = r.o.gpuMem === undefined ? undefined : Math.floor((r.o.gpuMem - residentBytes) / ((context + r.o.steps) * kvBytesPerToken(r)));
    batch = largestFeasible(sequences, (b) => fullFits(r, b, prompt), guess);
    if (batch === 0) return { ...base, status: "failed", note: `one sequence's KV (${fmtMiB(r.o.workload.context * kvBytesPerToken(r))}) does not fit beside the model` };
    r.cx.progress(`full attention: ${batch} of ${sequences} sequences fit at once`);
  }
  try {
    using model = loadFor(r);
    using dec = new BatchDecoder(model, batch);
    const waves: { sequences: number; walls: number[] }[] = [];
    for (let done = 0; done < sequences && !r.cx.signal?.aborted; ) {
      const n = Math.min(batch, sequences - done), slots = Array.from({ length: n }, (_, i) => i), first = new Int32Array(n);
      for (const s of slots) first[s] = fillSlot(r, dec, s, prompt);
      waves.push({ sequences: n, walls: decodeSteps(dec, slots, first, r.o.steps, r.cx.signal).slice(r.o.warmup) });
      done += n;
    }
    return { ...base, status: "ok", batch, waves: waves.length, ...workloadSpeed(waves), msPerStep: median(waves[0]!.walls) };
  } catch (e) {
    if (r.o.fullBatch === undefined || !isOom(e)) throw e;
    const cap = r.o.gpuMem === undefined ? "" : ` under --gpu-mem ${r.o.gpuMem} bytes (${fmtMiB(r.o.gpuMem)})`;
    throw new HybridgenError(`--full-batch ${r.o.fullBatch}: ${batch} sequences of ${context} tokens do not fit${cap}: ${message(e)}`, "EUSAGE");
  }
}

const kvBytesPerToken = (r: Run) => 2 * r.files.shape.layers * r.files.shape.kvHeads * r.files.shape.headDim * DTYPE_BYTES[r.o.kvDtype];

/**
 * The planner's run for all N sequences at once under the cap (residentBytes: what a model holds
 * besides its KV), with config c's byte model and the host's per-row costs (--issue-ms, --stage-ms).
 * A hybrid configuration's auto window is the least the host's memory leaves: every window token is
 * read every step, while the rows a step selects do not grow with the offloaded part (and the host's
 * issuing does not hide the device's reads: last session's 8 × 131 000 took the two in turn).
 */
async function planWorkload(r: Run, residentBytes: number, batch = r.o.workload.sequences, window: number | "auto" = "auto", c?: AttentionConfig, indexRankMs?: number): Promise<RunPlan> {
  const { planRun } = await import("@hybridgen/memtier");
  const s = r.files.shape, cap = r.o.gpuMem;
  return planRun({
    model: { layers: s.layers, heads: s.heads, kvHeads: s.kvHeads, headDim: s.headDim, weightsBytes: residentBytes, batchRowBytes: modelInfo(r.files.config, s).batchRowBytes },
    kvElementBytes: DTYPE_BYTES[r.o.kvDtype], contextTokens: r.o.workload.context + r.o.steps, batch, gpuKvBudget: window,
    // The CPU backend's resident bytes include its activations: no further reserve. A device keeps the planner's.
    gpu: cap === undefined ? undefined : {
      freeBytes: cap, ...(r.cx.gpuReadGBs ? { readBandwidthGBs: r.cx.gpuReadGBs } : {}), ...(r.cx.linkGBs ? { linkBandwidthGBs: r.cx.linkGBs } : {}),
      ...(r.cx.backend.name === "cpu" ? { reserveBytes: 0 } : {}),
      // A link with a side stream fetches each layer's rows during the layer before (the handed-off transport's rows fetched ahead).
      ...(c?.hybrid && r.o.gatherGBs !== undefined ? { gatherGBs: r.o.gatherGBs, fetchAhead: r.cx.backend.hostTransfers?.().rowFetch !== undefined } : {}),
      ...(indexRankMs === undefined ? {} : { indexRankMs }),
    },
    // The CPU backend's prefill reads its store in place: no device scratch.
    tiers: [...r.cx.tiers], k: r.o.k, appendTokens: prefillBlock(r), prefill: !r.o.syntheticKv && r.cx.backend.name !== "cpu",
    ...(c?.hybrid ? planSelection(c.hybrid, r.cx.backend.indexRank !== undefined) : {}),
    ...(c?.hybrid && r.o.issueMs !== undefined ? { issueMsPerRowLayer: r.o.issueMs } : {}),
    ...(c?.hybrid && r.o.stageMs !== undefined ? { stageMsPerRowLayer: r.o.stageMs } : {}),
    leastWindow: c?.hybrid !== undefined,
  });
}

/**
 * A hybrid configuration's device index ranking, timed where its plan ranks the pages on the device
 * (runtime's indexRankCharge at the index's shape and the verified layers' want): ms one layer's
 * ranking of one sequence, which the planner charges past its bytes; undefined elsewhere or where it cannot be timed.
 */
function rankCharge(r: Run, c: AttentionConfig, plan: RunPlan): number | undefined {
  if (!c.hybrid || plan.index?.placement !== "device" || plan.offloadedTokens === 0 || !r.cx.backend.indexRank) return undefined;
  const sel = planSelection(c.hybrid, true), defaults = PageIndexOptionsSchema.parse({});
  const pageSize = sel.index?.pageSize ?? defaults.pageSize, form = sel.index?.form ?? defaults.form, s = r.files.shape;
  try {
    const shape = deviceIndexShape(form, s.kvHeads, s.heads / s.kvHeads, s.headDim, Math.ceil(plan.offloadedTokens / pageSize));
    const { want, indexRankMs } = indexRankCharge(r.cx.backend, shape, { k: r.o.k, candidates: sel.candidates, offloaded: plan.offloadedTokens, pageSize, layers: s.layers });
    r.cx.progress(`${c.name}: the device index ranks a layer of a sequence in ${(indexRankMs * 1e3).toFixed(1)} µs (want ${want} pages): the planner charges it`);
    return indexRankMs;
  } catch (e) {
    r.cx.progress(`${c.name}: the device index's ranking not timed (${message(e)}): the planner charges its bytes`);
    return undefined;
  }
}

/**
 * One offloading configuration with all N sequences at once, each with a `window`-token device
 * window (sinks included); out of device memory (the configuration's own device buffers, which
 * the planner does not count) shrinks the window by a fifth and tries again, down to `minWindow`.
 */
async function measureOffloading(r: Run, c: AttentionConfig, prompt: Int32Array, planned: number, minWindow: number): Promise<WorkloadRow> {
  const { sequences } = r.o.workload;
  const { CpuBackend, hostStoreAllocator } = await import("@hybridgen/kernels-cpu");
  let lastOom = "";
  for (let window = planned; window >= minWindow; window = Math.floor(window * 0.8)) {
    const base = { config: c.name, family: c.family, kind: c.kind, batch: sequences, waves: 1, window };
    let model: CausalLM | null = null, dec: BatchDecoder | null = null;
    const attached: AttachedAttention[] = [];
    try {
      model = loadFor(r, window);
      dec = new BatchDecoder(model, sequences);
      const slots = Array.from({ length: sequences }, (_, i) => i), seqs = slots.map((i) => sequenceModel(model!, dec!.sequence(i)));
      const first = new Int32Array(sequences);
      let storeMs = 0, fillMs = 0;
      for (const i of slots) {
        const t0 = performance.now();
        // The offloaded KV in host memory: outside the CPU backend's cap, or in the device backend's pinned host store.
        if (r.cx.backend instanceof CpuBackend) seqs[i]!.cache.placeStore(hostStoreAllocator());
        else await prepareHostStore(seqs[i]!, r.cx.backend, r.o.threads ?? 1);
        const t1 = performance.now();
        first[i] = fillSlot(r, dec, i, prompt);
        storeMs += t1 - t0;
        fillMs += performance.now() - t1;
      }
      r.cx.progress(`${c.name}: ${sequences} sequences ${r.o.syntheticKv ? "filled with synthetic KV" : "prefilled"}, window ${window} tokens each (planned ${planned}), ${model.cache.storeCount} offloaded; host stores ${secs(storeMs)}, fill ${secs(fillMs)}`);
      attached.push(...await attachAttentionConfigs(seqs, r.cx.backend, c, r.o.cpuStageThreads === undefined ? {} : { cpuStageThreads: r.o.cpuStageThreads }));
      const all = decodeSteps(dec, slots, first, r.o.steps, r.cx.signal), walls = all.slice(r.o.warmup);
      r.cx.progress(`${c.name}: ${all.length} steps, the first ${secs(all[0] ?? 0)}, the rest ${secs(all.slice(1).reduce((a, b) => a + b, 0))}`);
      r.cx.progress(`${c.name}, sequence 0: ${attached[0]!.summary()}`); // where a step's time went
      return { ...base, status: "ok", ...workloadSpeed([{ sequences, walls }]), msPerStep: median(walls) };
    } catch (e) {
      if (!isOom(e)) throw e;
      lastOom = message(e);
      r.cx.progress(`${c.name}: window ${window} does not fit (${lastOom})`);
    } finally {
      for (const a of attached) a.close();
      dec?.close();
      model?.close();
    }
  }
  return { config: c.name, family: c.family, kind: c.kind, status: "failed", note: `no window from ${planned} down to ${minWindow} tokens fits: ${lastOom}` };
}

/**
 * A measured row with the bytes its step must read and their floor, from the planner at the
 * row's batch and window: full attention reads its weights and every sequence's whole KV on the
 * device; a hybrid configuration the window there, what its selector's stage reads in the host tiers
 * (the runtime's planSelection) and the rows sent up (the floor is the planner's ms/step); FlexGen-style AoG also sends every
 * offloaded K and V row up each step (its floor: the slower of the device's reads and the link).
 */
async function withFloor(r: Run, residentBytes: number, row: WorkloadRow, c: AttentionConfig, indexRankMs?: number): Promise<WorkloadRow> {
  if (row.status !== "ok" || row.batch === undefined) return row;
  const full = row.kind === "full", window = full ? r.o.workload.context + r.o.steps : row.window!;
  const p = (await planWorkload(r, residentBytes, row.batch, window, row.kind === "hybrid" ? c : undefined, row.kind === "hybrid" ? indexRankMs : undefined)).predicted;
  if (full) return { ...row, bytesPerStep: p.bytes, floorMsPerStep: p.gpuMs };
  if (row.kind === "hybrid") return { ...row, bytesPerStep: p.bytes, floorMsPerStep: p.msPerToken, predictedMsPerStep: p.msPerToken };
  const link = row.batch * Math.max(0, r.o.workload.context + r.o.steps - window) * kvBytesPerToken(r);
  const linkMs = r.cx.linkGBs ? (link / (r.cx.linkGBs * 1e9)) * 1e3 : null;
  return { ...row, bytesPerStep: { ...p.bytes, link }, floorMsPerStep: p.gpuMs === null || linkMs === null ? null : Math.max(p.gpuMs, linkMs) };
}

/** The whole workload bench of one model. */
export async function measureWorkload(files: ModelFiles, name: string, o: BenchOptions & { readonly workload: Workload }, cx0: WorkloadContext): Promise<WorkloadResult> {
  // Every progress line with the seconds since the bench began: a run cut by a time limit says where its time went.
  const began = performance.now(), cx: WorkloadContext = { ...cx0, progress: (line) => cx0.progress(`${line} [${secs(performance.now() - began)}]`) };
  const r: Run = { files, name, o, cx };
  const { sequences, context } = o.workload;
  if (context + o.steps > files.shape.maxPositions) {
    throw new HybridgenError(`--workload ${sequences}x${context} plus --steps ${o.steps} exceeds ${name}'s max_position_embeddings (${files.shape.maxPositions})`, "ECONTEXT");
  }
  const weights = weightBytes(files, o.dtype);
  if (o.gpuMem !== undefined && o.gpuMem < weights) {
    throw new HybridgenError(`--gpu-mem ${o.gpuMem} bytes (${fmtMiB(o.gpuMem)}) is below ${name}'s weights: ${weights} bytes (${fmtMiB(weights)})`, "EUSAGE");
  }
  const perToken = kvBytesPerToken(r);
  // What a loaded model holds besides its KV: a model with a window of one block, less that window.
  let residentBytes: number;
  {
    const before = deviceBytesInUse(cx.backend);
    const block = prefillBlock(r);
    let m: CausalLM;
    try {
      m = loadFor(r, Math.min(context + o.steps, o.sinkTokens + 64));
    } catch (e) {
      if (!isOom(e)) throw e;
      throw new HybridgenError(`--gpu-mem ${o.gpuMem} bytes (${fmtMiB(o.gpuMem ?? 0)}) holds ${name}'s weights (${fmtMiB(weights)}) but not its activations and a minimal window: ${message(e)}`, "EUSAGE");
    }
    const windowBytes = perToken * Math.min(context + o.steps, o.sinkTokens + 64 + block);
    residentBytes = Math.max(weights, deviceBytesInUse(cx.backend) - before - windowBytes);
    m.close();
  }
  cx.progress(`a loaded model holds ${fmtMiB(residentBytes)} beside its KV`);
  const configs = o.configs.map((c) => attentionConfig(c, o.k));
  const prompt = syntheticTokens(context, files.shape.vocabSize, o.seed);
  const rows: WorkloadRow[] = [];
  // Each row's figures as it ends: a run stopped by a time limit still says what it measured.
  const said = (x: WorkloadRow) => {
    cx.progress(x.status === "ok" ? `${x.config}: ${x.tokensPerSec!.toFixed(1)} tokens/s, ${x.msPerStep!.toFixed(2)} ms a step of ${x.batch} (${x.waves} wave${x.waves === 1 ? "" : "s"})` : `${x.config}: ${x.status} (${x.note})`);
    return x;
  };
  for (const c of configs.filter((x) => x.kind === "full")) rows.push(said(measureFull(r, c, prompt, residentBytes)));
  const plan = await planWorkload(r, residentBytes);
  const window = plan.gpu?.windowTokens ?? context + o.steps;
  const offloading = configs.filter((x) => x.kind !== "full");
  /** Per hybrid configuration: its device index's ranking as timed (rankCharge), charged in its planned window and its row's prediction. */
  const ranks = new Map<string, number>();
  if (offloading.length > 0 && !cx.signal?.aborted) {
    if (!plan.fits) {
      for (const c of offloading) rows.push({ config: c.name, family: c.family, kind: c.kind, status: "failed", note: plan.refusal ?? "the planner found no room" });
    } else if (window >= context + o.steps) {
      for (const c of offloading) rows.push({ config: c.name, family: c.family, kind: c.kind, status: "skipped", note: `all ${sequences} sequences' KV fits on the device: nothing to offload` });
    } else if (window <= o.sinkTokens + 1) {
      for (const c of offloading) rows.push({ config: c.name, family: c.family, kind: c.kind, status: "failed", note: `the planner's window (${window} tokens a sequence) leaves no room beside ${o.sinkTokens} sinks` });
    } else {
      for (const c of offloading) {
        if (cx.signal?.aborted) break;
        // A configuration's own window: a device page index takes its room beside the windows.
        let own = window;
        if (c.kind === "hybrid") {
          let p = await planWorkload(r, residentBytes, sequences, "auto", c);
          const rank = rankCharge(r, c, p);
          if (rank !== undefined) {
            ranks.set(c.name, rank);
            p = await planWorkload(r, residentBytes, sequences, "auto", c, rank);
          }
          own = p.gpu?.windowTokens ?? window;
          const ms = p.predicted.msPerToken;
          cx.progress(`${c.name}: the planner's window ${own} tokens a sequence, ${ms === null ? "no" : ms.toFixed(2)} ms a step of ${sequences} predicted`);
        }
        rows.push(said(await measureOffloading(r, c, prompt, Math.min(window, Math.max(own, o.sinkTokens + 2)), o.sinkTokens + 2)));
      }
    }
  }
  for (const [i, row] of rows.entries()) rows[i] = await withFloor(r, residentBytes, row, configs.find((c) => c.name === row.config)!, ranks.get(row.config));
  const order = (x: WorkloadRow) => o.configs.indexOf(x.config);
  rows.sort((a, b) => order(a) - order(b));
  if (!rows.some((x) => x.status === "ok")) {
    const cap = o.gpuMem === undefined ? "no cap" : `--gpu-mem ${o.gpuMem} bytes (${fmtMiB(o.gpuMem)})`;
    const full = rows.find((x) => x.kind === "full"), off = rows.find((x) => x.kind !== "full");
    const why = [full && `full attention: ${full.note}`, off && `offloading: ${off.note}`].filter(Boolean).join("; ");
    throw new HybridgenError(`--workload ${sequences}x${context} fits nowhere under ${cap}: ${why}`, "ECONTEXT");
  }
  return {
    model: name, workload: o.workload, steps: o.steps, warmup: o.warmup, gpuMemBytes: o.gpuMem ?? null, residentBytes, kvBytesPerToken: perToken,
    plan: { fits: plan.fits, refusal: plan.refusal, offloadedTokens: plan.offloadedTokens, windowTokens: window, predicted: plan.predicted },
    rows,
  };
}
