/**
 * The tensors an architecture expects in a checkpoint (HF names and shapes), from its config
 * alone. Used to make dummy weights, to count parameters for `inspect` and to write the
 * parity checkpoints. The role says how a dummy tensor is initialised.
 */
export type TensorRole = "embedding" | "position" | "matrix" | "norm" | "norm-bias" | "bias";

export interface TensorSpec {
  readonly name: string;
  readonly shape: readonly number[];
  readonly role: TensorRole;
}

export function elementCount(spec: Pick<TensorSpec, "shape">): number {
  return spec.shape.reduce((a, b) => a * b, 1);
}

/** Uniform init for a dummy tensor: values in [offset − scale, offset + scale). Matrices get
 * variance 1/fan_in, so activations keep their size through the layers. */
export function dummyInit(spec: TensorSpec): { scale: number; offset: number } {
  switch (spec.role) {
    case "embedding": return { scale: 1, offset: 0 };
    case "position": return { scale: 0.5, offset: 0 };
    case "matrix": return { scale: Math.sqrt(3 / spec.shape[spec.shape.length - 1]), offset: 0 };
    case "norm": return { scale: 0.2, offset: 1 };
    case "norm-bias": return { scale: 0.1, offset: 0 };
    case "bias": return { scale: 0.1, offset: 0 };
  }
}
