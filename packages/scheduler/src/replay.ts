/**
 * Replay: drives a scheduler step by step on a cost model fitted from a timing trace, as the
 * engine would (a timing the selector cannot run falls back to one it can, as HybridAttention
 * does), and reports how it behaved: K and timing per step, ms/token, timing switches, the
 * step from which it stayed settled, and the same against every fixed (K, timing) choice.
 */
import { seededRandom, type Scheduler, type SelectionTiming } from "@hybridgen/spec";
import { simulateStep, type CostModel } from "./cost-model.js";
import { FixedScheduler } from "./fixed-scheduler.js";

export interface ReplayOptions {
  /** Decode steps (default 64). */
  readonly steps?: number;
  /** Seed of the draws from the trace's residuals (default 1). */
  readonly seed?: number;
  /** Timings the selector can run, first = the engine's fallback (default: those in the model, post first). */
  readonly timings?: readonly SelectionTiming[];
  /** Leading steps left out of meanMs, as a bench leaves out its warm-up step (default 1). */
  readonly warmup?: number;
  /** K within this factor of the final K counts as settled (default 1.25). */
  readonly settleTolerance?: number;
}

export interface ReplayResult {
  readonly k: number[];
  readonly timing: SelectionTiming[];
  readonly wallMs: number[];
  /** Mean wall ms per step after the warm-up steps: ms/token. */
  readonly meanMs: number;
  /** Changes of the timing the engine ran between consecutive steps. */
  readonly switches: number;
  /** First step from which the timing never changes and K stays within the tolerance of its final value. */
  readonly settleStep: number;
}

export function replay(scheduler: Scheduler, model: CostModel, options: ReplayOptions = {}): ReplayResult {
  const steps = options.steps ?? 64;
  const warmup = Math.min(options.warmup ?? 1, steps - 1);
  const allowed = options.timings ?? (["post", "pre"] as const).filter((t) => model.timings[t]);
  const r = seededRandom(options.seed ?? 1);
  const out = { k: [] as number[], timing: [] as SelectionTiming[], wallMs: [] as number[] };
  scheduler.reset();
  let d = scheduler.initial();
  for (let step = 0; step < steps; step++) {
    const timing = allowed.includes(d.timing) ? d.timing : allowed[0]!;
    const offloaded = model.offloaded + step;
    const res = model.timings[timing]!.residuals;
    const s = simulateStep(model, timing, d.k, offloaded, res[Math.floor(r() * res.length)]);
    out.k.push(d.k);
    out.timing.push(timing);
    out.wallMs.push(s.wallMs);
    d = scheduler.next({ step, tGpuMs: s.tGpuMs, tCpuMs: s.tCpuMs, tTxMs: s.tTxMs, k: d.k, timing, offloaded });
  }
  const timed = out.wallMs.slice(warmup);
  let switches = 0;
  for (let i = 1; i < steps; i++) if (out.timing[i] !== out.timing[i - 1]) switches++;
  return { ...out, meanMs: timed.reduce((a, b) => a + b, 0) / timed.length, switches, settleStep: settleStep(out.k, out.timing, options.settleTolerance ?? 1.25) };
}

function settleStep(k: readonly number[], timing: readonly SelectionTiming[], tol: number): number {
  const n = k.length;
  const tail = [...k.slice(Math.max(0, n - 8))].sort((a, b) => a - b);
  const final = tail[Math.floor(tail.length / 2)]!;
  let s = n - 1;
  while (s > 0 && timing[s - 1] === timing[n - 1] && k[s - 1]! <= final * tol && k[s - 1]! >= final / tol) s--;
  return s;
}

export interface FixedChoice {
  readonly k: number;
  readonly timing: SelectionTiming;
  readonly meanMs: number;
}

/**
 * The fastest fixed (K, timing) on the model, K from kMin to the offloaded count (powers of √2
 * times kMin, and the count itself), with the same noise draws as replay().
 */
export function bestFixed(model: CostModel, kMin: number, options: ReplayOptions = {}): FixedChoice {
  const allowed = options.timings ?? (["post", "pre"] as const).filter((t) => model.timings[t]);
  let best: FixedChoice | undefined;
  const ks: number[] = [];
  for (let k = kMin; k < model.offloaded; k *= Math.SQRT2) ks.push(Math.round(k));
  ks.push(model.offloaded);
  for (const timing of allowed) {
    for (const k of ks) {
      const { meanMs } = replay(new FixedScheduler({ k, timing }), model, { ...options, timings: allowed });
      if (!best || meanMs < best.meanMs) best = { k, timing, meanMs };
    }
  }
  return best!;
}
