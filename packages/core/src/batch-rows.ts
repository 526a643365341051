/**
 * BatchRows: the attention half of a batched decode step, shared by every architecture.
 *
 * A batched step runs B sequences' next tokens as one block of B rows: each projection is one
 * matmul of B rows (the weights are read once for the whole batch), but every row attends
 * over its OWN sequence's KV cache at its own position. The architecture writes q, k, v
 * ([B, heads·headDim], [B, kvHeads·headDim] ×2) and calls attend(); row i's k, v go to
 * sequence i's cache and its attention goes to row i of `att`. Buffers and the per-row views
 * (a row of q seen as a one-row tensor, a row of k as [kvHeads, headDim]) are made once.
 */
import type { Backend, BatchAttnRow, Tensor } from "./backend.js";
import type { Attention, AttentionLayout } from "./attention.js";
import { fail } from "./errors.js";
import type { KvCache } from "./kv-cache.js";
import type { WeightLoader } from "./weight-loader.js";

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

  constructor(private readonly backend: Backend, w: WeightLoader, layout: AttentionLayout, capacity: number) {
    this.capacity = capacity;
    const qw = layout.heads * layout.headDim, kvw = layout.kvHeads * layout.headDim;
    this.q = w.alloc([capacity, qw]);
    this.k = w.alloc([capacity, kvw]);
    this.v = w.alloc([capacity, kvw]);
    this.att = w.alloc([capacity, qw]);
    for (let i = 0; i < capacity; i++) {
      this.qRow.push(w.view(this.q, i * qw, [1, qw]));
      this.attRow.push(w.view(this.att, i * qw, [1, qw]));
      this.kRow.push(w.view(this.k, i * kvw, [layout.kvHeads, layout.headDim]));
      this.vRow.push(w.view(this.v, i * kvw, [layout.kvHeads, layout.headDim]));
    }
  }

  /**
   * Row i (i < B): append k[i], v[i] of `layer` to seqs[i]'s cache at positions[i] (already
   * appended with cache.append), then att[i] = attention of q[i] over that cache's [0, positions[i]].
   */
  attend(layer: number, seqs: readonly SequenceState[], positions: Int32Array, B: number): void {
    const be = this.backend;
    if (be.attnDecodeBatch && this.batchable(seqs, positions, B)) {
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
    for (let i = 0; i < B; i++) {
      const { cache: c, attention } = seqs[i], pos = positions[i];
      c.writeRows(layer, this.kRow[i], this.vRow[i], pos, 1);
      // One contiguous span from position 0: the backend's decode kernel, as Attention.attend does.
      if (be.attnCausal && c.spanCount === 1 && c.spanPos[0] === 0 && c.spanLen[0] === pos + 1) {
        be.attnCausal(this.attRow[i], this.qRow[i], 1, c.spanK(0, layer), c.spanV(0, layer), c.spanSlot[0], pos, attention.scale);
      } else {
        attention.attendFull(layer, this.q, i, pos, this.att);
      }
    }
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

  /** Fails unless 1 ≤ B ≤ capacity. */
  checkRows(B: number): void {
    if (!(Number.isInteger(B) && B >= 1 && B <= this.capacity)) fail(`batched decode: ${B} rows, the batch holds 1..${this.capacity}`);
  }
}
