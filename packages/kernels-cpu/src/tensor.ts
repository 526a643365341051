import type { Pointer } from "bun:ffi";
import { NativeTensor, type DType } from "@hybridgen/spec";

/**
 * A CPU tensor: row-major data at a native address. `owned` tensors were allocated by the
 * backend (and are freed by it); the others are caller bytes used in place (loadWeight),
 * kept reachable through `keep` so the garbage collector cannot free them under us.
 * A view aliases part of a `base` tensor; it dies with its base.
 */
export class CpuTensor extends NativeTensor {
  readonly backend = "cpu";
  declare readonly base?: CpuTensor;

  constructor(
    owner: object,
    dtype: DType,
    shape: readonly number[],
    readonly ptr: Pointer,
    byteLength: number,
    readonly owned: boolean,
    readonly keep?: Uint8Array,
    base?: CpuTensor,
  ) {
    super(owner, dtype, shape, byteLength, base);
  }

  protected get start(): number {
    return this.ptr;
  }

  /** Address of element `index` (no bounds check: callers check first). */
  at(index: number): Pointer {
    return (this.ptr + index * this.elementBytes) as Pointer;
  }
}
