/**
 * planRun: where every byte of a hybrid run goes — the weights, the GPU window, K and V on
 * each host tier, the disk — and the ms/token those bytes cost at the tiers' bandwidths. It is
 * what `hybridgen plan` prints and what `--gpu-kv-budget auto` sizes the window from; a run
 * that fits nowhere is refused here, before anything is allocated.
 *
 * The device reserve beside the weights and the windows: the given reserve, the activations at
 * the prefill block, the batched step's B rows of activations, and each sequence's own device
 * buffers — its f32 score rows over the context, its prefill scratch (two K/V pairs of one layer
 * over the context) and the hybrid step's staging.
 *
 * The prediction is a bandwidth floor per decode step (all sequences of the batch):
 *   GPU stage   = (weights, read once a step, and W_q once more a layer ahead on q̃ + every
 *                 sequence's window KV) / GPU read bandwidth
 *                 (no GPU: the fastest tier's, where the CPU backend runs the same step), and a
 *                 device index's ranking: layers × sequences × its measured ms a layer (its
 *                 passes and launches cost past its bytes; on a side stream beside the layer,
 *                 indexRankBeside, a layer costs the longer of the two), else its bytes at that bandwidth
 *   CPU stage   = Σ over tiers of the offloaded K bytes there the selector reads (all for top-K,
 *                 two rows a page for Quest's bounds, none for StreamingLLM or the page index, whose
 *                 own bytes count instead) / the tier's read bandwidth; K spilled
 *                 to a file tier (the last resort: all of V is there first) is read back through
 *                 page faults every step, kDiskMs
 *   V gather    = the rows the stage gathers (K a KV head on layer 0, candidates·K on the verified
 *                 layers) read from their tiers; a disk row is one 4 KiB read, so the disk's share
 *                 is max(rows ÷ depth × read latency, rows × page ÷ bandwidth) (the tier's latency
 *                 of one read at `readDepth` in flight, measured on the stage's own gather)
 *   V transfer  = those V rows, and the verified layers' K rows beside them, / host→device bandwidth
 *                 (where verified layers keep keep·K of their candidates, V rows of those alone); where
 *                 the device gathers the rows itself (gpu.gatherGBs) the gather and the transfer are one
 *                 op at that rate inside the GPU stage: ms/token = max(GPU stage + it, CPU stage, host);
 *                 with gpu.fetchAhead the rows fetched during the layer before cross beside the reads:
 *                 ms/token = max(max(GPU stage, fetched) + the rest, CPU stage, host)
 *   host        = layers × batch × the driving thread's issuing of a row's layer (measured; the
 *                 CPU stage gets its jobs' fixed cost the same way)
 *   hand-offs   = the layers whose CPU-stage job waits for the layer's true query (serialLayers:
 *                 every layer with exact logits) × batch × one hand-off's round trip (gpu.handOffMs,
 *                 measured: the query's send, the stage's wake and job, the done word seen by the
 *                 device) — the device idles there; a job ahead on q̃ runs during the layer before
 *   ms/token    = max(GPU stage, CPU stage, host) + V gather + V transfer + hand-offs
 * (the stages overlap; the selected rows can only move once the CPU stage chose them).
 * With leastWindow an "auto" window is the smallest the memory tiers leave (a page index on the device:
 * an offloaded token costs the device its index bytes, a window token its K and V): every window token
 * is read every step, and the rows the step selects do not grow with the offloaded part.
 */
import { z } from "zod";
import { HybridgenError, MemoryTierSchema, PlacementPolicySchema, isFileTier } from "@hybridgen/spec";
import { formatBytes } from "./format.js";
import { layoutStore, type StoreLayoutResult } from "./layout.js";
import { placeKv } from "./placement.js";

