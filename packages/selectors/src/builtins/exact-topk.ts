/**
 * Post-QKᵀ exact top-K: every offloaded token has been scored; keep the K with the largest
 * logits. Per KV head (default) a token's importance is the MAX of its logits over the query
 * heads of the group: the KV head must keep any token some head of its group attends to
 * strongly (a mean would let one head's sharp peak drown in the others' indifference).
 * `shared: true` takes the max over all heads and returns one list for every KV head.
 */
import { z } from "zod";
import { defineSelector } from "../define-selector.js";
import { BUILTIN } from "../builtin-mark.js";
import { newScratch, scratchView, type Scratch } from "./scratch.js";

export const ExactTopKOptionsSchema = z.object({
  /** One list for all KV heads (max over every query head) instead of one per KV head. */
  shared: z.boolean().default(false),
});

export const exactTopK = defineSelector<z.output<typeof ExactTopKOptionsSchema>, Scratch>({
  name: "topk",
  description: "post-QKᵀ exact top-K per KV head (max over the group's query heads)",
  timings: ["post"],
  options: ExactTopKOptionsSchema,
  kernel: (o) => (o.shared ? "topk-shared" : "topk"),
  initState: () => newScratch(),
  select(input, options) {
    if (input.timing !== "post") throw new Error("needs logits");
    const { offloaded: n, k, logits, layout, primitives: P, state } = input;
    const best = scratchView(state, n);
    if (options.shared) {
      P.maxRows(logits, n, best);
      return { kind: "shared", ids: P.topK(best, k, n) };
    }
    const ids: Int32Array[] = [];
    for (let g = 0; g < layout.kvHeads; g++) {
      const group = logits.slice(g * layout.groupSize, (g + 1) * layout.groupSize);
      P.maxRows(group, n, best);
      ids.push(P.topK(best, k, n));
    }
    return { kind: "perKvHead", ids };
  },
}, BUILTIN);
