/**
 * The page index kernel's indexes in the CPU stage: per store K tensor, core's page index
 * (pageIndexLayout's bytes) in native memory of its own. A job folds in the rows evicted since the
 * tensor's last index job; a new epoch, another shape or fewer rows than folded start over.
 */
import type { Pointer } from "bun:ffi";
import { pageIndexLayout, type PageIndexForm } from "@hybridgen/core";
import type { CpuTensor } from "./tensor.js";
import { TensorRegions, type NativeRegion } from "./tensor-regions.js";

interface Region extends NativeRegion { key: string; pageCapacity: number; summarized: number; epoch: number | undefined }

export class PageIndexRegions {
  private readonly regions = new TensorRegions<Region>("the page index");

  constructor(private readonly kvHeads: number, private readonly capacity: number, private readonly headDim: number) {}

  /** The index of `k` and the first row it lacks (the job folds in rows [from, offloaded)). */
  region(k: CpuTensor, offloaded: number, form: PageIndexForm, pageSize: number, superPages: number, epoch: number | undefined): { address: Pointer; pageCapacity: number; from: number } {
    const key = `${form}/${pageSize}/${superPages}`;
    let r = this.regions.get(k);
    if (r && r.key !== key) {
      this.regions.drop(k);
      r = undefined;
    }
    if (!r) {
      const layout = pageIndexLayout(this.kvHeads, this.headDim, this.capacity, pageSize, superPages, form);
      r = this.regions.alloc(k, layout.bytes, (p) => ({ p, bytes: layout.bytes, key, pageCapacity: layout.pageCapacity, summarized: 0, epoch }));
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

  get bytes(): number {
    return this.regions.bytes;
  }

  close(): void {
    this.regions.close();
  }
}