export const GpuPlanInputSchema = z.object({
  /** Device memory free before the run (cudaMemGetInfo). */
  freeBytes: z.number().int().nonnegative(),
  /** Device memory read bandwidth, GB/s (a probe or the data sheet); absent: the GPU stage is not predicted. */
  readBandwidthGBs: z.number().positive().optional(),
  /** Host → device copy bandwidth, GB/s (the host link's probe); absent: the V transfer is not predicted. */
  linkBandwidthGBs: z.number().positive().optional(),
  /** Device bytes kept for activations and staging (default 2 GiB); the prefill's K/V scratch (4 × context rows of one layer) comes on top. */
  reserveBytes: z.number().int().nonnegative().default(2 * 2 ** 30),
  /** ms one layer's ranking of a device index takes for one sequence (@hybridgen/runtime's timeIndexRank, measured); absent: its bytes at readBandwidthGBs. */
  indexRankMs: z.number().nonnegative().optional(),
  /** The ranking runs on a side stream beside the rest of the layer (one sequence's step on a device with one): a layer costs the longer of its streamed bytes and its ranking, not their sum. */
  indexRankBeside: z.boolean().default(false),
  /** ms the device waits for one layer's CPU-stage job when it waits for it at once (a hand-off's round trip, measured); absent: not charged. */
  handOffMs: z.number().nonnegative().optional(),
  /**
   * GB/s at which the device gathers selected rows from pinned host memory itself (the mapped and
   * handed-off transports, measured): the rows' reads and their crossing are then one op on the
   * device's stream, charged inside its part of the step; absent: the stage gathers them and the link copies them.
   */
  gatherGBs: z.number().positive().optional(),
  /**
   * With gatherGBs: the device gathers a layer's rows on a side stream during the layer before (the
   * handed-off transport's rows fetched ahead) wherever the layer's job runs ahead on q̃ — every layer
   * but the serial ones and the first — so those rows (the candidates' K rows, and their
   * V rows unless keep) cross the link beside the device's reads; the rest cross inside their layer.
   */
  fetchAhead: z.boolean().default(false),
});

export const RunPlanInputSchema = z.object({
  model: z.object({
    layers: z.number().int().positive(),
    /** Query heads (the hybrid step's score rows are one a query head); default kvHeads. */
    heads: z.number().int().positive().optional(),
    kvHeads: z.number().int().positive(),
    headDim: z.number().int().positive(),
    weightsBytes: z.number().int().nonnegative(),
    /** Device bytes of the model's activations at its prefill block (LlamaModel.activationBytes), on top of the reserve. */
    activationBytes: z.number().int().nonnegative().default(0),
    /** Device bytes one row of the batched decode step takes (LlamaModel.batchRowBytes); reserved B times for a batch of B > 1. */
    batchRowBytes: z.number().int().nonnegative().default(0),
    /** Bytes of one layer's query projection (W_q): a layer whose job goes ahead projects q̃ with it once more a step (the batch's rows in one matmul). */
    queryProjectionBytes: z.number().int().nonnegative().default(0),
  }),
  /** Bytes of one K (or V) element: 2 for bf16/f16, 4 for f32. */
  kvElementBytes: z.number().int().positive(),
  contextTokens: z.number().int().positive(),
  batch: z.number().int().positive().default(1),
  /** No GPU: everything lives in host memory (the CPU backend). */
  gpu: GpuPlanInputSchema.optional(),
  /** Window tokens per sequence (sinks included), or "auto": what the device memory holds. */
  gpuKvBudget: z.union([z.literal("auto"), z.number().int().positive()]).default("auto"),
  tiers: z.array(MemoryTierSchema).min(1),
  policy: PlacementPolicySchema.default("semantic"),
  hostBudgetBytes: z.number().int().nonnegative().optional(),
  headroom: z.number().min(0).max(0.95).default(0.1),
  /** Plan against the memory free now (MemFree) instead of each tier's capacity. */
  useFree: z.boolean().default(false),
  /** Offloaded tokens selected per KV head and layer (the CPU stage's K). */
  k: z.number().int().positive().default(64),
  /** Candidates per selected token the device scores (verified logits, the runtime's HybridOptions.candidates; 1 for exact or speculative,
   * whose layers gather K rows a KV head and send no K rows up). */
  candidates: z.number().int().positive().default(4),
  /** Verified layers keep keep·K of their candidates·K once the device scored their K rows, and only those V rows come up (HybridOptions.keep); absent: every candidate's. */
  keep: z.number().int().positive().optional(),
  /** The selector tracks accumulated scores (h2o, keyformer): the window's logits are materialised, so the score rows span the context. */
  trackScores: z.boolean().default(false),
  pageBytes: z.number().int().positive().default(4096),
  /** The prompt is prefilled over offloaded rows (its K/V scratch is reserved); false: decode only (a synthetic KV fill). */
  prefill: z.boolean().default(true),
  /** The most tokens appended at once (the prefill block): the window's ring keeps that many slots past the budget. */
  appendTokens: z.number().int().nonnegative().default(512),
  /**
   * The page index chooses the stage's rows (the "index" selector): the stage reads the index, not
   * every offloaded K row, and only the chosen pages' rows leave the tiers (disk included). Its page
   * level lives in device memory ("device": charged to the GPU beside the window, ranked at its read
   * rate), on the host ("host": the CPU stage reads it and its super-pages from the fastest tier), or
   * where it fits ("auto": the device when it has room for the index and a window).
   */
  /**
   * What the CPU stage reads to choose the rows (the selector's byte model; the page index is `index`):
   * "scan" every offloaded K row (top-K after QKᵀ, the default's), "bounds" two K rows a page of
   * `boundsPageSize` (Quest's per-channel min and max), "none" no K (StreamingLLM: positions alone).
   * Past "scan" the chosen rows' K leave the tiers beside their V (the stage or the device scores them).
   */
  selection: z.enum(["scan", "bounds", "none"]).default("scan"),
  boundsPageSize: z.number().int().positive().default(16),
  /**
   * The host's own per-row costs of a batched step, measured (a hybrid run's stats line): the
   * driving thread issuing one row's device work of one layer, and the CPU stage's one job past
   * the bytes it reads. The step is no shorter than layers × batch × either (hostMs, cpuMs).
   */
  issueMsPerRowLayer: z.number().nonnegative().optional(),
  /** Layers whose CPU-stage job waits for the layer's true query (exact logits: all of them; else the exact layers): each costs gpu.handOffMs a sequence. */
  serialLayers: z.number().int().nonnegative().default(0),
  stageMsPerRowLayer: z.number().nonnegative().optional(),
  /**
   * "auto" window: the smallest the memory tiers leave (the store fills host memory first, never a
   * file tier the fullest window would not use), down to appendTokens: a window token's K and V are
   * read every step (a page index on the device: an offloaded one costs its index bytes), an offloaded
   * one only when selected.
   */
  leastWindow: z.boolean().default(false),
  index: z.object({
    form: z.enum(["int8", "int4"]).default("int8"),
    pageSize: z.number().int().min(1).max(4096).default(16),
    superPages: z.number().int().min(1).max(4096).default(16),
    placement: z.enum(["auto", "host", "device"]).default("auto"),
  }).optional(),
});
export type RunPlanInput = z.input<typeof RunPlanInputSchema>;

