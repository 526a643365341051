/**
 * DeviceStaging: the device's side of the CPU stage's buffers, for the transports whose rows cross
 * a host link (staged, mapped, handed off). It pins the stage's buffers, brings each layer's query
 * to the host and the stage's selected logits and rows to the device, and reads T_gpu / T_tx from
 * the link's events. It decides nothing: the transport says which op each layer takes.
 *
 * Double buffering by layer parity (the stage's slots): layer l's logits land straight in
 * scores[l & 1] from column `col` and its rows in the slot's row buffers, so the copy for layer l
 * only has to wait for the compute of layer l − 2, never for the layer the compute stream is working
 * on. With the window as a flash-decode partial the score rows hold the selected columns alone
 * ([heads, rows], col 0, grown with the row buffers); only a materialised window (tracked scores,
 * or a backend without attnPartial/attnMerge) needs whole [heads, maxContext] rows, col storeStart.
 * The gathered-row buffers hold the widest selection so far (selectionRows), not the whole store;
 * reserve() grows them.
 *
 * The done signals of handed-off jobs are a word of this staging's own (pinDoneWord), so the stages
 * of a batch's sequences, which share the link and run at their own pace, never satisfy or roll
 * back one another's waits.
 */
import {
  type Backend, type HandOffRow, type KeepRow, type RescoreRow, type SignalledSend, type HostCopy, type HostRegion, type HostSignal, type HostTransfers, type RowFetch, type RowFetchGather, type RowGather, type Tensor, DTYPE_BYTES, fail, type CpuStage,
} from "@hybridgen/spec";
import type { KvCache } from "@hybridgen/core";
import { GatheredValues } from "@hybridgen/spec/kit";
import { grownRows } from "../row-path.js";

/** The host block that holds a staging's done word: a device link pins and maps only whole blocks of 2 MiB or more (the CUDA link). */
const DONE_BLOCK_BYTES = 2 << 20;

interface Regions {
  readonly query: HostRegion;
  readonly logits: HostRegion;
  readonly values: HostRegion;
  readonly keys: HostRegion | null;
  readonly table?: HostRegion;
}

export interface DeviceStagingOptions {
  /** Rows per KV head the gathered-row buffers start with (selectionRows of the first step's K). */
  readonly rows: number;
  /** Some layer's device scores the selected K rows (verified logits), so they come up too. */
  readonly keys: boolean;
  /** The window's logits are materialised beside the selected ones: the score rows span the whole context. */
  readonly wholeRows: boolean;
}

export class DeviceStaging implements Disposable {
  readonly link: HostTransfers;
  private readonly regions: Regions[];
  private readonly pinned: HostRegion[] = [];
  /** Per slot, one row a head: the selected logits from column `col` (and the window's, with whole rows). */
  readonly scores: Tensor[] = [];
  /** Column of the first selected logit in a score row: the store's (storeStart) in a whole row, else 0. */
  readonly col: number;
  private readonly wholeRows: boolean;
  private values: GatheredValues[] = [];
  /** The selected K rows per slot, for verified logits. */
  private keys: (GatheredValues | null)[] = [];
  private rowsPerHead: number;
  /** The host word the jobs' done signals are raised in (pinned and mapped), and the last value handed out. */
  private doneWord: { readonly tensor: Tensor; readonly region: HostRegion } | null = null;
  private doneValue = 0;
  /** The side-stream fetches of a handed-off step (null: the compute stream gathers). */
  private fetcher: RowFetch | null = null;
  private closed = false;

  constructor(
    private readonly backend: Backend,
    private readonly cache: KvCache,
    stage: CpuStage,
    private readonly heads: number,
    private readonly headDim: number,
    options: DeviceStagingOptions,
  ) {
    const link = cache.hostLink;
    if (!link) fail("hybrid attention: the KV cache has no host store (attachHostStore) for a device backend");
    if (!stage.hostStaging) fail(`hybrid attention: CPU stage '${stage.name}' does not expose host staging buffers for the device's copies`);
    this.link = link;
    this.regions = [stage.hostStaging(0), stage.hostStaging(1)];
    this.rowsPerHead = Math.max(1, Math.min(cache.storeCapacity, options.rows));
    this.wholeRows = options.wholeRows;
    this.col = options.wholeRows ? cache.storeStart : 0;
    try {
      for (const r of this.regions) {
        for (const region of [r.query, r.logits, r.values, ...(r.keys ? [r.keys] : []), ...(r.table ? [r.table] : [])]) {
          link.pin(region);
          this.pinned.push(region);
        }
      }
      this.allocScores();
      this.allocRows(options.keys);
    } catch (e) {
      this.close();
      throw e;
    }
  }

