/**
 * The device side of a hybrid layer that every transport shares: the window's share (its
 * flash-decode partial, or its logits materialised at their concatenated columns), the verified
 * logits of staged K rows, and the one softmax over window ∪ selected followed by A·V — plus the
 * accumulated scores a selector may ask for. Columns of the concatenated logits: [0, S) the
 * tokens before the store, [S, S + kmax) the selected offloaded tokens, then the ring.
 */
import { ATTN_PARTIAL_MAX_SPANS, type AttnMergeRow, type AttnPartialRow, type Tensor, type AccumulatedScores, type HeadLayout, fail, type CpuStageOutput, keptColumns } from "@hybridgen/spec";
import type { Attention } from "@hybridgen/core";
import type { HybridStats } from "./hybrid-stats.js";

export class StepMerge implements Disposable {
  /** The window's flash-decode partial [heads, headDim + 2]; null: window logits are materialised (tracked scores need every probability). */
  readonly part: Tensor | null;
  private readonly spans = new Int32Array(2 * ATTN_PARTIAL_MAX_SPANS);
  private readonly negInf: Float32Array;
  private scoreRows: Float32Array[][] = []; // [layer][kvHead] per position
  private scoreSteps = 0;

  constructor(private readonly attention: Attention, private readonly layout: HeadLayout, readonly trackScores: boolean, private readonly stats: HybridStats) {
    const be = attention.backend;
    this.negInf = new Float32Array(attention.cache.storeCapacity).fill(-Infinity);
    this.part = !trackScores && be.attnPartial && be.attnMerge ? be.alloc([layout.heads, layout.headDim + 2]) : null;
  }

  /** A new sequence: the accumulated scores start from zero. */
  reset(layers: number): void {
    const maxContext = this.attention.cache.maxContext;
    this.scoreRows = this.trackScores
      ? Array.from({ length: layers }, () => Array.from({ length: this.layout.kvHeads }, () => new Float32Array(maxContext)))
      : [];
    this.scoreSteps = 0;
  }

  /** A step ended: one more step in the accumulated scores. */
  stepDone(): void {
    if (this.trackScores) this.scoreSteps++;
  }

  /** The accumulated scores of `layer` (when tracked). */
  scores(layer: number): AccumulatedScores | undefined {
    if (!this.trackScores) return undefined;
    const S = this.attention.cache.storeStart;
    return { perKvHead: this.scoreRows[layer]!.map((r) => r.subarray(S)), steps: this.scoreSteps };
  }

  /**
   * The window's share (sinks and ring), before the stage is collected: its flash-decode partial
   * (K and V read once, no window logits written), or with tracked scores q·Kᵀ of every window
   * span at its concatenated column (the accumulated scores need every window probability).
   */
  scoreWindow(layer: number, q: Tensor, scores: Tensor, kmax: number): void {
    const a = this.attention, c = a.cache;
    const p = this.partialRow(layer, q);
    if (p) {
      a.backend.attnPartial!(p.part, p.q, p.qRow, p.k, p.v, p.spans, p.scale);
      return;
    }
    for (let s = 0; s < c.spanCount; s++) {
      if (c.spanRegion[s] === 2) continue;
      a.backend.attnLogits(scores, this.column(c.spanPos[s], kmax), q, 0, c.windowK[layer], c.spanSlot[s], c.spanLen[s], a.scale);
    }
  }

  /**
   * scoreWindow's partial as the arguments of its attnPartial (a batched step's rows go as one
   * Backend.attnPartialRows; the spans stay valid until this sequence's next call); null where the
   * window's logits are materialised.
   */
  partialRow(layer: number, q: Tensor): AttnPartialRow | null {
    if (!this.part) return null;
    const a = this.attention, c = a.cache;
    let n = 0;
    for (let s = 0; s < c.spanCount; s++) {
      if (c.spanRegion[s] === 2) continue;
      this.spans[n++] = c.spanSlot[s];
      this.spans[n++] = c.spanLen[s];
    }
    return { part: this.part, q, qRow: 0, k: c.windowK[layer]!, v: c.windowV[layer]!, spans: this.spans.subarray(0, n), scale: a.scale };
  }