export interface RunPlan {
  readonly contextTokens: number;
  readonly batch: number;
  readonly bytesPerToken: { readonly k: number; readonly v: number };
  readonly weights: { readonly where: "gpu" | "host"; readonly bytes: number };
  readonly gpu: null | {
    readonly freeBytes: number; readonly reserveBytes: number; readonly fitTokens: number; readonly windowTokens: number; readonly windowBytes: number;
    /** The batched step's activations (B rows; 0 at batch 1), in the reserve. */
    readonly batchRowsBytes: number;
    /** One sequence's device bytes: its window with the ring's append slots, and in the reserve its score rows, prefill scratch and the hybrid step's staging. */
    readonly perSequence: { readonly windowBytes: number; readonly scoresBytes: number; readonly scratchBytes: number; readonly stagingBytes: number };
  };
  /** The page index, when it chooses (input.index): where it lives and its bytes (every layer, the batch's sequences). */
  readonly index: null | { readonly placement: "host" | "device"; readonly bytes: number };
  /** Host window (no GPU): the window's KV lives in host memory with the weights. */
  readonly hostWindowBytes: number;
  readonly offloadedTokens: number;
  readonly store: StoreLayoutResult;
  readonly tiers: readonly {
    readonly id: string; readonly kind: string; readonly capacityBytes: number; readonly availableBytes: number;
    readonly kBytes: number; readonly vBytes: number; readonly readBandwidthGBs?: number; readonly readLatencyUs?: number; readonly readDepth?: number;
    readonly faultLatencyUs?: number; readonly faultDepth?: number;
  }[];
  readonly fits: boolean;
  /** The one-line reason the run cannot go ahead (null when it fits). */
  readonly refusal: string | null;
  readonly predicted: {
    readonly gpuMs: number | null; readonly cpuMs: number | null;
    /** The driving thread's issuing of the step (layers × batch × issueMsPerRowLayer; 0 when not given). */
    readonly hostMs: number;
    /** The device's waits for jobs that wait for their true query (serialLayers × batch × gpu.handOffMs; 0 when not given). */
    readonly handOffMs: number;
    /** The part of cpuMs that reads K spilled to file tiers back (0 when none is). */
    readonly kDiskMs: number | null;
    readonly vGatherMs: number | null; readonly vTransferMs: number | null;
    /** ms a decode step takes: one token of every sequence of the batch. */
    readonly msPerToken: number | null;
    /** What a step reads, by where: the device (weights and windows), each tier (the stage's K, the V rows it gathers), the link (rows sent up). */
    readonly bytes: { readonly gpu: number; readonly tiers: Readonly<Record<string, number>>; readonly link: number };
    /** Tokens/s of the whole batch: batch × 1000 / msPerToken. */
    readonly tokensPerSecond: number | null;
  };
}

