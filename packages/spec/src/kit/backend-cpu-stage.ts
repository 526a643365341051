/**
 * BackendCpuStage: the CpuStage built from Backend ops and TypeScript, synchronous. It runs
 * on any backend (ReferenceBackend in tests) and is the readable definition of what a native
 * stage computes; kernels-cpu's NativeCpuStage must match it.
 */
import type { Backend, Tensor } from "../backend.js";
import { offloadedKeys, referencePrimitives } from "../contracts/selector-primitives.js";
import { questPages, questSelection, type QuestPageState } from "../contracts/quest-selection.js";
import { indexFor, indexSelection, indexSelectionFrom, indexWant, type PageIndexState } from "../contracts/page-index.js";
import { selectionForKvHead, streamingSelection, type OffloadedKeys, type Selection } from "../contracts/selector.js";
import { fail } from "../errors.js";
import type { CpuStage, CpuStageJob, CpuStageOutput, CpuStageShape } from "../hybrid/cpu-stage.js";
import { checkStageJob } from "../hybrid/check-stage-job.js";
import { GatheredValues } from "./gathered-values.js";
import { SPEC_VERSION } from "../version.js";

/** Pages a KV head a device may choose for a job (the query buffer holds that many after the query). */
const CHOSEN_MAX = 256;

interface Slot {
  /** The query, then room for a device's chosen pages (int32 [kvHeads, want]): what a signalled send fills. */
  buffer: Float32Array;
  query: Float32Array;
  chosen: Int32Array;
  logits: Float32Array;
  ids: Int32Array;
  counts: Int32Array;
  values: GatheredValues; // store: [kvHeads · storeCapacity, headDim] f32
  keys: GatheredValues | null; // the same for K rows, when the shape asks for them
  keysStaged: boolean; // the slot's last job staged K rows
}

export class BackendCpuStage implements CpuStage {
  readonly spec = SPEC_VERSION;
  readonly name = "backend";
  readonly concurrent = false;
  readonly takesChosenPages = true;
  private shape: CpuStageShape | null = null;
  private slots: Slot[] = [];
  private scoresT: Tensor | null = null; // [heads, storeCapacity]
  private qT: Tensor | null = null; // [1, heads · headDim]
  private rows: Float32Array[] = [];
  private readonly tableViews = new Map<Tensor, Tensor>();
  private readonly questStates = new Map<Tensor, QuestPageState & { epoch: number | undefined }>(); // per store K
  private readonly indexStates = new Map<Tensor, PageIndexState & { epoch: number | undefined }>(); // per store K
  private busyMs = 0;
  private closed = false;

  constructor(private readonly backend: Backend) {}

  prepare(shape: CpuStageShape): void {
    if (this.shape) fail("cpu stage: prepare() called twice");
    const { heads, kvHeads, headDim, storeCapacity: cap } = shape;
    this.shape = shape;
    const be = this.backend;
    this.scoresT = be.alloc([heads, cap]);
    this.qT = be.alloc([1, heads * headDim]);
    this.rows = Array.from({ length: heads }, () => new Float32Array(cap));
    for (let s = 0; s < 2; s++) {
      const buffer = new Float32Array(heads * headDim + kvHeads * CHOSEN_MAX);
      this.slots.push({
        buffer, query: buffer.subarray(0, heads * headDim), chosen: new Int32Array(buffer.buffer, heads * headDim * 4, kvHeads * CHOSEN_MAX), logits: new Float32Array(heads * cap),
        ids: new Int32Array(kvHeads * cap), counts: new Int32Array(kvHeads),
        values: new GatheredValues(be, be.alloc([kvHeads * cap, headDim]), kvHeads, headDim),
        keys: shape.stageKeys ? new GatheredValues(be, be.alloc([kvHeads * cap, headDim]), kvHeads, headDim) : null,
        keysStaged: false,
      });
    }
  }

  query(slot: 0 | 1): Float32Array {
    return this.slot(slot).query;
  }

  chosenPages(slot: 0 | 1): Int32Array {
    return this.slot(slot).chosen;
  }

  /** The slot's query and the chosen pages after it, as one buffer (a host link's query region). */
  queryBuffer(slot: 0 | 1): Float32Array {
    return this.slot(slot).buffer;
  }

