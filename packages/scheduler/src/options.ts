import { z } from "zod";
import { DEFAULT_K, DEFAULT_TIMING, KSchema, SelectionTimingSchema } from "@hybridgen/spec";

/** FixedScheduler: the same K and timing every step. */
export const FixedSchedulerOptionsSchema = z
  .object({
    k: KSchema.default(DEFAULT_K),
    timing: SelectionTimingSchema.default(DEFAULT_TIMING),
  })
  .strict();
export type FixedSchedulerOptions = z.input<typeof FixedSchedulerOptionsSchema>;

/** FeedbackScheduler: paper Algorithm 1 with a step-size model and hysteresis (see README). */
export const FeedbackSchedulerOptionsSchema = z
  .object({
    /** Accuracy floor from offline profiling: K never goes below it. */
    kMin: KSchema.default(DEFAULT_K),
    /** Upper bound on K (default: unbounded; the engine still clamps to the offloaded count). */
    kMax: KSchema.optional(),
    /** K of the first step (default kMin: Algorithm 1 starts there). */
    k: KSchema.optional(),
    /** Timing of the first step (Algorithm 1 starts with post-QKᵀ). */
    timing: SelectionTimingSchema.default(DEFAULT_TIMING),
    /** Largest factor K may change by in one decision, up or down. */
    maxStep: z.number().gt(1).max(16).default(2),
    /** Grow K only while T_cpu + T_tx ≤ (1 − deadband)·T_gpu; shrink when above T_gpu. Avoids flapping at the boundary. */
    deadband: z.number().min(0).max(0.5).default(0.05),
    /**
     * Grow K only while the device stage predicted at the new K stays ≤ (1 + gpuGrowth)·T_gpu at
     * kMin; above that, shrink back. The device gathers and aggregates the K rows, so a larger K
     * lengthens T_gpu itself: a load that hides behind it does not make K free (1: up to twice
     * the kMin device stage; 0: no growth once T_gpu is seen to rise with K).
     */
    gpuGrowth: z.number().min(0).max(1).default(0.1),
    /**
     * K moves in multiples of kQuantum above kMin (doubling first while a step of maxStep adds less
     * than kQuantum, so a small kMin grows too), and shrinks toward the device cap only once it
     * is a whole quantum past it: each distinct K is a decode step the device records afresh (CUDA
     * graphs), so a K that jitters by a token would re-record every step.
     */
    kQuantum: z.number().int().positive().default(16),
    /**
     * Allow switching to pre-QKᵀ when post is CPU-bound at kMin (false: post only, K pinned at
     * kMin). Set it from the selector: false when its timings lack "pre". A step the engine ran
     * post although pre was asked for (the selector cannot run pre) turns it off as well.
     */
    allowPre: z.boolean().default(true),
    /** Switch back to post-QKᵀ when its predicted CPU stage fits again (an extension of Algorithm 1). */
    returnToPost: z.boolean().default(true),
    /** Predicted post load must be ≤ (1 − postMargin)·T_gpu to return to post. */
    postMargin: z.number().min(0).max(0.9).default(0.15),
    /** Steps to stay in a timing after switching before switching again; doubled after each
     * return to post that did not fit (back-off). The first timing needs no dwell. */
    minDwellSteps: z.number().int().nonnegative().default(4),
  })
  .strict()
  .refine((o) => o.allowPre || o.timing === "post", { message: "timing pre needs allowPre", path: ["timing"] })
  .refine((o) => o.kMax === undefined || o.kMax >= o.kMin, { message: "kMax must be ≥ kMin", path: ["kMax"] })
  .refine((o) => o.k === undefined || (o.k >= o.kMin && (o.kMax === undefined || o.k <= o.kMax)), {
    message: "k (the first step's) must lie in [kMin, kMax]",
    path: ["k"],
  });
export type FeedbackSchedulerOptions = z.input<typeof FeedbackSchedulerOptionsSchema>;
export type ResolvedFeedbackOptions = z.output<typeof FeedbackSchedulerOptionsSchema>;

/** A scheduler as a config file or the CLI names it. */
export const SchedulerSpecSchema = z.discriminatedUnion("kind", [
  z.object({ kind: z.literal("fixed") }).extend(FixedSchedulerOptionsSchema.shape),
  z.object({ kind: z.literal("feedback"), options: FeedbackSchedulerOptionsSchema.optional() }),
]);
export type SchedulerSpec = z.input<typeof SchedulerSpecSchema>;
