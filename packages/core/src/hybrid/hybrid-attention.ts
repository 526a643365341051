/**
 * HybridAttention: decode-step attention split by tokens (paper §4.2, Figure 12).
 *
 * Per layer: the CPU stage scores the query against the layer's offloaded K (all of it
 * post-QKᵀ, only chosen slots pre-QKᵀ), selects, and stages the selected logits and V rows;
 * the device scores the window (sinks + recent ring). The logits are concatenated in position
 * order — columns [0, S) sinks, [S, S + K) the selected offloaded tokens (ascending slot =
 * position order, short per-head lists padded with −∞), then the ring — softmaxed once and
 * aggregated over the matching V rows (staged V for offloaded tokens, window V otherwise).
 * Where the backend has attnPartial/attnMerge and no scores are tracked, the window is never
 * materialised: its flash-decode partial (K and V read once) is merged with the selected columns.
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
 * On a device backend whose KV cache keeps its store in host memory (KvCache.attachHostStore),
 * a DeviceStaging moves the query to the host and the stage's logits and V rows to the device
 * on the copy stream, and T_gpu / T_tx come from the backend's events; otherwise (the CPU
 * backend) the stage's output is written with Backend.write and times are host wall times.
 *
 * On a backend that records decode steps (Backend.beginStep/endStep: CUDA graphs), the device
 * work between two host interactions — a layer's softmax and A·V, the rest of the layer, the next
 * layer's projections up to the query's copy to the host — is recorded as one segment per layer
 * and replayed as a graph, instead of a launch per op.
 *
 * Where the staging hands off on the device (DeviceStaging.handsOff) and the stage runs a kernel
 * (top-K, Quest, streaming, all), the step is handed off: every layer's job is queued as soon as its
 * query is sent, the device waits for each job and reads its output in place, and the host issues
 * the whole step without waiting; it collects the jobs' times at endStep. Where the link fetches
 * rows ahead (DeviceStaging.fetchesAhead), a layer's rows are gathered on a side stream as soon as
 * its job is done — the next layer's is queued right after this layer's hand-off — so they cross
 * the link during the layer before instead of inside the layer.
 *
 * A row of a batched step (BatchRows) hands off the same way, its jobs' done signals in a word of
 * its own sequence's staging. Its device work is launched as issued, not recorded: the backend
 * records one segment at a time, and a row's would take in the other rows' work issued between its
 * ops. The host waits for each row's stage once, at the batched step's end.
 */
import { ATTN_PARTIAL_MAX_SPANS, type HostSignal, type Tensor } from "../backend.js";
import type { Attention, DecodeAttention, DecodeBatchStep, QueryProjector } from "../attention.js";
import type { Scheduler, SchedulerDecision } from "../contracts/scheduler.js";
import { referencePrimitives } from "../contracts/selector-primitives.js";
import {
  clampBudget, headLayout, stageKernel, type AccumulatedScores, type HeadLayout, type Selection, type SelectionTiming, type SelectorKernel,
  type TokenSelector,
} from "../contracts/selector.js";
import { fail } from "../errors.js";
import type { CpuStage, CpuStageJob, CpuStageOutput, CpuStageWork } from "./cpu-stage.js";
import { DeviceStaging } from "./device-staging.js";
import { selectionRows, type RowPath } from "./row-path.js";
import { HybridStats } from "./hybrid-stats.js";
import { HybridOptionsSchema, type HybridOptions, type LogitsMode } from "./options.js";

export interface HybridAttentionParts {
  readonly attention: Attention;
  /** Computes a layer's query from a residual row (LlamaModel implements it). */
  readonly projector: QueryProjector;
  /** Owned from here on: closed with the HybridAttention. */
  readonly stage: CpuStage;
  readonly selector: TokenSelector;
  readonly scheduler: Scheduler;
}

interface StepPlan {
  timing: SelectionTiming;
  budget: number;
  kmax: number;
  offloaded: number;
  /** What the stage does; "score" means a JS selector chooses after the logits are back, "pre" before submitting. */
  work: "kernel" | "score" | "pre";
  /** The stage kernel that chooses (work "kernel"). */
  kernel: SelectorKernel | undefined;
}

let hybridCount = 0;