  submit(job: CpuStageJob): void {
    const shape = this.ready();
    checkStageJob(job, shape);
    if (job.ready) fail("cpu stage: BackendCpuStage runs on the calling thread and cannot wait for a device's signal (ready)");
    const t0 = performance.now();
    const s = this.slot(job.slot);
    this.backend.write(this.qT!, s.query);
    const w = job.work;
    if (w.kind === "selected") {
      this.scoreSelected(job, w.selection);
    } else if (w.kind === "quest") {
      this.scoreSelected(job, this.questChoice(job, w.budget, w.pageSize));
    } else if (w.kind === "index") {
      this.scoreSelected(job, this.indexChoice(job, w));
    } else if (w.kind === "streaming") {
      this.scoreSelected(job, { kind: "shared", ids: streamingSelection(job.offloaded, Math.min(w.budget, job.offloaded), w.sinks) });
    } else {
      this.scoreAll(job);
      if (w.kind === "topk") this.gather(job, topKSelection(this.rows, job.offloaded, w.budget, w.shared, shape));
    }
    this.busyMs = performance.now() - t0;
  }

  /** The store's K as f32 values: a copy (this stage defines semantics; native stages hand a view). */
  offloadedKeys(k: Tensor): OffloadedKeys {
    const shape = this.ready();
    return offloadedKeys("f32", shape.kvHeads, shape.storeCapacity, shape.headDim, this.backend.read(k));
  }

  wait(): number {
    return this.busyMs;
  }

  allLogits(): readonly Float32Array[] {
    return this.rows;
  }

  gather(job: CpuStageJob, selection: Selection): void {
    const { heads, kvHeads } = this.ready();
    const s = this.slot(job.slot), group = heads / kvHeads, kmax = job.kmax;
    this.setIds(s, job, selection);
    for (let h = 0; h < heads; h++) {
      const g = Math.floor(h / group), n = s.counts[g], row = this.rows[h];
      for (let i = 0; i < kmax; i++) s.logits[h * kmax + i] = i < n ? row[s.ids[g * kmax + i]] : -Infinity;
    }
    this.gatherValues(s, job);
  }

  output(slot: 0 | 1): CpuStageOutput {
    this.ready();
    const s = this.slot(slot);
    return { kmax: s.values.kmax, logits: s.logits, values: s.values.output(), keys: s.keysStaged && s.keys ? s.keys.output() : null, ids: s.ids, counts: s.counts };
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    const be = this.backend;
    for (const v of this.tableViews.values()) be.free(v);
    this.questStates.clear();
    this.indexStates.clear();
    for (const s of this.slots) {
      s.values.close();
      s.keys?.close();
    }
    if (this.scoresT) be.free(this.scoresT);
    if (this.qT) be.free(this.qT);
    this.slots = [];
  }

  [Symbol.dispose](): void {
    this.close();
  }

  private scoreAll(job: CpuStageJob): void {
    const be = this.backend, n = job.offloaded;
    be.attnLogits(this.scoresT!, 0, this.qT!, 0, job.k, 0, n, job.scale);
    const cap = this.shape!.storeCapacity;
    for (let h = 0; h < this.rows.length; h++) this.rows[h].set(be.read(this.scoresT!, h * cap, n));
  }

  /** Quest's pages from the slot's query, on summaries of this store kept across jobs (afresh in a new epoch). */
  private questChoice(job: CpuStageJob, budget: number, pageSize: number): Selection {
    const { heads, kvHeads } = this.shape!, keys = this.offloadedKeys(job.k);
    let st = this.questStates.get(job.k);
    if (!st || st.epoch !== job.storeEpoch) {
      st = { pages: null, summarized: 0, epoch: job.storeEpoch };
      this.questStates.set(job.k, st);
    }
    const P = referencePrimitives, pages = questPages(P, st, keys, job.offloaded, pageSize);
    return questSelection(P, this.slot(job.slot).query, heads / kvHeads, keys, pages, job.offloaded, budget);
  }

  /** The page index's choice from the slot's query, on an index of this store kept across jobs (afresh in a new epoch). */
  private indexChoice(job: CpuStageJob, w: Extract<CpuStageJob["work"], { kind: "index" }>): Selection {
    const { heads, kvHeads } = this.shape!, keys = this.offloadedKeys(job.k);
    let st = this.indexStates.get(job.k);
    if (!st || st.epoch !== job.storeEpoch) {
      st = { index: null, summarized: 0, epoch: job.storeEpoch };
      this.indexStates.set(job.k, st);
    }
    const P = referencePrimitives, s = this.slot(job.slot);
    if (w.chosen) {
      const want = indexWant(w.budget, job.offloaded, w.pageSize);
      if (want > CHOSEN_MAX) fail(`cpu stage: ${want} chosen pages a KV head exceed the ${CHOSEN_MAX} a slot holds`);
      return indexSelectionFrom(P, s.query, heads / kvHeads, keys, s.chosen, want, w.pageSize, job.offloaded, Math.min(w.budget, job.offloaded));
    }
    const index = indexFor(P, st, keys, job.offloaded, w.pageSize, w.superPages, w.form);
    return indexSelection(P, s.query, heads / kvHeads, keys, index, job.offloaded, w.budget);
  }

