import type { CausalLM } from "@hybridgen/core";

/** Greedy decode of `steps` tokens from position `first`; wall ms of each step (step + pick). */
export function greedyWalls(model: CausalLM, first: number, steps: number, around?: { step: number; range: (on: boolean) => void }, firstToken?: number): number[] {
  const walls: number[] = [];
  let tok = firstToken ?? model.argmaxLogits(); // a cache filled without a step (synthetic KV) has no logits yet
  for (let s = 0; s < steps; s++) {
    if (around?.step === s) around.range(true);
    const t0 = performance.now();
    model.step(Int32Array.of(tok), first + s);
    tok = model.argmaxLogits();
    walls.push(performance.now() - t0);
    if (around?.step === s) around.range(false);
  }
  return walls;
}

export const mean = (xs: readonly number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);
