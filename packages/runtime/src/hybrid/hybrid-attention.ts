/**
 * HybridAttention: decode-step attention split by tokens (paper §4.2, Figure 12) — the step
 * itself: its plan, the CPU stage's jobs, the one softmax and its accounting. How the stage's rows
 * reach the device is its transport (transport/: host, staged, mapped, handed off), chosen once at
 * construction from what the backend's host link, the stage and the store allow (chooseTransport).
 *
 * Per layer: the CPU stage scores the query against the layer's offloaded K (all of it
 * post-QKᵀ, only chosen slots pre-QKᵀ), selects, and stages the selected logits and V rows;
 * the device scores the window (sinks + recent ring). The logits are concatenated in position
 * order — columns [0, S) sinks, [S, S + K) the selected offloaded tokens (ascending slot =
 * position order, short per-head lists padded with −∞), then the ring — softmaxed once and
 * aggregated over the matching V rows (StepMerge). Where the backend has attnPartial/attnMerge
 * and no scores are tracked, the window is never materialised: its flash-decode partial is merged
 * with the selected columns.
 *
 * Logits modes: "exact" submits layer l's stage with the true q of layer l, then scores the
 * window while it runs. "speculative" computes q̃ₗ₊₁ = RoPE(W_q⁽ˡ⁺¹⁾·norm⁽ˡ⁺¹⁾(xₗ)) at the start
 * of layer l and submits layer l + 1's stage as soon as layer l's is collected, so it runs
 * during the rest of layer l and the start of layer l + 1 (layer 0's q̃ comes from the
 * embedding output, i.e. it is exact); q̃'s logits enter the softmax. "verified" runs the stage
 * ahead as speculative does, but q̃ only chooses `candidates`·K tokens: their K rows are staged
 * with the V rows and the device scores them with the true query. Layers in `exactLayers` (where
 * q̃ is a poor stand-in for q, found by profiling) wait for the true query, as "exact" does.
 * Prefill blocks always use exact full attention.
 *
 * A row of a batched step (BatchRows) runs the same way; the host waits for each row's stage once,
 * at the batched step's end, when its transport hands off.
 */
import {
  type Tensor, type Scheduler, type SchedulerDecision, referencePrimitives, headLayout, type AccumulatedScores, type HeadLayout, type TokenSelector, fail, type CpuStage, type CpuStageJob, type CpuStageWork, checkSpecVersion,
  stageKernel, type IndexKernel, type IndexRankRow, type HostSignal,
} from "@hybridgen/spec";
import type { Attention, DecodeAttention, DecodeBatchStep, QueryProjector, StepGroup } from "@hybridgen/core";
import { selectionRows, type RowPath } from "./row-path.js";
import { HybridStats } from "./hybrid-stats.js";
import { HybridOptionsSchema, keepProblem, type HybridOptions, type LogitsMode } from "./options.js";
import { StepAccount } from "./step-account.js";
import { StepMerge } from "./step-merge.js";
import { kernelWork, layerBudget, layerKmax, planStep, type StepPlan } from "./step-plan.js";
import type { TransportChoice } from "./transport/choose-transport.js";
import { checkHostIndex, DeviceIndex, freeDeviceBytes, hostIndexBytes, IndexSyncBatch, type RankedQuery } from "./device-index.js";
import { IndexBatch, type IndexBatchMember } from "./index-batch.js";
import { freemem } from "node:os";
import { openTransport } from "./transport/open-transport.js";
import type { StepDriver, StepTransport, TransportName } from "./transport/step-transport.js";

export interface HybridAttentionParts {
  readonly attention: Attention;
  /** Computes a layer's query from a residual row (LlamaModel implements it). */
  readonly projector: QueryProjector;
  /** Owned from here on: closed with the HybridAttention. */
  readonly stage: CpuStage;
  readonly selector: TokenSelector;
  readonly scheduler: Scheduler;
  /** The native stage a batch's sequences share (kernels-cpu's NativeStageGroup): a batched step flushes it once after each pass over the rows. */
  readonly stageGroup?: StageGroup;
}

