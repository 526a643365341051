/**
 * A NativeCpuStage slot's buffers: the query, the selected logits and the [counts | ids] table in
 * native blocks a device backend can pin (it pins only whole blocks of at least 2 MiB, and its
 * copies of them must be asynchronous), and the staged V (and K) rows in CpuBackend tensors.
 */
import type { Pointer } from "bun:ffi";
import { toArrayBuffer } from "bun:ffi";
import { type CpuStageShape, type CpuStageStaging } from "@hybridgen/spec";
import { GatheredValues } from "@hybridgen/spec/kit";
import type { CpuBackend } from "./cpu-backend.js";
import type { CpuTensor } from "./tensor.js";

/** The smallest block a device backend pins. */
export const PINNABLE_BYTES = 2 << 20;

export interface NativeBuf { p: Pointer; bytes: number }

export interface StageSlot {
  q: NativeBuf; query: Float32Array;
  /** int32 after the query in the same block: the pages a device chose for an "index" job with `chosen`. */
  chosen: Int32Array;
  sel: NativeBuf; logits: Float32Array;
  /** int32 [counts (kvHeads) | ids (kvHeads × storeCapacity)]: one block, so a device reads both in one go. */
  table: NativeBuf; countsView: Int32Array; idsView: Int32Array;
  /** Where the ids start (table + kvHeads · 4). */
  idsAddress: number;
  values: GatheredValues<CpuTensor>; // store: [kvHeads · cap, headDim] in the K/V dtype
  keys: GatheredValues<CpuTensor> | null; // the same for K rows, when the shape asks for them
  keysStaged: boolean; // the slot's last job staged K rows
}

/** A slot's buffers; `alloc` gives zeroed native memory the stage frees at close(). */
export function allocSlot(backend: CpuBackend, shape: CpuStageShape, alloc: (bytes: number) => NativeBuf): StageSlot {
  const { heads, kvHeads, headDim, storeCapacity: cap, dtype } = shape;
  const pinnable = (bytes: number) => alloc(Math.max(bytes, PINNABLE_BYTES));
  const q = pinnable(heads * headDim * 4), sel = pinnable(heads * cap * 4), table = pinnable(kvHeads * (1 + cap) * 4);
  // Host staging of the gathered rows: outside a capped backend's "device" memory, as beside a real device.
  const rows = () => new GatheredValues(backend, backend.allocHost([kvHeads * cap, headDim], dtype) as CpuTensor, kvHeads, headDim);
  return {
    q, query: new Float32Array(toArrayBuffer(q.p, 0, heads * headDim * 4)),
    chosen: new Int32Array(toArrayBuffer(q.p, heads * headDim * 4, q.bytes - heads * headDim * 4)),
    sel, logits: new Float32Array(toArrayBuffer(sel.p, 0, heads * cap * 4)),
    table,
    countsView: new Int32Array(toArrayBuffer(table.p, 0, kvHeads * 4)),
    idsView: new Int32Array(toArrayBuffer(table.p, kvHeads * 4, kvHeads * cap * 4)),
    idsAddress: table.p + kvHeads * 4,
    values: rows(),
    keys: shape.stageKeys ? rows() : null,
    keysStaged: false,
  };
}

/** The slot's host memory, whole blocks (CpuStage.hostStaging). */
export function slotStaging(s: StageSlot): CpuStageStaging {
  const v = s.values.store, k = s.keys?.store;
  return {
    query: { address: s.q.p, byteLength: s.q.bytes },
    logits: { address: s.sel.p, byteLength: s.sel.bytes },
    values: { address: v.ptr, byteLength: v.byteLength },
    keys: k ? { address: k.ptr, byteLength: k.byteLength } : null,
    table: { address: s.table.p, byteLength: s.table.bytes },
  };
}

export function closeSlot(s: StageSlot): void {
  s.values.close();
  s.keys?.close();
}
