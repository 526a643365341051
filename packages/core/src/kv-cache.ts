/**
 * KvCache: per-layer K and V storage with residency (paper §4.2: eviction engine + token
 * mapper). The most recent tokens live in a "window" (device memory in hybrid mode), older
 * ones in an offloaded "store" (host memory in hybrid mode); a token map records where every
 * position lives. Optionally the first `sinkTokens` positions stay pinned in the window
 * (attention sinks). For now both regions are tensors of the same backend.
 *
 * Layout: every region is a [kvHeads, capacity, headDim] tensor (per KV head, contiguous by
 * token), as the attention ops read. K and V are separate pools. The window holds the sinks at
 * slots [0, S) and a ring after them: appending never moves data, and eviction
 * (least-recently-generated) copies the oldest whole blocks of the ring to the end of the
 * store. So the store holds positions [S, S + storeCount) at slot = position − S, and the
 * whole cache is at most four spans in position order — sinks, store, two ring segments —
 * exactly the segments attention concatenates, without sorting.
 *
 * Host store (hybrid mode on a device backend, attachHostStore): the store lives only in host
 * memory of a host backend, page-locked, where the CPU stage reads it; the device store tensors
 * are freed, which is the device memory offloading exists to save. Every eviction copies the
 * moved K and V rows straight from the window's ring slots device → host on the backend's copy
 * stream, ordered after the compute that wrote them and before any later compute that reuses
 * the slots (one 2-D copy per layer, K/V and ring run); syncHostStore() waits for them.
 * A block that must attend over offloaded rows on the device (a prompt prefilled in several
 * blocks) brings one layer up at a time into a scratch pair, two pairs used in turn (the link's
 * double-buffered toDevice), so the device holds two layers' rows at most, and only once such a
 * block has run: loadContiguous(layer) lays the whole cache out at slot = position (sinks and
 * ring by device copies, the store by host → device copy) for one causal kernel over it;
 * loadStore(layer) brings only the store, where spanK/spanV find it (the row-by-row path).
 * Decode steps never need either: the hybrid runtime's CPU stage scores the offloaded rows.
 */
import { z } from "zod";
import {
  DTYPE_BYTES, type Backend, type DType, type HostCopy, type HostRegion, type HostTransfers, type KvStoreAllocator, type Tensor, check, fail, DEFAULT_SINK_TOKENS, GpuKvBudgetTokensSchema, SinkTokensSchema,
} from "@hybridgen/spec";

export const KvCacheOptionsSchema = z.object({
  layers: z.number().int().positive(),
  kvHeads: z.number().int().positive(),
  headDim: z.number().int().positive(),
  maxContext: z.number().int().positive(),
  dtype: z.enum(["f32", "f16", "bf16"]).default("f32"),
  /** Tokens kept resident in the window, sinks included; default: the whole context (no offloading). */
  gpuKvBudget: GpuKvBudgetTokensSchema.optional(),
  /** The first S positions stay in the window for good (attention sinks). */
  sinkTokens: SinkTokensSchema.default(DEFAULT_SINK_TOKENS),
  /** Eviction moves whole blocks of this many tokens. */
  evictBlock: z.number().int().positive().default(16),
  /** The most positions appended between two evictions (the prefill block). */
  maxAppend: z.number().int().positive().default(64),
});
export type KvCacheOptions = z.input<typeof KvCacheOptionsSchema>;

export type Residency = "window" | "store";

/**
 * Positions a cache of `maxContext` offloads at most: after an eviction more than budget − block
 * tokens stay in the window, so the store never holds more than context − budget + block (0 when
 * the budget covers the whole context).
 */
export function kvStoreCapacity(o: { readonly maxContext: number; readonly gpuKvBudget: number; readonly evictBlock: number }): number {
  return o.gpuKvBudget < o.maxContext ? Math.min(o.maxContext, o.maxContext - o.gpuKvBudget + o.evictBlock) : 0;
}

/**
 * Bytes a cache made with `options` takes: its window (on the cache's backend), its store (the
 * device's, or the host tiers' once attached or placed), and the two K/V scratch pairs of one
 * layer over the whole context that a prefill over a host store brings layers up into.
 */
