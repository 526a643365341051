/**
 * Loads checkpoint tensors onto a backend and owns what it loaded: matmul weights in the
 * model's weight dtype (in place when already stored so), norms and biases in f32, and
 * row-wise fusions (q;k;v) so a decode step runs one matmul where it would run three.
 */
import { type Backend, type DType, type Tensor, DTYPE_BYTES, fail, convertBytes } from "@hybridgen/spec";
import type { WeightSource, WeightView } from "./model-files.js";

/** The stored tensor `name`, checked to exist with exactly `shape`. */
export function requireTensor(src: WeightSource, name: string, shape: readonly number[]): WeightView {
  const w = src.get(name);
  if (!w) fail(`missing tensor ${name} in the model weights`);
  if (w.shape.length !== shape.length || w.shape.some((d, i) => d !== shape[i])) {
    fail(`tensor ${name} has shape [${w.shape.join(", ")}], expected [${shape.join(", ")}]`);
  }
  return w;
}

export class WeightLoader {
  private readonly owned: Tensor[] = [];
  private readonly views: Tensor[] = [];

  constructor(
    readonly backend: Backend,
    readonly src: WeightSource,
    readonly weightDtype: DType,
  ) {}

  /** A matmul/embedding weight in the weight dtype. */
  matrix(name: string, shape: readonly number[]): Tensor {
    const w = requireTensor(this.src, name, shape);
    return this.own(this.backend.loadWeight(convertBytes(w.bytes, w.dtype, this.weightDtype), this.weightDtype, shape));
  }

  /** Several [rows_i, cols] weights stacked row-wise into one tensor. */
  fused(names: readonly string[], rows: readonly number[], cols: number): Tensor {
    const size = DTYPE_BYTES[this.weightDtype];
    const total = rows.reduce((a, r) => a + r, 0);
    const bytes = new Uint8Array(total * cols * size);
    let off = 0;
    names.forEach((name, i) => {
      const w = requireTensor(this.src, name, [rows[i], cols]);
      bytes.set(convertBytes(w.bytes, w.dtype, this.weightDtype), off);
      off += rows[i] * cols * size;
    });
    return this.own(this.backend.loadWeight(bytes, this.weightDtype, [total, cols]));
  }

  /** A norm weight or bias, f32 (tiny, and read by f32-only ops). */
  vector(name: string, len: number): Tensor {
    return this.fusedVector([name], [len]);
  }

  /** Several vectors concatenated, f32. */
  fusedVector(names: readonly string[], lens: readonly number[]): Tensor {
    const total = lens.reduce((a, r) => a + r, 0);
    const bytes = new Uint8Array(total * 4);
    let off = 0;
    names.forEach((name, i) => {
      const w = requireTensor(this.src, name, [lens[i]]);
      bytes.set(convertBytes(w.bytes, w.dtype, "f32"), off);
      off += lens[i] * 4;
    });
    return this.own(this.backend.loadWeight(bytes, "f32", [total]));
  }

  /** A zero-filled f32 activation buffer. */
  alloc(shape: readonly number[]): Tensor {
    return this.own(this.backend.alloc(shape, "f32"));
  }

  view(t: Tensor, offset: number, shape: readonly number[]): Tensor {
    const v = this.backend.view(t, offset, shape);
    this.views.push(v);
    return v;
  }

  /** Frees every view, then every tensor. */
  close(): void {
    for (const t of this.views) this.backend.free(t);
    for (const t of this.owned) this.backend.free(t);
    this.views.length = 0;
    this.owned.length = 0;
  }

  private own(t: Tensor): Tensor {
    this.owned.push(t);
    return t;
  }
}
