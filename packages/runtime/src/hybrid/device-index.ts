/**
 * The page index's top level in device memory (issue 33's GPU-side pre-QKᵀ selector): per layer
 * the index's page level, page-major (the spec's DeviceIndexShape), ranked by Backend.indexRank
 * with the layer's query (q̃ when the stage runs ahead); the chosen pages travel to the host with the
 * query (right after it, indexChosenOffset), and the CPU stage only fills its lists from those
 * pages' rows ("index" work with `chosen`). The host keeps the definition's index (spec
 * page-index.ts) and folds the rows evicted since the last step into it, then the pages they touched
 * go up, so the device ranks every offloaded row, the newest included.
 */
import {
  type Backend, type DeviceIndexShape, type IndexFoldItem, type IndexKernel, type IndexRankRow, type OffloadedKeys, type PageIndex, type SelectorPrimitives, type Tensor, fail, indexFoldAll, indexWant, pageIndex,
  pageIndexLayout, PAGE_INDEX_FORM_CODE, seededRandom,
} from "@hybridgen/spec";
import type { DecodeBatchStep } from "@hybridgen/core";
import { StepMark, perOwner } from "./step-scope.js";

/** Bytes of the device's copy of an index over `capacity` rows a head (page level only, page-major). */
export function deviceIndexBytes(kvHeads: number, headDim: number, capacity: number, pageSize: number, form: IndexKernel["form"]): number {
  const pages = Math.ceil(capacity / pageSize), codeBytes = form === "int8" ? 2 * headDim : headDim;
  return pages * kvHeads * (codeBytes + 4);
}

export interface DeviceIndexParts {
  readonly backend: Backend;
  readonly kernel: IndexKernel;
  readonly layers: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  /** Rows per KV head of the store. */
  readonly capacity: number;
  /** Bytes of the uploads' staging buffer (default STAGE_BYTES; at least one page of every head). */
  readonly stageBytes?: number;
}

/** A device backend's free memory (its arena's), when it says (the CUDA backend's memory()). */
export function freeDeviceBytes(be: Backend): number | undefined {
  return (be as { memory?: () => { freeBytes: number } }).memory?.().freeBytes;
}

const gb = (b: number) => `${(b / 1e9).toFixed(2)} GB`;

/** Host bytes of every layer's index (page level and super-pages): the host folds evicted rows into it wherever the pages are ranked. */
export function hostIndexBytes(p: Omit<DeviceIndexParts, "backend" | "heads">): number {
  return p.layers * pageIndexLayout(p.kvHeads, p.headDim, p.capacity, p.kernel.pageSize, p.kernel.superPages, p.kernel.form).bytes;
}

/** One line, before any of it is written, when the index's host bytes exceed the host's available memory (the kernel's OOM kill otherwise, mid-run). */
export function checkHostIndex(bytes: number, availableBytes: number, placement: string): void {
  if (bytes > availableBytes) {
    fail(`page index: its host copy (${gb(bytes)}, every layer) does not fit the host's available ${gb(availableBytes)} (placement "${placement}"; form int4, larger pages or a shorter context need less)`);
  }
}

/** What the stage's query buffer takes from a ranking: the first `bytes` bytes of `tensor`, the query then the pages. */
export interface RankedQuery {
  readonly tensor: Tensor;
  readonly bytes: number;
}

/** A device index's shape (page-major, DeviceIndexShape) over `pages` pages a head. */
export function deviceIndexShape(form: IndexKernel["form"], kvHeads: number, group: number, headDim: number, pages: number): DeviceIndexShape {
  const codeBytes = form === "int8" ? 2 * headDim : headDim;
  return { form: PAGE_INDEX_FORM_CODE[form], kvHeads, group, headDim, pageCapacity: pages, scalesOffset: pages * kvHeads * codeBytes };
}

/**
 * Milliseconds one layer's ranking of the device index takes on `be`: `layers` rankings of `want`
 * pages among `shape.pageCapacity` random pages a head, recorded as one decode step where the backend
 * records (as a hybrid step's are), the best of `reps` runs over `layers`. The planner charges it: the
 * ranking's passes and launches cost past its bytes.
 */