  /** Both slots' query buffers are pinned memory the device maps (a signalled send may write them). */
  queriesMapped(): boolean {
    return this.regions.every((r) => this.link.mapped?.(r.query) === true);
  }

  /** Both slots' logits and [counts | ids] tables are pinned memory the device maps (a hand-off reads them in place). */
  tablesMapped(): boolean {
    return this.regions.every((r) => r.table !== undefined && this.link.mapped?.(r.table) === true && this.link.mapped(r.logits) === true);
  }

  /** A handed-off step's rows are fetched ahead on the link's side stream from now on. */
  fetchAhead(): void {
    this.fetcher ??= this.link.rowFetch!();
  }

  /** Whether a handed-off layer's rows are fetched ahead on the link's side stream (fetchRows). */
  get fetchesAhead(): boolean {
    return this.fetcher !== null;
  }

  /** Rows per KV head the gathered-row buffers hold now. */
  get rows(): number {
    return this.rowsPerHead;
  }

  /**
   * Before a step whose widest layer selects `width` rows per KV head: grows the buffers when they
   * are narrower (between steps; the device is idle first, since queued work may read the old ones).
   */
  reserve(width: number): void {
    const rows = grownRows(this.rowsPerHead, width, this.cache.storeCapacity);
    if (rows === this.rowsPerHead) return;
    this.link.mark("pause");
    this.link.fence();
    this.backend.read(this.scores[0]!, 0, 1); // a read waits for the compute stream
    const withKeys = this.keys.some((k) => k !== null);
    for (const v of this.values) v.close();
    for (const k of this.keys) k?.close();
    this.values = [];
    this.keys = [];
    this.rowsPerHead = rows;
    if (!this.wholeRows) this.allocScores();
    this.allocRows(withKeys);
    this.backend.read(this.values[0]!.store, 0, 1); // the zero fill is done before a copy lands in them
    this.link.mark("resume");
  }

  /**
   * Row 0 of q (heads × headDim f32) into the stage's query buffer of `slot`: `signalled` (a
   * compute-stream op; the next job waits for its signal on the stage's threads), else a copy the
   * host fences.
   */
  queryToHost(slot: 0 | 1, q: Tensor, signalled: boolean, bytes?: number): HostSignal | undefined {
    const width = Math.max(this.heads * this.headDim * 4, bytes ?? 0);
    if (width > this.regions[slot].query.byteLength) fail(`hybrid attention: ${width} query bytes do not fit the stage's query buffer of ${this.regions[slot].query.byteLength}`);
    if (signalled) return this.link.sendSignalled!(this.regions[slot].query, q, width);
    this.link.toHost([{ host: this.regions[slot].query, hostOffset: 0, tensor: q, tensorOffset: 0, width, rows: 1 }]);
    this.link.mark("pause");
    this.link.fence();
    this.link.mark("resume");
    return undefined;
  }

  /** queryToHost's signalled send as a row of the batch's one sendSignalledRows (checked as queryToHost checks it). */
  querySend(slot: 0 | 1, q: Tensor, bytes?: number): SignalledSend {
    const width = Math.max(this.heads * this.headDim * 4, bytes ?? 0);
    if (width > this.regions[slot].query.byteLength) fail(`hybrid attention: ${width} query bytes do not fit the stage's query buffer of ${this.regions[slot].query.byteLength}`);
    return { dst: this.regions[slot].query, src: q, bytes: width };
  }

  /**
   * Before the stage rewrites a slot's buffers, every copy that read them must be done: the
   * signal of the job's query (the compute stream consumed the slot's last layer before the
   * send) for the stage to wait for, or a fence here.
   */
  beforeSubmit(ready: HostSignal | undefined): HostSignal | undefined {
    if (ready) return ready;
    this.link.fence();
    return undefined;
  }