export function kvCacheFootprint(options: KvCacheOptions): { readonly window: number; readonly store: number; readonly scratch: number; readonly storeCapacity: number } {
  const o = KvCacheOptionsSchema.parse(options);
  const budget = Math.min(o.gpuKvBudget ?? o.maxContext, o.maxContext);
  const windowCapacity = Math.min(o.maxContext, budget + Math.min(o.maxAppend, o.maxContext));
  const storeCapacity = kvStoreCapacity({ maxContext: o.maxContext, gpuKvBudget: budget, evictBlock: o.evictBlock });
  const row = o.kvHeads * o.headDim * DTYPE_BYTES[o.dtype];
  return { window: 2 * o.layers * windowCapacity * row, store: 2 * o.layers * storeCapacity * row, scratch: storeCapacity > 0 ? 4 * o.maxContext * row : 0, storeCapacity };
}

/** The host copy of the store (see attachHostStore). */
interface HostStore {
  readonly backend: Backend;
  readonly link: HostTransfers;
  readonly k: Tensor[];
  readonly v: Tensor[];
  readonly regions: HostRegion[]; // K then V of every layer
  readonly pinned: HostRegion[]; // those page-locked (all but file-backed ones)
  /** Close `backend` with the cache (it was made for the store alone). */
  readonly ownsBackend: boolean;
  /** Device → host copies issued since the last syncHostStore(). */
  pending: boolean;
}
const NONE = 0, WINDOW = 1, STORE = 2;

export class KvCache implements Disposable {
  readonly layers: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly maxContext: number;
  readonly dtype: DType;
  readonly gpuKvBudget: number;
  readonly sinkTokens: number;
  readonly evictBlock: number;
  readonly maxAppend: number;
  readonly windowCapacity: number;
  /** 0 when the budget covers the whole context. */
  readonly storeCapacity: number;
  readonly windowK: readonly Tensor[];
  readonly windowV: readonly Tensor[];
  /** The device store (made on first use); empty when storeCapacity is 0 or the store is in host memory. */
  get storeK(): readonly Tensor[] {
    this.ensureDeviceStore();
    return this._storeK;
  }
  get storeV(): readonly Tensor[] {
    this.ensureDeviceStore();
    return this._storeV;
  }

  /**
   * The store on the cache's backend, allocated when first needed: a store that attachHostStore
   * or placeStore puts elsewhere never takes device memory (at 1.5M tokens it would not fit).
   */
  private ensureDeviceStore(): void {
    if (this._storeK.length === 0 && this.storeCapacity > 0 && !this.host && !this.closed) {
      const shape = [this.kvHeads, this.storeCapacity, this.headDim];
      const k: Tensor[] = [], v: Tensor[] = [];
      try {
        for (let l = 0; l < this.layers; l++) {
          k.push(this.backend.alloc(shape, this.dtype));
          v.push(this.backend.alloc(shape, this.dtype));
        }
      } catch (e) {
        for (const t of [...k, ...v]) this.backend.free(t);
        throw e;
      }
      this._storeK = k;
      this._storeV = v;
    }
  }

  /**
   * Every cached position in position order as `spanCount` (≤ 4) spans: span s covers
   * positions [spanPos[s], spanPos[s] + spanLen[s]) at slots from spanSlot[s] of the region
   * spanRegion[s] (1 window, 2 store). Preallocated so the decode loop reads them without
   * allocating; spanK/spanV give the tensors.
   */
  readonly spanSlot = new Int32Array(4);
  readonly spanPos = new Int32Array(4);
  readonly spanLen = new Int32Array(4);
  readonly spanRegion = new Uint8Array(4);
  spanCount = 0;

  private readonly regionOf: Uint8Array;
  private readonly slotOf: Int32Array;
  private readonly ringCapacity: number;
  private _length = 0;
  private _storeCount = 0;
  private ringHead = 0; // ring index (0-based, slot − S) of the oldest ring token
  private stage: Tensor | null = null; // head-major staging rows for multi-token writes
  private readonly gatherIds: Int32Array;
  private gatherView: Int32Array | null = null;
  private closed = false;
  /** Bumped by reset(): a checkpoint of an earlier sequence no longer matches the store. */
  private generation = 0;
  private _rewinds = 0;
  private host: HostStore | null = null;
  private storeAllocator: KvStoreAllocator | null = null;
  private _storeK: Tensor[];
  private _storeV: Tensor[];
  /** Device scratch for loadStore()/loadContiguous(): two [K, V] pairs of maxContext slots used
   * in turn, the layer each holds (−1: none) and whether it holds the contiguous layout. */
  private readonly scratch: { k: Tensor; v: Tensor; layer: number; contiguous: boolean }[] = [];
  private scratchTurn = 0;

