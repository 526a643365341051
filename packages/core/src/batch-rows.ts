/**
 * BatchRows: the attention half of a batched decode step, shared by every architecture.
 *
 * A batched step runs B sequences' next tokens as one block of B rows: each projection is one
 * matmul of B rows (the weights are read once for the whole batch), but every row attends
 * over its OWN sequence's KV cache at its own position. The architecture writes q, k, v
 * ([B, heads·headDim], [B, kvHeads·headDim] ×2) and calls attend(); row i's k, v go to
 * sequence i's cache and its attention goes to row i of `att`. Buffers and the per-row views
 * (a row of q seen as a one-row tensor, a row of k as [kvHeads, headDim]) are made once.
 * q and k share one allocation (q's capacity rows, then k's) so that RoPE of both is one call
 * over their heads (ropeQK).
 *
 * A sequence with a decode attention (hybrid attention, one per sequence) gets its hooks row by
 * row: layerInput with its residual row (bindResidual), prepareAttend for every row before any
 * row's attend, so all sequences' CPU stages of a layer run before the first is waited on; the
 * stage groups the rows share are flushed once after each pass.
 * On a backend that records decode steps (beginStep/endStep: CUDA graphs) a step whose every row
 * is handed off (DecodeAttention.batchRecordable: no layer waits on the host) is recorded a layer at
 * a time for the whole batch — every row's device work of layer l, from the layer's input to the
 * next layer's, is one segment replayed as one graph — so the host records layer l + 1 while the
 * device runs layer l. A step with a row that waits on the host runs eagerly.
 */
import { type Backend, type BatchAttnRow, type KvAppendRow, type Tensor, fail } from "@hybridgen/spec";
import type { Attention, AttentionLayout, DecodeBatchStep, StepGroup } from "./attention.js";
import type { KvCache } from "./kv-cache.js";
import type { WeightLoader } from "./weight-loader.js";

let batchRowsCount = 0; // segment keys differ between batches (their models' recorded ops differ)

/** One sequence's KV state: its cache and the attention stage over it. */
export interface SequenceState {
  readonly cache: KvCache;
  readonly attention: Attention;
}

export class BatchRows {
  readonly capacity: number;
  /** [capacity, heads·headDim] queries (RoPE applied by the architecture). */
  readonly q: Tensor;
  /** [capacity, kvHeads·headDim] new keys and values. */
  readonly k: Tensor;
  readonly v: Tensor;
  /** [capacity, heads·headDim] attention outputs. */
  readonly att: Tensor;
  private readonly qRow: Tensor[] = [];
  private readonly kRow: Tensor[] = [];
  private readonly vRow: Tensor[] = [];
  private readonly attRow: Tensor[] = [];
  /** attnDecodeBatch's rows, rewritten in place every layer (no allocation in a step). */
  private readonly table: BatchAttnRow[] = [];
  /** q's and k's heads as rows of headDim: [capacity·heads q heads, then capacity·kvHeads k heads]. */
  private readonly qkHeads: Tensor;
  /** ropeQK's position of each head row (setPositions fills it once a step). */
  private readonly headPos: Int32Array;
  private readonly layout: AttentionLayout;
  private ropeRows = 0;
  /** Rows of the architecture's residual stream (bindResidual), for the decode attentions' layerInput. */
  private readonly xRow: Tensor[] = [];
  /** The step the decode attentions share (rewritten every step). */
  private readonly step: DecodeBatchStep & { rows: number; serial: number };
  /** The architecture's batched query projection (bindQueries): layer's queries of the first B residual rows into out. */
  private project: ((layer: number, B: number, out: Tensor) => void) | null = null;
  /** Two [capacity, heads·headDim] query buffers taken by layer parity (a layer's input asks for two layers' at most), made by bindQueries. */
  private readonly queries: Tensor[] = [];
  private readonly queryRows: Tensor[][] = [];
  /** The layer each query buffer holds this step (−1: none). */
  private readonly queryLayer = [-1, -1];
  /** Per batch size, per layer: the key of the layer's recorded segment. */
  private readonly segmentKeys: string[][] = [];
  private readonly keyPrefix = `batch-rows-${batchRowsCount++}-`;
  private segmentOpen = false;
  /** This step's rows are all handed off: it is recorded a layer at a time. */
  private records = false;
  /** The distinct stage groups this step's rows share (beginStep), each flushed once a pass. */
  private readonly groups: StepGroup[] = [];

