import type { CausalLM } from "@hybridgen/core";

/** Greedy decode of `steps` tokens from position `first`; wall ms of each step (step + pick). */
export function greedyWalls(model: CausalLM, first: number, steps: number): number[] {
  const walls: number[] = [];
  let tok = model.argmaxLogits();
  for (let s = 0; s < steps; s++) {
    const t0 = performance.now();
    model.step(Int32Array.of(tok), first + s);
    tok = model.argmaxLogits();
    walls.push(performance.now() - t0);
  }
  return walls;
}

export const mean = (xs: readonly number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);