  /** A done signal for a job whose output the device will take (handOff): the next value (modulo 2³²) of this staging's word. */
  doneSignal(): HostSignal {
    if (!this.doneWord) fail("hybrid attention: a done signal from a staging that does not hand off");
    this.doneValue = (this.doneValue + 1) >>> 0;
    return { address: this.doneWord.region.address, value: this.doneValue };
  }

  /**
   * The buffers a handed-off layer's rows land in (slot `slot`, width kmax; `keys`: K rows too, for
   * verified logits), as [kvHeads, kmax, headDim] views: made on the host, before the layer's segment.
   */
  handOffRows(slot: 0 | 1, kmax: number, keys: boolean): { values: Tensor; keys: Tensor | null } {
    const { v, k } = this.setWidth(slot, kmax, keys);
    return { values: v.output(), keys: k ? k.output() : null };
  }

  /**
   * The hand-off of `layer` (slot `slot`, after handOffRows), queued on the compute stream: the
   * device waits for the job's `done`, then reads the stage's logits into scores[slot] from column
   * `col` (unless it scores the K rows itself: `keys`), and gathers the V (and K) rows by the slot's
   * table — or, when they were fetched ahead (`fetched`: fetchRows), waits for the side stream's gathers.
   */
  handOff(layer: number, slot: 0 | 1, done: HostSignal, keys: boolean, fetched: boolean, keep = 0): void {
    const r = this.regions[slot]!, v = this.values[slot]!, k = keys ? this.keys[slot]! : null, kmax = v.kmax;
    this.link.awaitSignal!(done); // also when fetched: the device's wait for the stage is timed here (waitMs)
    if (fetched) this.fetcher!.ready(slot);
    if (!k) {
      const scores = this.scores[slot]!;
      this.link.readMapped!({ host: r.logits, hostOffset: 0, tensor: scores, tensorOffset: this.col * 4, width: kmax * 4, rows: this.heads, hostPitch: kmax * 4, tensorPitch: scores.shape[1]! * 4 });
    }
    if (fetched) return;
    for (const g of this.slotGathers(layer, slot, keys, keep)) this.link.gatherRowsAt!(g.dst, g.src, g.rows, g.table);
  }

  /**
   * The hand-off of `layer` (after handOffRows) as a row of the batch's one handOffRows call: the
   * wait, the logits read and the gathers that handOff() would queue on their own (none when the
   * rows were fetched ahead: `fetched`, and the batch's wait for its fetch goes before it).
   */
  batchHandOff(layer: number, slot: 0 | 1, done: HostSignal, keys: boolean, keep = 0, fetched = false): HandOffRow {
    const r = this.regions[slot]!, scores = this.scores[slot]!, kmax = this.values[slot]!.kmax;
    const logits = keys ? null : { host: r.logits, hostOffset: 0, tensor: scores, tensorOffset: this.col * 4, width: kmax * 4, rows: this.heads, hostPitch: kmax * 4, tensorPitch: scores.shape[1]! * 4 };
    return { done, logits, gathers: fetched ? [] : this.slotGathers(layer, slot, keys, keep) };
  }

  /**
   * A verified layer's kept candidates (after its logits are scored): `keep` a KV head stay, the
   * rest's logits become −∞, and only the kept V rows come up into the slot's V buffer (HostTransfers.keepRows).
   */
  keepRow(layer: number, slot: 0 | 1, keep: number, group: number): KeepRow {
    const v = this.values[slot]!;
    return { scores: this.scores[slot]!, col: this.col, group, keep, values: v.store, src: this.hostOf(this.cache.stageStoreV(layer)), rows: this.rowGather(v.kmax), table: this.regions[slot]!.table! };
  }

  /** The verified logits of a handed-off layer (after handOffRows or batchHandOff) as a row of a rescoreRows: what attnLogits and the link's padColumnsAt would write. */
  batchRescore(slot: 0 | 1, q: Tensor, keys: Tensor, kmax: number, scale: number): RescoreRow {
    return { scores: this.scores[slot]!, col: this.col, q, keys, kmax, scale, table: this.regions[slot]!.table! };
  }

