import { DTYPE_BYTES, type DType, type Tensor } from "./backend.js";

/**
 * What every backend that keeps tensors at a native address (a host pointer, a device
 * address) tracks about one: its row geometry, which backend instance made it, whether it
 * (or the tensor it views) was freed. BackendChecks validates calls against these fields;
 * a subclass adds the address in the form its FFI layer wants.
 */
export abstract class NativeTensor implements Tensor {
  abstract readonly backend: string;
  /** Elements in the last dimension, and the product of the others. */
  readonly cols: number;
  readonly rows: number;
  readonly numel: number;
  freed = false;

  constructor(
    /** The backend instance that made it (tensors of another instance are refused). */
    readonly owner: object,
    readonly dtype: DType,
    readonly shape: readonly number[],
    readonly byteLength: number,
    /** For a view, the owning tensor it aliases: the view dies with it. */
    readonly base?: NativeTensor,
  ) {
    this.numel = shape.reduce((a, b) => a * b, 1);
    this.cols = shape.length ? shape[shape.length - 1] : 1;
    this.rows = this.cols ? this.numel / this.cols : 0;
  }

  /** Address of element 0, as a plain number (for overlap checks). */
  protected abstract get start(): number;

  get elementBytes(): number {
    return DTYPE_BYTES[this.dtype];
  }

  /** Freed itself, or a view of a freed tensor. */
  get dead(): boolean {
    return this.freed || (this.base !== undefined && this.base.freed);
  }

  /** Whether the first `rows` rows of this and the first `otherRows` of `other` share any byte. */
  overlaps(other: NativeTensor, rows: number, otherRows: number): boolean {
    const a0 = this.start, a1 = a0 + rows * this.cols * this.elementBytes;
    const b0 = other.start, b1 = b0 + otherRows * other.cols * other.elementBytes;
    return a0 < b1 && b0 < a1;
  }

  toString(): string {
    return `${this.dtype}[${this.shape.join("x")}]`;
  }
}
