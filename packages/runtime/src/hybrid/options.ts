/** Options of hybrid attention (the CLI's --attention hybrid flags map onto these). */
import { z } from "zod";
import { RowPathRequestSchema } from "./row-path.js";

export const LogitsModeSchema = z.enum(["exact", "speculative", "verified"]);
export type LogitsMode = z.infer<typeof LogitsModeSchema>;

/** Verified logits: candidates·K tokens q̃ chooses for the device to score (the runtime's and the CLI's option too). */
export const CandidatesSchema = z.number().int("must be an integer").min(1, "must be at least 1").max(64, "must be ≤ 64");

/** Why `keep` cannot apply (it needs verified logits and at most the candidates), or null: one rule for the options and the step. */
export function keepProblem(keep: number | undefined, logits: LogitsMode, candidates: number): string | null {
  return keep !== undefined && (logits !== "verified" || keep > candidates) ? `keep ${keep} needs verified logits and at most the candidates (${candidates}); logits are ${logits}` : null;
}

export const HybridOptionsSchema = z.object({
  /**
   * exact: the CPU stage of layer i scores with the true query of layer i (no cross-layer
   * overlap; with "all" selection identical to full attention). speculative (the paper's):
   * it scores with q̃ᵢ = RoPE(W_q⁽ⁱ⁾·norm⁽ⁱ⁾(xᵢ₋₁)), computed one layer ahead, so it runs
   * while the device finishes layer i − 1, and q̃'s logits enter the softmax. verified: q̃ only
   * chooses the candidates (ahead, as speculative); the device scores their K rows with the true
   * query, so the softmax sees exact logits over what q̃ chose.
   */
  logits: LogitsModeSchema.default("verified"),
  /** Layers whose selection waits for the true query (q̃ agrees poorly there; from profiling). */
  exactLayers: z.array(z.number().int().nonnegative()).default([]),
  /** Verified: q̃ chooses this many times K candidates for the device to score (4: at least
   * exact top-K's top-1 agreement and KL at every K of apps/bench/src/eval/hybrid-eval.ts on stories15M). */
  candidates: CandidatesSchema.default(4),
  /** Verified, handed off on a link that keeps rows (HostTransfers.keepRows): of the candidates·K
   * the device scores with the true query it keeps keep·K a KV head (the best by the group's largest
   * logit) and brings up only their V rows; absent: every candidate's V row. At most `candidates`. */
  keep: CandidatesSchema.optional(),
  /** On a device backend: where the selected V (and K) rows come from — "mapped" (the device reads
   * them from the pinned host store), "staged" (the CPU stage copies them, the copy stream uploads
   * them), "auto" (default: mapped wherever chooseRowPath finds it can run). */
  rowPath: RowPathRequestSchema.default("auto"),
  /** Maintain accumulated scores even when the selector does not ask for them. */
  trackScores: z.boolean().default(false),
});
export type HybridOptions = z.input<typeof HybridOptionsSchema>;

/** The engine's defaults (logits mode, candidates, row path…), parsed once for every reader. */
export const HYBRID_DEFAULTS: Readonly<z.output<typeof HybridOptionsSchema>> = Object.freeze(HybridOptionsSchema.parse({}));