  constructor(private readonly backend: Backend, private readonly w: WeightLoader, layout: AttentionLayout, capacity: number) {
    this.capacity = capacity;
    this.layout = layout;
    const qw = layout.heads * layout.headDim, kvw = layout.kvHeads * layout.headDim;
    const qk = w.alloc([capacity * (qw + kvw)]);
    this.q = w.view(qk, 0, [capacity, qw]);
    this.k = w.view(qk, capacity * qw, [capacity, kvw]);
    const headRows = capacity * (layout.heads + layout.kvHeads);
    this.qkHeads = w.view(qk, 0, [headRows, layout.headDim]);
    this.headPos = new Int32Array(headRows);
    this.v = w.alloc([capacity, kvw]);
    this.att = w.alloc([capacity, qw]);
    this.step = { rows: 0, serial: 0, query: (layer, x) => this.query(layer, this.xRow.indexOf(x)), queryOfRow: (layer, row) => this.query(layer, row) };
    for (let i = 0; i < capacity; i++) {
      this.qRow.push(w.view(this.q, i * qw, [1, qw]));
      this.attRow.push(w.view(this.att, i * qw, [1, qw]));
      this.kRow.push(w.view(this.k, i * kvw, [layout.kvHeads, layout.headDim]));
      this.vRow.push(w.view(this.v, i * kvw, [layout.kvHeads, layout.headDim]));
    }
  }

  /** The architecture's [capacity, width] residual rows, seen one by one by layerInput. */
  bindResidual(x: Tensor, width: number): void {
    this.xRow.length = 0;
    for (let i = 0; i < this.capacity; i++) this.xRow.push(this.w.view(x, i * width, [1, width]));
  }

  /** The architecture's batched query projection: `project(layer, B, out)` writes layer's queries of the first B residual rows (at the step's positions) to out's rows. */
  bindQueries(project: (layer: number, B: number, out: Tensor) => void): void {
    this.project = project;
    const qw = this.layout.heads * this.layout.headDim;
    for (let b = this.queries.length; b < 2; b++) {
      const t = this.w.alloc([this.capacity, qw]);
      this.queries.push(t);
      this.queryRows.push(Array.from({ length: this.capacity }, (_, i) => this.w.view(t, i * qw, [1, qw])));
    }
  }

  /** DecodeBatchStep.query: every row's query of `layer` on the first ask this step, then the row's. */
  private query(layer: number, row: number): Tensor | null {
    if (!this.project || row < 0 || row >= this.step.rows) return null;
    const b = layer & 1;
    if (this.queryLayer[b] !== layer) {
      this.project!(layer, this.step.rows, this.queries[b]!);
      this.queryLayer[b] = layer;
    }
    return this.queryRows[b]![row]!;
  }

  /** Layer `layer`'s input is in the residual rows: each row's decode attention sees its own (bindResidual first). */
  layerInput(layer: number, seqs: readonly SequenceState[], B: number): void {
    if (hasDecodeAttention(seqs, B)) this.openSegment(layer, B);
    for (let i = 0; i < B; i++) {
      const d = seqs[i].attention.decodeAttention;
      if (!d) continue;
      if (this.xRow.length === 0) fail("batched decode: the architecture bound no residual rows for decode attention");
      d.layerInput(layer, this.xRow[i]);
    }
    this.rowsDone();
  }