/** What a hybrid attention uses of the native stage its batch shares. */
export interface StageGroup extends StepGroup {
  /** This sequence's lane takes part in `step` (null: a step of its own): the group goes by itself once the step's lanes have a job each. */
  join(step: { readonly serial: number } | null): void;
  /** Groups of two jobs or more so far: run at once (a job a thread), one after another over the whole pool. */
  groupCounts(): { atOnce: number; inTurn: number };
}

export class HybridAttention implements DecodeAttention, StepDriver, IndexBatchMember, Disposable {
  readonly stats = new HybridStats();
  readonly logitsMode: LogitsMode;
  readonly layout: HeadLayout;
  readonly layers: number;
  readonly ahead: readonly boolean[];
  readonly rescore: readonly boolean[];
  readonly merge: StepMerge;
  readonly stage: CpuStage;
  /** How the stage's rows reach the device, and why (chosen once). */
  readonly transportChoice: TransportChoice;
  private readonly transport: StepTransport;
  private readonly attention: Attention;
  private readonly projector: QueryProjector;
  private readonly selector: TokenSelector;
  private readonly scheduler: Scheduler;
  /** The native stage shared with the batch's other sequences (null: a stage of its own). */
  readonly stageGroup: StageGroup | null;
  private readonly candidates: number;
  /** Verified layers keep keep·K of their candidates·K (HybridOptions.keep; null: all). */
  private readonly keep: number | null;
  private readonly positions: Int32Array;
  private readonly specQ: Tensor;
  private states: unknown[] = [];
  private decision: SchedulerDecision;
  private current: StepPlan | null = null;
  private pos = 0;
  private step = 0;
  private jobs: (CpuStageJob | null)[] = [];
  private readonly account: StepAccount;
  /** The batched step this step is a row of (null: a step of its own), and which row. */
  private batchStep: DecodeBatchStep | null = null;
  private batchRow = -1;
  /** This step's pages are ranked with the batch's other rows' (the backend's IndexBatch). */
  private batchRanks = false;
  /** This step is handed off on the device (the host collects its jobs at the end). */
  private handedOff = false;
  private inFlight = false; // a stage job was submitted and not yet collected
  private clampSaid = false;
  /** This step's device-index fold and upload on the driving thread (ms). */
  private indexSyncMs = 0;
  /** KvCache.rewinds when the per-sequence state was made: a restore() since means a new one. */
  private cacheRewinds = -1;
  /** Per layer, the share of the scheduler's K it selects (recalibrate's layerK; null: all of it). */
  private kShare: number[] | null = null;
  /** Whether the stage (and the transport) were prepared for verified layers' K rows. */
  private readonly keysPrepared: boolean;
  /** Closed with this (a prefill calibrator feeding recalibrate). */
  private readonly owned: Disposable[] = [];
  /** The page index's page level on the device, when the selector's index is ranked there (null: the stage ranks its own). */
  readonly deviceIndex: DeviceIndex | null;
  private closed = false;

