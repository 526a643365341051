/**
 * What a decode step must read and a prefill chunk must compute, from the model's shape alone:
 * the bytes and FLOPs the server counts (`hybridgen_decode_bytes_total`, `hybridgen_prefill_flops_total`)
 * so a benchmark can set each measured step beside its floor (bytes over a card's bandwidth, FLOPs
 * over its peak). A model of the work, not a measurement.
 */
import type { LogitsMode } from "@hybridgen/runtime";

export interface StepCostShape {
  readonly layers: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  /** Bytes of one KV element (the cache's dtype, on the device and in the host store). */
  readonly kvElementBytes: number;
  /** Weight bytes one decode step reads: every weight but the embedding table, of which it reads a row a sequence. */
  readonly decodeWeightBytes: number;
  /** Parameters a prefill token is multiplied by: all but the embedding table and (read for the last position only) the LM head. */
  readonly matmulParams: number;
}

/** The rows a hybrid step brings up the link for the rows its selection held (HybridStats.sumK: K, or the candidates under verified logits). */
export interface LinkRows {
  readonly logits: LogitsMode;
  readonly candidates: number;
  /** Verified: keep·K of the candidates have their V rows brought (absent: every candidate's). */
  readonly keep?: number;
}

/** One decoding sequence of a step: its positions on the device (the window, or all of them under full attention) and, hybrid, Σ over layers of the rows a KV head's selection held. */
export interface StepRow {
  readonly resident: number;
  readonly selectedRows: number;
}

export class StepCost {
  /** K and V bytes of one position over every layer. */
  readonly bytesPerToken: number;
  /** Bytes of one KV head's row of K (or V) in one layer. */
  private readonly rowBytes: number;

  constructor(private readonly shape: StepCostShape, private readonly link: LinkRows | null) {
    this.rowBytes = shape.headDim * shape.kvElementBytes;
    this.bytesPerToken = 2 * shape.layers * shape.kvHeads * this.rowBytes;
  }

  /**
   * Bytes a batched decode step reads: on the device the weights once and each row's resident K and V;
   * over the link each row's selected rows — exact or speculative logits: V rows (the logits are
   * the CPU stage's); verified: the candidates' K rows and the V rows of the kept ones.
   */
  decode(rows: readonly StepRow[]): { device: number; link: number } {
    let device = this.shape.decodeWeightBytes, selected = 0;
    for (const r of rows) {
      device += r.resident * this.bytesPerToken;
      selected += r.selectedRows;
    }
    const l = this.link;
    const perRow = !l ? 0 : l.logits === "verified" ? 1 + (l.keep === undefined ? 1 : l.keep / l.candidates) : 1;
    return { device, link: selected * this.shape.kvHeads * this.rowBytes * perRow };
  }

  /** Bytes a prefill chunk brings up the link: with positions offloaded, every layer's store (its K and V) comes up for the chunk's causal attention over the whole context (KvCache.loadContiguous). */
  prefillLinkBytes(offloaded: number): number {
    return offloaded * this.bytesPerToken;
  }

  /** FLOPs of prefilling positions [start, end): the matmuls and causal attention's QKᵀ and PV over every earlier position (dense, as exact prefill computes it). */
  prefillFlops(start: number, end: number): number {
    const n = end - start;
    if (n <= 0) return 0;
    const attended = n * start + (n * (n + 1)) / 2; // Σ over the chunk's positions p of p + 1
    return 2 * this.shape.matmulParams * n + 4 * this.shape.layers * this.shape.heads * this.shape.headDim * attended;
  }
}
