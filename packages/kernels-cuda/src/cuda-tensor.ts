import { NativeTensor, type DType } from "@hybridgen/spec";

/**
 * A device tensor: row-major data at a device address inside the backend's arena. An owning
 * tensor holds an arena block (`arenaOffset`); a view aliases part of a `base` tensor and dies
 * with it.
 */
export class CudaTensor extends NativeTensor {
  readonly backend = "cuda";
  declare readonly base?: CudaTensor;

  constructor(
    owner: object,
    dtype: DType,
    shape: readonly number[],
    /** Device address of element 0. */
    readonly addr: number,
    byteLength: number,
    readonly arenaOffset: number,
    base?: CudaTensor,
  ) {
    super(owner, dtype, shape, byteLength, base);
  }

  protected get start(): number {
    return this.addr;
  }

  /** Device address of element `index` (callers check bounds first). */
  at(index: number): number {
    return this.addr + index * this.elementBytes;
  }
}
