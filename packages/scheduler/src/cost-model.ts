/**
 * A cost model per (timing, K) fitted from a timing trace, with the trace's own step-to-step
 * noise: per timing, T_gpu, T_cpu and T_tx are each a + b·K' (K' = min(K, offloaded), least
 * squares, b ≥ 0), and a step's wall time is max(T_gpu, T_cpu + T_tx) + an overhead (the mean
 * of the rest in the trace: the part of a step neither stage hides). Each trace step leaves
 * residuals (ratios for the three times, a difference for the wall), which replay() draws
 * from to give simulated steps the noise the machine had. A timing seen at one K only borrows
 * its per-K slopes from the other timing (the same V rows are gathered, copied and aggregated
 * per selected token). One trace describes one context; other lengths need their own.
 */
import { HybridgenError, type SelectionTiming } from "@hybridgen/spec";
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
  /** Set when this timing was seen at one K only and its slopes come from the other timing. */
  readonly slopesFrom?: SelectionTiming;
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
 * Fits the model from the trace's runs (all, or those labelled in `runs`: one configuration's
 * logits mode and selectors); `skipSteps` leading steps of each run are left out (the first
 * hybrid steps include warm-up: graph capture, first touches).
 */
export function fitCostModel(trace: TimingTrace, options: { skipSteps?: number; runs?: readonly string[] } = {}): CostModel {
  const skip = options.skipSteps ?? 1;
  const runs = options.runs ? trace.runs.filter((r) => options.runs!.includes(r.label)) : trace.runs;
  if (runs.length === 0) throw new HybridgenError(`timing trace: no run labelled ${options.runs!.join(", ")} (runs: ${trace.runs.map((r) => r.label).join(", ")})`);
  const byTiming: Record<SelectionTiming, TraceStep[]> = { pre: [], post: [] };
  for (const run of runs) for (const s of run.steps.slice(skip)) byTiming[s.timing].push(s);
  const xs = (steps: readonly TraceStep[]) => steps.map((s) => Math.min(s.k, s.offloaded));
  const distinct = (timing: SelectionTiming) => [...new Set(xs(byTiming[timing]))].sort((p, q) => p - q);
  const own = (["post", "pre"] as const).filter((t) => distinct(t).length >= 2);
  if (own.length === 0) {
    const seen = (["post", "pre"] as const).filter((t) => byTiming[t].length > 0).map((t) => `${t} at K ${distinct(t).join(", ")}`).join("; ");
    throw new HybridgenError(`timing trace: every timing at one K only (${seen}): record a second K to fit the cost per K`);
  }
  const timings: Partial<Record<SelectionTiming, TimingCost>> = {};
  for (const timing of own) timings[timing] = fitTiming(byTiming[timing], xs(byTiming[timing]), distinct(timing));
  for (const timing of (["post", "pre"] as const).filter((t) => !own.includes(t) && byTiming[t].length > 0)) {
    const from = own[0]!;
    timings[timing] = fitTiming(byTiming[timing], xs(byTiming[timing]), distinct(timing), timings[from], from);
  }
  const first = runs[0]!.steps[0]!;
  return { timings, offloaded: first.offloaded };
}

function fitTiming(steps: readonly TraceStep[], x: readonly number[], kSeen: number[], slopes?: TimingCost, slopesFrom?: SelectionTiming): TimingCost {
  const line = (y: number[], b?: number) => (b === undefined ? fitLine(x, y) : { a: mean(y) - b * mean(x), b });
  const gpu = line(steps.map((s) => s.tGpuMs), slopes?.gpu.b);
  const cpu = line(steps.map((s) => s.tCpuMs), slopes?.cpu.b);
  const tx = line(steps.map((s) => s.tTxMs), slopes?.tx.b);
  const bare = steps.map((_, i) => Math.max(at(gpu, x[i]!), at(cpu, x[i]!) + at(tx, x[i]!)));
  const overheadMs = Math.max(0, mean(steps.map((s, i) => s.wallMs - bare[i]!)));
  const residuals = steps.map((s, i) => ({
    gpu: ratio(s.tGpuMs, at(gpu, x[i]!)),
    cpu: ratio(s.tCpuMs, at(cpu, x[i]!)),
    tx: ratio(s.tTxMs, at(tx, x[i]!)),
    wallMs: s.wallMs - (Math.max(s.tGpuMs, s.tCpuMs + s.tTxMs) + overheadMs),
  }));
  return { gpu, cpu, tx, overheadMs, residuals, kSeen, ...(slopesFrom ? { slopesFrom } : {}) };
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
