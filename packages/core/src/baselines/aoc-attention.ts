/**
 * AoC (MoE-Lightning-style): attention over the offloaded tokens runs entirely on the CPU — the
 * host backend that holds the store (KvCache.hostBackend; the backend itself when the store is
 * in its memory) scores the query against every offloaded K row, softmaxes and sums the V rows
 * — and only that partial output and its log-sum-exp go to the device, which merges them with
 * the window's attention in one softmax.
 *
 * The merge is exact with the backend's ordinary ops: the CPU's part enters the device softmax
 * as one extra column per query head whose logit is the part's log-sum-exp λ and whose V row is
 * the part's normalised output o (exp(λ)·o = Σ_j exp(l_j)·v_j over the offloaded tokens). As V
 * rows belong to KV heads, a group of G query heads gets G extra columns; query head h sees its
 * own at logit λ_h and −∞ at the others. λ comes from the host's softmax itself: one more
 * column at a reference logit c adds exp(c) to the sum, so its probability p = exp(c)/(exp(c) +
 * Σ_j exp(l_j)) gives λ = c + log((1 − p)/p), and o is the aggregate divided by 1 − p. Any c is
 * exact on paper; in f32 it must be neither far below λ (p underflows) nor above it (1 − p
 * cancels). c is the largest value of the head's logits row as the backend's argmax finds it
 * (the maximum logit, so p ∈ (0, ½], unless a stale column past the offloaded ones is larger);
 * when p leaves [1e−30, ½] the row is scored again and its maximum found by a scan.
 */
import { DTYPE_BYTES, type Backend, type Tensor } from "@hybridgen/spec";
import type { Attention } from "../attention.js";
import { BaselineAttention } from "./baseline-attention.js";

export class AoCAttention extends BaselineAttention {
  readonly name = "aoc";
  private readonly host: Backend;
  private readonly heads: number;
  private readonly headDim: number;
  private readonly group: number;
  /** Host: the query, [heads, storeCapacity + 1] logits, the partial output. */
  private readonly hq: Tensor;
  private readonly hs: Tensor;
  private readonly ho: Tensor;
  /** Device: [heads, G + windowCapacity] logits (extra columns first), the extra V rows [kvHeads, G, headDim]. */
  private readonly ds: Tensor;
  private readonly dv: Tensor;
  private readonly dsWidth: number;
  private readonly extra: Float32Array;
  private readonly owned: [Backend, Tensor][] = [];

  constructor(attention: Attention) {
    super(attention, "AoC");
    const c = attention.cache, be = attention.backend;
    this.host = c.hostBackend ?? be;
    const { heads, kvHeads, headDim } = attention.layout;
    this.heads = heads;
    this.headDim = headDim;
    this.group = heads / kvHeads;
    this.dsWidth = this.group + c.windowCapacity + 1;
    this.extra = new Float32Array((heads - 1) * this.dsWidth + this.group);
    try {
      this.hq = this.alloc(this.host, [1, heads * headDim]);
      this.hs = this.alloc(this.host, [heads, c.storeCapacity + 1]);
      this.ho = this.alloc(this.host, [1, heads * headDim]);
      this.ds = this.alloc(be, [heads, this.dsWidth]);
      this.dv = this.alloc(be, [kvHeads, this.group, headDim]);
    } catch (e) {
      this.freeAll();
      throw e;
    }
  }

  protected prepareStep(): void {
    this.attention.cache.syncHostStore(); // the evictions' rows are in host memory
  }

