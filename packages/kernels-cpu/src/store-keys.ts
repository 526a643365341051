/**
 * A CPU tensor's memory as core's OffloadedKeys, without a copy: what a pre-QKᵀ selector reads
 * of the host store ([kvHeads, capacity, headDim] K of one layer). One view per tensor, made
 * on first use; it is valid while the tensor lives (the store lives as long as its cache).
 */
import { toArrayBuffer } from "bun:ffi";
import { fail, offloadedKeys, type OffloadedKeys } from "@hybridgen/spec";
import type { CpuTensor } from "./tensor.js";

const views = new WeakMap<CpuTensor, OffloadedKeys>();

export function storeKeys(t: CpuTensor): OffloadedKeys {
  if (t.dead) fail("store keys: the tensor was freed");
  let v = views.get(t);
  if (!v) {
    if (t.shape.length !== 3) fail(`store keys: expected a [kvHeads, capacity, headDim] tensor, got ${t}`);
    const [kvHeads, capacity, headDim] = t.shape as [number, number, number];
    const buf = toArrayBuffer(t.ptr, 0, t.byteLength);
    const data = t.dtype === "f32" ? new Float32Array(buf, 0, t.numel) : new Uint16Array(buf, 0, t.numel);
    v = offloadedKeys(t.dtype, kvHeads, capacity, headDim, data);
    views.set(t, v);
  }
  return v;
}
