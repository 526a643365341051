/**
 * The Scheduler contract (paper §4.3, Algorithm 1): after every decode step the engine reports
 * the measured stage times; the scheduler answers with the K and the selection timing for the
 * next step. One K serves every layer (the paper's choice); the selected tokens still differ
 * per layer. The engine clamps K to the offloaded count when it selects; the scheduler itself
 * never answers below kMin.
 */
import { z } from "zod";
import { HybridgenError } from "../errors.js";
import { SelectionTimingSchema, type SelectionTiming } from "./selector.js";
import type { SpecVersion } from "../version.js";

const ms = z.number().finite().nonnegative();

/** Per-layer times of one step (arrays indexed by layer), when the engine measures them. */
export const LayerTimingsSchema = z.object({
  tGpuMs: z.array(ms),
  tCpuMs: z.array(ms),
  tTxMs: z.array(ms),
});

/**
 * One step's measurements. tGpuMs: the device stage (window attention + rest of the block) that
 * the CPU stage hides behind; tCpuMs: the CPU stage (scoring + selection + V gather); tTxMs: the
 * host→device copy of selected logits and V rows. All three are summed over layers.
 */
export const StepTimingsSchema = z.object({
  step: z.number().int().nonnegative(),
  tGpuMs: ms,
  tCpuMs: ms,
  tTxMs: ms,
  /** How long the step waited for the CPU stage (the device's waits in a handed-off step, else the host's): the part of T_cpu not hidden. */
  tWaitMs: ms.optional(),
  /** The K this step ran with (before clamping to the offloaded count). */
  k: z.number().int().nonnegative(),
  timing: SelectionTimingSchema,
  /** Offloaded tokens per layer of the sequence (the largest in the batch). */
  offloaded: z.number().int().nonnegative(),
  layers: z.number().int().positive().optional(),
  perLayer: LayerTimingsSchema.optional(),
});
export type StepTimings = z.infer<typeof StepTimingsSchema>;
export type LayerTimings = z.infer<typeof LayerTimingsSchema>;

export const SchedulerDecisionSchema = z.object({
  k: z.number().int().positive(),
  timing: SelectionTimingSchema,
});
export type SchedulerDecision = z.infer<typeof SchedulerDecisionSchema>;

/** Bounds every scheduler honours. kMin comes from offline accuracy profiling (paper Fig. 14). */
export const SchedulerBoundsSchema = z
  .object({
    kMin: z.number().int().positive().default(64),
    kMax: z.number().int().positive().optional(),
  })
  .refine((b) => b.kMax === undefined || b.kMax >= b.kMin, { message: "kMax must be ≥ kMin", path: ["kMax"] });
export type SchedulerBounds = z.infer<typeof SchedulerBoundsSchema>;

/** Which scheduler to build, as the CLI/config names it (the packages own the full options). */
export const SchedulerKindSchema = z.enum(["fixed", "feedback"]);
export type SchedulerKind = z.infer<typeof SchedulerKindSchema>;

export interface Scheduler {
  /** The spec version it was written for (SPEC_VERSION); absent: written before the field. */
  readonly spec?: SpecVersion;
  readonly name: string;
  /** The decision for the first step, before any measurement. */
  initial(): SchedulerDecision;
  /** Feeds one step's measurements; returns the decision for the next step. */
  next(t: StepTimings): SchedulerDecision;
  /** Forget history (a new generation). */
  reset(): void;
}

/** Clamps k into [kMin, kMax] — the invariant every Scheduler keeps. */
export function clampK(k: number, bounds: { kMin: number; kMax?: number }): number {
  const hi = bounds.kMax ?? Number.MAX_SAFE_INTEGER;
  return Math.min(hi, Math.max(bounds.kMin, Math.round(k)));
}

/** Parses an engine-reported measurement, throwing a one-line HybridgenError on a bad value. */
export function parseStepTimings(raw: unknown): StepTimings {
  const r = StepTimingsSchema.safeParse(raw);
  if (!r.success) {
    const i = r.error.issues[0];
    throw new HybridgenError(`step timings: ${i?.path.join(".") || "value"}: ${i?.message ?? "invalid"}`);
  }
  return r.data;
}

/** One hybrid decode step as the scheduler was told it: the K and timing it ran with, its
 * offloaded count, T_gpu / T_cpu / T_tx summed over layers, and the step's wall time. */
export interface HybridStepRecord {
  readonly step: number;
  readonly k: number;
  readonly timing: SelectionTiming;
  readonly offloaded: number;
  readonly tGpuMs: number;
  readonly tCpuMs: number;
  readonly tTxMs: number;
  /** The step's wait for the CPU stage (StepTimings.tWaitMs). */
  readonly tWaitMs?: number;
  /** beginStep → endStep on the host, after the device finished the step. */
  readonly wallMs: number;
}
