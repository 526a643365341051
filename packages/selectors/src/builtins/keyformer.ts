/**
 * Keyformer-style key tokens, per KV head: post-QKᵀ, every offloaded token's logit plus Gumbel
 * noise, divided by a temperature τ that rises linearly from `tauStart` to `tauEnd` over
 * `tauSteps` decode steps, is softmaxed over the offloaded tokens, and the probabilities are
 * added (over the group's query heads) to a per-token score the selector keeps across steps.
 * It returns the newest `recentFraction`·K tokens plus the K − recent older ones with the
 * highest score. The noise is read from a table of 65 536 Gumbel samples drawn once per layer
 * from a seeded generator, at an odd stride from an offset that changes with the step and head
 * (two logarithms per token and head would cost more than the rest of the selector); a run is
 * reproducible.
 */
import { z } from "zod";
import { seededRandom } from "@hybridgen/spec";
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
  /** GUMBEL_TABLE standard Gumbel samples. */
  gumbel: Float32Array;
  steps: number;
  probs: Float32Array;
}

export const GUMBEL_TABLE = 65536;
/** Odd, so j ↦ j·stride mod GUMBEL_TABLE visits every entry before repeating. */
const STRIDE = 40503;

/** The table of standard Gumbel samples of a layer (seeded). */
export function gumbelTable(seed: number, layer: number): Float32Array {
  const random = seededRandom(seed * 1009 + layer);
  return Float32Array.from({ length: GUMBEL_TABLE }, () => {
    const u = Math.min(Math.max(random(), 1e-12), 1 - 1e-12);
    return -Math.log(-Math.log(u));
  });
}

/** The table index of token j's noise at decode step `step`, query head h. */
export function gumbelIndex(step: number, h: number, j: number): number {
  return (Math.imul(step, 7919) + Math.imul(h, 104729) + Math.imul(j, STRIDE)) & (GUMBEL_TABLE - 1);
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
    gumbel: gumbelTable(o.seed, info.layer),
    steps: 0,
    probs: new Float32Array(0),
  }),
  select(input, o) {
    if (input.timing !== "post") throw new Error("needs logits");
    const { offloaded: n, k, layout, logits, state, primitives: P } = input;
    const step = state.steps++;
    const inv = 1 / keyformerTau(o, step), scale = o.noise;
    state.probs = grow(state.probs, n);
    const probs = state.probs, table = state.gumbel, mask = GUMBEL_TABLE - 1;
    for (let g = 0; g < layout.kvHeads; g++) {
      const acc = (state.score[g] = grow(state.score[g]!, n));
      for (let h = g * layout.groupSize; h < (g + 1) * layout.groupSize; h++) {
        const row = logits[h]!;
        let at = gumbelIndex(step, h, 0);
        let max = -Infinity;
        for (let j = 0; j < n; j++) {
          const x = (row[j]! + scale * table[at]!) * inv;
          at = (at + STRIDE) & mask;
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