  /**
   * Verified logits: the true query against the staged K rows, into columns [col, col + kmax) of
   * scores; a KV head's list shorter than kmax gets −∞ in its padded columns (the staged rows there are zeros).
   */
  verifiedLogits(scores: Tensor, col: number, q: Tensor, keys: Tensor | null, counts: Int32Array, kmax: number): void {
    if (!keys) fail("hybrid attention: the CPU stage returned no K rows for a verified layer");
    const a = this.attention, width = scores.shape[1]!, group = this.layout.groupSize;
    a.backend.attnLogits(scores, col, q, 0, keys, 0, kmax, a.scale);
    for (let h = 0; h < this.layout.heads; h++) {
      const n = counts[Math.floor(h / group)]!;
      if (n < kmax) a.backend.write(scores, this.negInf.subarray(0, kmax - n), h * width + col + n);
    }
  }

  /**
   * A verified layer's kept candidates on a backend that holds its scores in reach (the host
   * transport): keptColumns of the verified logits [col, col + kmax) of each head, the rest −∞ (as
   * HostTransfers.keepRows writes them; their V rows then weigh nothing).
   */
  keepColumns(scores: Tensor, col: number, counts: Int32Array, kmax: number, keep: number): void {
    const be = this.attention.backend, width = scores.shape[1]!, { heads, groupSize: group } = this.layout;
    const rows = new Float32Array(heads * kmax);
    for (let h = 0; h < heads; h++) rows.set(be.read(scores, h * width + col, kmax), h * kmax);
    const kept = keptColumns(rows, kmax, 0, group, kmax, counts.subarray(0, heads / group), keep);
    for (let h = 0; h < heads; h++) {
      const g = Math.floor(h / group), row = rows.subarray(h * kmax, (h + 1) * kmax);
      for (let j = 0; j < kmax; j++) if (!kept[g * kmax + j]) row[j] = -Infinity;
      be.write(scores, row, h * width + col);
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
  softmaxAggregate(layer: number, scores: Tensor, col: number, outp: CpuStageOutput | null, values: Tensor | null, kmax: number, out: Tensor): void {
    const a = this.attention, be = a.backend, c = a.cache;
    const m = this.mergeRow(layer, scores, col, values, kmax, out);
    if (m) {
      be.attnMerge!(m.out, m.outRow, m.part, m.logits, m.col, m.v, m.start, m.count);
      return;
    }
    this.stats.sumK += kmax;
    this.stats.layerSteps++;
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

  /**
   * softmaxAggregate with the window's partial, as its attnMerge's arguments (counted as that merge
   * is): a batched step merges every row's in one Backend.attnMergeRows. Null where the window's
   * logits are materialised (softmaxAggregate's own path).
   */
  mergeRow(layer: number, scores: Tensor, col: number, values: Tensor | null, kmax: number, out: Tensor): AttnMergeRow | null {
    if (!this.part) return null;
    this.stats.sumK += kmax;
    this.stats.layerSteps++;
    return { out, outRow: 0, part: this.part, logits: scores, col, v: values ?? this.attention.cache.windowV[layer], start: 0, count: values ? kmax : 0 };
  }

  close(): void {
    if (this.part) this.attention.backend.free(this.part);
  }

  [Symbol.dispose](): void {
    this.close();
  }

  /** Column of position p in the concatenated logits [before the store | K selected | after]. */
  private column(p: number, kmax: number): number {
    const c = this.attention.cache;
    return p < c.storeStart ? p : p - c.storeCount + kmax;
  }

  /** Adds this layer's attention probabilities to the per-position sums of each KV head. */
  private accumulate(layer: number, scores: Tensor, total: number, ids: Int32Array, counts: Int32Array, kmax: number): void {
    const a = this.attention, c = a.cache, S = c.storeStart, storeCount = c.storeCount;
    const group = this.layout.groupSize, width = c.maxContext;
    for (let h = 0; h < this.layout.heads; h++) {
      const g = Math.floor(h / group), acc = this.scoreRows[layer]![g]!;
      const p = a.backend.read(scores, h * width, total);
      for (let col = 0; col < total; col++) {
        let pos: number;
        if (col < S) pos = col;
        else if (col < S + kmax) {
          const i = col - S;
          if (i >= counts[g]!) continue;
          pos = S + ids[g * kmax + i]!;
        } else pos = col - kmax + storeCount;
        acc[pos] += p[col]!;
      }
    }
  }
}