export function timeIndexRank(be: Backend, shape: DeviceIndexShape, want: number, layers: number, reps = 5): number {
  if (!be.indexRank || !be.indexRankScratch) fail(`page index: the ${be.name} backend cannot rank pages on the device`);
  const need = be.indexRankScratch(shape, want);
  if (need === 0) fail(`page index: the ${be.name} backend does not rank ${shape.pageCapacity} pages a head, want ${want} (form ${shape.form}, headDim ${shape.headDim}, group ${shape.group})`);
  const rnd = seededRandom(shape.pageCapacity * 31 + want), made: Tensor[] = [];
  const alloc = (floats: number) => {
    const t = be.alloc([Math.ceil(floats)]);
    made.push(t);
    return t;
  };
  try {
    const codeFloats = shape.scalesOffset / 4, scales = shape.pageCapacity * shape.kvHeads;
    const index = alloc(codeFloats + scales), q = alloc(shape.kvHeads * shape.group * shape.headDim), out = alloc(shape.kvHeads * want), scratch = alloc(need / 4 + 1);
    // Codes as random bytes below 0x40 (no word of them a NaN on the way), in chunks; scales positive.
    const chunk = new Uint32Array(1 << 20);
    for (let at = 0; at < codeFloats; at += chunk.length) {
      for (let i = 0; i < chunk.length; i++) chunk[i] = (rnd() * 2 ** 32) & 0x3f3f3f3f;
      const n = Math.min(chunk.length, codeFloats - at);
      be.write(index, new Float32Array(chunk.buffer, 0, n), at);
    }
    be.write(index, Float32Array.from({ length: scales }, () => 1e-3 + rnd() * 1e-2), codeFloats);
    be.write(q, Float32Array.from({ length: shape.kvHeads * shape.group * shape.headDim }, () => rnd() * 2 - 1));
    const key = `index-rank-${shape.form}-${shape.kvHeads}-${shape.group}-${shape.headDim}-${shape.pageCapacity}-${want}-${layers}`;
    const run = () => {
      const t0 = performance.now();
      be.beginStep?.(key);
      for (let l = 0; l < layers; l++) be.indexRank!(out, 0, index, shape, q, shape.pageCapacity, want, scratch);
      be.endStep?.();
      be.read(out, 0, 1); // waits for the rankings
      return performance.now() - t0;
    };
    run(); // a recording backend captures the step here
    let best = Infinity;
    for (let r = 0; r < reps; r++) best = Math.min(best, run());
    return best / layers;
  } finally {
    for (const t of made) be.free(t);
  }
}

/**
 * What the planner charges for a device index's ranking (RunPlanInput gpu.indexRankMs), in one
 * place: the want of a step's widest layer (candidates·K of the offloaded rows, in pages) and one
 * layer's ranking at that want on `be` (timeIndexRank).
 */
export function indexRankCharge(be: Backend, shape: DeviceIndexShape, o: { k: number; candidates: number; offloaded: number; pageSize: number; layers: number }): { want: number; indexRankMs: number } {
  const want = indexWant(o.k * o.candidates, o.offloaded, o.pageSize);
  return { want, indexRankMs: timeIndexRank(be, shape, want, o.layers) };
}

/** Bytes of the uploads' staging buffer: a step's one new page a layer is ~66 KB at the 8B shape; a sequence's first fold goes up in runs of this. */
const STAGE_BYTES = 4 << 20;

/** The most pages a head may ask for (the kernel's limit, WANT_MAX in native/page_index.cuh, bounds the search). */
const WANT_LIMIT = 256;

export class DeviceIndex implements Disposable {
  readonly shape: DeviceIndexShape;
  readonly bytes: number;
  private readonly backend: Backend;
  private readonly kernel: IndexKernel;
  private readonly host: PageIndex[] = [];
  private readonly device: Tensor[] = [];
  /** One row: the query, then the chosen pages (int32), sent to the host in one copy. */
  /** By layer parity: a batch ranks the next layer of every row before a row has sent this one. */
  private readonly out: Tensor[] = [];
  private readonly outQuery: Tensor[] = [];
  private readonly scratch: Tensor;
  /** Bytes of the query at the start of a ranking's output; its pages follow. */
  readonly queryBytes: number;
  /** Uploads go through one staging buffer: a step's pages of every layer cross in one write, then device copies (queued as one batch where the backend batches). */
  private readonly stageHost: Uint8Array;
  private readonly stageDevice: Tensor;
  private stageUsed = 0;
  private readonly stageCopies: { readonly layer: number; readonly at: number; readonly from: number; readonly floats: number }[] = [];
  /** Offloaded rows folded into the host index and uploaded, per layer. */
  private readonly summarized: number[];
  /** Pages [p0, p1) of a layer folds() counted and uploadFolded() has not sent yet. */
  private readonly unsent: { readonly layer: number; readonly p0: number; readonly p1: number }[] = [];
  private readonly maxWant: number;

