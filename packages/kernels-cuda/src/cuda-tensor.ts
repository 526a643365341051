import { DTYPE_BYTES, type DType, type Tensor } from "@hybridgen/core";

/**
 * A device tensor: row-major data at a device address inside the backend's arena. An owning
 * tensor holds an arena block (`arenaOffset`); a view aliases part of a `base` tensor and dies
 * with it.
 */
export class CudaTensor implements Tensor {
  readonly backend = "cuda";
  readonly cols: number;
  readonly rows: number;
  readonly numel: number;
  freed = false;

  constructor(
    readonly owner: object,
    readonly dtype: DType,
    readonly shape: readonly number[],
    /** Device address of element 0. */
    readonly addr: number,
    readonly byteLength: number,
    readonly arenaOffset: number,
    readonly base?: CudaTensor,
  ) {
    this.numel = shape.reduce((a, b) => a * b, 1);
    this.cols = shape[shape.length - 1];
    this.rows = this.numel / this.cols;
  }

  get elementBytes(): number {
    return DTYPE_BYTES[this.dtype];
  }

  get dead(): boolean {
    return this.freed || (this.base !== undefined && this.base.freed);
  }

  /** Device address of element `index` (callers check bounds first). */
  at(index: number): number {
    return this.addr + index * DTYPE_BYTES[this.dtype];
  }

  /** Whether the first `rows` rows of this and `other` share any byte. */
  overlaps(other: CudaTensor, rows: number, otherRows: number): boolean {
    const a0 = this.addr, a1 = a0 + rows * this.cols * this.elementBytes;
    const b0 = other.addr, b1 = b0 + otherRows * other.cols * other.elementBytes;
    return a0 < b1 && b0 < a1;
  }

  toString(): string {
    return `${this.dtype}[${this.shape.join("x")}]`;
  }
}