  /**
   * The step's positions (row i of the batch at positions[i]) for ropeQK: every head row of q's
   * first B rows and of k's first B rows takes its row's position. q's rows B..capacity−1 lie
   * between (position 0: rotated, never read).
   */
  setPositions(positions: Int32Array, B: number): void {
    const { heads, kvHeads } = this.layout, p = this.headPos, kBase = this.capacity * heads;
    p.fill(0, 0, kBase);
    for (let i = 0; i < B; i++) {
      p.fill(positions[i], i * heads, (i + 1) * heads);
      p.fill(positions[i], kBase + i * kvHeads, kBase + (i + 1) * kvHeads);
    }
    this.ropeRows = kBase + B * kvHeads;
  }

  /** RoPE of q's and k's first B rows (setPositions first) in one backend call. */
  ropeQK(be: Backend, cos: Tensor, sin: Tensor): void {
    be.rope(this.qkHeads, this.ropeRows, this.headPos, 1, this.layout.headDim, cos, sin);
  }

  /**
   * Row i (i < B): append k[i], v[i] of `layer` to seqs[i]'s cache at positions[i] (already
   * appended with cache.append), then att[i] = attention of q[i] over that cache's [0, positions[i]].
   */
  attend(layer: number, seqs: readonly SequenceState[], positions: Int32Array, B: number): void {
    const be = this.backend;
    const decode = hasDecodeAttention(seqs, B);
    if (!decode && be.attnDecodeBatch && this.batchable(seqs, positions, B)) {
      // One backend call for all rows: each row's K/V append and its attention over its own cache.
      const t = this.table;
      t.length = B;
      for (let i = 0; i < B; i++) {
        const c = seqs[i].cache, pos = positions[i], r = t[i];
        r.kCache = c.spanK(0, layer);
        r.vCache = c.spanV(0, layer);
        r.start = c.spanSlot[0];
        r.slot = r.start + pos;
        r.firstPos = pos;
      }
      be.attnDecodeBatch(this.att, this.q, this.k, this.v, t, seqs[0].attention.scale);
      return;
    }
    this.appendRows(layer, seqs, positions, B);
    if (decode) {
      for (let i = 0; i < B; i++) seqs[i].attention.decodeAttention?.prepareAttend?.(layer, this.qRow[i]);
      this.rowsDone();
    }
    for (let i = 0; i < B; i++) {
      const { cache: c, attention } = seqs[i], pos = positions[i];
      const d = attention.decodeAttention;
      if (d) {
        d.attend(layer, this.qRow[i], this.attRow[i]);
        continue;
      }
      // One contiguous span from position 0: the backend's decode kernel, as Attention.attend does.
      if (be.attnCausal && c.spanCount === 1 && c.spanPos[0] === 0 && c.spanLen[0] === pos + 1) {
        be.attnCausal(this.attRow[i], this.qRow[i], 1, c.spanK(0, layer), c.spanV(0, layer), c.spanSlot[0], pos, attention.scale);
      } else {
        attention.attendFull(layer, this.q, i, pos, this.att);
      }
    }
    if (decode) this.rowsDone();
  }

  /**
   * Row i's new K and V of `layer` into seqs[i]'s cache at positions[i]: one Backend.appendKvRows for
   * every row where the backend has it and the rows' windows are of one shape and dtype, else each
   * row's writeRows (a launch a KV head).
   */
  private appendRows(layer: number, seqs: readonly SequenceState[], positions: Int32Array, B: number): void {
    const be = this.backend;
    const w0 = seqs[0].cache.windowK[layer]!;
    let same = be.appendKvRows !== undefined && this.k.dtype === "f32";
    for (let i = 1; i < B && same; i++) {
      const w = seqs[i].cache.windowK[layer]!;
      same = w.dtype === w0.dtype && w.shape.length === w0.shape.length && w.shape.every((d, j) => d === w0.shape[j]);
    }
    if (!same) {
      for (let i = 0; i < B; i++) seqs[i].cache.writeRows(layer, this.kRow[i], this.vRow[i], positions[i], 1);
      return;
    }
    const rows: KvAppendRow[] = [];
    for (let i = 0; i < B; i++) {
      const c = seqs[i].cache;
      rows.push({ k: c.windowK[layer]!, v: c.windowV[layer]!, slot: c.windowSlot(positions[i]), kNew: this.kRow[i]!, vNew: this.vRow[i]! });
    }
    be.appendKvRows!(rows);
  }