  /** Whether the backend ranks this index's shape at all (headDim, group, form). */
  static ranks(p: DeviceIndexParts): boolean {
    const shape = deviceIndexShape(p.kernel.form, p.kvHeads, p.heads / p.kvHeads, p.headDim, Math.ceil(p.capacity / p.kernel.pageSize));
    return (p.backend.indexRankScratch?.(shape, 1) ?? 0) > 0;
  }

  /** Device bytes of every layer's index for these parts. */
  static bytesFor(p: DeviceIndexParts): number {
    return p.layers * deviceIndexBytes(p.kvHeads, p.headDim, p.capacity, p.kernel.pageSize, p.kernel.form);
  }

  constructor(p: DeviceIndexParts) {
    const be = p.backend;
    if (!be.indexRank || !be.indexRankScratch) fail(`page index: the ${be.name} backend cannot rank pages on the device (placement "device")`);
    const k = p.kernel, pageCapacity = Math.ceil(p.capacity / k.pageSize);
    this.backend = be;
    this.kernel = k;
    this.shape = deviceIndexShape(k.form, p.kvHeads, p.heads / p.kvHeads, p.headDim, pageCapacity);
    this.bytes = deviceIndexBytes(p.kvHeads, p.headDim, p.capacity, k.pageSize, k.form);
    // The widest choice the backend ranks at this capacity (its candidates bound it), found once.
    let lo = 0, hi = Math.min(pageCapacity, WANT_LIMIT);
    while (lo < hi) {
      const mid = Math.ceil((lo + hi) / 2);
      if (be.indexRankScratch(this.shape, mid) > 0) lo = mid;
      else hi = mid - 1;
    }
    if (lo === 0) fail(`page index: the ${be.name} backend does not rank ${pageCapacity} pages of form ${k.form} (headDim ${p.headDim}, ${this.shape.group} query heads a KV head)`);
    this.maxWant = lo;
    // Enough for any want up to the widest: a batched ranking lays every row out at the rows' largest want.
    let scratchBytes = 0;
    for (let w = 1; w <= lo; w++) scratchBytes = Math.max(scratchBytes, be.indexRankScratch(this.shape, w));
    const free = freeDeviceBytes(be);
    if (free !== undefined && this.bytes * p.layers > free) {
      fail(`page index: the device index (${gb(this.bytes * p.layers)} for ${p.layers} layers) does not fit the device's free ${gb(free)} (placement "device"; "host" keeps it on the CPU stage)`);
    }
    this.queryBytes = p.heads * p.headDim * 4;
    this.summarized = new Array(p.layers).fill(0);
    const width = p.heads * p.headDim, made: Tensor[] = [];
    try {
      for (let l = 0; l < p.layers; l++) {
        this.host.push(pageIndex(p.kvHeads, p.headDim, p.capacity, k.pageSize, k.superPages, k.form));
        made.push(be.alloc([Math.ceil(this.bytes / 4)]));
      }
      for (const _ of [0, 1]) {
        const out = be.alloc([1, width + Math.ceil(p.kvHeads * this.maxWant / 4) * 4]);
        made.push(out);
        this.out.push(out);
        this.outQuery.push(be.view(out, 0, [1, width]));
      }
      this.scratch = be.alloc([Math.ceil(scratchBytes / 4)]);
      made.push(this.scratch);
      this.stageHost = new Uint8Array(Math.ceil(Math.max(p.stageBytes ?? STAGE_BYTES, p.kvHeads * (2 * p.headDim + 4)) / 4) * 4);
      this.stageDevice = be.alloc([this.stageHost.length / 4]);
    } catch (e) {
      for (const t of made) be.free(t);
      throw e;
    }
    this.device = made.slice(0, p.layers);
  }

