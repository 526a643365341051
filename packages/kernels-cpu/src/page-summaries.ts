/**
 * The Quest kernel's page summaries in the CPU stage: per store K tensor, the per-page, per-channel
 * min and max of its rows (min [kvHeads, pageCapacity, headDim] bf16, then max), in native memory
 * of their own. A job folds in the rows evicted since the tensor's last quest job. bf16 rounded
 * outward (min toward −∞, max toward +∞; core's summarizePages): the bounds read half f32's bytes
 * and still bound every q·k.
 */
import type { Pointer } from "bun:ffi";
import type { CpuTensor } from "./tensor.js";
import { TensorRegions, type NativeRegion } from "./tensor-regions.js";

interface Region extends NativeRegion { pageSize: number; pageCapacity: number; summarized: number; epoch: number | undefined }

export class PageSummaryRegions {
  private readonly regions = new TensorRegions<Region>("Quest page summaries");

  constructor(private readonly kvHeads: number, private readonly capacity: number, private readonly headDim: number) {}

  /**
   * The summaries of `k` and the first row they lack (the job folds in rows [from, offloaded)).
   * A new epoch (rows may have been rewritten), another page size or fewer rows than folded start over.
   */
  region(k: CpuTensor, offloaded: number, pageSize: number, epoch: number | undefined): { address: Pointer; pageCapacity: number; from: number } {
    let r = this.regions.get(k);
    if (r && r.pageSize !== pageSize) {
      this.regions.drop(k);
      r = undefined;
    }
    if (!r) {
      const pageCapacity = Math.ceil(this.capacity / pageSize), bytes = 2 * this.kvHeads * pageCapacity * this.headDim * 2;
      r = this.regions.alloc(k, bytes, (p) => ({ p, bytes, pageSize, pageCapacity, summarized: 0, epoch }));
    }
    if (r.epoch !== epoch || offloaded < r.summarized) r.summarized = 0;
    r.epoch = epoch;
    const from = r.summarized;
    r.summarized = offloaded;
    return { address: r.p, pageCapacity: r.pageCapacity, from };
  }

  /** The next region() of `k` starts over (a job that was to fold in its rows failed). */
  forget(k: CpuTensor): void {
    const r = this.regions.get(k);
    if (r) r.summarized = 0;
  }

  /** Bytes held by the summaries. */
  get bytes(): number {
    return this.regions.bytes;
  }

  close(): void {
    this.regions.close();
  }
}
