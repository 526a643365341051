/**
 * A cost model per (timing, K) fitted from a timing trace, with the trace's own step-to-step
 * noise: per timing, T_gpu, T_cpu and T_tx are each a + b·K' (K' = min(K, offloaded), least
 * squares, b ≥ 0), and a step's wall time is max(T_gpu, T_cpu + T_tx) + an overhead (the mean
 * of the rest in the trace: the part of a step neither stage hides). Each trace step leaves
 * residuals (ratios for the three times, a difference for the wall), which replay() draws
 * from to give simulated steps the noise the machine had. One trace describes one context;
 * other lengths need their own.
 */
import { HybridgenError, type SelectionTiming } from "@hybridgen/core";
import type { TimingTrace, TraceStep } from "./timing-trace.js";

/** ms = a + b·min(K, offloaded). */
export interface LinearCost {
  readonly a: number;
  readonly b: number;
}

/** The residuals of one trace step against the fit. */
export interface StepResidual {
  readonly gpu: number;
  readonly cpu: number;
  readonly tx: number;
  /** Wall ms beyond the model's. */
  readonly wallMs: number;
}

export interface TimingCost {
  readonly gpu: LinearCost;
  readonly cpu: LinearCost;
  readonly tx: LinearCost;
  readonly overheadMs: number;
  readonly residuals: readonly StepResidual[];
  /** The K values the fit saw (extrapolating far beyond them is a guess). */
  readonly kSeen: readonly number[];
}

export interface CostModel {
  readonly timings: Partial<Record<SelectionTiming, TimingCost>>;
  /** The offloaded count at the trace's first step (replays start there and add one a step). */
  readonly offloaded: number;
}

export interface SimulatedStep {
  readonly tGpuMs: number;
  readonly tCpuMs: number;
  readonly tTxMs: number;
  readonly wallMs: number;
}

/**
 * Fits the model from every run of the trace; `skipSteps` leading steps of each run are left
 * out (the first hybrid step includes warm-up: graph capture, first touches).
 */
export function fitCostModel(trace: TimingTrace, options: { skipSteps?: number } = {}): CostModel {
  const skip = options.skipSteps ?? 1;
  const byTiming: Record<SelectionTiming, TraceStep[]> = { pre: [], post: [] };
  for (const run of trace.runs) for (const s of run.steps.slice(skip)) byTiming[s.timing].push(s);
  const timings: Partial<Record<SelectionTiming, TimingCost>> = {};
  for (const timing of ["post", "pre"] as const) {
    const steps = byTiming[timing];
    if (steps.length === 0) continue;
    const x = steps.map((s) => Math.min(s.k, s.offloaded));
    const kSeen = [...new Set(x)].sort((p, q) => p - q);
    if (kSeen.length < 2) {
      throw new HybridgenError(`timing trace: ${timing} steps at one K only (${kSeen[0]}): record a second K to fit its cost per K`);
    }
    const gpu = fitLine(x, steps.map((s) => s.tGpuMs));
    const cpu = fitLine(x, steps.map((s) => s.tCpuMs));
    const tx = fitLine(x, steps.map((s) => s.tTxMs));
    const bare = steps.map((s, i) => Math.max(at(gpu, x[i]!), at(cpu, x[i]!) + at(tx, x[i]!)));
    const overheadMs = Math.max(0, mean(steps.map((s, i) => s.wallMs - bare[i]!)));
    const residuals = steps.map((s, i) => ({
      gpu: ratio(s.tGpuMs, at(gpu, x[i]!)),
      cpu: ratio(s.tCpuMs, at(cpu, x[i]!)),
      tx: ratio(s.tTxMs, at(tx, x[i]!)),
      wallMs: s.wallMs - (Math.max(s.tGpuMs, s.tCpuMs + s.tTxMs) + overheadMs),
    }));
    timings[timing] = { gpu, cpu, tx, overheadMs, residuals, kSeen };
  }
  const first = trace.runs[0]!.steps[0]!;
  return { timings, offloaded: first.offloaded };
}

/** One step at (timing, K) with `offloaded` tokens; `noise` is a trace step's residual (none: the mean). */
export function simulateStep(model: CostModel, timing: SelectionTiming, k: number, offloaded: number, noise?: StepResidual): SimulatedStep {
  const c = model.timings[timing];
  if (!c) throw new HybridgenError(`cost model: the trace has no ${timing} steps`);
  const x = Math.min(k, offloaded);
  const tGpuMs = at(c.gpu, x) * (noise?.gpu ?? 1);
  const tCpuMs = at(c.cpu, x) * (noise?.cpu ?? 1);
  const tTxMs = at(c.tx, x) * (noise?.tx ?? 1);
  const wallMs = Math.max(0, Math.max(tGpuMs, tCpuMs + tTxMs) + c.overheadMs + (noise?.wallMs ?? 0));
  return { tGpuMs, tCpuMs, tTxMs, wallMs };
}

function at(l: LinearCost, x: number): number {
  return Math.max(0, l.a + l.b * x);
}

function ratio(obs: number, fit: number): number {
  return fit > 0 ? obs / fit : 1;
}

function mean(v: readonly number[]): number {
  return v.reduce((s, x) => s + x, 0) / v.length;
}

/** Least squares y = a + b·x with b ≥ 0 (a cost never falls as K grows). */
function fitLine(x: readonly number[], y: readonly number[]): LinearCost {
  const mx = mean(x), my = mean(y);
  let sxy = 0, sxx = 0;
  for (let i = 0; i < x.length; i++) {
    sxy += (x[i]! - mx) * (y[i]! - my);
    sxx += (x[i]! - mx) ** 2;
  }
  const b = sxx > 0 ? Math.max(0, sxy / sxx) : 0;
  return { a: my - b * mx, b };
}