  /**
   * Before a step with `offloaded` rows: folds each layer's rows evicted since the last call into the
   * host index (afresh when the store shrank: a new sequence) and uploads the pages they touched.
   */
  sync(offloaded: number, P: SelectorPrimitives, keysOf: (layer: number) => OffloadedKeys): void {
    indexFoldAll(P, this.folds(offloaded, keysOf));
    this.uploadFolded();
  }

  /**
   * sync() in two halves, so a batch's rows fold as one call (IndexSyncBatch): the folds this step
   * needs (the host indexes counted as folded from here on), then uploadFolded() once they ran.
   */
  folds(offloaded: number, keysOf: (layer: number) => OffloadedKeys): IndexFoldItem[] {
    const items: IndexFoldItem[] = [];
    for (let l = 0; l < this.host.length; l++) {
      let from = this.summarized[l]!;
      if (offloaded === from) continue;
      if (offloaded < from) from = 0;
      const x = this.host[l]!;
      if (from === 0) x.data.fill(0);
      items.push({ keys: keysOf(l), from, to: offloaded, index: x });
      this.summarized[l] = offloaded;
      this.unsent.push({ layer: l, p0: Math.floor(from / this.kernel.pageSize), p1: Math.ceil(offloaded / this.kernel.pageSize) });
    }
    return items;
  }

  /** After folds()' items were folded: their pages go up (one staging write, then device copies). */
  uploadFolded(): void {
    for (const u of this.unsent) this.upload(u.layer, this.host[u.layer]!, u.p0, u.p1, this.shape.kvHeads);
    this.unsent.length = 0;
    this.flushStage();
  }

  /** Rows a page of the index. */
  get pageSize(): number {
    return this.kernel.pageSize;
  }

  /** A new sequence: the next sync folds its store from row 0 (its count alone may have grown past the last one's). */
  reset(): void {
    this.summarized.fill(0);
    this.unsent.length = 0;
  }

  /** Pages [p0, p1) of every head, head-major on the host, page-major on the device: into the staging buffer, in runs of pages that fit it. */
  private upload(layer: number, x: PageIndex, p0: number, p1: number, kv: number): void {
    const cb = x.codeBytes, perPage = kv * (cb + 4);
    const hostScales = new Float32Array(x.data.buffer, x.data.byteOffset + x.pageScales, kv * x.pageCapacity);
    for (let a = p0; a < p1;) {
      if (this.stageHost.length - this.stageUsed < perPage) this.flushStage();
      const b = Math.min(p1, a + Math.floor((this.stageHost.length - this.stageUsed) / perPage)), n = b - a;
      const codesAt = this.stageUsed, scalesAt = codesAt + n * kv * cb;
      const scales = new Float32Array(this.stageHost.buffer, scalesAt, n * kv);
      for (let g = 0; g < kv; g++) {
        for (let p = a; p < b; p++) {
          const at = x.pageCodes + (g * x.pageCapacity + p) * cb;
          this.stageHost.set(x.data.subarray(at, at + cb), codesAt + ((p - a) * kv + g) * cb);
          scales[(p - a) * kv + g] = hostScales[g * x.pageCapacity + p]!;
        }
      }
      this.stageCopies.push({ layer, at: (a * kv * cb) / 4, from: codesAt / 4, floats: (n * kv * cb) / 4 });
      this.stageCopies.push({ layer, at: this.shape.scalesOffset / 4 + a * kv, from: scalesAt / 4, floats: n * kv });
      this.stageUsed = scalesAt + n * kv * 4;
      a = b;
    }
  }

  /** The staged pages up in one write, then each run copied to its layer's index on the device (in stream order: a later write waits for these copies). */
  private flushStage(): void {
    if (this.stageUsed === 0) return;
    const be = this.backend;
    be.write(this.stageDevice, new Float32Array(this.stageHost.buffer, 0, this.stageUsed / 4));
    for (const c of this.stageCopies) be.copyRows(be.view(this.device[c.layer]!, c.at, [1, c.floats]), 0, be.view(this.stageDevice, c.from, [1, c.floats]), 0, 1);
    this.stageCopies.length = 0;
    this.stageUsed = 0;
  }