export class HybridAttention implements DecodeAttention, Disposable {
  readonly stats = new HybridStats();
  readonly logitsMode: LogitsMode;
  readonly layout: HeadLayout;
  private readonly attention: Attention;
  private readonly projector: QueryProjector;
  private readonly stage: CpuStage;
  private readonly selector: TokenSelector;
  private readonly scheduler: Scheduler;
  private readonly layers: number;
  private readonly positions: Int32Array;
  private readonly specQ: Tensor;
  private readonly trackScores: boolean;
  /** Per layer: the stage is submitted ahead with q̃ (else it waits for the true query). */
  private readonly ahead: boolean[];
  /** Per layer: the device re-scores the staged K rows with the true query (verified). */
  private readonly rescore: boolean[];
  private readonly candidates: number;
  private readonly negInf: Float32Array;
  /** Per layer: the signal of its query's send (the job waits for it; undefined: fenced). */
  private readySignals: (HostSignal | undefined)[] = [];
  /** This step is handed off on the device (see the class comment). */
  private handOffStep = false;
  /** Set when the cache's store is in host memory the device reaches by copies. */
  private readonly device: DeviceStaging | null;
  /** The window's flash-decode partial [heads, headDim + 2]; null: window logits are materialised (tracked scores need every probability). */
  private readonly part: Tensor | null;
  private readonly spans = new Int32Array(2 * ATTN_PARTIAL_MAX_SPANS);
  private states: unknown[] = [];
  private scoreRows: Float32Array[][] = []; // [layer][kvHead] per position
  private scoreSteps = 0;
  private decision: SchedulerDecision;
  private plan: StepPlan | null = null;
  private pos = 0;
  private step = 0;
  private jobs: (CpuStageJob | null)[] = [];
  /** Per layer: its rows were fetched ahead this step (DeviceStaging.fetchRows). */
  private fetched: boolean[] = [];
  private selections: (Selection | null)[] = [];
  private stepStart = 0;
  private stepWait = 0;
  private stepJs = 0;
  private stepTx = 0;
  private stepCpu = 0;
  /** The step's CPU-stage phases so far: score, top-K, gather, hand-offs (ms). */
  private readonly stepSplit = [0, 0, 0, 0];
  private clampSaid = false;
  /** KvCache.rewinds when the per-sequence state was made: a restore() since means a new one. */
  private cacheRewinds = -1;
  private discardTimes = true; // the device's first timed step drops what prefill recorded
  private inFlight = false; // a stage job was submitted and not yet collected
  /** A layer whose stage submission waits until the device work before it has been issued (-1: none). */
  private deferred = -1;
  /** Whether the backend records segments (set when the store is in host memory and no scores are read back). */
  private readonly segments: boolean;
  private segmentOpen = false;
  /** The batched step this step is a row of (null: a step of its own). */
  private batchStep: DecodeBatchStep | null = null;
  private readonly segmentKeys: string[];
  private closed = false;

