/**
 * The Quest kernel's page summaries in the CPU stage: per store K tensor, the per-page, per-channel
 * min and max of its rows (min [kvHeads, pageCapacity, headDim] f32, then max), in native memory
 * of their own. A job folds in the rows evicted since the tensor's last quest job.
 */
import { FFIType, type Pointer } from "bun:ffi";
import { fail } from "@hybridgen/core";
import { openNativeSymbols } from "./native.js";
import type { CpuTensor } from "./tensor.js";

const { ptr, u64, void: none } = FFIType;
const symbols = {
  hg_alloc: { args: [u64], returns: ptr },
  hg_free: { args: [ptr, u64], returns: none },
} as const;
let lib: ReturnType<typeof openNativeSymbols<typeof symbols>> | undefined;
const mem = () => (lib ??= openNativeSymbols(symbols));

interface Region { p: Pointer; bytes: number; pageSize: number; pageCapacity: number; summarized: number; epoch: number | undefined }

export class PageSummaryRegions {
  private readonly regions = new Map<CpuTensor, Region>();

  constructor(private readonly kvHeads: number, private readonly capacity: number, private readonly headDim: number) {}

  /**
   * The summaries of `k` and the first row they lack (the job folds in rows [from, offloaded)).
   * A new epoch (rows may have been rewritten), another page size or fewer rows than folded start over.
   */
  region(k: CpuTensor, offloaded: number, pageSize: number, epoch: number | undefined): { address: Pointer; pageCapacity: number; from: number } {
    for (const [t, r] of this.regions) if (t.dead) this.drop(t, r); // its store was freed
    let r = this.regions.get(k);
    if (r && r.pageSize !== pageSize) {
      this.drop(k, r);
      r = undefined;
    }
    if (!r) {
      const pageCapacity = Math.ceil(this.capacity / pageSize), bytes = 2 * this.kvHeads * pageCapacity * this.headDim * 4;
      const p = mem().hg_alloc(bytes);
      if (!p) fail(`cpu stage: could not allocate ${bytes} bytes for Quest page summaries`);
      r = { p: p as Pointer, bytes, pageSize, pageCapacity, summarized: 0, epoch };
      this.regions.set(k, r);
    }
    if (r.epoch !== epoch || offloaded < r.summarized) r.summarized = 0;
    r.epoch = epoch;
    const from = r.summarized;
    r.summarized = offloaded;
    return { address: r.p, pageCapacity: r.pageCapacity, from };
  }

  /** Bytes held by the summaries. */
  get bytes(): number {
    let b = 0;
    for (const r of this.regions.values()) b += r.bytes;
    return b;
  }

  close(): void {
    for (const [t, r] of this.regions) this.drop(t, r);
  }

  private drop(t: CpuTensor, r: Region): void {
    mem().hg_free(r.p, r.bytes);
    this.regions.delete(t);
  }
}
