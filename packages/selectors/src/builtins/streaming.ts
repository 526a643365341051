/**
 * StreamingLLM's pattern as a pre-QKᵀ selector: the `sinks` oldest offloaded tokens (attention
 * sinks) plus the newest ones, K in all, chosen from positions alone, so no logits are
 * computed for the rest. Also valid post-QKᵀ (it then ignores the logits). Declares the CpuStage
 * kernel "streaming" (pre-QKᵀ only), which a stage runs instead of select().
 */
import { streamingSelection } from "@hybridgen/spec";
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
  // The CpuStage's "streaming" kernel computes the same list, so a pre-QKᵀ step runs no JS selection
  // and the stage's job can queue (and hand off on the device) like Quest's.
  // Sinks past 2³¹ − 1 choose as 2³¹ − 1 does (no store holds that many slots), and the kernel's field is 32-bit.
  kernel: ({ sinks }) => ({ name: "streaming", sinks: Math.min(sinks, 0x7fffffff) }),
  select({ offloaded: n, k }, { sinks }) {
    return { kind: "shared", ids: streamingSelection(n, k, sinks) };
  },
}, BUILTIN);