  constructor(parts: HybridAttentionParts, options: HybridOptions = {}) {
    const parsed = HybridOptionsSchema.safeParse(options);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      fail(`invalid hybrid option ${issue.path.join(".")}: ${issue.message}`);
    }
    const { attention, projector, stage, selector, scheduler } = parts;
    checkSpecVersion(`backend "${attention.backend.name}"`, attention.backend);
    checkSpecVersion(`CPU stage "${stage.name}"`, stage);
    checkSpecVersion(`selector "${selector.name}"`, selector);
    checkSpecVersion(`scheduler "${scheduler.name}"`, scheduler);
    const cache = attention.cache;
    if (cache.storeCapacity === 0) fail("hybrid attention needs a KV window budget smaller than the context (nothing would be offloaded)");
    this.attention = attention;
    this.projector = projector;
    this.stage = stage;
    this.selector = selector;
    this.scheduler = scheduler;
    this.stageGroup = parts.stageGroup ?? null;
    const o = parsed.data;
    this.logitsMode = o.logits;
    this.layers = cache.layers;
    const bad = o.exactLayers.find((l) => l >= cache.layers);
    if (bad !== undefined) fail(`invalid hybrid option exactLayers: layer ${bad} does not exist (the model has ${cache.layers})`);
    const exact = new Set(o.exactLayers);
    this.ahead = Array.from({ length: this.layers }, (_, l) => o.logits !== "exact" && !exact.has(l));
    // Layer 0's q̃ is its true query: nothing to verify there.
    this.rescore = this.ahead.map((a, l) => a && l > 0 && o.logits === "verified");
    this.candidates = o.logits === "verified" ? o.candidates : 1;
    const keepBad = keepProblem(o.keep, o.logits, o.candidates);
    if (keepBad) fail(`invalid hybrid option ${keepBad}`);
    this.keep = o.keep !== undefined && this.rescore.includes(true) ? o.keep : null;
    this.keysPrepared = this.rescore.includes(true);
    const { heads, kvHeads, headDim } = attention.layout;
    this.layout = headLayout(heads, kvHeads, headDim);
    stage.prepare({ heads, kvHeads, headDim, storeCapacity: cache.storeCapacity, dtype: cache.dtype, stageKeys: this.rescore.includes(true) });
    this.deviceIndex = this.openDeviceIndex(attention, stage, selector);
    if (stage.scoring && stage.scoring !== "full") this.stats.scoring = `${stage.scoring}, ${stage.rescoreFactor ?? 1}·K rescored`;
    this.account = new StepAccount(this.stats, stage);
    this.positions = new Int32Array(cache.storeCapacity);
    for (let i = 0; i < this.positions.length; i++) this.positions[i] = cache.storeStart + i;
    this.specQ = attention.backend.alloc([1, heads * headDim]);
    const trackScores = o.trackScores || selector.needsScores;
    this.merge = new StepMerge(attention, this.layout, trackScores, this.stats);
    try {
      const opened = openTransport(this, attention, { rowPath: o.rowPath, trackScores, rows: this.rowsFor(scheduler.initial().k), wholeRows: !this.merge.part });
      this.transport = opened.transport;
      this.transportChoice = opened.choice;
    } catch (e) {
      attention.backend.free(this.specQ);
      this.merge.close();
      this.deviceIndex?.close();
      throw e;
    }
    this.stats.rows = this.transport.note;
    this.decision = scheduler.initial();
    this.jobs = new Array(this.layers).fill(null);
    this.newSequence();
  }

  /** Route `attention`'s decode steps through a new HybridAttention. */
  static attach(parts: HybridAttentionParts, options: HybridOptions = {}): HybridAttention {
    const h = new HybridAttention(parts, options);
    parts.attention.setDecodeAttention(h);
    return h;
  }

  /**
   * A calibration's decision, between steps: `exactLayers` (null: unchanged) select with the true
   * query from the next step on; with `layerK`, each layer selects its share of the scheduler's K
   * (K · layerK[l] / max layerK, the largest layer all of it); and the scheduler's first decision
   * is taken again (its K may have moved).
   */
  recalibrate(exactLayers: readonly number[] | null, layerK: readonly number[] | null = null): void {
    this.checkOpen();
    if (layerK) {
      if (layerK.length !== this.layers || layerK.some((k) => !(k >= 1))) fail(`recalibrate: layerK must hold a K ≥ 1 for each of the ${this.layers} layers`);
      const top = Math.max(...layerK);
      this.kShare = layerK.map((k) => k / top);
    }
    if (exactLayers) {
      const bad = exactLayers.find((l) => !Number.isInteger(l) || l < 0 || l >= this.layers);
      if (bad !== undefined) fail(`recalibrate: layer ${bad} does not exist (the model has ${this.layers})`);
      const exact = new Set(exactLayers), ahead = this.ahead as boolean[], rescore = this.rescore as boolean[];
      for (let l = 0; l < this.layers; l++) {
        ahead[l] = this.logitsMode !== "exact" && !exact.has(l);
        rescore[l] = ahead[l]! && l > 0 && this.logitsMode === "verified";
      }
      if (rescore.includes(true) && !this.keysPrepared) fail("recalibrate: verified layers need K rows the stage was not prepared for (attach with no exact layers)");
    }
    this.decision = this.scheduler.initial();
  }

  /** Closes `d` with this hybrid attention. */
  adopt(d: Disposable): void {
    this.owned.push(d);
  }

  /** Layers whose selection waits for the true query (exactLayers, or every layer in exact mode). */
  get exactLayers(): number[] {
    return this.ahead.flatMap((a, l) => (a ? [] : [l]));
  }

  /**
   * DecodeAttention.batchRecordable: this step is handed off and every layer's job goes ahead on the
   * layer before's q̃ (a layer that waits for its true query is not recorded with other rows: such a
   * batch hung on a device, its query's send never run).
   */
  get batchRecordable(): boolean {
    return this.handedOff && this.ahead.every(Boolean);
  }

  /** The transport's name: how the stage's rows reach the device. */
  get transportName(): TransportName {
    return this.transport.name;
  }

  /** Per layer, where a device backend gets the selected rows (empty on a host backend). */
  get rowPaths(): readonly RowPath[] {
    return this.transport.rowPaths;
  }

  /** The current step's accumulated scores of `layer` (when tracked). */
  accumulatedScores(layer: number): AccumulatedScores | undefined {
    return this.merge.scores(layer);
  }

  newSequence(): void {
    this.drain();
    this.cacheRewinds = this.attention.cache.rewinds;
    const info = (layer: number) => ({ layer, sequence: 0, layout: this.layout });
    this.states = Array.from({ length: this.layers }, (_, l) => this.selector.initState(info(l)));
    this.merge.reset(this.layers);
    this.deviceIndex?.reset();
    this.step = 0;
    this.transport.newSequence();
    this.scheduler.reset();
    this.decision = this.scheduler.initial();
  }

  beginStep(pos: number, batch?: DecodeBatchStep, row?: number): void {
    this.checkOpen();
    this.batchStep = batch ?? null;
    this.batchRow = row ?? -1;
    this.batchRanks = false;
    try {
      this.beginRow(pos);
    } finally {
      // The batch's last row: every row's index folds as one call, then their uploads.
      if (batch && row === batch.rows - 1) {
        const t0 = performance.now();
        IndexSyncBatch.of(this.attention.backend).flush(batch);
        this.indexSyncMs += performance.now() - t0;
      }
    }
  }

  private beginRow(pos: number): void {
    this.indexSyncMs = 0;
    this.transport.startStep(this.batchStep);
    this.drain();
    // A checkpoint restored under a live hybrid attention: selector states describe another store.
    if (this.attention.cache.rewinds !== this.cacheRewinds) this.newSequence();
    this.pos = pos;
    this.account.begin();
    this.jobs.fill(null);
    this.handedOff = false;
    this.current = null;
    const offloaded = this.attention.cache.storeCount;
    if (offloaded === 0) return;
    this.transport.syncStore();
    if (this.deviceIndex) {
      const t0 = performance.now(), P = this.stage.primitives ?? referencePrimitives, keysOf = (l: number) => this.stage.offloadedKeys!(this.attention.cache.stageStoreK(l));
      // A batch row's folds join the batch's (one call for every row's layers, at its last row's beginStep).
      if (this.batchStep && this.batchRow >= 0) IndexSyncBatch.of(this.attention.backend).join(this.batchStep, this.deviceIndex, this.deviceIndex.folds(offloaded, keysOf), P);
      else this.deviceIndex.sync(offloaded, P, keysOf);
      this.indexSyncMs = performance.now() - t0;
    }
    const { plan, refusedTiming, clamped } = planStep(this.selector, this.decision, offloaded);
    if (refusedTiming) this.stats.note(`selector "${this.selector.name}" cannot run ${refusedTiming}-QKᵀ selection; using ${plan.timing}`);
    if (clamped && !this.clampSaid) {
      this.clampSaid = true;
      this.stats.note(`K ${this.decision.k} exceeds the offloaded tokens (${offloaded} at step ${this.step}): clamped to the offloaded count`);
    }
    this.handedOff = this.transport.planned(plan, this.rowsFor(plan.budget));
    this.current = plan;
    // Counted in the step's lanes only when it will submit jobs: a lane that never does would hold the group's jobs back.
    this.stageGroup?.join(this.batchStep);
    if (this.batchStep?.queryOfRow && this.batchRow >= 0 && this.ranksOnDevice(plan)) {
      this.batchRanks = IndexBatch.of(this.attention.backend).join(this.batchStep, this, this.deviceIndex!.shape);
    }
  }

  layerInput(layer: number, x: Tensor): void {
    if (!this.current) return;
    if (layer === 0 && this.ahead[0]) {
      // Layer 0's input is the embedding output: q̃₀ is the true q₀.
      this.project(0, x);
      this.submit(0);
    }
    if (layer + 1 < this.layers && this.ahead[layer + 1]) this.project(layer + 1, x);
  }

  attend(layer: number, q: Tensor, out: Tensor): void {
    if (!this.current) {
      this.attention.attendFull(layer, q, 0, this.pos, out);
      return;
    }
    this.prepareAttend(layer, q);
    this.transport.attend(layer, q, out);
  }

  /**
   * A layer that waits for its true query submits its stage with it, and the transport queues what
   * goes before the stage's output (once: a batched step calls this for every row first).
   */
  prepareAttend(layer: number, q: Tensor): void {
    if (!this.current) return;
    if (!this.ahead[layer] && !this.jobs[layer]) {
      this.sendQuery(layer, q);
      this.submit(layer);
    }
    this.transport.prepareAttend?.(layer, q);
  }

  endStep(): void {
    this.transport.flush();
    const plan = this.current;
    if (!plan) return;
    if (this.handedOff) {
      // The device took the jobs' output already: the host waits for them once, for their times.
      this.inFlight = false;
      this.account.waitForStage();
    }
    this.current = null;
    const timings = this.account.finish(plan, () => this.transport.stepTimes(this.batchStep), this.handedOff, {
      step: this.step, k: this.decision.k, layers: this.layers, ...(this.deviceIndex ? { indexSyncMs: this.indexSyncMs } : {}),
    });
    this.merge.stepDone();
    this.decision = this.scheduler.next(timings);
    this.step++;
  }

  close(): void {
    if (this.closed) return;
    this.transport.flush();
    this.drain();
    this.closed = true;
    if (this.attention.decodeAttention === this) this.attention.setDecodeAttention(null);
    for (const d of this.owned.splice(0)) d[Symbol.dispose]();
    try {
      this.transport.close();
    } finally {
      this.deviceIndex?.close();
      this.attention.backend.free(this.specQ);
      this.merge.close();
      this.stage.close();
    }
  }

  [Symbol.dispose](): void {
    this.close();
  }

  // ---- what the transport drives (StepDriver) ------------------------------------------------

  plan(): StepPlan {
    return this.current ?? fail("hybrid attention: no planned step");
  }

  /** The step's width at `layer`: verified layers score `candidates`·K tokens. */
  layerKmax(layer: number): number {
    return layerKmax(this.plan(), this.widths(), layer);
  }

  layerKeep(layer: number): number {
    if (this.keep === null || !this.rescore[layer]) return 0;
    const kmax = this.layerKmax(layer), keep = Math.ceil((kmax * this.keep) / this.candidates);
    return keep < kmax ? keep : 0;
  }

  get keeps(): boolean {
    return this.keep !== null;
  }

  job(layer: number): CpuStageJob | null {
    return this.jobs[layer] ?? null;
  }

  done(layer: number): HostSignal | undefined {
    return this.jobs[layer]?.done;
  }

  addTx(ms: number): void {
    this.account.addTx(ms);
  }

  submit(layer: number): void {
    const plan = this.plan(), c = this.attention.cache, slot = (layer & 1) as 0 | 1;
    let work: CpuStageWork;
    if (plan.work === "kernel") {
      work = kernelWork(plan, layerBudget(plan, this.widths(), layer));
      if (work.kind === "index" && this.ranksOnDevice(plan)) work = { ...work, chosen: true };
    } else if (plan.work === "score") {
      work = { kind: "score" };
    } else {
      const t0 = performance.now();
      const selection = this.selector.select({
        ...this.selectionBase(layer, plan), timing: "pre",
        query: this.stage.query(slot), speculative: this.ahead[layer]! && layer > 0,
      });
      this.account.jsSince(t0);
      work = { kind: "selected", selection };
    }
    const job: CpuStageJob = {
      slot, k: c.stageStoreK(layer), v: c.stageStoreV(layer), offloaded: plan.offloaded, kmax: this.layerKmax(layer), scale: this.attention.scale, work,
      keys: this.rescore[layer], storeEpoch: c.rewinds, ...this.transport.jobLink(layer),
    };
    this.jobs[layer] = job;
    this.stage.submit(job);
    this.inFlight = true;
  }

  submitNext(layer: number): void {
    if (layer + 1 < this.layers && this.ahead[layer + 1]) this.submit(layer + 1);
  }

  /** Waits for layer's stage; a post-QKᵀ JS selector chooses now and the stage gathers. */
  collect(layer: number): void {
    const job = this.jobs[layer];
    if (!job) fail(`hybrid attention: layer ${layer}'s CPU stage was never submitted`);
    this.inFlight = false;
    this.account.waitForStage();
    const t1 = performance.now();
    if (job.work.kind === "score") {
      const selection = this.selector.select({
        ...this.selectionBase(layer, this.plan()), timing: "post",
        logits: this.stage.allLogits(), query: this.stage.query(job.slot), speculative: this.ahead[layer]! && layer > 0,
      });
      this.stage.gather(job, selection);
      this.account.jsSince(t1);
    }
  }

  // ---- internals ----------------------------------------------------------------------------

  private widths() {
    return { rescore: this.rescore, candidates: this.candidates, usesBudget: this.selector.usesBudget, kShare: this.kShare };
  }

  /** Rows per KV head the device's gathered-row buffers need at scheduler K = k (the widest layer). */
  private rowsFor(k: number): number {
    const candidates = this.rescore.includes(true) ? this.candidates : 1;
    return selectionRows({ storeCapacity: this.attention.cache.storeCapacity, usesBudget: this.selector.usesBudget, k, candidates });
  }

  /** q̃ of `layer` from residual row x, to the stage's query buffer of that layer's slot. */
  private project(layer: number, x: Tensor): void {
    // A batched step projects every row's q̃ of the layer in one matmul (W_q read once for the batch).
    const batched = this.batchStep?.query?.(layer, x);
    if (batched) return this.sendQuery(layer, batched);
    this.projector.projectQuery(layer, x, this.pos, this.specQ);
    this.sendQuery(layer, this.specQ);
  }

  /** The query to the stage; with the index on the device, the pages it ranks with it go along. */
  private sendQuery(layer: number, q: Tensor): void {
    const plan = this.plan();
    if (this.ranksOnDevice(plan)) {
      // A batch row's layer ahead on q̃ is ranked with every row's (one launch); else on its own.
      const batched = this.batchRanks && this.ahead[layer] ? IndexBatch.of(this.attention.backend).rank(this.batchStep!, layer, this) : null;
      if (batched) return this.transport.sendQuery(layer, batched.tensor, batched.bytes);
      // The query's copy into the ranking's output stays in line (the side stream waits for it); the ranking and the send go beside.
      const x = this.deviceIndex!, { row, ranked } = x.row(layer, q, plan.offloaded, layerBudget(plan, this.widths(), layer));
      this.transport.sendRanked(layer, () => row && x.rankRow(row), ranked.tensor, ranked.bytes);
    } else {
      this.transport.sendQuery(layer, q);
    }
  }

  /** IndexBatchMember: layer's ranking with this row's q̃ of the batch (null: the layer waits for its true query, or the batch projects no q̃). */
  indexRow(layer: number): { readonly row: IndexRankRow | null; readonly ranked: RankedQuery } | null {
    const plan = this.current;
    if (!plan || !this.batchRanks || !this.ahead[layer]) return null;
    const q = this.batchStep!.queryOfRow!(layer, this.batchRow);
    return q ? this.deviceIndex!.row(layer, q, plan.offloaded, layerBudget(plan, this.widths(), layer)) : null;
  }

  /** This step's stage kernel is the index, and the device ranks its pages. */
  private ranksOnDevice(plan: StepPlan): boolean {
    return this.deviceIndex !== null && plan.work === "kernel" && typeof plan.kernel === "object" && plan.kernel.name === "index";
  }

  /**
   * The device's index when the selector's pre-QKᵀ kernel is the index placed there: "device" needs
   * a backend that ranks and a stage that takes chosen pages (one line otherwise); "auto" takes the
   * device when both can, the backend ranks the shape and the index fits its free memory.
   */
  private openDeviceIndex(attention: Attention, stage: CpuStage, selector: TokenSelector): DeviceIndex | null {
    const kernel = stageKernel(selector, "pre");
    if (typeof kernel !== "object" || kernel.name !== "index") return null;
    const k = kernel as IndexKernel, placement = k.placement ?? "auto", be = attention.backend;
    const { heads, kvHeads, headDim } = attention.layout, c = attention.cache;
    const parts = { backend: be, kernel: k, layers: c.layers, heads, kvHeads, headDim, capacity: c.storeCapacity };
    checkHostIndex(hostIndexBytes(parts), freemem(), placement);
    if (placement === "host") return null;
    const able = be.indexRank !== undefined && stage.takesChosenPages === true && stage.offloadedKeys !== undefined;
    if (!able) {
      if (placement === "device") fail(`page index: placement "device" needs a backend that ranks pages (${be.name}: ${be.indexRank ? "yes" : "no"}) and a CPU stage that takes them (${stage.name}: ${stage.takesChosenPages ? "yes" : "no"})`);
      return null;
    }
    if (placement === "auto") {
      const free = freeDeviceBytes(be);
      if ((free !== undefined && DeviceIndex.bytesFor(parts) > free) || !DeviceIndex.ranks(parts)) return null;
    }
    return new DeviceIndex(parts);
  }

  private selectionBase(layer: number, plan: StepPlan) {
    return {
      layer, step: this.step, sequence: 0, offloaded: plan.offloaded, positions: this.positions, k: layerBudget(plan, this.widths(), layer),
      layout: this.layout, state: this.states[layer], scores: this.merge.scores(layer),
      primitives: this.stage.primitives ?? referencePrimitives,
      keys: this.selector.needsKeys ? this.stage.offloadedKeys?.(this.attention.cache.stageStoreK(layer)) : undefined,
    };
  }

  /** After a step that failed mid-way (a selector threw), collect the jobs left running (queued ones are cancelled). */
  private drain(): void {
    if (!this.inFlight) return;
    this.inFlight = false;
    try {
      this.stage.cancel?.();
      this.stage.wait();
    } catch {
      // the failed step already reported its error
    }
  }

  private checkOpen(): void {
    if (this.closed) fail("hybrid attention used after close()");
  }
}
