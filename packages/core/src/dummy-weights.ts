/**
 * Dummy weights (as FlexGen's _DUMMY_ / vLLM's --load-format dummy): every tensor an
 * architecture expects, filled on demand with deterministic random values from a seed.
 * Nothing is read from disk; a tensor's bytes exist only while the model loads it.
 */
import { DTYPE_BYTES, type DType, check } from "@hybridgen/spec";
import type { WeightSource, WeightView } from "./model-files.js";
import { fillKey, randomFillTs, type RandomFill } from "@hybridgen/spec/kit";
import { dummyInit, elementCount, type TensorSpec } from "./tensor-spec.js";

export interface DummyWeightOptions {
  readonly seed?: number;
  /** Stored dtype of every tensor (default bf16, as most released checkpoints). */
  readonly dtype?: DType;
  /** The fill to use (default: the TypeScript one; kernels-cpu's native fill is faster). */
  readonly fill?: RandomFill;
}

export class DummyWeightSource implements WeightSource {
  readonly seed: number;
  readonly dtype: DType;
  private readonly specs: ReadonlyMap<string, TensorSpec>;
  private readonly fill: RandomFill;
  // LlamaModel reads the embedding twice (its dtype, then the weight): keep the last one.
  private last: { name: string; view: WeightView } | null = null;

  constructor(specs: readonly TensorSpec[], options: DummyWeightOptions = {}) {
    this.seed = options.seed ?? 0;
    this.dtype = options.dtype ?? "bf16";
    check(Number.isInteger(this.seed) && this.seed >= 0 && this.seed <= 0xffffffff, `dummy weights: seed must be an integer in [0, 2^32), got ${this.seed}`);
    check(this.dtype in DTYPE_BYTES, `dummy weights: unsupported dtype ${String(this.dtype)}`);
    this.specs = new Map(specs.map((s) => [s.name, s]));
    this.fill = options.fill ?? randomFillTs;
  }

  names(): string[] {
    return [...this.specs.keys()];
  }

  get(name: string): WeightView | undefined {
    if (this.last?.name === name) return this.last.view;
    const spec = this.specs.get(name);
    if (!spec) return undefined;
    const bytes = new Uint8Array(elementCount(spec) * DTYPE_BYTES[this.dtype]);
    this.fill(bytes, this.dtype, { key: fillKey(this.seed, name), ...dummyInit(spec) });
    const view: WeightView = { dtype: this.dtype, shape: spec.shape, bytes };
    this.last = { name, view };
    return view;
  }
}