  constructor(private readonly backend: Backend, options: KvCacheOptions) {
    const parsed = KvCacheOptionsSchema.safeParse(options);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      fail(`invalid KV cache option ${issue.path.join(".")}: ${issue.message}`);
    }
    const o = parsed.data;
    this.layers = o.layers;
    this.kvHeads = o.kvHeads;
    this.headDim = o.headDim;
    this.maxContext = o.maxContext;
    this.dtype = o.dtype;
    this.gpuKvBudget = Math.min(o.gpuKvBudget ?? o.maxContext, o.maxContext);
    this.evictBlock = o.evictBlock;
    this.maxAppend = Math.min(o.maxAppend, o.maxContext);
    const offloads = this.gpuKvBudget < this.maxContext;
    this.sinkTokens = offloads ? o.sinkTokens : 0; // nothing is ever evicted otherwise
    check(!offloads || this.sinkTokens < this.gpuKvBudget,
      `KV cache: ${this.sinkTokens} sink tokens leave no room in a window budget of ${this.gpuKvBudget} (need sinks < budget)`);
    check(!offloads || this.evictBlock <= this.gpuKvBudget - this.sinkTokens,
      `KV eviction block (${this.evictBlock}) must not exceed the window budget less the sinks (${this.gpuKvBudget - this.sinkTokens})`);
    this.windowCapacity = Math.min(this.maxContext, this.gpuKvBudget + this.maxAppend);
    this.ringCapacity = this.windowCapacity - this.sinkTokens;
    this.storeCapacity = kvStoreCapacity(this);
    this.regionOf = new Uint8Array(this.maxContext);
    this.slotOf = new Int32Array(this.maxContext);
    this.gatherIds = new Int32Array(this.kvHeads * this.maxAppend);

