/**
 * The measurements of `hybridgen profile-kmin` on a loaded model (CPU backend, KV window set):
 * one full-attention pass that records the reference answers and the speculation recall
 * per layer, then one hybrid pass (exact logits) per selector and K.
 */
import { HybridgenError, type Backend, type CausalLM, type SelectionTiming } from "@hybridgen/core";
import { AgreementMeter, SpeculationRecallProbe, referenceStep, teacherForce, type ReferenceStep } from "@hybridgen/runtime";
import { createHybridAttention } from "@hybridgen/runtime";
import { selectorFromSpec } from "@hybridgen/selectors";

export interface ProfileSequence {
  /** Where it came from (errors and the report). */
  readonly name: string;
  readonly ids: readonly number[];
}

export interface SelectorAgreement {
  readonly timing: SelectionTiming;
  /** [K, top-1 agreement, mean KL] in ascending K. */
  readonly rows: [number, number, number][];
}

export interface ProfileMeasurements {
  /** Decode steps compared per pass (over every sequence). */
  readonly steps: number;
  readonly perSelector: Record<string, SelectorAgreement>;
  /** recall[layer][i]: recall of the true top-recallKs[i] by q̃'s; massRecall the same by attention mass. */
  readonly recall: number[][];
  readonly massRecall: number[][];
  readonly recallKs: readonly number[];
}

export interface MeasureOptions {
  readonly selectors: readonly string[];
  readonly ks: readonly number[];
  /** K values of the recall (ks plus any other asked for). */
  readonly recallKs: readonly number[];
  /** q̃ chooses candidates·K tokens in the recall. */
  readonly candidates: number;
  /** The KV window: each sequence is prefilled up to it. */
  readonly gpuKvBudget: number;
  /** Selectors that throw are left out with a warning (the defaults), rather than ending the run. */
  readonly skipFailing: boolean;
  readonly progress: (line: string) => void;
}

/** Post-QKᵀ when the selector can (it scores every offloaded token), else its own timing. */
const timingOf = (timings: readonly SelectionTiming[]): SelectionTiming => (timings.includes("post") ? "post" : timings[0]!);

export async function measureProfile(model: CausalLM, backend: Backend, seqs: readonly ProfileSequence[], o: MeasureOptions): Promise<ProfileMeasurements> {
  const forced = (visit: (seq: number, logits: Float32Array) => void) =>
    seqs.forEach((s, i) => teacherForce(model, s.ids, o.gpuKvBudget, (l) => visit(i, l)));

  let t0 = performance.now();
  const refs: ReferenceStep[][] = seqs.map(() => []);
  let recall: number[][], massRecall: number[][];
  {
    using probe = SpeculationRecallProbe.attach(model.attention, model, o.recallKs, o.candidates);
    forced((i, l) => refs[i]!.push(referenceStep(l)));
    recall = probe.recall();
    massRecall = probe.massRecall();
  }
  const steps = refs.reduce((n, r) => n + r.length, 0);
  o.progress(`full attention: ${steps} decode steps with offloaded tokens, q̃ recall per layer measured (${secs(t0)})`);

  const perSelector: Record<string, SelectorAgreement> = {};
  for (const name of o.selectors) {
    try {
      perSelector[name] = await sweepSelector(name);
    } catch (e) {
      if (!o.skipFailing || !(e instanceof HybridgenError)) throw e;
      o.progress(`warning: ${name} left out: ${e.message.split("\n")[0]}`);
    }
  }
  return { steps, perSelector, recall, massRecall, recallKs: o.recallKs };

  async function sweepSelector(name: string): Promise<SelectorAgreement> {
    const probe = selectorFromSpec(name);
    const timing = timingOf(probe.timings);
    const rows: [number, number, number][] = [];
    // A selector that ignores K (no budget) gives one answer for every K.
    for (const k of probe.usesBudget ? o.ks : o.ks.slice(0, 1)) {
      t0 = performance.now();
      const meter = new AgreementMeter();
      const hybrid = await createHybridAttention(model, backend, { selector: name, scheduler: "fixed", k, timing, logits: "exact", cpuStageThreads: 1 });
      try {
        const next = seqs.map(() => 0);
        forced((i, l) => meter.add(refs[i]![next[i]!++]!, l));
      } finally {
        hybrid.close();
      }
      rows.push([k, meter.top1, meter.meanKl]);
      o.progress(`${name} (${timing}) K=${k}: top-1 ${pct(meter.top1)}, mean KL ${meter.meanKl.toExponential(2)} (${secs(t0)})`);
    }
    if (!probe.usesBudget) for (const k of o.ks.slice(1)) rows.push([k, rows[0]![1], rows[0]![2]]);
    return { timing, rows };
  }
}

export const pct = (x: number) => `${(x * 100).toFixed(2)}%`;
const secs = (t0: number) => `${((performance.now() - t0) / 1000).toFixed(1)} s`;
