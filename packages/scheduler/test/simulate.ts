import { seededRandom, type Scheduler, type SelectionTiming, type StepTimings } from "@hybridgen/spec";

/** Seeded PRNG (core's mulberry32) so failures reproduce. */
export const rng = seededRandom;

/**
 * A synthetic machine: the GPU stage takes gpuMs (+ gpuPerKMs per selected token: the device
 * gathers and aggregates the K rows); post-QKᵀ scores every offloaded token
 * (scoreMs each, streaming), pre-QKᵀ scores only the K chosen (preScoreMs each, gathers);
 * both gather and transfer K V rows.
 */
export interface Machine {
  gpuMs: number;
  gpuPerKMs?: number;
  fixedMs: number;
  scoreMs: number;
  preScoreMs: number;
  gatherMs: number;
  txMs: number;
}

export function measure(m: Machine, step: number, k: number, timing: SelectionTiming, offloaded: number, noise = 0, r: () => number = Math.random): StepTimings {
  const kk = Math.min(k, offloaded);
  const jitter = () => 1 + noise * (2 * r() - 1);
  const scored = timing === "post" ? m.scoreMs * offloaded : m.preScoreMs * kk;
  return {
    step,
    tGpuMs: (m.gpuMs + (m.gpuPerKMs ?? 0) * kk) * jitter(),
    tCpuMs: (m.fixedMs + scored + m.gatherMs * kk) * jitter(),
    tTxMs: m.txMs * kk * jitter(),
    k,
    timing,
    offloaded,
  };
}

/** Noise-free load of a decision, the quantity the scheduler balances against gpuMs. */
export function load(m: Machine, k: number, timing: SelectionTiming, offloaded: number): number {
  const t = measure(m, 0, k, timing, offloaded);
  return t.tCpuMs + t.tTxMs;
}

export interface Trace {
  k: number[];
  timing: SelectionTiming[];
}

/** Runs `steps` steps; offloaded(step) gives the store size; machine(step) may change over time. */
export function run(s: Scheduler, steps: number, machine: (step: number) => Machine, offloaded: (step: number) => number, noise = 0, seed = 1): Trace {
  const r = rng(seed);
  const trace: Trace = { k: [], timing: [] };
  let d = s.initial();
  for (let step = 0; step < steps; step++) {
    trace.k.push(d.k);
    trace.timing.push(d.timing);
    d = s.next(measure(machine(step), step, d.k, d.timing, offloaded(step), noise, r));
  }
  return trace;
}
