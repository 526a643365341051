/**
 * A StepTransport is one way a hybrid step's rows reach the device: how the query reaches the CPU
 * stage, how the stage's selected logits and V (and K) rows reach the softmax, and where the step's
 * times come from. HybridAttention (the step: plan, merge, accounting) picks one at construction
 * (chooseTransport) and drives every layer through it:
 *   host        the backend reads the stage's buffers itself (the CPU backend: no host link);
 *   staged      the stage copies the rows into pinned buffers, the copy stream uploads them;
 *   mapped      the device gathers the rows from the pinned, mapped host store by the stage's ids;
 *   handed-off  mapped, and the device (not the host) waits for each layer's job, so the host issues
 *               the whole step without blocking; rows may be fetched ahead on a side stream.
 */
import type { DecodeBatchStep } from "@hybridgen/core";
import type { Tensor, HeadLayout, CpuStage, CpuStageJob, HostSignal } from "@hybridgen/spec";
import type { RowPath } from "../row-path.js";
import type { StepMerge } from "../step-merge.js";
import type { StepPlan } from "../step-plan.js";

export type TransportName = "host" | "staged" | "mapped" | "handed-off";

/** What a transport asks of the step it carries. */
export interface StepDriver {
  readonly layers: number;
  readonly layout: HeadLayout;
  /** Per layer: the stage is submitted ahead with q̃ (else it waits for the true query). */
  readonly ahead: readonly boolean[];
  /** Per layer: the device re-scores the staged K rows with the true query (verified). */
  readonly rescore: readonly boolean[];
  readonly merge: StepMerge;
  readonly stage: CpuStage;
  /** The current step's plan (transports run only inside a planned step). */
  plan(): StepPlan;
  layerKmax(layer: number): number;
  /** The candidates a verified layer keeps a KV head (HybridOptions.keep), where fewer than layerKmax; else 0 (every candidate's V row comes up). */
  layerKeep(layer: number): number;
  /** The keep option is set: the transport must keep rows on the device. */
  readonly keeps: boolean;
  /** The layer's job this step (null: not submitted yet, or its table made on the device). */
  job(layer: number): CpuStageJob | null;
  /** The signal a handed-off layer's rows wait for: its job's done, or the device-made table's (undefined: neither yet). */
  done(layer: number): HostSignal | undefined;
  submit(layer: number): void;
  /** After layer l is collected: the next layer's stage goes ahead now when it runs on q̃. */
  submitNext(layer: number): void;
  /** Waits for layer's stage; a post-QKᵀ JS selector chooses then and the stage gathers. */
  collect(layer: number): void;
  /** Host time spent moving data (T_tx where there are no device events). */
  addTx(ms: number): void;
}

/** A step's device-side times (from the link's events); null from a transport that has none (host wall times). */
export type StepTimes = { readonly gpuMs: number; readonly txMs: number; readonly waitMs?: number; readonly segmentMs?: number; readonly hostWaitMs?: number } | null;

export interface StepTransport extends Disposable {
  readonly name: TransportName;
  /** Per layer, how its rows come up (empty on the host transport). */
  readonly rowPaths: readonly RowPath[];
  /** The stats line's words on it, e.g. "transport mapped: V rows read by the device from pinned host memory (32 of 32 layers)". */
  readonly note: string;
  /** A new sequence: the device's first timed step drops what prefill recorded. */
  newSequence(): void;
  /** Every decode step's start, before anything is planned; `batch`: the batched step it is a row of. */
  startStep(batch: DecodeBatchStep | null): void;
  /** A step with offloaded tokens, before its plan: the host store catches up with the evictions. */
  syncStore(): void;
  /** After the plan, whose widest layer needs `rows` rows per KV head: true when the step is handed off on the device. */
  planned(plan: StepPlan, rows: number): boolean;
  /** Row 0 of q (a layer's query or q̃) into the stage's query buffer of the layer's slot; `bytes`
   * past the query's (the pages a device index chose, after it in q) land in the slot's chosenPages. */
  sendQuery(layer: number, q: Tensor, bytes?: number): void;
  /**
   * A device-ranked layer: `rank` issues its ranking into `q` (the query, then the pages: `bytes` in
   * all), then q goes as sendQuery sends it — both on the backend's side stream where the transport
   * can put them there, joined before the segment they land in ends; else in line.
   */
  sendRanked(layer: number, rank: () => void, q: Tensor, bytes: number): void;
  /** A job's fields that depend on how rows travel. */
  jobLink(layer: number): Pick<CpuStageJob, "ready" | "done" | "deviceGather">;
  /** A batched step calls it for every row before any row's attend (after the layer's job is submitted): the device work that can go first. */
  prepareAttend?(layer: number, q: Tensor): void;
  /** The layer's attention once its job is submitted (prepareAttend): window, stage output, one softmax, A·V into out. */
  attend(layer: number, q: Tensor, out: Tensor): void;
  /** Before anything that talks to the host (a step's end, a close): recorded device work runs. */
  flush(): void;
  /** The step's device times, after it ran (a batched step's are read once, for all its rows). */
  stepTimes(batch: DecodeBatchStep | null): StepTimes;
  close(): void;
}