  constructor(parts: HybridAttentionParts, options: HybridOptions = {}) {
    const parsed = HybridOptionsSchema.safeParse(options);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      fail(`invalid hybrid option ${issue.path.join(".")}: ${issue.message}`);
    }
    const { attention, projector, stage, selector, scheduler } = parts;
    const cache = attention.cache;
    if (cache.storeCapacity === 0) fail("hybrid attention needs a KV window budget smaller than the context (nothing would be offloaded)");
    this.attention = attention;
    this.projector = projector;
    this.stage = stage;
    this.selector = selector;
    this.scheduler = scheduler;
    const o = parsed.data;
    this.logitsMode = o.logits;
    this.trackScores = o.trackScores || selector.needsScores;
    this.layers = cache.layers;
    const bad = o.exactLayers.find((l) => l >= cache.layers);
    if (bad !== undefined) fail(`invalid hybrid option exactLayers: layer ${bad} does not exist (the model has ${cache.layers})`);
    const exact = new Set(o.exactLayers);
    this.ahead = Array.from({ length: this.layers }, (_, l) => o.logits !== "exact" && !exact.has(l));
    // Layer 0's q̃ is its true query: nothing to verify there.
    this.rescore = this.ahead.map((a, l) => a && l > 0 && o.logits === "verified");
    this.candidates = o.logits === "verified" ? o.candidates : 1;
    const { heads, kvHeads, headDim } = attention.layout;
    this.layout = headLayout(heads, kvHeads, headDim);
    stage.prepare({ heads, kvHeads, headDim, storeCapacity: cache.storeCapacity, dtype: cache.dtype, stageKeys: this.rescore.includes(true) });
    if (stage.scoring && stage.scoring !== "full") this.stats.scoring = `${stage.scoring}, ${stage.rescoreFactor ?? 1}·K rescored`;
    this.negInf = new Float32Array(cache.storeCapacity).fill(-Infinity);
    this.positions = new Int32Array(cache.storeCapacity);
    for (let i = 0; i < this.positions.length; i++) this.positions[i] = cache.storeStart + i;
    this.specQ = attention.backend.alloc([1, heads * headDim]);
    const be0 = attention.backend;
    this.part = !this.trackScores && be0.attnPartial && be0.attnMerge ? be0.alloc([heads, headDim + 2]) : null;
    try {
      this.device = cache.hostLink
        ? new DeviceStaging(attention.backend, cache, stage, heads, headDim, { rows: this.rowsFor(scheduler.initial().k), rowPath: o.rowPath, keys: this.rescore, wholeRows: !this.part })
        : null;
    } catch (e) {
      attention.backend.free(this.specQ);
      if (this.part) attention.backend.free(this.part);
      throw e;
    }
    if (this.device) this.stats.rows = rowsNote(this.device.paths, this.device.stagedReason, this.device.fetchesAhead);
    const be = attention.backend;
    this.segments = this.device !== null && !this.trackScores && be.beginStep !== undefined && be.endStep !== undefined;
    this.segmentKeys = Array.from({ length: this.layers }, (_, l) => `hybrid-${hybridCount}-${l}`);
    hybridCount++;
    this.decision = scheduler.initial();
    this.jobs = new Array(this.layers).fill(null);
    this.fetched = new Array(this.layers).fill(false);
    this.selections = new Array(this.layers).fill(null);
    this.newSequence();
  }

  /** Route `attention`'s decode steps through a new HybridAttention. */
  static attach(parts: HybridAttentionParts, options: HybridOptions = {}): HybridAttention {
    const h = new HybridAttention(parts, options);
    parts.attention.setDecodeAttention(h);
    return h;
  }

  /** The current step's accumulated scores of `layer` (when tracked). */
  accumulatedScores(layer: number): AccumulatedScores | undefined {
    if (!this.trackScores) return undefined;
    const S = this.attention.cache.storeStart;
    return { perKvHead: this.scoreRows[layer].map((r) => r.subarray(S)), steps: this.scoreSteps };
  }

  newSequence(): void {
    this.drain();
    this.cacheRewinds = this.attention.cache.rewinds;
    const info = (layer: number) => ({ layer, sequence: 0, layout: this.layout });
    this.states = Array.from({ length: this.layers }, (_, l) => this.selector.initState(info(l)));
    const maxContext = this.attention.cache.maxContext;
    this.scoreRows = this.trackScores
      ? Array.from({ length: this.layers }, () => Array.from({ length: this.layout.kvHeads }, () => new Float32Array(maxContext)))
      : [];
    this.scoreSteps = 0;
    this.step = 0;
    this.discardTimes = true;
    this.scheduler.reset();
    this.decision = this.scheduler.initial();
  }

  beginStep(pos: number, batch?: DecodeBatchStep): void {
    this.checkOpen();
    this.closeSegment();
    this.batchStep = batch ?? null;
    this.deferred = -1;
    this.drain();
    // A checkpoint restored under a live hybrid attention: selector states describe another store.
    if (this.attention.cache.rewinds !== this.cacheRewinds) this.newSequence();
    this.pos = pos;
    this.stepStart = performance.now();
    this.stepWait = this.stepJs = this.stepTx = this.stepCpu = 0;
    this.stepSplit.fill(0);
    this.jobs.fill(null);
    this.fetched.fill(false);
    this.selections.fill(null);
    this.readySignals = [];
    this.handOffStep = false;
    const offloaded = this.attention.cache.storeCount;
    if (offloaded === 0) {
      this.plan = null;
      return;
    }
    if (this.device) {
      if (this.discardTimes) this.device.times();
      this.discardTimes = false;
      this.device.pause();
      this.attention.cache.syncHostStore(); // the evictions' rows are in host memory
      this.device.resume();
    }
    let timing = this.decision.timing;
    if (!this.selector.timings.includes(timing)) {
      this.stats.note(`selector "${this.selector.name}" cannot run ${timing}-QKᵀ selection; using ${this.selector.timings[0]}`);
      timing = this.selector.timings[0];
    }
    const { budget, clamped } = clampBudget(this.decision.k, offloaded);
    if (clamped && this.selector.usesBudget && !this.clampSaid) {
      this.clampSaid = true;
      this.stats.note(`K ${this.decision.k} exceeds the offloaded tokens (${offloaded} at step ${this.step}): clamped to the offloaded count`);
    }
    const kernel = stageKernel(this.selector, timing);
    const work = kernel ? "kernel" : timing === "post" ? "score" : "pre";
    const kmax = this.selector.usesBudget ? budget : offloaded;
    this.device?.reserve(this.rowsFor(budget)); // the gathered-row buffers hold this step's widest selection
    this.plan = { timing, budget, kmax, offloaded, work, kernel };
    this.handOffStep = this.device !== null && this.device.handsOff && this.segments && work === "kernel";
  }

  layerInput(layer: number, x: Tensor): void {
    if (!this.plan) return;
    if (layer === 0 && this.ahead[0]) {
      // Layer 0's input is the embedding output: q̃₀ is the true q₀.
      this.project(0, x);
      this.submit(0);
    }
    if (layer + 1 < this.layers && this.ahead[layer + 1]) this.project(layer + 1, x);
  }

  attend(layer: number, q: Tensor, out: Tensor): void {
    const plan = this.plan;
    const a = this.attention;
    if (!plan) {
      a.attendFull(layer, q, 0, this.pos, out);
      return;
    }
    if (this.device) {
      this.attendStaged(this.device, layer, q, out);
      return;
    }
    const be = a.backend, c = a.cache, heads = this.layout.heads, slot = (layer & 1) as 0 | 1;
    this.prepareAttend(layer, q);
    // Device: the window's attention while the CPU stage runs.
    const kmax = this.layerKmax(layer);
    const scores = a.scores, width = c.maxContext, S = c.storeStart;
    this.scoreWindow(layer, q, scores, kmax);
    this.collect(layer);
    this.submitNext(layer);

    const outp = this.stage.output(slot);
    if (this.rescore[layer]) {
      if (kmax > 0) this.verifiedLogits(scores, S, q, outp.keys, outp.counts, kmax);
    } else {
      const t0 = performance.now();
      for (let h = 0; h < heads && kmax > 0; h++) be.write(scores, outp.logits.subarray(h * kmax, (h + 1) * kmax), h * width + S);
      this.stepTx += performance.now() - t0;
    }
    this.softmaxAggregate(layer, scores, S, outp, kmax > 0 ? outp.values : null, kmax, out);
  }

  /** A layer that waits for its true query submits its stage with it (once: a batched step calls this for every row first). */
  prepareAttend(layer: number, q: Tensor): void {
    if (!this.plan || this.ahead[layer] || this.jobs[layer]) return;
    const slot = (layer & 1) as 0 | 1;
    if (this.device) {
      this.queryToHost(this.device, layer, q);
    } else {
      const t0 = performance.now();
      this.stage.query(slot).set(this.attention.backend.read(q, 0, this.layout.heads * this.layout.headDim));
      this.stepTx += performance.now() - t0;
    }
    this.submit(layer);
  }

  /**
   * attend() on a device backend with the store in host memory: as the CPU-backend path, but
   * the query goes to the stage's pinned buffer by a device → host copy, the selected tokens'
   * logits (uploaded, or scored here from uploaded K rows) land in scores[layer & 1] from column
   * d.col (the store's columns beside the window's when those are materialised, else 0), and the
   * stage's V rows arrive by copy.
   */
  private attendStaged(d: DeviceStaging, layer: number, q: Tensor, out: Tensor): void {
    const slot = (layer & 1) as 0 | 1, scores = d.scores[slot];
    this.prepareAttend(layer, q);
    const kmax = this.layerKmax(layer);
    this.scoreWindow(layer, q, scores, kmax);
    if (this.handOffStep) {
      this.handOff(d, layer, q, kmax, out);
      return;
    }
    // The segment (from the last layer's A·V to this window's share) runs before the host blocks.
    this.closeSegment();
    this.submitDeferred();
    d.pause();
    this.collect(layer);
    d.resume();
    // A JS pre-QKᵀ selection runs on this thread: submit the next layer when the layer after it
    // projects its q̃, so the selection overlaps the device work issued up to then. A stage
    // kernel's job (top-K, Quest) starts at once: it runs on the stage's threads.
    if (this.plan!.work === "pre" && layer + 2 < this.layers && this.ahead[layer + 1] && this.ahead[layer + 2]) this.deferred = layer + 1;
    else this.submitNext(layer);
    const outp = this.stage.output(slot), rescore = this.rescore[layer];
    const up = kmax > 0 ? d.upload(layer, slot, kmax, rescore, outp.ids, outp.counts) : null;
    // Verified logits of a short list get −∞ written by the host: that layer's segment starts after them.
    let padded = false;
    for (let g = 0; rescore && up !== null && g < this.layout.kvHeads; g++) padded ||= outp.counts[g]! < kmax;
    if (!padded) this.openSegment(layer);
    if (up) d.gatherRows(slot); // mapped rows: the device reads them inside the segment
    if (rescore && up) this.verifiedLogits(scores, d.col, q, up.keys, outp.counts, kmax);
    if (padded) this.openSegment(layer);
    this.softmaxAggregate(layer, scores, d.col, outp, up ? up.values : null, kmax, out);
  }

  /**
   * A handed-off layer: what is recorded so far starts running, and the device, not the host,
   * waits for the layer's job before its selected columns; the next layer's job is queued behind it.
   */
  private handOff(d: DeviceStaging, layer: number, q: Tensor, kmax: number, out: Tensor): void {
    const slot = (layer & 1) as 0 | 1, scores = d.scores[slot], job = this.jobs[layer];
    if (!job?.done) fail(`hybrid attention: layer ${layer}'s CPU stage was never submitted with a done signal`);
    // A batch's rows fetch too: each sequence's staging has slots of its own, and on the link's one
    // side stream their fetches queue in the order the rows are issued, which is the compute stream's.
    const fetch = d.fetchesAhead;
    this.closeSegment();
    const up = d.handOffRows(slot, kmax, this.rescore[layer]!);
    if (fetch && !this.fetched[layer]) d.fetchRows(layer, slot, job.done, this.rescore[layer]!, kmax); // before the segment that waits for it
    this.openSegment(layer);
    d.handOff(layer, slot, job.done, this.rescore[layer]!, fetch);
    this.submitNext(layer);
    if (fetch) this.fetchNext(d, layer);
    if (this.rescore[layer]) {
      this.attention.backend.attnLogits(scores, d.col, q, 0, up.keys!, 0, kmax, this.attention.scale);
      d.padColumns(slot, kmax, this.layout.groupSize);
    }
    this.softmaxAggregate(layer, scores, d.col, null, up.values, kmax, out); // a handed-off step tracks no scores
    if (fetch) d.releaseRows(slot);
  }

  /**
   * The next layer's rows, fetched ahead as soon as its job (just queued on q̃) is done: its slot was
   * freed by the layer before this one. Only the width is set here (this layer's segment records):
   * the next hand-off makes the row views, before its own segment.
   */
  private fetchNext(d: DeviceStaging, layer: number): void {
    const next = layer + 1, job = next < this.layers ? this.jobs[next] : null;
    if (!job?.done) return;
    d.fetchRows(next, (next & 1) as 0 | 1, job.done, this.rescore[next]!, this.layerKmax(next));
    this.fetched[next] = true;
  }

  /** Records the device ops from here to the next host interaction as layer's segment. */
  private openSegment(layer: number): void {
    if (!this.segments || this.batchStep) return; // other rows' device work would land in this segment
    this.attention.backend.beginStep!(this.segmentKeys[layer]!);
    this.segmentOpen = true;
  }

  /** Runs the recorded segment (a graph replay): before anything that talks to the host. */
  private closeSegment(): void {
    if (!this.segmentOpen) return;
    this.segmentOpen = false;
    this.attention.backend.endStep!();
  }

  private submitDeferred(): void {
    if (this.deferred < 0) return;
    const layer = this.deferred;
    this.deferred = -1;
    this.submit(layer);
  }

  /** After layer l is collected: the next layer's stage goes ahead now when it runs on q̃. */
  private submitNext(layer: number): void {
    if (layer + 1 < this.layers && this.ahead[layer + 1]) this.submit(layer + 1);
  }

  /**
   * Verified logits: the true query against the staged K rows, into columns [col, col + kmax) of
   * scores; a KV head's list shorter than kmax gets −∞ in its padded columns (the staged rows there are zeros).
   */
  private verifiedLogits(scores: Tensor, col: number, q: Tensor, keys: Tensor | null, counts: Int32Array, kmax: number): void {
    if (!keys) fail("hybrid attention: the CPU stage returned no K rows for a verified layer");
    const a = this.attention, width = scores.shape[1]!, group = this.layout.groupSize;
    a.backend.attnLogits(scores, col, q, 0, keys, 0, kmax, a.scale);
    for (let h = 0; h < this.layout.heads; h++) {
      const n = counts[Math.floor(h / group)];
      if (n < kmax) a.backend.write(scores, this.negInf.subarray(0, kmax - n), h * width + col + n);
    }
  }

  /** Per layer, where a device backend gets the selected rows (empty on a host backend). */
  get rowPaths(): readonly RowPath[] {
    return this.device?.paths ?? [];
  }

  /** Rows per KV head the device's gathered-row buffers need at scheduler K = k (the widest layer). */
  private rowsFor(k: number): number {
    const candidates = this.rescore.includes(true) ? this.candidates : 1;
    return selectionRows({ storeCapacity: this.attention.cache.storeCapacity, usesBudget: this.selector.usesBudget, k, candidates });
  }

  /** The step's width at `layer`: verified layers score `candidates`·K tokens. */
  private layerKmax(layer: number): number {
    const plan = this.plan!;
    if (!this.rescore[layer] || !this.selector.usesBudget) return plan.kmax;
    return Math.min(plan.offloaded, plan.kmax * this.candidates);
  }

  /** The selection budget at `layer` (K, widened on verified layers). */
  private layerBudget(layer: number): number {
    const plan = this.plan!;
    return this.rescore[layer] ? Math.min(plan.offloaded, plan.budget * this.candidates) : plan.budget;
  }

  /** Column of position p in the concatenated logits [before the store | K selected | after]. */
  private column(p: number, kmax: number): number {
    const c = this.attention.cache;
    return p < c.storeStart ? p : p - c.storeCount + kmax;
  }

  /**
   * The window's share (sinks and ring), before the stage is collected: its flash-decode partial
   * (K and V read once, no window logits written), or with tracked scores q·Kᵀ of every window
   * span at its concatenated column (the accumulated scores need every window probability).
   */
  private scoreWindow(layer: number, q: Tensor, scores: Tensor, kmax: number): void {
    const a = this.attention, c = a.cache;
    if (this.part) {
      let n = 0;
      for (let s = 0; s < c.spanCount; s++) {
        if (c.spanRegion[s] === 2) continue;
        this.spans[n++] = c.spanSlot[s];
        this.spans[n++] = c.spanLen[s];
      }
      a.backend.attnPartial!(this.part, q, 0, c.windowK[layer], c.windowV[layer], this.spans.subarray(0, n), a.scale);
      return;
    }
    for (let s = 0; s < c.spanCount; s++) {
      if (c.spanRegion[s] === 2) continue;
      a.backend.attnLogits(scores, this.column(c.spanPos[s], kmax), q, 0, c.windowK[layer], c.spanSlot[s], c.spanLen[s], a.scale);
    }
  }

  /**
   * One softmax over window ∪ selected, then A·V. With the window's partial: merged with the
   * selected columns [col, col + kmax) of `scores` and their V rows `values` (the stage's kmax
   * selected rows; null when nothing was selected). Else span by span in position order over the
   * materialised row (col is then the store's column S): window spans from their V rows, the store
   * span from `values` (skipped when null); the first span written overwrites `out`, the rest accumulate.
   * `outp` (the stage's ids and counts) is read only when scores are tracked.
   */
  private softmaxAggregate(layer: number, scores: Tensor, col: number, outp: CpuStageOutput | null, values: Tensor | null, kmax: number, out: Tensor): void {
    const a = this.attention, be = a.backend, c = a.cache;
    this.stats.sumK += kmax;
    this.stats.layerSteps++;
    if (this.part) {
      be.attnMerge!(out, 0, this.part, scores, col, values ?? c.windowV[layer], 0, values ? kmax : 0);
      return;
    }
    const total = c.length - c.storeCount + kmax;
    be.softmax(scores, this.layout.heads, total);
    if (this.trackScores) this.accumulate(layer, scores, total, outp!.ids, outp!.counts, kmax);
    let first = true;
    for (let s = 0; s < c.spanCount; s++) {
      if (c.spanRegion[s] === 2) {
        if (!values) continue;
        be.attnAggregate(out, 0, scores, col, values, 0, kmax, !first);
      } else {
        be.attnAggregate(out, 0, scores, this.column(c.spanPos[s], kmax), c.windowV[layer], c.spanSlot[s], c.spanLen[s], !first);
      }
      first = false;
    }
  }

  endStep(): void {
    this.closeSegment();
    const plan = this.plan;
    if (!plan) return;
    if (this.handOffStep) this.collectJobs();
    this.plan = null;
    const wall = performance.now() - this.stepStart;
    let device = Math.max(0, wall - this.stepWait - this.stepJs - this.stepTx);
    let held = this.stepWait; // what the CPU stage held the step up by
    if (this.device) {
      this.device.pause();
      // CUDA events: compute-stream busy time, copy-stream time (a batched step's, once for all its rows).
      const t = this.batchStep ? (this.batchStep.times ??= this.device.times()) : this.device.times();
      device = t.gpuMs;
      this.stepTx = t.txMs;
      if (this.handOffStep) held = t.waitMs ?? 0;
    }
    const st = this.stats;
    st.steps++;
    if (this.handOffStep) st.handedOffSteps++;
    st.offloaded = plan.offloaded;
    st.cpuStageMs += this.stepCpu;
    st.cpuJsMs += this.stepJs;
    st.waitMs += held;
    st.issueMs += Math.max(0, wall - this.stepWait);
    st.deviceMs += device;
    st.txMs += this.stepTx;
    if (this.trackScores) this.scoreSteps++;
    const timings = {
      step: this.step, tGpuMs: device, tCpuMs: this.stepCpu + this.stepJs, tTxMs: this.stepTx, tWaitMs: held,
      k: this.decision.k, timing: plan.timing, offloaded: plan.offloaded, layers: this.layers,
    };
    // the scheduler's inputs per step (stats trace, --json), and what the stats line's median step reads
    st.record(timings, performance.now() - this.stepStart, { issueMs: Math.max(0, wall - this.stepWait), split: this.stage.lastSplit ? this.stepSplit : undefined });
    this.decision = this.scheduler.next(timings);
    this.step++;
  }

  close(): void {
    if (this.closed) return;
    this.closeSegment();
    this.drain();
    this.closed = true;
    if (this.attention.decodeAttention === this) this.attention.setDecodeAttention(null);
    try {
      this.device?.close();
    } finally {
      this.attention.backend.free(this.specQ);
      if (this.part) this.attention.backend.free(this.part);
      this.stage.close();
    }
  }

  [Symbol.dispose](): void {
    this.close();
  }

  // ---- the CPU stage ------------------------------------------------------------------------

  /** q̃ of `layer` from residual row x, into the stage's query buffer of that layer's slot. */
  private project(layer: number, x: Tensor): void {
    this.projector.projectQuery(layer, x, this.pos, this.specQ);
    if (this.device) {
      this.queryToHost(this.device, layer, this.specQ);
      return;
    }
    const t0 = performance.now();
    const q = this.attention.backend.read(this.specQ, 0, this.layout.heads * this.layout.headDim);
    this.stage.query((layer & 1) as 0 | 1).set(q);
    this.stepTx += performance.now() - t0;
  }

  /** A query for the stage: sent inside the open segment when the device signals it, else the segment ends and the host fences the copy (a JS pre-QKᵀ selector reads it on this thread). */
  private queryToHost(d: DeviceStaging, layer: number, q: Tensor): void {
    const hostReads = this.plan!.work === "pre";
    if (hostReads || !d.recordsQuery) {
      this.closeSegment();
      this.submitDeferred();
    }
    this.readySignals[layer] = d.queryToHost((layer & 1) as 0 | 1, q, hostReads);
  }

  private submit(layer: number): void {
    const plan = this.plan!, c = this.attention.cache, slot = (layer & 1) as 0 | 1;
    let work: CpuStageWork;
    if (plan.work === "kernel") {
      const kernel = plan.kernel!;
      work = kernel === "all"
        ? { kind: "topk", budget: plan.offloaded, shared: true }
        : typeof kernel === "string"
          ? { kind: "topk", budget: this.layerBudget(layer), shared: kernel === "topk-shared" }
          : kernel.name === "quest"
            ? { kind: "quest", budget: this.layerBudget(layer), pageSize: kernel.pageSize }
            : { kind: "streaming", budget: this.layerBudget(layer), sinks: kernel.sinks };
    } else if (plan.work === "score") {
      work = { kind: "score" };
    } else {
      const t0 = performance.now();
      const selection = this.selector.select({
        ...this.selectionBase(layer, plan), timing: "pre",
        query: this.stage.query(slot), speculative: this.ahead[layer] && layer > 0,
      });
      this.stepJs += performance.now() - t0;
      this.selections[layer] = selection;
      work = { kind: "selected", selection };
    }
    const job: CpuStageJob = {
      slot, k: c.stageStoreK(layer), v: c.stageStoreV(layer), offloaded: plan.offloaded, kmax: this.layerKmax(layer), scale: this.attention.scale, work,
      keys: this.rescore[layer], storeEpoch: c.rewinds, deviceGather: this.device?.mapped(layer) ?? false,
      ready: this.device?.beforeSubmit(this.readySignals[layer]), done: this.handOffStep ? this.device!.doneSignal() : undefined,
    };
    this.jobs[layer] = job;
    this.stage.submit(job);
    this.inFlight = true;
  }

  /** Waits for layer's stage; a post-QKᵀ JS selector chooses now and the stage gathers. */
  private collect(layer: number): void {
    const job = this.jobs[layer];
    if (!job) fail(`hybrid attention: layer ${layer}'s CPU stage was never submitted`);
    const t0 = performance.now();
    this.inFlight = false;
    this.stepCpu += this.stage.wait();
    const t1 = performance.now();
    this.stepWait += t1 - t0;
    this.addSplit();
    if (job.work.kind === "score") {
      const plan = this.plan!;
      const selection = this.selector.select({
        ...this.selectionBase(layer, plan), timing: "post",
        logits: this.stage.allLogits(), query: this.stage.query(job.slot), speculative: this.ahead[layer] && layer > 0,
      });
      this.stage.gather(job, selection);
      this.stepJs += performance.now() - t1;
    }
  }

  private selectionBase(layer: number, plan: StepPlan) {
    return {
      layer, step: this.step, sequence: 0, offloaded: plan.offloaded, positions: this.positions, k: this.layerBudget(layer),
      layout: this.layout, state: this.states[layer], scores: this.accumulatedScores(layer),
      primitives: this.stage.primitives ?? referencePrimitives,
      keys: this.selector.needsKeys ? this.stage.offloadedKeys?.(this.attention.cache.stageStoreK(layer)) : undefined,
    };
  }

  /** Adds this layer's attention probabilities to the per-position sums of each KV head. */
  private accumulate(layer: number, scores: Tensor, total: number, ids: Int32Array, counts: Int32Array, kmax: number): void {
    const a = this.attention, c = a.cache, S = c.storeStart, storeCount = c.storeCount;
    const group = this.layout.groupSize, width = c.maxContext;
    for (let h = 0; h < this.layout.heads; h++) {
      const g = Math.floor(h / group), acc = this.scoreRows[layer][g];
      const p = a.backend.read(scores, h * width, total);
      for (let col = 0; col < total; col++) {
        let pos: number;
        if (col < S) pos = col;
        else if (col < S + kmax) {
          const i = col - S;
          if (i >= counts[g]) continue;
          pos = S + ids[g * kmax + i];
        } else pos = col - kmax + storeCount;
        acc[pos] += p[col];
      }
    }
  }

  /** A handed-off step's end: the host waits for every queued job (the device took their output already) and adds up their times. */
  private collectJobs(): void {
    const t0 = performance.now();
    this.inFlight = false;
    this.stepCpu += this.stage.wait();
    this.stepWait += performance.now() - t0;
    this.addSplit();
  }

  private addSplit(): void {
    const split = this.stage.lastSplit?.();
    if (!split) return;
    const st = this.stats;
    st.cpuScoreMs += split.scoreMs;
    st.cpuSelectMs += split.selectMs;
    st.cpuGatherMs += split.gatherMs;
    st.handoffMs += split.handoffMs;
    const s = this.stepSplit;
    s[0] += split.scoreMs;
    s[1] += split.selectMs;
    s[2] += split.gatherMs;
    s[3] += split.handoffMs;
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

/** The stats line's note on where V rows come from, e.g. "V rows read by the device from pinned host memory (32 of 32 layers)". */
function rowsNote(paths: readonly RowPath[], stagedReason: string, fetchedAhead: boolean): string {
  const mapped = paths.filter((p) => p === "mapped").length;
  const ahead = fetchedAhead ? ", fetched ahead on a side stream in handed-off steps" : "";
  if (mapped === paths.length) return `V rows read by the device from pinned host memory (${mapped} of ${paths.length} layers)${ahead}`;
  return `V rows staged by the CPU stage on ${paths.length - mapped} of ${paths.length} layers (${stagedReason})`;
}