  protected attendOffloaded(layer: number, q: Tensor, out: Tensor): void {
    const a = this.attention, c = a.cache, be = a.backend, n = this.offloaded;
    const heads = this.heads, G = this.group, width = this.dsWidth;
    // CPU: the offloaded part, normalised, and each head's log-sum-exp.
    const t0 = performance.now();
    const hostQ = this.host === be ? q : this.hq;
    if (hostQ !== q) this.host.write(this.hq, be.read(q, 0, heads * this.headDim));
    const { lse, scale } = this.partial(layer, hostQ, n);
    const o = this.host.read(this.ho, 0, heads * this.headDim);
    for (let h = 0, d = this.headDim; h < heads; h++) for (let i = h * d; i < (h + 1) * d; i++) o[i]! *= scale[h]!;
    this.stats.cpuMs += performance.now() - t0;
    // Device: the extra columns (λ_h on the diagonal of each group, −∞ elsewhere), then the window.
    const ex = this.extra;
    for (let h = 0; h < heads; h++) {
      const row = ex.subarray(h * width, h * width + G);
      row.fill(-Infinity);
      row[h % G] = lse[h]!;
    }
    be.write(this.ds, ex, 0);
    be.write(this.dv, o, 0);
    const S0 = c.storeStart;
    for (let s = 0; s < c.spanCount; s++) {
      if (c.spanRegion[s] === 2) continue;
      const p = c.spanPos[s], col = G + (p < S0 ? p : p - n);
      be.attnLogits(this.ds, col, q, 0, c.windowK[layer]!, c.spanSlot[s], c.spanLen[s], a.scale);
    }
    const total = G + this.pos + 1 - n;
    be.softmax(this.ds, heads, total);
    be.attnAggregate(out, 0, this.ds, 0, this.dv, 0, G, false);
    for (let s = 0; s < c.spanCount; s++) {
      if (c.spanRegion[s] === 2) continue;
      const p = c.spanPos[s], col = G + (p < S0 ? p : p - n);
      be.attnAggregate(out, 0, this.ds, col, c.windowV[layer]!, c.spanSlot[s], c.spanLen[s], true);
    }
    this.stats.layerSteps++;
    if (this.host !== be) this.stats.bytesMoved += 4 * (2 * heads * this.headDim + ex.length);
  }

  /**
   * Host attention of q over store rows [0, n) of `layer`: ho holds the output times 1 − p; per
   * head the log-sum-exp λ and the factor 1/(1 − p) that normalises ho (see the header).
   */
  private partial(layer: number, q: Tensor, n: number): { lse: Float32Array; scale: Float32Array } {
    const H = this.host, c = this.attention.cache, width = c.storeCapacity + 1, heads = this.heads;
    const col = new Float32Array(heads), lse = new Float32Array(heads), scale = new Float32Array(heads);
    for (let exact = false; ; exact = true) {
      H.attnLogits(this.hs, 0, q, 0, c.stageStoreK(layer), 0, n, this.attention.scale);
      for (let h = 0; h < heads; h++) {
        if (exact) {
          if (h === 0) this.stats.maxScans++;
          const row = H.read(this.hs, h * width, n);
          let m = -Infinity;
          for (let j = 0; j < n; j++) if (row[j]! > m) m = row[j]!;
          col[h] = m;
        } else {
          col[h] = H.read(this.hs, h * width + H.argmax(this.hs, h), 1)[0]!;
        }
        H.write(this.hs, col.subarray(h, h + 1), h * width + n);
      }
      H.softmax(this.hs, heads, n + 1);
      let fits = true;
      for (let h = 0; h < heads; h++) {
        const p = H.read(this.hs, h * width + n, 1)[0]!;
        if (!(p >= 1e-30 && p <= 0.5)) fits = false;
        lse[h] = col[h]! + Math.log((1 - p) / p);
        scale[h] = 1 / (1 - p);
      }
      if (!fits && !exact) {
        this.stats.refMisses++;
        continue;
      }
      H.attnAggregate(this.ho, 0, this.hs, 0, c.stageStoreV(layer), 0, n, false);
      return { lse, scale };
    }
  }

  protected release(): void {
    this.freeAll();
  }

  private alloc(b: Backend, shape: number[]): Tensor {
    const t = b.alloc(shape);
    this.owned.push([b, t]);
    return t;
  }

  private freeAll(): void {
    for (const [b, t] of this.owned.splice(0)) b.free(t);
  }
}

/** Bytes of K and V one layer's offloaded rows take (what AoG would move and AoC reads in place). */
export function offloadedLayerBytes(attention: Attention): number {
  const c = attention.cache;
  return 2 * c.storeCount * c.kvHeads * c.headDim * DTYPE_BYTES[c.dtype];
}
