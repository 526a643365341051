/**
 * Native memory a CPU stage keeps per store K tensor (key sketches, Quest page summaries), apart
 * from the store's own: made on first use, freed at close() or as soon as its tensor is freed.
 */
import { FFIType, type Pointer } from "bun:ffi";
import { fail } from "@hybridgen/spec";
import { openNativeSymbols } from "./native.js";
import type { CpuTensor } from "./tensor.js";

const { ptr, u64, void: none } = FFIType;
const symbols = {
  hg_alloc: { args: [u64], returns: ptr },
  hg_free: { args: [ptr, u64], returns: none },
} as const;
let lib: ReturnType<typeof openNativeSymbols<typeof symbols>> | undefined;
const mem = () => (lib ??= openNativeSymbols(symbols));

/** What every region has: its native address and size; the owner adds its own progress fields. */
export interface NativeRegion {
  readonly p: Pointer;
  readonly bytes: number;
}

export class TensorRegions<R extends NativeRegion> {
  private readonly regions = new Map<CpuTensor, R>();

  /** `what` names the contents in the allocation error, e.g. "Quest page summaries". */
  constructor(private readonly what: string) {}

  /** `k`'s region, if it has one, after freeing those of freed tensors (their stores went). */
  get(k: CpuTensor): R | undefined {
    for (const [t, r] of this.regions) if (t.dead) this.free(t, r);
    return this.regions.get(k);
  }

  /** A new region of `bytes` for `k`, its fields from `make` given the address. */
  alloc(k: CpuTensor, bytes: number, make: (p: Pointer) => R): R {
    const p = mem().hg_alloc(bytes);
    if (!p) fail(`cpu stage: could not allocate ${bytes} bytes for ${this.what}`);
    const r = make(p as Pointer);
    this.regions.set(k, r);
    return r;
  }

  /** Frees `k`'s region (a no-op without one). */
  drop(k: CpuTensor): void {
    const r = this.regions.get(k);
    if (r) this.free(k, r);
  }

  /** Bytes held by all regions. */
  get bytes(): number {
    let b = 0;
    for (const r of this.regions.values()) b += r.bytes;
    return b;
  }

  close(): void {
    for (const [t, r] of this.regions) this.free(t, r);
  }

  private free(t: CpuTensor, r: R): void {
    mem().hg_free(r.p, r.bytes);
    this.regions.delete(t);
  }
}

interface Folded extends NativeRegion { key: string; folded: number; epoch: number | undefined }

/**
 * Regions derived from a store's rows that stage jobs extend as the store grows (Quest's page
 * summaries, the page index): a job folds in the rows since the tensor's last one. Contents of
 * another kind (`key`: a page size, a form), a new epoch (rows may have been rewritten) or fewer
 * rows than folded start over.
 */
export class FoldedRegions {
  private readonly regions: TensorRegions<Folded>;

  constructor(what: string) {
    this.regions = new TensorRegions(what);
  }

  /** `k`'s region of `bytes` for contents `key`, and the first row it lacks (the job folds in rows [from, offloaded)). */
  region(k: CpuTensor, offloaded: number, key: string, bytes: number, epoch: number | undefined): { address: Pointer; from: number } {
    let r = this.regions.get(k);
    if (r && r.key !== key) {
      this.regions.drop(k);
      r = undefined;
    }
    r ??= this.regions.alloc(k, bytes, (p) => ({ p, bytes, key, folded: 0, epoch }));
    if (r.epoch !== epoch || offloaded < r.folded) r.folded = 0;
    r.epoch = epoch;
    const from = r.folded;
    r.folded = offloaded;
    return { address: r.p, from };
  }

  /** The next region() of `k` starts over (a job that was to fold in its rows failed). */
  forget(k: CpuTensor): void {
    const r = this.regions.get(k);
    if (r) r.folded = 0;
  }

  /** Bytes held by the regions. */
  get bytes(): number {
    return this.regions.bytes;
  }

  close(): void {
    this.regions.close();
  }
}