/** Window tokens per sequence the device memory holds: what is free after weights and the reserve, over batch × KV bytes per token. */
export function gpuWindowTokens(o: { freeBytes: number; weightsBytes: number; reserveBytes: number; bytesPerToken: number; batch: number }): number {
  const left = o.freeBytes - o.weightsBytes - o.reserveBytes;
  return left <= 0 ? 0 : Math.floor(left / (o.bytesPerToken * o.batch));
}

const ms = (bytes: number, gbs: number | undefined) => (gbs === undefined ? null : (bytes / (gbs * 1e9)) * 1e3);

/** `rows` disk rows, each one page read: bound by the reads' latency at the tier's depth or by its bandwidth, whichever is slower. */
export function diskRowsMs(rows: number, pageBytes: number, t: { readBandwidthGBs?: number; readLatencyUs?: number; readDepth?: number }): number | null {
  const bw = ms(rows * pageBytes, t.readBandwidthGBs);
  const lat = t.readLatencyUs === undefined ? null : ((rows / (t.readDepth ?? 1)) * t.readLatencyUs) / 1e3;
  return bw === null ? lat : lat === null ? bw : Math.max(bw, lat);
}

/** The kernel's default read-around of a page fault on a file mapping (read_ahead_kb). */
const READ_AROUND = 128 * 1024;

/**
 * `bytes` of K spilled in `unitBytes` units to a file tier, read back by the CPU stage's scoring
 * every step through the mapping: a fault reads up to the read-around of its unit, one in flight a
 * stage thread — the slower of faults ÷ depth × a fault's latency, and the bytes at the tier's bandwidth.
 */
export function kDiskMs(bytes: number, unitBytes: number, t: { readBandwidthGBs?: number; faultLatencyUs?: number; faultDepth?: number }): number | null {
  const bw = ms(bytes, t.readBandwidthGBs);
  const faults = Math.ceil(bytes / Math.min(unitBytes, READ_AROUND));
  const lat = t.faultLatencyUs === undefined ? null : ((faults / (t.faultDepth ?? 1)) * t.faultLatencyUs) / 1e3;
  return bw === null ? lat : lat === null ? bw : Math.max(bw, lat);
}