  /**
   * Layer `layer`'s best pages for a list of `budget` of `offloaded` rows, ranked with row 0 of q:
   * the tensor whose first `bytes` bytes are the query then the pages (what the stage's query buffer takes).
   */
  rank(layer: number, q: Tensor, offloaded: number, budget: number): RankedQuery {
    const r = this.row(layer, q, offloaded, budget);
    if (r.row) this.rankRow(r.row);
    return r.ranked;
  }

  /** A row()'s ranking (its scratch is the index's one: a step's rankings run in stream order on one stream, compute or side). */
  rankRow(row: IndexRankRow): void {
    this.backend.indexRank!(row.out, row.outOffset, row.index, this.shape, row.q, row.count, row.want, row.scratch);
  }

  /**
   * rank() up to the ranking itself: the query is in the output, `row` the ranking's arguments (null:
   * no page wanted), `ranked` what the stage's query buffer takes once it ran (Backend.indexRankRows ranks many rows at once).
   */
  row(layer: number, q: Tensor, offloaded: number, budget: number): { readonly row: IndexRankRow | null; readonly ranked: RankedQuery } {
    // A batch whose last row has no hybrid attention never flushed its sync: the first ranking does.
    if (this.unsent.length > 0) IndexSyncBatch.of(this.backend).flush();
    if (this.unsent.length > 0) fail("page index: a ranking before the step's folded pages were uploaded");
    const want = indexWant(budget, offloaded, this.kernel.pageSize);
    if (want > this.maxWant) fail(`page index: K ${budget} needs ${want} pages a KV head, past the ${this.maxWant} the device ranks at ${this.shape.pageCapacity} pages (a smaller K or larger pages)`);
    const out = this.out[layer & 1]!;
    this.backend.copyRows(this.outQuery[layer & 1]!, 0, q, 0, 1);
    // Whole 16-byte units: a device's signalled copy moves no less (the pages' tail past kvHeads·want is not read).
    const ranked = { tensor: out, bytes: this.queryBytes + Math.ceil((this.shape.kvHeads * want) / 4) * 16 };
    const row = want > 0 ? { out, outOffset: this.queryBytes, index: this.device[layer]!, q, count: Math.ceil(offloaded / this.kernel.pageSize), want, scratch: this.scratch } : null;
    return { row, ranked };
  }

  close(): void {
    for (const t of this.device.splice(0)) this.backend.free(t);
    for (const t of this.out) this.backend.free(t);
    this.backend.free(this.scratch);
    this.backend.free(this.stageDevice);
  }

  [Symbol.dispose](): void {
    this.close();
  }
}

/**
 * The device indexes of a batched step's rows synced together: each row's beginStep joins with the
 * folds its index needs, and the step's last row runs every row's as one indexFoldAll (a native
 * stage's one pool op for the batch's rows × layers, where each row's own sync was a fold call a
 * layer on the driving thread), then each index uploads its pages. One per backend (IndexSyncBatch.of).
 */
export class IndexSyncBatch {
  private readonly mark = new StepMark();
  private readonly members: DeviceIndex[] = [];
  private readonly items: IndexFoldItem[] = [];
  private P: SelectorPrimitives | null = null;
  /** indexFoldAll calls made for batches (a test counts them: one a step). */
  calls = 0;

  static readonly of = perOwner((_backend: Backend) => new IndexSyncBatch());

  /** A row's index with the folds it needs this step (`step`'s serial); P: the primitives that fold them. */
  join(step: DecodeBatchStep, index: DeviceIndex, items: readonly IndexFoldItem[], P: SelectorPrimitives): void {
    if (this.mark.moveTo(step)) {
      this.members.length = 0;
      this.items.length = 0;
      this.P = null;
    }
    this.P ??= P;
    this.members.push(index);
    this.items.push(...items);
  }

  /** Every joined row's folds as one call, then their uploads (the step's last row calls it once the rows have joined; without a step: whatever joined). */
  flush(step: DecodeBatchStep | null = this.mark.step): void {
    if (!this.mark.holds(step) || this.members.length === 0) return;
    if (this.items.length > 0) {
      this.calls++;
      indexFoldAll(this.P!, this.items);
    }
    for (const m of this.members) m.uploadFolded();
    this.members.length = 0;
    this.items.length = 0;
  }
}
