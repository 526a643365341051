/**
 * StreamingLLM's pattern as a pre-QKᵀ selector: the `sinks` oldest offloaded tokens (attention
 * sinks) plus the newest ones, K in all, chosen from positions alone, so no logits are
 * computed for the rest. Also valid post-QKᵀ (it then ignores the logits).
 */
import { z } from "zod";
import { defineSelector } from "../define-selector.js";
import { BUILTIN } from "../builtin-mark.js";

export const StreamingOptionsSchema = z.object({
  /** Oldest offloaded tokens always kept (StreamingLLM keeps 4). */
  sinks: z.number().int().nonnegative().default(4),
});

export const streamingLLM = defineSelector<z.output<typeof StreamingOptionsSchema>>({
  name: "streaming",
  description: "pre-QKᵀ positional: the oldest `sinks` offloaded tokens plus the newest (StreamingLLM)",
  timings: ["pre", "post"],
  options: StreamingOptionsSchema,
  select({ offloaded: n, k, primitives: P }, { sinks }) {
    const s = Math.min(sinks, k, n);
    const recent = k - s; // k ≤ n, so [n − recent, n) never overlaps [0, s)
    const ids = new Int32Array(k);
    ids.set(P.range(0, s), 0);
    ids.set(P.range(n - recent, recent), s);
    return { kind: "shared", ids };
  },
}, BUILTIN);
