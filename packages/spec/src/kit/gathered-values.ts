import type { Backend, Tensor } from "../backend.js";

/**
 * The V rows a CPU stage gathered for one job slot, on the device backend: `store` holds up
 * to [kvHeads · cap, headDim] rows, and output() hands attention the first kmax rows of each
 * KV head as a [kvHeads, kmax, headDim] view, made again only when kmax changes (so decode
 * steps with an unchanged budget allocate nothing).
 */
export class GatheredValues<T extends Tensor = Tensor> {
  /** Rows per KV head of the last gather. */
  kmax = 0;
  private view: Tensor | null = null;
  private viewKmax = -1;

  constructor(
    private readonly backend: Backend,
    readonly store: T,
    private readonly kvHeads: number,
    private readonly headDim: number,
  ) {}

  /** The last gather's rows, [kvHeads, max(1, kmax), headDim] (a view of `store`). */
  output(): Tensor {
    if (this.viewKmax !== this.kmax) {
      if (this.view) this.backend.free(this.view);
      this.view = this.backend.view(this.store, 0, [this.kvHeads, Math.max(1, this.kmax), this.headDim]);
      this.viewKmax = this.kmax;
    }
    return this.view!;
  }

  /** Frees the view and the store. */
  close(): void {
    if (this.view) this.backend.free(this.view);
    this.view = null;
    this.backend.free(this.store);
  }
}