  /** The rows' pass is over: each stage group they share sends what they queued, once. */
  private rowsDone(): void {
    for (const g of this.groups) g.flush();
  }

  /**
   * Whether every row's cache is one contiguous span of slots from position 0 through its new
   * position (full attention, no eviction yet): then attnDecodeBatch's one span per row is exact.
   * Positions must have been appended (the span covers them only then).
   */
  private batchable(seqs: readonly SequenceState[], positions: Int32Array, B: number): boolean {
    const scale = seqs[0].attention.scale;
    for (let i = 0; i < B; i++) {
      const { cache: c, attention } = seqs[i];
      if (c.spanCount !== 1 || c.spanPos[0] !== 0 || c.spanLen[0] !== positions[i] + 1 || attention.scale !== scale) return false;
    }
    while (this.table.length < B) this.table.push({ kCache: this.q, vCache: this.q, slot: 0, start: 0, firstPos: 0 });
    return true;
  }

  /** Every row's decode attention: beginStep with the step they share (a new sequence at position 0 is reset first). */
  beginStep(seqs: readonly SequenceState[], positions: Int32Array, B: number): void {
    const step = this.step;
    step.rows = B;
    step.serial++;
    step.times = undefined;
    this.queryLayer.fill(-1);
    this.records = true;
    this.groups.length = 0;
    for (let i = 0; i < B; i++) {
      const d = seqs[i].attention.decodeAttention;
      if (!d) continue;
      if (positions[i] === 0) d.newSequence();
      d.beginStep(positions[i], step, i);
      this.records &&= d.batchRecordable === true;
      if (d.stageGroup && !this.groups.includes(d.stageGroup)) this.groups.push(d.stageGroup);
    }
  }

  /**
   * Every row's decode attention: the step's layers are done (before eviction). A row that fails
   * (its CPU stage's error, collected here) does not keep the rows after it from collecting theirs;
   * the first failure is thrown once all have ended.
   */
  endStep(seqs: readonly SequenceState[], B: number): void {
    this.closeSegment(); // the rows' step times wait for the device
    let failure: { error: unknown } | null = null;
    for (let i = 0; i < B; i++) {
      try {
        seqs[i].attention.decodeAttention?.endStep();
      } catch (error) {
        failure ??= { error };
      }
    }
    if (failure) throw failure.error;
  }

  /** Runs the open segment (a graph replay): before the rows talk to the host, or when a step fails. */
  closeSegment(): void {
    if (!this.segmentOpen) return;
    this.segmentOpen = false;
    this.backend.endStep!();
  }

  /** Layer `layer`'s segment of a B-row step with decode attentions: the one before it runs now. */
  private openSegment(layer: number, B: number): void {
    const be = this.backend;
    if (!this.records || !be.beginStep || !be.endStep) return;
    this.closeSegment();
    const keys = (this.segmentKeys[B] ??= []);
    be.beginStep((keys[layer] ??= `${this.keyPrefix}${B}-${layer}`));
    this.segmentOpen = true;
  }

  /** Fails unless 1 ≤ B ≤ capacity. */
  checkRows(B: number): void {
    if (!(Number.isInteger(B) && B >= 1 && B <= this.capacity)) fail(`batched decode: ${B} rows, the batch holds 1..${this.capacity}`);
  }
}

/** Whether any of the first B rows has a decode attention (hybrid: the rows go one by one). */
export function hasDecodeAttention(seqs: readonly SequenceState[], B: number = seqs.length): boolean {
  for (let i = 0; i < B; i++) if (seqs[i].attention.decodeAttention) return true;
  return false;
}
