/**
 * Timing traces: the per-step scheduler inputs of real hybrid runs (HybridStats.trace), kept as
 * JSON so a scheduler can be replayed against them (replay.ts) without the machine they came
 * from. timingTraceFromRuns() is the recorder: stats traces of one or more runs in, a fixture out.
 */
import { z } from "zod";
import { HybridgenError, SelectionTimingSchema, type HybridStepRecord } from "@hybridgen/spec";

export const TIMING_TRACE_FORMAT = "hybridgen-timing-trace/1";

const ms = z.number().finite().nonnegative();

export const TraceStepSchema = z.object({
  step: z.number().int().nonnegative(),
  k: z.number().int().positive(),
  timing: SelectionTimingSchema,
  offloaded: z.number().int().nonnegative(),
  tGpuMs: ms,
  tCpuMs: ms,
  tTxMs: ms,
  /** The step's wait for the CPU stage (optional: an engine that cannot tell leaves it out). */
  tWaitMs: ms.optional(),
  /** The step's wall time: ms/token of a decode step. */
  wallMs: ms,
});
export type TraceStep = z.infer<typeof TraceStepSchema>;

export const TimingTraceRunSchema = z.object({
  /** e.g. "fixed post K=256", "feedback kMin=256". */
  label: z.string().min(1),
  /** The scheduler that chose each step's K and timing ("fixed", "feedback"). */
  scheduler: z.string().min(1),
  steps: z.array(TraceStepSchema).min(1),
});
export type TimingTraceRun = z.infer<typeof TimingTraceRunSchema>;

export const TimingTraceSchema = z.object({
  format: z.literal(TIMING_TRACE_FORMAT),
  /** Where the numbers come from: the command and machine of a recording, or what they were derived from. */
  source: z.string().min(1),
  /** True when built from published figures and assumptions rather than recorded step by step. */
  derived: z.boolean(),
  /** The run's shape: model, context, window, layers, logits mode, machine… */
  setup: z.record(z.string(), z.union([z.string(), z.number(), z.boolean()])).default({}),
  runs: z.array(TimingTraceRunSchema).min(1),
});
export type TimingTrace = z.output<typeof TimingTraceSchema>;

/** Validates a trace (e.g. a parsed fixture file); a bad one is a one-line HybridgenError. */
export function parseTimingTrace(raw: unknown): TimingTrace {
  const r = TimingTraceSchema.safeParse(raw);
  if (r.success) return r.data;
  const i = r.error.issues[0];
  throw new HybridgenError(`timing trace: ${i?.path.join(".") || "value"}: ${i?.message ?? "invalid"}`);
}

/** One recorded run: a label, the scheduler's name, and the stats trace of its steps. */
export interface RecordedRun {
  readonly label: string;
  readonly scheduler: string;
  /** HybridAttention.stats.trace after the run (or a slice of it). */
  readonly steps: readonly HybridStepRecord[];
}

/**
 * The recorder: turns HybridStats traces of real runs into a timing-trace fixture, e.g.
 *   writeFileSync("trace.json", JSON.stringify(timingTraceFromRuns(
 *     [{ label: "fixed post K=256", scheduler: "fixed", steps: ha.stats.trace }, …],
 *     { source: "kernels-cuda hybrid-bench on an H200, 2026-12-02", setup: { context: 32768, window: 4096 } })));
 * Steps with K = 0 (nothing offloaded) are left out.
 */
export function timingTraceFromRuns(
  runs: readonly RecordedRun[],
  meta: { source: string; derived?: boolean; setup?: Record<string, string | number | boolean> },
): TimingTrace {
  return parseTimingTrace({
    format: TIMING_TRACE_FORMAT,
    source: meta.source,
    derived: meta.derived ?? false,
    setup: meta.setup ?? {},
    runs: runs.map((r) => ({
      label: r.label,
      scheduler: r.scheduler,
      steps: r.steps.filter((s) => s.k > 0).map((s) => ({
        step: s.step, k: s.k, timing: s.timing, offloaded: s.offloaded, tGpuMs: s.tGpuMs, tCpuMs: s.tCpuMs, tTxMs: s.tTxMs, tWaitMs: s.tWaitMs, wallMs: s.wallMs,
      })),
    })),
  });
}
