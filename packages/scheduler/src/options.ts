import { z } from "zod";
import { SelectionTimingSchema } from "@hybridgen/core";

const positiveInt = z.number().int().positive();

/** FixedScheduler: the same K and timing every step. */
export const FixedSchedulerOptionsSchema = z.object({
  k: positiveInt.default(128),
  timing: SelectionTimingSchema.default("post"),
});
export type FixedSchedulerOptions = z.input<typeof FixedSchedulerOptionsSchema>;

/** FeedbackScheduler: paper Algorithm 1 with a step-size model and hysteresis (see README). */
export const FeedbackSchedulerOptionsSchema = z
  .object({
    /** Accuracy floor from offline profiling: K never goes below it. */
    kMin: positiveInt.default(64),
    /** Upper bound on K (default: unbounded; the engine still clamps to the offloaded count). */
    kMax: positiveInt.optional(),
    /** K of the first step (Algorithm 1 starts at kMin). */
    kInitial: positiveInt.optional(),
    /** Timing of the first step (Algorithm 1 starts with post-QKᵀ). */
    initialTiming: SelectionTimingSchema.default("post"),
    /** Largest factor K may change by in one decision, up or down. */
    maxStep: z.number().gt(1).max(16).default(2),
    /** Grow K only while T_cpu + T_tx ≤ (1 − deadband)·T_gpu; shrink when above T_gpu. Avoids flapping at the boundary. */
    deadband: z.number().min(0).max(0.5).default(0.05),
    /** Allow switching to pre-QKᵀ when post is CPU-bound at kMin (false: post only, K pinned at kMin). */
    allowPre: z.boolean().default(true),
    /** Switch back to post-QKᵀ when its predicted CPU stage fits again (an extension of Algorithm 1). */
    returnToPost: z.boolean().default(true),
    /** Predicted post load must be ≤ (1 − postMargin)·T_gpu to return to post. */
    postMargin: z.number().min(0).max(0.9).default(0.15),
    /** Steps to stay in a timing after switching before switching again. */
    minDwellSteps: z.number().int().nonnegative().default(4),
  })
  .refine((o) => o.kMax === undefined || o.kMax >= o.kMin, { message: "kMax must be ≥ kMin", path: ["kMax"] })
  .refine((o) => o.kInitial === undefined || (o.kInitial >= o.kMin && (o.kMax === undefined || o.kInitial <= o.kMax)), {
    message: "kInitial must lie in [kMin, kMax]",
    path: ["kInitial"],
  });
export type FeedbackSchedulerOptions = z.input<typeof FeedbackSchedulerOptionsSchema>;
export type ResolvedFeedbackOptions = z.output<typeof FeedbackSchedulerOptionsSchema>;

/** A scheduler as a config file or the CLI names it. */
export const SchedulerSpecSchema = z.discriminatedUnion("kind", [
  z.object({ kind: z.literal("fixed") }).extend(FixedSchedulerOptionsSchema.shape),
  z.object({ kind: z.literal("feedback"), options: FeedbackSchedulerOptionsSchema.optional() }),
]);
export type SchedulerSpec = z.input<typeof SchedulerSpecSchema>;