export function planRun(input: RunPlanInput): RunPlan {
  const r = RunPlanInputSchema.safeParse(input);
  if (!r.success) {
    const i = r.error.issues[0];
    throw new HybridgenError(`plan: ${i?.path.join(".") || "value"}: ${i?.message ?? "invalid"}`);
  }
  const o = r.data;
  const per = o.model.layers * o.model.kvHeads * o.model.headDim * o.kvElementBytes; // K (or V) bytes of one token
  const total = 2 * per;
  const B = o.batch, ctx = o.contextTokens;
  let refusal: string | null = null;

  let gpu: RunPlan["gpu"] = null;
  let window: number;
  // The page index's bytes per offloaded token (every layer): codes and a scale a page and KV head, and its super-pages on the host.
  const codeBytes = o.index ? (o.index.form === "int8" ? 2 : 1) * o.model.headDim : 0;
  const indexPerToken = o.index ? (o.model.layers * o.model.kvHeads * (codeBytes + 4)) / o.index.pageSize : 0;
  let indexOnDevice = false, indexRefusal: string | null = null;
  if (o.gpu) {
    // Each sequence's own: a prompt prefilled in blocks over offloaded rows brings one layer up at a time into two K/V scratch pairs of the whole context.
    const row = o.model.kvHeads * o.model.headDim * o.kvElementBytes; // one token's K (or V) of one layer
    const heads = o.model.heads ?? o.model.kvHeads;
    const scratch = o.prefill ? 4 * ctx * row : 0;
    // The hybrid step's device staging: two slots of gathered V and K rows, each the widest selection (candidates·K rows a KV head),
    // and two of f32 score rows a query head, as wide as that selection (the whole context only when scores are tracked).
    const width = Math.min(ctx, o.k * o.candidates), scoreCols = o.trackScores ? ctx : width;
    const staging = 4 * width * row + 2 * heads * scoreCols * 4;
    // Attention's f32 score rows: a row a query head over the context.
    const scores = heads * ctx * 4;
    const batchRows = B > 1 ? B * o.model.batchRowBytes : 0;
    const reserve = o.gpu.reserveBytes + o.model.activationBytes + batchRows + B * (scratch + staging + scores);
    let fit = Math.max(0, gpuWindowTokens({ freeBytes: o.gpu.freeBytes, weightsBytes: o.model.weightsBytes, reserveBytes: reserve, bytesPerToken: total, batch: B }) - o.appendTokens);
    if (o.index && o.index.placement !== "host") {
      // The device index covers the offloaded tokens: each token the window gives up costs its index bytes instead.
      const left = o.gpu.freeBytes - o.model.weightsBytes - reserve - ctx * indexPerToken * B;
      const withIndex = left <= 0 ? 0 : Math.max(0, Math.floor(left / ((total - indexPerToken) * B)) - o.appendTokens);
      if (o.index.placement === "device" || withIndex > 0) {
        fit = withIndex;
        indexOnDevice = true;
        if (withIndex === 0 && o.index.placement === "device") {
          indexRefusal = `the page index on the GPU (${formatBytes(ctx * indexPerToken * B)} for ${ctx} tokens × batch ${B}) leaves no room for a window: ${formatBytes(o.gpu.freeBytes)} free, weights ${formatBytes(o.model.weightsBytes)}, reserve ${formatBytes(reserve)} (index placement "host" keeps it on the CPU stage)`;
        }
      }
    }
    window = o.gpuKvBudget === "auto" ? Math.min(fit, ctx) : Math.min(o.gpuKvBudget, ctx);
    if (indexRefusal) {
      refusal = indexRefusal;
    } else if (o.model.weightsBytes + reserve > o.gpu.freeBytes) {
      refusal = `the weights (${formatBytes(o.model.weightsBytes)}) and the reserve (${formatBytes(reserve)}, activations and each sequence's score rows, prefill scratch and staging included) exceed the GPU's free ${formatBytes(o.gpu.freeBytes)}`;
    } else if (window > fit) {
      refusal = `a GPU window of ${window} tokens × batch ${B} needs ${formatBytes(window * B * total)}, but ${formatBytes(fit * B * total)} (${fit} tokens) is free after the weights and the reserve`;
    } else if (window < 1) {
      refusal = `no room for a GPU window: ${formatBytes(o.gpu.freeBytes)} free, weights ${formatBytes(o.model.weightsBytes)}, reserve ${formatBytes(reserve)}`;
    }
    gpu = {
      freeBytes: o.gpu.freeBytes, reserveBytes: reserve, fitTokens: fit, windowTokens: window, windowBytes: window * B * total, batchRowsBytes: batchRows,
      perSequence: { windowBytes: Math.min(ctx, window + o.appendTokens) * total, scoresBytes: scores, scratchBytes: scratch, stagingBytes: staging },
    };
  } else {
    window = o.gpuKvBudget === "auto" ? ctx : Math.min(o.gpuKvBudget, ctx);
  }
  const offloaded = ctx - window;
  const hostWindowBytes = o.gpu ? 0 : window * B * total;
  if (o.index && !o.gpu && o.index.placement === "device" && !refusal) refusal = `the page index's placement "device" needs a GPU (index placement "host" keeps it on the CPU stage)`;
  const indexBytes = o.index ? Math.ceil(offloaded * B * indexPerToken) : 0;
  // The host keeps the index (page level and super-pages) wherever it is ranked: it folds evicted rows in there.
  const hostIndexCopy = o.index ? Math.ceil(indexBytes * (1 + 1 / o.index.superPages)) : 0;
  const hostIndexBytes = indexOnDevice ? 0 : hostIndexCopy;

  // On the CPU backend the weights and the window sit in the fastest DRAM tier before the store; the index's host copy does on any.
  const placement = placeKv(o.policy, o.tiers);
  const fastest = placement.k.mode === "fill" ? placement.k.order[0]! : placement.k.tiers[0]!;
  const reserved = { [fastest]: (o.gpu ? 0 : o.model.weightsBytes + hostWindowBytes) + hostIndexCopy };
  const store = layoutStore({
    tiers: o.tiers, placement, layers: o.model.layers, regionBytes: Math.max(1, o.model.kvHeads * offloaded * B * o.model.headDim * o.kvElementBytes),
    pageBytes: o.pageBytes, headroom: o.headroom, useFreeBytes: o.useFree, hostBudgetBytes: o.hostBudgetBytes, reservedBytes: reserved,
  });
  const storeK = offloaded === 0 ? 0 : offloaded * B * per;
  const byId = new Map(o.tiers.map((t) => [t.id, t]));
  const tiers = store.tiers.map((t) => {
    const scale = offloaded === 0 ? 0 : 1; // an empty store takes nothing
    const src = byId.get(t.id)!;
    return { id: t.id, kind: t.kind, capacityBytes: src.capacityBytes, availableBytes: t.availableBytes, kBytes: t.kBytes * scale, vBytes: t.vBytes * scale,
      readBandwidthGBs: src.readBandwidthGBs, readLatencyUs: src.readLatencyUs, readDepth: src.readDepth, faultLatencyUs: src.faultLatencyUs, faultDepth: src.faultDepth };
  });
  if (!refusal && hostIndexCopy > 0) {
    const t = byId.get(fastest)!;
    const usable = Math.floor((o.useFree && t.freeBytes !== undefined ? t.freeBytes : t.capacityBytes) * (1 - o.headroom));
    if (hostIndexCopy + (o.gpu ? 0 : o.model.weightsBytes + hostWindowBytes) > usable) {
      refusal = `the page index's host copy (${formatBytes(hostIndexCopy)} for ${offloaded} offloaded tokens × batch ${B}) does not fit ${fastest}'s usable ${formatBytes(usable)}` +
        `${o.gpu ? "" : ` beside the weights and the window (${formatBytes(o.model.weightsBytes + hostWindowBytes)})`} (form int4, larger pages or a shorter context need less)`;
    }
  }
  if (!refusal && !o.gpu) {
    const t = byId.get(fastest)!;
    const usable = Math.floor((o.useFree && t.freeBytes !== undefined ? t.freeBytes : t.capacityBytes) * (1 - o.headroom));
    if (o.model.weightsBytes + hostWindowBytes > usable) {
      refusal = `the weights (${formatBytes(o.model.weightsBytes)}) and a window of ${window} tokens × batch ${B} (${formatBytes(hostWindowBytes)}) exceed ${fastest}'s usable ${formatBytes(usable)}` +
        ` (a smaller --gpu-kv-budget offloads the rest)`;
    }
  }
  if (!refusal && offloaded > 0 && !store.fits) {
    const room = store.tiers.reduce((n, t) => n + t.availableBytes, 0);
    refusal = `context ${ctx} × batch ${B} needs ${formatBytes(ctx * B * total)} of KV: ` +
      `${o.gpu ? `the GPU window holds ${window} tokens (${formatBytes(window * B * total)})` : `weights and window take ${formatBytes(o.model.weightsBytes + hostWindowBytes)} of host memory`}, ` +
      `the host tiers and disk have room for ${formatBytes(room)} of the ${formatBytes(2 * storeK)} offloaded: short by ${formatBytes(store.shortfallBytes)} ` +
      `(add --kv-disk DIR, raise --host-kv-budget, or shorten the context)`;
  }

  // Predicted step time from the tiers' bandwidths.
  const rowBytes = o.model.headDim * o.kvElementBytes;
  const verified = o.candidates > 1;
  // The share of the offloaded K the stage reads to choose; past a full scan it reads the chosen rows' K (as many as it gathers V rows).
  const keyShare = o.index || o.selection === "none" ? 0 : o.selection === "bounds" ? Math.min(1, 2 / o.boundsPageSize) : 1;
  const kRowsToo = keyShare < 1 ? 2 : 1;
  // Disk reads a gathered row costs: one page each, but the index's rows come in whole index pages, one run of reads a page.
  const readsPerRow = o.index ? Math.ceil((o.index.pageSize * rowBytes) / o.pageBytes) / o.index.pageSize : 1;
  // Rows each layer's stage gathers over its KV heads: K on layer 0 (its q̃ is its true query), candidates·K on the verified layers after it.
  const layerRows = (l: number) => (offloaded === 0 ? 0 : Math.min(offloaded, l === 0 ? o.k : o.k * o.candidates) * o.model.kvHeads * B);
  // Their V rows: on verified layers that keep some candidates, only the kept ones.
  const keep = verified && o.keep !== undefined && o.keep < o.candidates ? o.keep : null;
  const layerVRows = (l: number) => (keep === null || l === 0 || offloaded === 0 ? layerRows(l) : Math.min(offloaded, o.k * keep) * o.model.kvHeads * B);
  const R = store.layout.regionBytes;
  const diskRows = new Map<string, number>();
  let memoryRows = 0, movedBytes = 0, keyRows = 0, fetchedBytes = 0;
  // Layers whose rows are fetched ahead (gpu.fetchAhead): ahead on q̃ (the serial layers come first in the count), the first layer not (nothing runs before it).
  const fetchedFrom = Math.min(o.model.layers, Math.max(1, o.serialLayers));
  for (let l = 0; l < o.model.layers; l++) {
    const rows = layerVRows(l);
    keyRows += layerRows(l);
    let onDisk = 0;
    for (const s of store.layout.v[l] ?? []) {
      if (s.mode !== "file" || rows === 0) continue;
      const share = (rows * s.bytes) / R;
      diskRows.set(s.tier, (diskRows.get(s.tier) ?? 0) + share);
      onDisk += share;
    }
    memoryRows += rows - onDisk;
    const kBytes = verified && l > 0 ? layerRows(l) * rowBytes : 0; // verified layers send the candidates' K rows up beside their V rows
    movedBytes += rows * rowBytes + kBytes;
    // Fetched ahead: the hand-off's gathers, K and V, or K alone where the layer keeps some (its kept V rows come after the rescoring).
    if (o.gpu?.fetchAhead && l >= fetchedFrom) fetchedBytes += kBytes + (keep !== null && l > 0 ? 0 : rows * rowBytes);
  }
  let cpuMs: number | null = 0;
  let kDiskTotal: number | null = 0;
  let vGatherMs: number | null = 0;
  const memoryV = tiers.reduce((n, t) => n + (isFileTier(t) ? 0 : t.vBytes), 0);
  const tierBytes: Record<string, number> = {};
  const totalK = tiers.reduce((n, t) => n + t.kBytes, 0);
  for (const t of tiers) {
    const vRows = isFileTier(t) ? diskRows.get(t.id) ?? 0 : memoryV > 0 ? (memoryRows * t.vBytes) / memoryV : 0;
    // Past a full scan the chosen rows' K comes from wherever K lives (on the disk tier only what a K spill moved there), not with their V.
    const kRows = kRowsToo > 1 && totalK > 0 ? (keyRows * t.kBytes) / totalK : 0;
    const kRead = t.kBytes * keyShare;
    tierBytes[t.id] = kRead + (vRows + kRows) * (isFileTier(t) ? readsPerRow * o.pageBytes : rowBytes);
    if (kRead > 0) {
      const m = isFileTier(t) ? kDiskMs(kRead, store.layout.kSpill!.unitBytes, byId.get(t.id)!) : ms(kRead, t.readBandwidthGBs);
      if (isFileTier(t)) kDiskTotal = kDiskTotal === null || m === null ? null : kDiskTotal + m;
      cpuMs = cpuMs === null || m === null ? null : cpuMs + m;
    }
    const rows = vRows + kRows;
    if (rows > 0) {
      const m = isFileTier(t) ? diskRowsMs(rows * readsPerRow, o.pageBytes, byId.get(t.id)!) : ms(rows * rowBytes, t.readBandwidthGBs);
      vGatherMs = vGatherMs === null || m === null ? null : vGatherMs + m;
    }
  }
  if (hostIndexBytes > 0) {
    const m = ms(hostIndexBytes, byId.get(fastest)!.readBandwidthGBs);
    cpuMs = cpuMs === null || m === null ? null : cpuMs + m;
    tierBytes[fastest] = (tierBytes[fastest] ?? 0) + hostIndexBytes;
  }
  const rowLayers = offloaded > 0 ? o.model.layers * B : 0;
  if (cpuMs !== null && o.stageMsPerRowLayer !== undefined) cpuMs += rowLayers * o.stageMsPerRowLayer;
  const hostMs = rowLayers * (o.issueMsPerRowLayer ?? 0);
  // Without a GPU the CPU backend's own step reads the weights and the window from the fastest tier (and a device index).
  // Layers ahead on q̃ (all but the serial ones) read their W_q once more to project it.
  const aheadBytes = offloaded > 0 ? (o.model.layers - Math.min(o.serialLayers, o.model.layers)) * o.model.queryProjectionBytes : 0;
  const gpuBytes = o.model.weightsBytes + aheadBytes + window * B * total + (indexOnDevice ? indexBytes : 0);
  const rankMs = indexOnDevice && offloaded > 0 ? o.gpu?.indexRankMs : undefined;
  const streamed = ms(rankMs === undefined ? gpuBytes : gpuBytes - indexBytes, o.gpu ? o.gpu.readBandwidthGBs : byId.get(fastest)!.readBandwidthGBs);
  const L = o.model.layers, gpuMs = streamed === null || rankMs === undefined ? streamed : o.gpu?.indexRankBeside ? L * Math.max(streamed / L, B * rankMs) : streamed + L * B * rankMs;
  const deviceGathers = o.gpu?.gatherGBs !== undefined;
  const vTransferMs = o.gpu ? (offloaded === 0 ? 0 : ms(movedBytes, deviceGathers ? o.gpu.gatherGBs : o.gpu.linkBandwidthGBs)) : 0;
  if (deviceGathers) vGatherMs = 0; // the device's gather reads the tiers: its time is vTransferMs
  // The device's part of a step: its reads, and the rows it gathers — those fetched ahead beside the reads, the rest after them.
  const fetchedMs = deviceGathers && offloaded > 0 ? ms(fetchedBytes, o.gpu!.gatherGBs)! : 0;
  const inLayerMs = vTransferMs === null ? null : vTransferMs - fetchedMs;
  const handOffMs = offloaded > 0 ? Math.min(o.serialLayers, o.model.layers) * B * (o.gpu?.handOffMs ?? 0) : 0;
  const msPerToken = gpuMs === null || cpuMs === null || vGatherMs === null || vTransferMs === null || inLayerMs === null ? null
    : deviceGathers ? Math.max(Math.max(gpuMs, fetchedMs) + inLayerMs, cpuMs, hostMs) + handOffMs
    : Math.max(gpuMs, cpuMs, hostMs) + vGatherMs + vTransferMs + handOffMs;

  if (o.leastWindow && gpu && o.gpuKvBudget === "auto" && refusal === null) {
    // The store grows as the window shrinks: the least window whose store fits in no more file bytes than this one's (monotone, so bisect).
    const fileBytes = (ts: RunPlan["tiers"]) => ts.reduce((n, t) => n + (isFileTier(t) ? t.kBytes + t.vBytes : 0), 0);
    const limit = fileBytes(tiers);
    const at = (w: number) => planRun({ ...input, gpuKvBudget: w, leastWindow: false });
    const ok = (p: RunPlan) => p.fits && fileBytes(p.tiers) <= limit;
    let lo = Math.max(1, Math.min(window, o.appendTokens)), hi = window;
    if (!ok(at(lo))) {
      while (lo < hi) {
        const mid = Math.floor((lo + hi) / 2);
        if (ok(at(mid))) hi = mid;
        else lo = mid + 1;
      }
    } else hi = lo;
    if (hi < window) return at(hi);
  }

  return {
    contextTokens: ctx, batch: B, bytesPerToken: { k: per, v: per },
    weights: { where: o.gpu ? "gpu" : "host", bytes: o.model.weightsBytes },
    gpu, hostWindowBytes, offloadedTokens: offloaded, store, tiers,
    index: o.index ? { placement: indexOnDevice ? "device" : "host", bytes: indexOnDevice ? indexBytes : hostIndexBytes } : null,
    fits: refusal === null, refusal,
    predicted: {
      gpuMs, cpuMs, hostMs, handOffMs, kDiskMs: kDiskTotal, vGatherMs, vTransferMs, msPerToken, tokensPerSecond: msPerToken === null || msPerToken <= 0 ? null : (B * 1000) / msPerToken,
      bytes: { gpu: gpuBytes, tiers: tierBytes, link: o.gpu && offloaded > 0 ? movedBytes : 0 },
    },
  };
}