  /** Pre-QKᵀ: one gathered-logits call per distinct list (one for a shared selection). */
  private scoreSelected(job: CpuStageJob, selection: Selection): void {
    const { heads, kvHeads, storeCapacity: cap } = this.shape!;
    const be = this.backend, s = this.slot(job.slot), group = heads / kvHeads, kmax = job.kmax;
    this.setIds(s, job, selection);
    for (let g = 0; g < kvHeads; g++) {
      const n = s.counts[g];
      if (n > 0 && (selection.kind === "perKvHead" || g === 0)) {
        be.attnLogitsGather(this.scoresT!, 0, this.qT!, 0, job.k, s.ids.subarray(g * kmax, g * kmax + n), job.scale);
      }
      for (let h = g * group; h < (g + 1) * group; h++) {
        const got = n > 0 ? be.read(this.scoresT!, h * cap, n) : new Float32Array(0);
        s.logits.set(got, h * kmax);
        s.logits.fill(-Infinity, h * kmax + n, (h + 1) * kmax);
      }
    }
    this.gatherValues(s, job);
  }

  private setIds(s: Slot, job: CpuStageJob, selection: Selection): void {
    const { kvHeads } = this.shape!, kmax = job.kmax;
    s.values.kmax = kmax;
    for (let g = 0; g < kvHeads; g++) {
      const ids = selectionForKvHead(selection, g);
      if (ids.length > kmax) fail(`cpu stage: KV head ${g} selected ${ids.length} tokens, more than the step's width ${kmax}`);
      for (let i = 0; i < ids.length; i++) {
        const id = ids[i];
        if (!(id >= 0 && id < job.offloaded)) fail(`cpu stage: selected slot ${id} out of range [0, ${job.offloaded})`);
        if (i > 0 && id <= ids[i - 1]) fail(`cpu stage: KV head ${g} selection is not strictly ascending at slot ${id}`);
      }
      s.ids.set(ids, g * kmax);
      s.ids.fill(0, g * kmax + ids.length, (g + 1) * kmax);
      s.counts[g] = ids.length;
    }
  }

  /** values[g, i] = V[g, ids[g, i]] as f32 rows (and K rows for a job with `keys`); padding
   * repeats slot 0 (finite; its logit is −∞ or masked, so probability 0). */
  private gatherValues(s: Slot, job: CpuStageJob): void {
    s.keysStaged = job.keys === true;
    if (s.keys) s.keys.kmax = job.kmax;
    const { kvHeads, storeCapacity: cap } = this.shape!, kmax = job.kmax;
    if (kmax === 0 || job.deviceGather) return; // the device reads the rows from the mapped store itself
    const rows = new Int32Array(kvHeads * kmax);
    for (let g = 0; g < kvHeads; g++) for (let i = 0; i < kmax; i++) rows[g * kmax + i] = g * cap + s.ids[g * kmax + i];
    this.backend.embedding(s.values.store, this.table(job.v), rows);
    if (job.keys) this.backend.embedding(s.keys!.store, this.table(job.k), rows);
  }

  /** A store tensor as [kvHeads · cap, headDim] rows (views made once per store tensor). */
  private table(store: Tensor): Tensor {
    let table = this.tableViews.get(store);
    if (!table) {
      const { kvHeads, storeCapacity: cap, headDim } = this.shape!;
      table = this.backend.view(store, 0, [kvHeads * cap, headDim]);
      this.tableViews.set(store, table);
    }
    return table;
  }

  private slot(i: 0 | 1): Slot {
    const s = this.slots[i];
    if (!s) fail(this.closed ? "cpu stage used after close()" : `cpu stage: slot ${i} does not exist (call prepare() first)`);
    return s;
  }

  private ready(): CpuStageShape {
    if (this.closed) fail("cpu stage used after close()");
    if (!this.shape) fail("cpu stage: prepare() was not called");
    return this.shape;
  }
}

/**
 * Exact top-K from per-query-head logits: per KV head the max over its group's heads (or one
 * shared list from the max over all heads), then the `budget` largest, ties to the lower slot.
 */
export function topKSelection(rows: readonly Float32Array[], offloaded: number, budget: number, shared: boolean, shape: { heads: number; kvHeads: number }): Selection {
  const P = referencePrimitives, group = shape.heads / shape.kvHeads;
  const best = new Float32Array(offloaded);
  if (shared) {
    P.maxRows(rows, offloaded, best);
    return { kind: "shared", ids: P.topK(best, budget, offloaded) };
  }
  const ids: Int32Array[] = [];
  for (let g = 0; g < shape.kvHeads; g++) {
    P.maxRows(rows.slice(g * group, (g + 1) * group), offloaded, best);
    ids.push(P.topK(best, budget, offloaded));
  }
  return { kind: "perKvHead", ids };
}