  /**
   * Queues `layer`'s row gathers (slot `slot`, width kmax) on the side stream: they run once the
   * job's `done` is raised and the slot's last releaseRows() has run; handOff(…, fetched) waits for
   * them. No views are made (a segment may be recording): handOffRows makes them at the same width.
   */
  fetchRows(layer: number, slot: 0 | 1, done: HostSignal, keys: boolean, kmax: number, keep = 0): void {
    if (!this.fetcher) fail("hybrid attention: rows fetched ahead on a link without rowFetch");
    this.setWidth(slot, kmax, keys);
    this.fetcher.fetch(slot, done, this.slotGathers(layer, slot, keys, keep));
  }

  /**
   * `layer`'s gathers into slot `slot` at width kmax (set here) for a batch's one fetch of every row's
   * (HandOffBatch); no views are made (a segment may be recording): the next hand-off makes them.
   */
  fetchGathers(layer: number, slot: 0 | 1, keys: boolean, kmax: number, keep = 0): RowFetchGather[] {
    this.setWidth(slot, kmax, keys);
    return this.slotGathers(layer, slot, keys, keep);
  }

  /** After the merge that read slot `slot`'s fetched rows (compute stream, recordable): a later fetch may refill them. */
  releaseRows(slot: 0 | 1): void {
    this.fetcher?.release(slot);
  }

  /** Slot `slot`'s row buffers (K too for `keys`) set to width kmax, which they must hold. */
  private setWidth(slot: 0 | 1, kmax: number, keys: boolean): { v: GatheredValues; k: GatheredValues | null } {
    const v = this.values[slot]!, k = keys ? this.keys[slot]! : null;
    if (keys && !k) fail("hybrid attention: no device buffers for K rows (a verified layer the staging was not told of)");
    if (kmax > this.rowsPerHead) fail(`hybrid attention: ${kmax} selected rows per KV head exceed the device's gathered-row buffers (${this.rowsPerHead}); reserve() first`);
    v.kmax = kmax;
    if (k) k.kmax = kmax;
    return { v, k };
  }

  /**
   * The gathers of `layer`'s K (verified) and V rows into slot `slot`'s buffers at their kmax (set, and K's buffers checked, by setWidth),
   * by the slot's table; a layer that keeps some candidates (`keep` > 0) gathers K alone (keepRow brings up the kept V rows).
   */
  private slotGathers(layer: number, slot: 0 | 1, keys: boolean, keep = 0): RowFetchGather[] {
    const v = this.values[slot]!, k = keys ? this.keys[slot]! : null, table = this.regions[slot]!.table!, c = this.cache, rows = this.rowGather(v.kmax);
    const gathers: RowFetchGather[] = [];
    if (k) gathers.push({ dst: k.store, src: this.hostOf(c.stageStoreK(layer)), rows, table });
    if (keep > 0 && !k) fail("hybrid attention: candidates kept on a layer that scores no K rows");
    if (keep === 0) gathers.push({ dst: v.store, src: this.hostOf(c.stageStoreV(layer)), rows, table });
    return gathers;
  }

  /**
   * The stage's output (slot `slot`) for width kmax: its logits [heads, kmax] into scores[slot]
   * from column `col` of every head (unless the device scores the K rows itself: `keys`), and with
   * `stagedRows` the V rows (and K rows) the stage copied, into the slot's device buffers (else
   * gatherRows() fills them). Returns them as [kvHeads, kmax, headDim]. Compute ops queued after it
   * wait for the copy.
   */
  upload(slot: 0 | 1, kmax: number, keys: boolean, stagedRows: boolean): { values: Tensor; keys: Tensor | null } {
    const r = this.regions[slot]!, { v, k } = this.setWidth(slot, kmax, keys);
    const copies: HostCopy[] = [];
    if (!k) {
      const scores = this.scores[slot]!;
      copies.push({ host: r.logits, hostOffset: 0, tensor: scores, tensorOffset: this.col * 4, width: kmax * 4, rows: this.heads, hostPitch: kmax * 4, tensorPitch: scores.shape[1]! * 4 });
    }
    if (stagedRows) {
      const rowBytes = this.cache.kvHeads * kmax * this.headDim * DTYPE_BYTES[this.cache.dtype];
      copies.push({ host: r.values, hostOffset: 0, tensor: v.store, tensorOffset: 0, width: rowBytes, rows: 1 });
      if (k) {
        if (!r.keys) fail("hybrid attention: the CPU stage stages no K rows (prepare it with stageKeys)");
        copies.push({ host: r.keys, hostOffset: 0, tensor: k.store, tensorOffset: 0, width: rowBytes, rows: 1 });
      }
    }
    // Called even with nothing to copy: the link's double buffering counts one call per layer.
    this.link.toDevice(copies);
    return { values: v.output(), keys: k ? k.output() : null };
  }

