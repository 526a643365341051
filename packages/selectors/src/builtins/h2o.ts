/**
 * H2O-style heavy hitters, per KV head: the newest `recentFraction`·K offloaded tokens plus the
 * K − recent older ones with the largest accumulated attention (summed over the group's query
 * heads and past steps, kept by the engine). Needs no logits of this step, so it runs pre-QKᵀ;
 * post-QKᵀ it behaves the same (the current step's scores arrive only after softmax).
 */
import { z } from "zod";
import { defineSelector } from "../define-selector.js";
import { BUILTIN } from "../builtin-mark.js";

export const H2OOptionsSchema = z.object({
  /** Share of K given to the most recent offloaded tokens. */
  recentFraction: z.number().min(0).max(1).default(0.5),
});

export const h2o = defineSelector<z.output<typeof H2OOptionsSchema>>({
  name: "h2o",
  description: "heavy hitters by accumulated attention + recent tokens, per KV head (H2O)",
  timings: ["pre", "post"],
  options: H2OOptionsSchema,
  needsScores: true,
  select({ offloaded: n, k, layout, scores, primitives: P }, { recentFraction }) {
    if (!scores) throw new Error("accumulated scores missing");
    const recent = Math.min(k, Math.floor(k * recentFraction));
    const older = n - recent;
    const tail = P.range(older, recent);
    const ids: Int32Array[] = [];
    for (let g = 0; g < layout.kvHeads; g++) {
      const heavy = P.topK(scores.perKvHead[g]!, k - recent, older);
      const list = new Int32Array(k);
      list.set(heavy, 0);
      list.set(tail, heavy.length);
      ids.push(list);
    }
    return { kind: "perKvHead", ids };
  },
}, BUILTIN);
