/** Options of hybrid attention (the CLI's --attention hybrid flags map onto these). */
import { z } from "zod";

export const LogitsModeSchema = z.enum(["exact", "speculative"]);
export type LogitsMode = z.infer<typeof LogitsModeSchema>;

export const HybridOptionsSchema = z.object({
  /**
   * exact: the CPU stage of layer i scores with the true query of layer i (no cross-layer
   * overlap; with "all" selection identical to full attention). speculative (the paper's):
   * it scores with q̃ᵢ = RoPE(W_q⁽ⁱ⁾·norm⁽ⁱ⁾(xᵢ₋₁)), computed one layer ahead, so it runs
   * while the device finishes layer i − 1.
   */
  logits: LogitsModeSchema.default("speculative"),
  /** Maintain accumulated scores even when the selector does not ask for them. */
  trackScores: z.boolean().default(false),
});
export type HybridOptions = z.input<typeof HybridOptionsSchema>;