    const alloc = (cap: number) => backend.alloc([this.kvHeads, cap, this.headDim], this.dtype);
    const wk: Tensor[] = [], wv: Tensor[] = [];
    try {
      for (let l = 0; l < this.layers; l++) {
        wk.push(alloc(this.windowCapacity));
        wv.push(alloc(this.windowCapacity));
      }
    } catch (e) {
      for (const t of [...wk, ...wv]) backend.free(t);
      throw e;
    }
    this.windowK = wk;
    this.windowV = wv;
    this._storeK = [];
    this._storeV = [];
  }

  /**
   * Keep the store in host memory only: tensors of `host` (a host backend, e.g. the CPU backend)
   * with the store's layout, pinned through `link` (the device backend's hostTransfers()), filled
   * by every later eviction with a device → host copy; the device store tensors are freed. Call
   * it before the first append. `ownsBackend`: close `host` when the cache closes (a backend made
   * for the store alone).
   */
  attachHostStore(host: Backend, link: HostTransfers, ownsBackend = false, allocator?: KvStoreAllocator): void {
    this.checkOpen();
    if (this.host) fail("KV cache: a host store is already attached");
    if (this.storeCapacity === 0) fail("KV cache: no store to keep in host memory (the window holds the whole context)");
    if (this._length > 0) fail(`KV cache: attach the host store before the first token (${this._length} are cached)`);
    if (this.storeAllocator) fail("KV cache: the store was placed already (placeStore); attach the host store with the allocator instead");
    if (!host.hostRegion) fail(`KV cache: backend '${host.name}' has no host memory to hold the store`);
    const k: Tensor[] = [], v: Tensor[] = [], regions: HostRegion[] = [], pinned: HostRegion[] = [];
    const shape = [this.kvHeads, this.storeCapacity, this.headDim];
    try {
      for (const [pool, list] of [["k", k], ["v", v]] as const) {
        for (let l = 0; l < this.layers; l++) {
          const t = allocator ? allocator.alloc(host, pool, l, shape, this.dtype) : host.alloc(shape, this.dtype);
          list.push(t);
          const r = host.hostRegion(t);
          regions.push(r);
          if (allocator && !allocator.pinnable(t)) continue; // file-backed: copies from it stay synchronous
          link.pin(r);
          pinned.push(r);
        }
      }
    } catch (e) {
      for (const r of pinned) link.unpin(r);
      for (const t of [...k, ...v]) host.free(t);
      allocator?.release();
      throw e;
    }
    this.storeAllocator = allocator ?? null;
    this.host = { backend: host, link, k, v, regions, pinned, pending: false, ownsBackend };
    for (const t of [...this._storeK, ...this._storeV]) this.backend.free(t);
    this._storeK = [];
    this._storeV = [];
  }

  /**
   * The store on the cache's own backend (a host backend: the CPU backend's hybrid attention),
   * reallocated from `allocator` before the first token: bound to NUMA nodes or file-backed.
   * With a device backend use attachHostStore(…, allocator) instead.
   */
  placeStore(allocator: KvStoreAllocator): void {
    this.checkOpen();
    if (this.host) fail("KV cache: the store is in host memory already; pass the allocator to attachHostStore");
    if (this.storeAllocator) fail("KV cache: the store was placed already");
    if (this.storeCapacity === 0) fail("KV cache: no store to place (the window holds the whole context)");
    if (this._length > 0) fail(`KV cache: place the store before the first token (${this._length} are cached)`);
    const shape = [this.kvHeads, this.storeCapacity, this.headDim];
    const k: Tensor[] = [], v: Tensor[] = [];
    try {
      for (const [pool, list] of [["k", k], ["v", v]] as const) {
        for (let l = 0; l < this.layers; l++) list.push(allocator.alloc(this.backend, pool, l, shape, this.dtype));
      }
    } catch (e) {
      for (const t of [...k, ...v]) this.backend.free(t);
      allocator.release();
      throw e;
    }
    for (const t of [...this._storeK, ...this._storeV]) this.backend.free(t);
    this._storeK = k;
    this._storeV = v;
    this.storeAllocator = allocator;
  }

  /** Whether the store is in host memory only (attachHostStore). */
  get storeInHost(): boolean {
    return this.host !== null;
  }

  /** The host backend holding the store (attachHostStore), whose CPU stage reads it; null without one. */
  get hostBackend(): Backend | null {
    return this.host?.backend ?? null;
  }

  /** Bytes of device memory the store would take on the device (K and V, every layer). */
  get storeBytes(): number {
    return 2 * this.layers * this.kvHeads * this.storeCapacity * this.headDim * DTYPE_BYTES[this.dtype];
  }

  /**
   * Before device ops of `layer` read store spans (spanK/spanV): with the store in host memory,
   * copy the layer's offloaded rows host → device into the next scratch pair (no-op otherwise).
   * Later compute ops wait for the copy; the one after next may reuse the pair.
   */
  loadStore(layer: number): void {
    this.checkOpen();
    if (!this.host || this._storeCount === 0) return;
    const s = this.upload(layer, 0);
    s.contiguous = false;
    s.layer = layer;
  }

  /**
   * With the store in host memory and rows offloaded: K and V of every cached position of
   * `layer` (the rows written so far) at slot = position of a device scratch pair, for one causal
   * kernel over slots [0, length). The store comes up by a host → device copy, sinks and ring
   * by device copies after the rows already written. Null otherwise (the cache's own spans serve).
   */
  loadContiguous(layer: number): { k: Tensor; v: Tensor } | null {
    this.checkOpen();
    if (!this.host || this._storeCount === 0) return null;
    const s = this.upload(layer, this.sinkTokens);
    const be = this.backend, mc = this.maxContext, wcap = this.windowCapacity;
    for (let i = 0; i < this.spanCount; i++) {
      if (this.spanRegion[i] !== WINDOW) continue;
      const pos = this.spanPos[i], slot = this.spanSlot[i], len = this.spanLen[i];
      for (let g = 0; g < this.kvHeads; g++) {
        be.copyRows(s.k, g * mc + pos, this.windowK[layer], g * wcap + slot, len);
        be.copyRows(s.v, g * mc + pos, this.windowV[layer], g * wcap + slot, len);
      }
    }
    s.contiguous = true;
    s.layer = layer;
    return s;
  }

  /** The layer's offloaded rows host → device into the next scratch pair, from slot `at`. */
  private upload(layer: number, at: number): { k: Tensor; v: Tensor; layer: number; contiguous: boolean } {
    const h = this.host!;
    if (!(Number.isInteger(layer) && layer >= 0 && layer < this.layers)) fail(`KV cache: layer ${layer} out of range [0, ${this.layers})`);
    this.syncHostStore(); // the evictions' rows must be in host memory before they go back up
    const turn = this.scratch.length < 2 ? this.scratch.length : this.scratchTurn; // pairs fill 0, 1 in order
    if (!this.scratch[turn]) {
      const alloc = () => this.backend.alloc([this.kvHeads, this.maxContext, this.headDim], this.dtype);
      const k = alloc();
      try {
        this.scratch.push({ k, v: alloc(), layer: -1, contiguous: false });
      } catch (e) {
        this.backend.free(k);
        throw e;
      }
    }
    this.scratchTurn = turn ^ 1;
    const s = this.scratch[turn];
    s.layer = -1;
    const row = this.headDim * DTYPE_BYTES[this.dtype], hostPitch = this.storeCapacity * row, tensorPitch = this.maxContext * row;
    const width = this._storeCount * row, tensorOffset = at * row;
    h.link.toDevice([
      { host: h.regions[layer], hostOffset: 0, tensor: s.k, tensorOffset, width, rows: this.kvHeads, hostPitch, tensorPitch },
      { host: h.regions[this.layers + layer], hostOffset: 0, tensor: s.v, tensorOffset, width, rows: this.kvHeads, hostPitch, tensorPitch },
    ]);
    return s;
  }

  /** Device scratch tensors loadStore()/loadContiguous() have allocated (0, 2 or 4). */
  get storeScratchTensors(): number {
    return this.scratch.length * 2;
  }

  /** The link of the host store (null without one). */
  get hostLink(): HostTransfers | null {
    return this.host?.link ?? null;
  }

  /** Store K of `layer` where the CPU stage reads it: the host store when attached, else the store. */
  stageStoreK(layer: number): Tensor {
    return this.host ? this.host.k[layer] : this.storeK[layer];
  }

  stageStoreV(layer: number): Tensor {
    return this.host ? this.host.v[layer] : this.storeV[layer];
  }

  private readonly syncStore = () => this.syncHostStore();

  /** Waits for the evictions' device → host copies (no-op without a host store or pending copies). */
  syncHostStore(): void {
    const h = this.host;
    if (!h || !h.pending) return;
    h.link.fence();
    h.pending = false;
  }

  /** Positions held (window + store). */
  get length(): number {
    return this._length;
  }
  /** Offloaded positions: the store holds [storeStart, storeStart + storeCount) at slot = position − storeStart. */
  get storeCount(): number {
    return this._storeCount;
  }
  /** Position of store slot 0 (the number of sink tokens). */
  get storeStart(): number {
    return this.sinkTokens;
  }
  /** Resident positions (sinks included). */
  get windowCount(): number {
    return this._length - this._storeCount;
  }
  /** Sink positions held so far (≤ sinkTokens). */
  get sinkCount(): number {
    return Math.min(this.sinkTokens, this._length);
  }

  /** Where position `pos` lives, from the token map. */
  locate(pos: number): { region: Residency; slot: number } {
    check(Number.isInteger(pos) && pos >= 0 && pos < this._length, `KV cache: position ${pos} is not cached (length ${this._length})`);
    return { region: this.regionOf[pos] === WINDOW ? "window" : "store", slot: this.slotOf[pos] };
  }

  /** The window's spans as objects (for tests and tools; the hot path reads span*). */
  windowSpans(): { slot: number; pos: number; count: number }[] {
    return this.spans().filter((s) => s.region === "window").map(({ slot, pos, count }) => ({ slot, pos, count }));
  }

  /** All spans in position order as objects. */
  spans(): { region: Residency; slot: number; pos: number; count: number }[] {
    return Array.from({ length: this.spanCount }, (_, s) => ({
      region: this.spanRegion[s] === STORE ? "store" as const : "window" as const,
      slot: this.spanSlot[s], pos: this.spanPos[s], count: this.spanLen[s],
    }));
  }

  /** K tensor of span s for `layer` (a store span in host memory: after loadStore(layer)). */
  spanK(s: number, layer: number): Tensor {
    if (this.spanRegion[s] !== STORE) return this.windowK[layer];
    return this.host ? this.loaded(layer).k : this.storeK[layer]!;
  }
  /** V tensor of span s for `layer`. */
  spanV(s: number, layer: number): Tensor {
    if (this.spanRegion[s] !== STORE) return this.windowV[layer];
    return this.host ? this.loaded(layer).v : this.storeV[layer]!;
  }

  private loaded(layer: number): { k: Tensor; v: Tensor } {
    const s = this.scratch.find((x) => x.layer === layer && !x.contiguous);
    if (!s) fail(`KV cache: layer ${layer}'s offloaded rows are in host memory; call loadStore(${layer}) before device ops read them`);
    return s;
  }

  /**
   * Give the next `n` positions window slots (their rows are then written layer by layer
   * with writeRows). Returns the first new position.
   */
  append(n: number): number {
    this.checkOpen();
    if (!(Number.isInteger(n) && n >= 1 && n <= this.maxAppend)) fail(`KV cache: cannot append ${n} positions at once (1..${this.maxAppend})`);
    if (this._length + n > this.maxContext) fail(`context overflow: ${this._length} + ${n} tokens exceed the context of ${this.maxContext}`);
    if (this.windowCount + n > this.windowCapacity) {
      fail(`KV cache: window full (${this.windowCount} + ${n} > ${this.windowCapacity}); call evict() between appends`);
    }
    const first = this._length, S = this.sinkTokens, rcap = this.ringCapacity;
    let ring = (this.ringHead + this.ringCount()) % rcap;
    for (let p = first; p < first + n; p++) {
      this.regionOf[p] = WINDOW;
      if (p < S) {
        this.slotOf[p] = p;
      } else {
        this.slotOf[p] = S + ring;
        ring = ring + 1 === rcap ? 0 : ring + 1;
      }
    }
    this._length += n;
    this.updateSpans();
    return first;
  }

  /** The window slot of position `pos` (appended and still in the window): where writeRows puts its K and V rows of every KV head. */
  windowSlot(pos: number): number {
    this.checkOpen();
    if (!(Number.isInteger(pos) && pos >= 0 && pos < this._length) || this.regionOf[pos] !== WINDOW) fail(`KV cache: position ${pos} is not in the window`);
    return this.slotOf[pos];
  }

  /**
   * Copy K and V of positions [firstPos, firstPos + n) for `layer` into their window slots.
   * `kRows`/`vRows` are f32 rows of width headDim, token-major: row i·kvHeads + g is KV head
   * g of token i (the natural layout of a k projection output seen at headDim width).
   */
  writeRows(layer: number, kRows: Tensor, vRows: Tensor, firstPos: number, n: number): void {
    this.checkOpen();
    if (!(Number.isInteger(layer) && layer >= 0 && layer < this.layers)) fail(`KV cache: layer ${layer} out of range [0, ${this.layers})`);
    if (!(n >= 1 && n <= this.maxAppend && firstPos >= 0 && firstPos + n <= this._length)) {
      fail(`KV cache: positions [${firstPos}, ${firstPos + n}) were not appended`);
    }
    if (this.regionOf[firstPos] !== WINDOW || this.regionOf[firstPos + n - 1] !== WINDOW) {
      fail(`KV cache: positions [${firstPos}, ${firstPos + n}) are no longer in the window`);
    }
    const be = this.backend, cap = this.windowCapacity, kvHeads = this.kvHeads;
    if (n === 1) {
      const slot0 = this.slotOf[firstPos];
      const wk = this.windowK[layer], wv = this.windowV[layer];
      for (let g = 0; g < kvHeads; g++) {
        be.copyRows(wk, g * cap + slot0, kRows, g, 1);
        be.copyRows(wv, g * cap + slot0, vRows, g, 1);
      }
      return;
    }
    // Gather to head-major order once, then one copy per KV head and run of consecutive
    // slots (sinks, ring, ring after wrap-around: at most three runs).
    const stage = this.stageRows();
    const ids = this.gatherIdsFor(n);
    for (const [src, dst] of [[kRows, this.windowK[layer]], [vRows, this.windowV[layer]]] as const) {
      be.embedding(stage, src, ids);
      let i = 0;
      while (i < n) {
        const slot0 = this.slotOf[firstPos + i];
        let run = 1;
        while (i + run < n && this.slotOf[firstPos + i + run] === slot0 + run) run++;
        for (let g = 0; g < kvHeads; g++) be.copyRows(dst, g * cap + slot0, stage, g * n + i, run);
        i += run;
      }
    }
  }

  /**
   * When the window holds more than its budget, move the oldest whole blocks of its ring
   * (every layer, K and V; sinks stay) to the end of the store. Returns the positions moved.
   */
  evict(): number {
    this.checkOpen();
    const over = this.windowCount - this.gpuKvBudget;
    if (over <= 0) return 0;
    const ringCount = this.ringCount();
    const count = Math.min(ringCount, Math.ceil(over / this.evictBlock) * this.evictBlock);
    if (count <= 0) return 0;
    const be = this.backend, wcap = this.windowCapacity, scap = this.storeCapacity, rcap = this.ringCapacity;
    const S = this.sinkTokens, head = this.ringHead, dst = this._storeCount;
    const first = Math.min(count, rcap - head);
    if (this.host) {
      this.copyToHost(dst, count, S + head, first);
    } else {
      for (let l = 0; l < this.layers; l++) {
        for (const [win, store] of [[this.windowK[l], this.storeK[l]!], [this.windowV[l], this.storeV[l]!]] as const) {
          for (let g = 0; g < this.kvHeads; g++) {
            be.copyRows(store, g * scap + dst, win, g * wcap + S + head, first);
            if (first < count) be.copyRows(store, g * scap + dst + first, win, g * wcap + S, count - first);
          }
        }
      }
    }
    for (const s of this.scratch) s.layer = -1; // the store changed: a block reloads it
    for (let p = S + dst; p < S + dst + count; p++) {
      this.regionOf[p] = STORE;
      this.slotOf[p] = p - S;
    }
    this._storeCount += count;
    this.ringHead = (head + count) % rcap;
    this.updateSpans();
    this.storeAllocator?.stored?.(this._storeCount, this.syncStore);
    return count;
  }

  /**
   * The cache's state now, to come back to with restore(): several continuations of one
   * prefilled context (an evaluation's questions, a prompt prefix reused). The store only grows
   * within a sequence, so its rows are not copied; the window (sinks and ring) is.
   */
  checkpoint(): KvCheckpoint {
    this.checkOpen();
    const be = this.backend, rows = this.kvHeads * this.windowCapacity, saved: Tensor[] = [];
    try {
      for (const t of [...this.windowK, ...this.windowV]) {
        const copy = be.alloc(t.shape, this.dtype);
        saved.push(copy);
        be.copyRows(copy, 0, t, 0, rows);
      }
    } catch (e) {
      for (const t of saved) be.free(t);
      throw e;
    }
    return new KvCheckpoint(be, this, this.generation, this._length, this._storeCount, this.ringHead,
      this.regionOf.slice(0, this._length), this.slotOf.slice(0, this._length), saved);
  }

  /** Back to a checkpoint of this cache's current sequence (positions appended since are forgotten). */
  restore(cp: KvCheckpoint): void {
    this.checkOpen();
    if (cp.cache !== this) fail("KV cache: the checkpoint belongs to another cache");
    if (cp.closed) fail("KV cache: the checkpoint was closed");
    if (cp.generation !== this.generation || cp.storeCount > this._storeCount) {
      fail("KV cache: the checkpoint is from an earlier sequence (reset since)");
    }
    this.syncHostStore();
    const rows = this.kvHeads * this.windowCapacity;
    [...this.windowK, ...this.windowV].forEach((t, i) => this.backend.copyRows(t, 0, cp.window[i]!, 0, rows));
    this.regionOf.fill(NONE, 0, this._length);
    this.regionOf.set(cp.regionOf);
    this.slotOf.set(cp.slotOf);
    this._length = cp.length;
    this._storeCount = cp.storeCount;
    this.ringHead = cp.ringHead;
    for (const s of this.scratch) s.layer = -1;
    this._rewinds++;
    this.updateSpans();
    this.storeAllocator?.stored?.(this._storeCount, this.syncStore);
  }

  /** Counts reset() and restore() calls: per-sequence state kept beside the cache (a selector's
   * summaries of the store) is stale once it changes. */
  get rewinds(): number {
    return this.generation + this._rewinds;
  }

  /** Forget every position (storage is kept for reuse). */
  reset(): void {
    this.checkOpen();
    this.generation++;
    this.regionOf.fill(NONE, 0, this._length);
    this._length = 0;
    this._storeCount = 0;
    this.ringHead = 0;
    this.spanCount = 0;
    for (const s of this.scratch) s.layer = -1;
    this.storeAllocator?.stored?.(0, this.syncStore);
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    const h = this.host;
    this.host = null;
    if (h) {
      try {
        h.link.fence(); // no DMA may still be writing memory about to be freed
      } finally {
        for (const r of h.pinned) h.link.unpin(r);
        for (const t of [...h.k, ...h.v]) h.backend.free(t);
        if (h.ownsBackend) h.backend[Symbol.dispose]();
      }
    }
    for (const t of [...this.windowK, ...this.windowV, ...this._storeK, ...this._storeV]) this.backend.free(t);
    this.storeAllocator?.release();
    this.storeAllocator = null;
    for (const s of this.scratch) {
      this.backend.free(s.k);
      this.backend.free(s.v);
    }
    this.scratch.length = 0;
    if (this.stage) this.backend.free(this.stage);
    this.stage = null;
  }

  [Symbol.dispose](): void {
    this.close();
  }

  /**
   * Window slots [slot, slot + first) then, when the ring wrapped, [S, S + count − first) of every
   * layer, K and V, to host store slots [dst, dst + count): device → host, one 2-D copy (a row per
   * KV head) for each run. The link orders later compute after them, so the slots may be reused.
   */
  private copyToHost(dst: number, count: number, slot: number, first: number): void {
    const h = this.host!, eb = DTYPE_BYTES[this.dtype], row = this.headDim * eb;
    const hostPitch = this.storeCapacity * row, tensorPitch = this.windowCapacity * row, S = this.sinkTokens;
    const copies: HostCopy[] = [];
    for (let l = 0; l < this.layers; l++) {
      for (const [tensor, host] of [[this.windowK[l], h.regions[l]], [this.windowV[l], h.regions[this.layers + l]]] as const) {
        copies.push({ host, hostOffset: dst * row, tensor, tensorOffset: slot * row, width: first * row, rows: this.kvHeads, hostPitch, tensorPitch });
        if (first < count) {
          copies.push({ host, hostOffset: (dst + first) * row, tensor, tensorOffset: S * row, width: (count - first) * row, rows: this.kvHeads, hostPitch, tensorPitch });
        }
      }
    }
    h.link.toHost(copies);
    h.pending = true;
  }

  /** Tokens in the ring (the window less the sinks). */
  private ringCount(): number {
    return this._length - this._storeCount - this.sinkCount;
  }

  private pushSpan(region: number, slot: number, pos: number, len: number): void {
    const s = this.spanCount++;
    this.spanRegion[s] = region;
    this.spanSlot[s] = slot;
    this.spanPos[s] = pos;
    this.spanLen[s] = len;
  }

  private updateSpans(): void {
    this.spanCount = 0;
    const S = this.sinkCount;
    if (S > 0) this.pushSpan(WINDOW, 0, 0, S);
    if (this._storeCount > 0) this.pushSpan(STORE, 0, this.sinkTokens, this._storeCount);
    const count = this.ringCount();
    if (count === 0) return;
    const pos = S + this._storeCount;
    const first = Math.min(count, this.ringCapacity - this.ringHead);
    this.pushSpan(WINDOW, this.sinkTokens + this.ringHead, pos, first);
    if (first < count) this.pushSpan(WINDOW, this.sinkTokens, pos + first, count - first);
  }

  private stageRows(): Tensor {
    this.stage ??= this.backend.alloc([this.kvHeads * this.maxAppend, this.headDim]);
    return this.stage;
  }

  /** ids[g·n + i] = i·kvHeads + g: token-major rows → head-major rows. */
  private gatherIdsFor(n: number): Int32Array {
    if (this.gatherView?.length !== n * this.kvHeads) {
      for (let g = 0; g < this.kvHeads; g++) for (let i = 0; i < n; i++) this.gatherIds[g * n + i] = i * this.kvHeads + g;
      this.gatherView = this.gatherIds.subarray(0, n * this.kvHeads);
    }
    return this.gatherView;
  }

  private checkOpen(): void {
    if (this.closed) fail("KV cache used after close()");
  }
}

/** A KvCache's state at one moment (KvCache.checkpoint); close it to free its copy of the window. */
export class KvCheckpoint implements Disposable {
  closed = false;
  constructor(
    private readonly backend: Backend,
    readonly cache: KvCache,
    readonly generation: number,
    readonly length: number,
    readonly storeCount: number,
    readonly ringHead: number,
    readonly regionOf: Uint8Array,
    readonly slotOf: Int32Array,
    readonly window: readonly Tensor[],
  ) {}

  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const t of this.window) this.backend.free(t);
  }

  [Symbol.dispose](): void {
    this.close();
  }
}
