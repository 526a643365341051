import type { Pointer } from "bun:ffi";
import { DTYPE_BYTES, type DType, type Tensor } from "@hybridgen/core";

/**
 * A CPU tensor: row-major data at a native address. `owned` tensors were allocated by the
 * backend (and are freed by it); the others are caller bytes used in place (loadWeight),
 * kept reachable through `keep` so the garbage collector cannot free them under us.
 * A view aliases part of a `base` tensor; it dies with its base.
 */
export class CpuTensor implements Tensor {
  readonly backend = "cpu";
  /** Elements in the last dimension, and the product of the others. */
  readonly cols: number;
  readonly rows: number;
  readonly numel: number;
  freed = false;

  constructor(
    readonly owner: object,
    readonly dtype: DType,
    readonly shape: readonly number[],
    readonly ptr: Pointer,
    readonly byteLength: number,
    readonly owned: boolean,
    readonly keep?: Uint8Array,
    readonly base?: CpuTensor,
  ) {
    this.numel = shape.reduce((a, b) => a * b, 1);
    this.cols = shape.length ? shape[shape.length - 1] : 1;
    this.rows = this.cols ? this.numel / this.cols : 0;
  }

  get elementBytes(): number {
    return DTYPE_BYTES[this.dtype];
  }

  /** Freed itself, or a view of a freed tensor. */
  get dead(): boolean {
    return this.freed || (this.base !== undefined && this.base.freed);
  }

  /** Address of element `index` (no bounds check: callers check first). */
  at(index: number): Pointer {
    return (this.ptr + index * DTYPE_BYTES[this.dtype]) as Pointer;
  }

  /** Whether the first `rows` rows of this and `other` share any byte. */
  overlaps(other: CpuTensor, rows: number, otherRows: number): boolean {
    const a0 = this.ptr as number, a1 = a0 + rows * this.cols * this.elementBytes;
    const b0 = other.ptr as number, b1 = b0 + otherRows * other.cols * other.elementBytes;
    return a0 < b1 && b0 < a1;
  }

  toString(): string {
    return `${this.dtype}[${this.shape.join("x")}]`;
  }
}
