/**
 * Keyformer-style key tokens, per KV head: post-QKᵀ, every offloaded token's logit plus Gumbel
 * noise, divided by a temperature τ that rises linearly from `tauStart` to `tauEnd` over
 * `tauSteps` decode steps, is softmaxed over the offloaded tokens, and the probabilities are
 * added (over the group's query heads) to a per-token score the selector keeps across steps.
 * It returns the newest `recentFraction`·K tokens plus the K − recent older ones with the
 * highest score. The noise comes from a seeded generator, so a run is reproducible.
 */
import { z } from "zod";
import { seededRandom } from "@hybridgen/core";
import { defineSelector } from "../define-selector.js";
import { BUILTIN } from "../builtin-mark.js";

export const KeyformerOptionsSchema = z.object({
  /** Share of K given to the most recent offloaded tokens. */
  recentFraction: z.number().min(0).max(1).default(0.5),
  /** Temperature of the first decode step and of step tauSteps and later. */
  tauStart: z.number().positive().default(1),
  tauEnd: z.number().positive().default(2),
  tauSteps: z.number().int().positive().default(256),
  /** Scale of the Gumbel noise (0: plain softmax scores). */
  noise: z.number().min(0).default(1),
  seed: z.number().int().nonnegative().default(0),
});
export type KeyformerOptions = z.output<typeof KeyformerOptionsSchema>;

export interface KeyformerState {
  /** Accumulated score per KV head, indexed by store slot (grown as the store grows). */
  score: Float32Array[];
  random: () => number;
  steps: number;
  noise: Float32Array;
  probs: Float32Array;
}

/** τ at decode step `step`: linear from tauStart to tauEnd over tauSteps steps, then tauEnd. */
export function keyformerTau(o: KeyformerOptions, step: number): number {
  const f = Math.min(1, step / o.tauSteps);
  return o.tauStart + (o.tauEnd - o.tauStart) * f;
}

function grow(a: Float32Array, n: number): Float32Array {
  if (a.length >= n) return a;
  const b = new Float32Array(Math.max(n, a.length * 2));
  b.set(a);
  return b;
}

export const keyformer = defineSelector<KeyformerOptions, KeyformerState>({
  name: "keyformer",
  description: "key tokens by accumulated Gumbel-softmax scores + recent tokens, per KV head (Keyformer)",
  timings: ["post"],
  options: KeyformerOptionsSchema,
  initState: (info, o) => ({
    score: Array.from({ length: info.layout.kvHeads }, () => new Float32Array(0)),
    random: seededRandom(o.seed * 1009 + info.layer),
    steps: 0,
    noise: new Float32Array(0),
    probs: new Float32Array(0),
  }),
  select(input, o) {
    if (input.timing !== "post") throw new Error("needs logits");
    const { offloaded: n, k, layout, logits, state, primitives: P } = input;
    const tau = keyformerTau(o, state.steps);
    state.steps++;
    state.noise = grow(state.noise, n);
    state.probs = grow(state.probs, n);
    const noise = state.noise, probs = state.probs;
    for (let g = 0; g < layout.kvHeads; g++) {
      const acc = (state.score[g] = grow(state.score[g]!, n));
      for (let h = g * layout.groupSize; h < (g + 1) * layout.groupSize; h++) {
        const row = logits[h]!;
        for (let j = 0; j < n; j++) {
          const u = Math.min(Math.max(state.random(), 1e-12), 1 - 1e-12);
          noise[j] = o.noise * -Math.log(-Math.log(u));
        }
        let max = -Infinity;
        for (let j = 0; j < n; j++) {
          const x = (row[j]! + noise[j]!) / tau;
          probs[j] = x;
          if (x > max) max = x;
        }
        let sum = 0;
        for (let j = 0; j < n; j++) {
          const e = Math.exp(probs[j]! - max);
          probs[j] = e;
          sum += e;
        }
        for (let j = 0; j < n; j++) acc[j] += probs[j]! / sum;
      }
    }
    const recent = Math.min(k, Math.floor(k * o.recentFraction));
    const older = n - recent;
    const tail = P.range(older, recent);
    const ids: Int32Array[] = [];
    for (let g = 0; g < layout.kvHeads; g++) {
      const heavy = P.topK(state.score[g]!, k - recent, older);
      const list = new Int32Array(heavy.length + recent);
      list.set(heavy, 0);
      list.set(tail, heavy.length);
      ids.push(list);
    }
    return { kind: "perKvHead", ids };
  },
}, BUILTIN);
