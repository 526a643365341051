/**
 * DeviceStaging: the device side of hybrid attention when the CPU stage's memory is not the
 * device's (a GPU backend with Backend.hostTransfers, the KV store kept in host memory). It
 * pins the stage's buffers, brings each layer's query to the host and the stage's selected
 * logits and V rows back to the device on the copy stream, and reads T_gpu / T_tx from the
 * backend's events.
 *
 * Double buffering by layer parity (the stage's slots): layer l's logits land straight in
 * scores[l & 1] at the columns of the offloaded tokens and its V rows in values[l & 1], so the
 * copy for layer l only has to wait for the compute of layer l − 2, never for the layer the
 * compute stream is working on.
 */
import type { Backend, HostCopy, HostRegion, HostTransfers, Tensor } from "../backend.js";
import { DTYPE_BYTES } from "../backend.js";
import { fail } from "../errors.js";
import type { KvCache } from "../kv-cache.js";
import type { CpuStage } from "./cpu-stage.js";
import { GatheredValues } from "./gathered-values.js";

interface Regions {
  readonly query: HostRegion;
  readonly logits: HostRegion;
  readonly values: HostRegion;
  readonly keys: HostRegion | null;
}

export class DeviceStaging implements Disposable {
  readonly link: HostTransfers;
  private readonly regions: Regions[];
  private readonly pinned: HostRegion[] = [];
  /** [heads, maxContext] per slot: window logits and the uploaded offloaded logits, one row a head. */
  readonly scores: Tensor[] = [];
  private readonly values: GatheredValues[] = [];
  /** The selected K rows per slot, for verified logits (when the stage stages them). */
  private readonly keys: (GatheredValues | null)[] = [];
  private closed = false;

  constructor(
    private readonly backend: Backend,
    private readonly cache: KvCache,
    stage: CpuStage,
    private readonly heads: number,
    private readonly headDim: number,
  ) {
    const link = cache.hostLink;
    if (!link) fail("hybrid attention: the KV cache has no host store (attachHostStore) for a device backend");
    if (!stage.hostStaging) fail(`hybrid attention: CPU stage '${stage.name}' does not expose host staging buffers for the device's copies`);
    this.link = link;
    this.regions = [stage.hostStaging(0), stage.hostStaging(1)];
    const { kvHeads, storeCapacity, maxContext, dtype } = cache;
    try {
      for (const r of this.regions) {
        for (const region of [r.query, r.logits, r.values, ...(r.keys ? [r.keys] : [])]) {
          link.pin(region);
          this.pinned.push(region);
        }
      }
      for (let s = 0; s < 2; s++) {
        this.scores.push(backend.alloc([heads, maxContext]));
        this.values.push(new GatheredValues(backend, backend.alloc([kvHeads * storeCapacity, headDim], dtype), kvHeads, headDim));
        const keys = this.regions[s]!.keys;
        this.keys.push(keys ? new GatheredValues(backend, backend.alloc([kvHeads * storeCapacity, headDim], dtype), kvHeads, headDim) : null);
      }
    } catch (e) {
      this.close();
      throw e;
    }
  }

  /** Row 0 of q (heads × headDim f32) into the stage's query buffer of `slot`; the host waits for it. */
  queryToHost(slot: 0 | 1, q: Tensor): void {
    const width = this.heads * this.headDim * 4;
    this.link.toHost([{ host: this.regions[slot].query, hostOffset: 0, tensor: q, tensorOffset: 0, width, rows: 1 }]);
    this.link.mark("pause");
    this.link.fence();
    this.link.mark("resume");
  }

  /** Before the stage rewrites a slot's buffers: every copy that read them is done (free when it is). */
  beforeSubmit(): void {
    this.link.fence();
  }

  /**
   * The stage's output of `slot` for width kmax: its logits [heads, kmax] into scores[slot] at
   * column `col` of every head (unless the device scores the K rows itself: `keys`), V rows (and
   * K rows) into the slot's device buffers; returns them as [kvHeads, kmax, headDim]. Compute
   * ops queued after it wait for the copy.
   */
  upload(slot: 0 | 1, kmax: number, col: number, keys: boolean): { values: Tensor; keys: Tensor | null } {
    const r = this.regions[slot]!, v = this.values[slot]!, k = keys ? this.keys[slot] : null;
    if (keys && (!k || !r.keys)) fail("hybrid attention: the CPU stage stages no K rows (prepare it with stageKeys)");
    v.kmax = kmax;
    const rowBytes = this.cache.kvHeads * kmax * this.headDim * DTYPE_BYTES[this.cache.dtype];
    const copies: HostCopy[] = [{ host: r.values, hostOffset: 0, tensor: v.store, tensorOffset: 0, width: rowBytes, rows: 1 }];
    if (k) {
      k.kmax = kmax;
      copies.push({ host: r.keys!, hostOffset: 0, tensor: k.store, tensorOffset: 0, width: rowBytes, rows: 1 });
    } else {
      copies.push({ host: r.logits, hostOffset: 0, tensor: this.scores[slot]!, tensorOffset: col * 4, width: kmax * 4, rows: this.heads, hostPitch: kmax * 4, tensorPitch: this.cache.maxContext * 4 });
    }
    this.link.toDevice(copies);
    return { values: v.output(), keys: k ? k.output() : null };
  }

  /** The host is about to block on something other than the device (the CPU stage). */
  pause(): void {
    this.link.mark("pause");
  }

  resume(): void {
    this.link.mark("resume");
  }

  /** Ends a step's timing: waits for the device; T_gpu and T_tx since the last call (ms). */
  times(): { gpuMs: number; txMs: number } {
    return this.link.times();
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    try {
      this.link.fence();
    } finally {
      for (const r of this.pinned) this.link.unpin(r);
      for (const v of this.values) v.close();
      for (const k of this.keys) k?.close();
      for (const t of this.scores) this.backend.free(t);
    }
  }

  [Symbol.dispose](): void {
    this.close();
  }
}
