/**
 * The CpuStage contract: the host side of hybrid attention for one layer at a time
 * (paper §4.2 Logits Calculator + V gather). It scores a query against a layer's offloaded K,
 * optionally selects top-K itself, and leaves the selected tokens' logits and V rows in a
 * staging area the device reads (pinned memory a GPU receives by DMA).
 *
 * Two staging slots (0, 1) let the stage prepare layer l + 1 while the device still reads
 * layer l's results (speculative mode). Output layout of a slot, for a step's width kmax:
 *   logits  [heads, kmax] f32, scaled by 1/√d; a KV head's list shorter than kmax is padded
 *           with −∞ (zero probability, so the softmax stays exact);
 *   values  [kvHeads, kmax, headDim], padded rows are zeros;
 *   ids     [kvHeads, kmax] store slots, ascending per KV head; counts[g] valid per head;
 *   keys    [kvHeads, kmax, headDim] the selected K rows, for jobs that ask (verified logits).
 *
 * An implementation may run submit() on threads of its own (`concurrent`), so the caller
 * drives the device stage until wait(); the portable BackendCpuStage runs synchronously.
 */
import type { DType, HostRegion, HostSignal, Tensor } from "../backend.js";
import type { OffloadedKeys, Selection, SelectorPrimitives } from "../contracts/selector.js";
import type { SpecVersion } from "../version.js";
import type { PageIndexForm } from "../contracts/page-index.js";

export interface CpuStageShape {
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  /** Rows per KV head of the store tensors (KvCache.storeCapacity). */
  readonly storeCapacity: number;
  /** Storage dtype of the store's K and V (a stage may stage V rows in it, unconverted). */
  readonly dtype: DType;
  /** Also keep a staging area for the selected K rows (jobs with `keys`: verified logits). */
  readonly stageKeys?: boolean;
}

/** What one submit() does. */
export type CpuStageWork =
  /** Post-QKᵀ, selection in JS afterwards: score every offloaded token into allLogits(). */
  | { readonly kind: "score" }
  /** Post-QKᵀ exact top-K inside the stage: per KV head the max over the group's query heads
   * (or over all heads when `shared`), then the `budget` largest, ties to the lower slot. */
  | { readonly kind: "topk"; readonly budget: number; readonly shared: boolean }
  /** Pre-QKᵀ: score only the selected slots (per KV head lists may differ). */
  | { readonly kind: "selected"; readonly selection: Selection }
  /** Pre-QKᵀ Quest pages inside the stage (questSelection with the slot's query; `budget` ids per
   * KV head), then as "selected". The stage keeps each store's page summaries, folding in the rows
   * evicted since its last quest job (afresh when `storeEpoch` changes or the store shrank). */
  | { readonly kind: "quest"; readonly budget: number; readonly pageSize: number }
  /** Pre-QKᵀ page index inside the stage (indexSelection with the slot's query; `budget` ids per KV
   * head), then as "selected". The stage keeps each store's index, folding in the rows evicted since
   * its last index job (afresh when `storeEpoch` changes or the store shrank). With `chosen` (a stage
   * that `takesChosenPages`), a device ranked the pages instead: each KV head's best
   * indexWant(budget, offloaded, pageSize) pages, best first, lie as int32 [kvHeads, want] right after
   * the query's heads·headDim floats in the slot's query buffer (indexChosenOffset); the stage then
   * neither folds nor searches an index of its own. */
  | { readonly kind: "index"; readonly budget: number; readonly form: PageIndexForm; readonly pageSize: number; readonly superPages: number; readonly chosen?: boolean }
  /** Pre-QKᵀ StreamingLLM inside the stage (streamingSelection: the `sinks` oldest slots plus the
   * newest, `budget` ids, the same list for every KV head), then as "selected". */
  | { readonly kind: "streaming"; readonly budget: number; readonly sinks: number };

export interface CpuStageJob {
  readonly slot: 0 | 1;
  /** The layer's store K and V ([kvHeads, storeCapacity, headDim]). */
  readonly k: Tensor;
  readonly v: Tensor;
  /** Offloaded tokens (valid store slots 0 … offloaded − 1). */
  readonly offloaded: number;
  /** Output width: lists are padded to it. */
  readonly kmax: number;
  readonly scale: number;
  readonly work: CpuStageWork;
  /** Stage the selected tokens' K rows beside their V rows (needs a shape with stageKeys), so the
   * device can score them with the true query ("verified" logits). */
  readonly keys?: boolean;
  /** The device reads the selected V (and K) rows from the store itself (pinned host memory mapped
   * into its address space): the stage may skip copying rows into `values`/`keys` and writes only
   * ids, counts and logits. BackendCpuStage and NativeCpuStage leave the row buffers untouched (padding
   * included), so their split's gather is ~0 (a selected job's selected logits count as scoring). */
  readonly deviceGather?: boolean;
  /** Changes whenever store rows below `offloaded` may have been rewritten (KvCache.rewinds): a
   * stage that keeps copies derived from the rows (compressed K) makes them again. */
  readonly storeEpoch?: number;
  /** The query is still on its way from the device (HostTransfers.sendSignalled): the stage's threads
   * wait for the signal before reading it. Only for a stage with `waitsForSignal`. */
  readonly ready?: HostSignal;
  /** Raised (the value written into the word) once the job's ids, counts and logits are written, or
   * once it failed or was cancelled: a device waits for it (HostTransfers.awaitSignal). Only for a
   * stage with `queueDepth` > 1. */
  readonly done?: HostSignal;
}

