/**
 * AoG (FlexGen-style offloading): every decode step, each layer's offloaded K and V come to the
 * device in full and the device attends over all of them plus the window, exactly as full
 * attention. With the store in host memory (KvCache.attachHostStore on a device backend) the
 * next layer's rows go up on the copy stream as soon as this layer's attention is queued, into
 * the other of the cache's two scratch pairs, so the copy overlaps the rest of this layer and
 * the start of the next (double buffering). On a backend whose store is already in its own
 * memory (the CPU backend) the rows are copied into a scratch pair of its own each layer, so
 * the bytes a step moves are the ones AoG moves.
 */
import { DTYPE_BYTES, type Tensor } from "@hybridgen/spec";
import type { Attention } from "../attention.js";
import { BaselineAttention } from "./baseline-attention.js";

export class AoGAttention extends BaselineAttention {
  readonly name = "aog";
  private readonly scratch: { k: Tensor; v: Tensor } | null;

  constructor(attention: Attention) {
    super(attention, "AoG");
    const c = attention.cache;
    const be = attention.backend;
    if (c.storeInHost) {
      this.scratch = null;
    } else {
      const k = be.alloc([c.kvHeads, c.storeCapacity, c.headDim], c.dtype);
      try {
        this.scratch = { k, v: be.alloc([c.kvHeads, c.storeCapacity, c.headDim], c.dtype) };
      } catch (e) {
        be.free(k);
        throw e;
      }
    }
  }

  protected prepareStep(): void {
    this.bringUp(0);
  }

  protected attendOffloaded(layer: number, q: Tensor, out: Tensor): void {
    const a = this.attention, c = a.cache, be = a.backend;
    const total = this.pos + 1;
    const storeK = this.scratch ? this.scratch.k : null, storeV = this.scratch ? this.scratch.v : null;
    for (let s = 0; s < c.spanCount; s++) {
      const store = c.spanRegion[s] === 2;
      const k = store && storeK ? storeK : c.spanK(s, layer), slot = store && storeK ? 0 : c.spanSlot[s];
      be.attnLogits(a.scores, c.spanPos[s], q, 0, k, slot, c.spanLen[s], a.scale);
    }
    be.softmax(a.scores, a.layout.heads, total);
    for (let s = 0; s < c.spanCount; s++) {
      const store = c.spanRegion[s] === 2;
      const v = store && storeV ? storeV : c.spanV(s, layer), slot = store && storeV ? 0 : c.spanSlot[s];
      be.attnAggregate(out, 0, a.scores, c.spanPos[s], v, slot, c.spanLen[s], s > 0);
    }
    // Queued after this layer's reads: the copy into the other pair may start now.
    if (layer + 1 < c.layers) this.bringUp(layer + 1);
    this.stats.layerSteps++;
    this.stats.bytesMoved += 2 * this.offloaded * c.kvHeads * c.headDim * DTYPE_BYTES[c.dtype];
  }

  /** Layer `layer`'s offloaded rows onto the device (host → device copy, or a device copy). */
  private bringUp(layer: number): void {
    const c = this.attention.cache;
    if (!this.scratch) {
      c.loadStore(layer);
      return;
    }
    const be = this.attention.backend, cap = c.storeCapacity;
    for (let g = 0; g < c.kvHeads; g++) {
      be.copyRows(this.scratch.k, g * cap, c.storeK[layer]!, g * cap, this.offloaded);
      be.copyRows(this.scratch.v, g * cap, c.storeV[layer]!, g * cap, this.offloaded);
    }
  }

  protected release(): void {
    if (this.scratch) {
      this.attention.backend.free(this.scratch.k);
      this.attention.backend.free(this.scratch.v);
    }
  }
}