  /**
   * `layer`'s K (with `keys`) and V rows, gathered by the device from the host store into slot `slot`'s buffers (after upload() set
   * their width), by the stage's ids; a layer that keeps some candidates (`keeps`) gathers K alone (keepRow brings up the kept V rows).
   */
  gatherRows(layer: number, slot: 0 | 1, keys: boolean, ids: Int32Array, counts: Int32Array, keeps = false): void {
    if (keys) this.gather(this.keys[slot]!, this.cache.stageStoreK(layer), ids, counts);
    if (keeps && !keys) fail("hybrid attention: candidates kept on a layer that scores no K rows");
    if (!keeps) this.gather(this.values[slot]!, this.cache.stageStoreV(layer), ids, counts);
  }

  /** The host is about to block on something other than the device (the CPU stage). */
  pause(): void {
    this.link.mark("pause");
  }

  resume(): void {
    this.link.mark("resume");
  }

  /** Ends a step's timing: waits for the device; T_gpu and T_tx since the last call (ms). */
  times(): { gpuMs: number; txMs: number; waitMs?: number } {
    return this.link.times();
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    try {
      this.fetcher?.close();
      this.link.fence();
    } finally {
      for (const r of this.pinned) this.link.unpin(r);
      for (const v of this.values) v.close();
      for (const k of this.keys) k?.close();
      for (const t of this.scores) this.backend.free(t);
      if (this.doneWord) this.cache.hostBackend!.free(this.doneWord.tensor);
    }
  }

  [Symbol.dispose](): void {
    this.close();
  }

  /**
   * The done word: the first word of a zeroed host block of the store's backend, pinned through the
   * link. False (and nothing kept) where the link does not map it for the device to poll.
   */
  pinDoneWord(): boolean {
    if (this.doneWord) return true;
    const host = this.cache.hostBackend;
    if (!host?.hostRegion) return false;
    const tensor = host.alloc([DONE_BLOCK_BYTES / 4]), region = host.hostRegion(tensor);
    try {
      this.link.pin(region);
    } catch (e) {
      host.free(tensor);
      throw e;
    }
    if (this.link.mapped!(region)) {
      this.pinned.push(region);
      this.doneWord = { tensor, region };
      return true;
    }
    this.link.unpin(region);
    host.free(tensor);
    return false;
  }

  /** Both slots' score rows: the whole context, or the selected columns alone (as wide as the row buffers). */
  private allocScores(): void {
    for (const t of this.scores.splice(0)) this.backend.free(t);
    const width = this.wholeRows ? this.cache.maxContext : this.rowsPerHead;
    for (let s = 0; s < 2; s++) this.scores.push(this.backend.alloc([this.heads, width]));
  }

  /** Both slots' gathered-row buffers at the current width (K rows too when a layer verifies). */
  private allocRows(withKeys: boolean): void {
    const { kvHeads, dtype } = this.cache, n = kvHeads * this.rowsPerHead;
    const make = () => new GatheredValues(this.backend, this.backend.alloc([n, this.headDim], dtype), kvHeads, this.headDim);
    for (let s = 0; s < 2; s++) {
      this.values.push(make());
      this.keys.push(withKeys ? make() : null);
    }
  }

  private gather(dst: GatheredValues, store: Tensor, ids: Int32Array, counts: Int32Array): void {
    this.link.gatherRows!(dst.store, this.hostOf(store), this.rowGather(dst.kmax), ids, counts);
  }

  /** The host memory of a store tensor (the cache's host backend's). */
  private hostOf(store: Tensor): HostRegion {
    return this.cache.hostBackend!.hostRegion!(store);
  }

  /** A gather of kmax rows a KV head from a store [kvHeads, storeCapacity, headDim]. */
  private rowGather(kmax: number): RowGather {
    const c = this.cache;
    return { groups: c.kvHeads, cap: c.storeCapacity, rowBytes: c.headDim * DTYPE_BYTES[c.dtype], kmax };
  }
}