export interface CpuStageOutput {
  readonly kmax: number;
  readonly logits: Float32Array;
  /** [kvHeads, kmax, headDim] view of the staging tensor (valid until the slot is reused). */
  readonly values: Tensor;
  /** [kvHeads, kmax, headDim] selected K rows, for a job with `keys` (else null). */
  readonly keys: Tensor | null;
  readonly ids: Int32Array;
  readonly counts: Int32Array;
}

export interface CpuStage extends Disposable {
  /** The spec version it was written for (SPEC_VERSION); absent: written before the field. */
  readonly spec?: SpecVersion;
  readonly name: string;
  /** True when submit() returns at once and the work runs on other threads. */
  readonly concurrent: boolean;
  /** Jobs may carry `ready`: the stage's threads wait for the device's signal, so the host need not. */
  readonly waitsForSignal?: boolean;
  /**
   * How many jobs submit() takes before a wait() (absent: 1). Queued jobs run in order, each into
   * its own job's slot; a stage with a queue also raises jobs' `done` signals and has cancel().
   */
  readonly queueDepth?: number;
  /** "index" jobs may carry `chosen`: the best pages come with the query (a device ranked them). */
  readonly takesChosenPages?: boolean;
  /** Allocate buffers for a model/cache shape (called once, before any submit). */
  prepare(shape: CpuStageShape): void;
  /** The query buffer of a slot (heads × headDim, RoPE applied); fill it before submit. */
  query(slot: 0 | 1): Float32Array;
  /** A stage that takesChosenPages: the int32 buffer right after a slot's query ("index" work's `chosen` pages), for a host that writes them itself. */
  chosenPages?(slot: 0 | 1): Int32Array;
  submit(job: CpuStageJob): void;
  /** Blocks until every submitted job is done; returns their busy time in ms (the first failure throws, after all have ended). */
  wait(): number;
  /** Queued jobs not yet started fail at once, a job waiting for its `ready` signal stops waiting (each raises its `done`); wait() then throws. */
  cancel?(): void;
  /** Per query head, the logits of a "score" job (valid until the next submit). */
  allLogits(): readonly Float32Array[];
  /** After a "score" job and a JS selection: stage the selected logits and V rows (synchronous). */
  gather(job: CpuStageJob, selection: Selection): void;
  output(slot: 0 | 1): CpuStageOutput;
  /**
   * Native stages: the host memory of a slot's buffers, which a device backend pins and copies
   * with its own DMA — query (heads × headDim f32), logits ([heads, kmax] f32 packed from the
   * start) and values ([kvHeads, kmax, headDim] in the store dtype, packed from the start).
   */
  hostStaging?(slot: 0 | 1): CpuStageStaging;
  /** Native stages: where the waited-for jobs' time went (ms, summed over the jobs of the last wait()). */
  lastSplit?(): CpuStageSplit;
  /** A store K tensor as selectors read it (SelectionBase.keys), without a copy; absent: selectors get no keys. */
  offloadedKeys?(k: Tensor): OffloadedKeys;
  /** Selector primitives the stage runs natively; absent: the engine hands referencePrimitives. */
  readonly primitives?: SelectorPrimitives;
  /** How top-K jobs score the offloaded keys: "full" rows, or a compressed copy ("int8", "int4") first. */
  readonly scoring?: string;
  /** With compressed scoring: the candidates per selected token rescored from the full rows. */
  readonly rescoreFactor?: number;
  close(): void;
}

/** A slot's buffers in host memory (CpuStage.hostStaging). */
export interface CpuStageStaging {
  readonly query: HostRegion;
  readonly logits: HostRegion;
  readonly values: HostRegion;
  readonly keys: HostRegion | null;
  /** int32 [counts (kvHeads) | ids (kvHeads × kmax)]: the slot's counts and ids, packed for the step's kmax (what gatherRowsAt reads). */
  readonly table?: HostRegion;
}

/** One job's time by phase (ms): what wait() returns is about score + select + gather. */
export interface CpuStageSplit {
  /** Query packing and q·Kᵀ over the offloaded rows (or the selected ones, pre-QKᵀ); a stage that takes
   * the group max per token while scoring (NativeCpuStage's fused top-K) counts it here. */
  readonly scoreMs: number;
  /** Top-K: the selection, and the group max per token where it is a pass of its own. */
  readonly selectMs: number;
  /** Selected logits and the V rows copied to the staging buffer. */
  readonly gatherMs: number;
  /** Hand-offs: submit → the stage thread starts it, and the job's end → wait() returns. */
  readonly handoffMs: number;
}
