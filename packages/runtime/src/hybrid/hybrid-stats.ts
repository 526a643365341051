import type { HybridStepRecord, SelectionTiming, StepTimings } from "@hybridgen/spec";
import { OffloadCounters } from "@hybridgen/core";

/** Steps kept in HybridStats.trace; older ones are dropped (counted in droppedSteps). */
export const HYBRID_TRACE_LIMIT = 4096;

/** Counters of a hybrid-attention run, and the CLI's one-line summary of them. */
export class HybridStats extends OffloadCounters {
  /** Σ of the width K (selected offloaded tokens per KV head, at most) over layer-steps. */
  sumK = 0;
  /** Σ over layer-steps of the CPU stage's busy time (native threads, or synchronous). */
  cpuStageMs = 0;
  /** Σ of JS work belonging to the CPU stage (selector calls, gathers after a JS selection). */
  cpuJsMs = 0;
  /** The CPU stage's scoring when not the full rows, e.g. "int8, 2·K rescored" (the stats line names it). */
  scoring = "";
  /** Where a device backend gets the selected V rows, e.g. "V rows read by the device from pinned host memory (32 of 32 layers)" (empty on a host backend). */
  rows = "";
  /** Σ of the CPU stage's phases (native stages with lastSplit): scoring, top-K, V gather, and
   * the thread hand-offs (submit → start, end → wait returns), which are not in cpuStageMs. */
  cpuScoreMs = 0;
  cpuSelectMs = 0;
  cpuGatherMs = 0;
  handoffMs = 0;
  /** Σ of time the device driver was blocked waiting for the CPU stage (in a handed-off step: the device's wait, awaitSignal). */
  waitMs = 0;
  /** Steps handed off on the device (the device, not the host, waited for the CPU stage). */
  handedOffSteps = 0;
  /** Σ of the driving thread's own time in hybrid steps (wall less waitMs): issuing and recording device work. */
  issueMs = 0;
  /** Σ of the device stage: T_gpu, the compute stream's busy time from CUDA events on a device
   * backend; else the step's wall time less waiting, CPU-stage JS work and copies. */
  deviceMs = 0;
  /** Σ of T_tx: the copy stream's time on a device backend (query down, logits and V rows up,
   * evicted K/V down); else the host time of writing the selected logits. */
  txMs = 0;
  /** What a prefill calibration chose (calibration.ts calibrationSummary; empty: none ran). */
  calibration = "";
  /** Notes said once (clamps, fallbacks). */
  readonly notes: string[] = [];
  /** The scheduler's inputs per step, the most recent HYBRID_TRACE_LIMIT of them. */
  readonly trace: HybridStepRecord[] = [];
  /** Steps recorded but no longer in trace. */
  droppedSteps = 0;
  /** Timing changes between consecutive recorded steps (all of them, dropped ones included). */
  timingSwitches = 0;
  private lastTiming: SelectionTiming | undefined;
  /** Beside each traced step: the driving thread's time less the host's own waits (issuing), and
   * the CPU stage's phases (score, top-K, gather, hand-offs) when the stage splits them. */
  private readonly issueTrace: number[] = [];
  private readonly splitTrace: (readonly number[] | undefined)[] = [];
  /** Beside each traced step: its indexSyncMs (undefined: no device index). */
  private readonly syncTrace: (number | undefined)[] = [];
  /** Beside each traced step on a backend that records segments: the device's time inside them, the driving thread's blocked at their starts. */
  private readonly segmentTrace: ({ readonly segmentMs: number; readonly hostWaitMs: number } | undefined)[] = [];

  /** Fraction of the CPU stage's busy time that ran while the device stage ran, in the median step. */
  get hiddenFraction(): number {
    const m = this.steady();
    if (m.cpu <= 0) return 0;
    return Math.min(1, Math.max(0, (m.cpu - m.wait) / m.cpu));
  }

  /**
   * The median traced step's figures, ms: the steady state. A step that records its graphs (the
   * first, or the first after K changed) waits far longer for the CPU stage than the rest, so a mean
   * over a short run would mostly be that step. Zeros before any step.
   */
  steady(): { cpu: number; gpu: number; tx: number; wait: number; issue: number } {
    const t = this.trace;
    const med = (f: (i: number) => number) => median(t.map((_, i) => f(i)));
    return {
      cpu: med((i) => t[i]!.tCpuMs), gpu: med((i) => t[i]!.tGpuMs), tx: med((i) => t[i]!.tTxMs),
      wait: med((i) => t[i]!.tWaitMs ?? 0), issue: med((i) => this.issueTrace[i]!),
    };
  }

  /** The median traced step's CPU-stage phases [score, top-K, gather, hand-offs] (ms), over the steps that split them; undefined when none did. */
  steadySplit(): number[] | undefined {
    const s = this.splitTrace.filter((x): x is readonly number[] => x !== undefined);
    return s.length ? [0, 1, 2, 3].map((p) => median(s.map((x) => x[p]!))) : undefined;
  }

  /** Rows each KV head's selection held, per layer and step: K, or under verified logits the 4·K candidates (not the scheduler's K). */
  get meanRows(): number {
    return this.perLayerStep(this.sumK);
  }

  note(message: string): void {
    if (!this.notes.includes(message)) this.notes.push(message);
  }

  /** Appends one step's scheduler inputs to the trace (the engine calls it once per hybrid step);
   * issueMs: the step's wall less the host's own waits (default: the wall); split: its CPU-stage
   * phases [score, top-K, gather, hand-offs] (copied); indexSyncMs: its device index's fold and upload. */
  record(t: StepTimings, wallMs: number, step: { issueMs?: number; split?: readonly number[]; indexSyncMs?: number; segments?: { segmentMs: number; hostWaitMs: number } } = {}): void {
    if (this.lastTiming !== undefined && this.lastTiming !== t.timing) this.timingSwitches++;
    this.lastTiming = t.timing;
    if (this.trace.length >= HYBRID_TRACE_LIMIT) {
      this.trace.shift();
      this.issueTrace.shift();
      this.splitTrace.shift();
      this.syncTrace.shift();
      this.segmentTrace.shift();
      this.droppedSteps++;
    }
    this.issueTrace.push(step.issueMs ?? wallMs);
    this.splitTrace.push(step.split ? [...step.split] : undefined);
    this.syncTrace.push(step.indexSyncMs);
    this.segmentTrace.push(step.segments ? { ...step.segments } : undefined);
    this.trace.push({
      step: t.step, k: t.k, timing: t.timing, offloaded: t.offloaded, tGpuMs: t.tGpuMs, tCpuMs: t.tCpuMs, tTxMs: t.tTxMs, tWaitMs: t.tWaitMs, wallMs,
    });
  }

  reset(): void {
    this.resetCounts();
    this.sumK = 0;
    this.cpuStageMs = this.cpuJsMs = this.waitMs = this.issueMs = this.deviceMs = this.txMs = 0;
    this.handedOffSteps = 0;
    this.cpuScoreMs = this.cpuSelectMs = this.cpuGatherMs = this.handoffMs = 0;
    this.notes.length = 0;
    this.trace.length = 0;
    this.issueTrace.length = this.splitTrace.length = this.syncTrace.length = this.segmentTrace.length = 0;
    this.droppedSteps = this.timingSwitches = 0;
    this.lastTiming = undefined;
  }

  /**
   * e.g. "hybrid: 224 tokens offloaded, mean rows selected per KV head 32.0, per layer: CPU stage 0.021 ms, device stage 0.310 ms, 71% of the CPU stage
   * hidden … (median of 9 hybrid steps), transfers 0.004 ms; …". The per-layer times are the median step's (steady(), steadySplit()).
   */
  summary(): string {
    const m = this.steady(), layers = this.steps ? this.layerSteps / this.steps : 0;
    const per = (ms: number) => (layers ? ms / layers : 0).toFixed(3);
    return `hybrid: ${this.offloaded} tokens offloaded, mean rows selected per KV head ${this.meanRows.toFixed(1)}, per layer: ` +
      `CPU stage ${per(m.cpu)} ms, device stage ${per(m.gpu)} ms, ` +
      `${Math.round(this.hiddenFraction * 100)}% of the CPU stage hidden behind the device stage (median of ${this.steps} hybrid steps), ` +
      `transfers ${per(m.tx)} ms; driving thread per layer: issuing ${per(m.issue)} ms, waiting for the CPU stage ${per(m.wait)} ms` + this.splitSummary() + (this.rows ? `; ${this.rows}` : "") +
      (this.handedOffSteps ? `; ${this.handedOffSteps} of ${this.steps} steps handed off (the device waited for the CPU stage)` : "") +
this.segmentSummary() + this.syncSummary() + this.schedulerSummary() +
      (this.calibration ? `; ${this.calibration}` : "");
  }

  /**
   * "; recorded segments per layer: the device in them … ms, idle between them … ms; the driving thread blocked on the device … ms" of
   * the median step (empty where the backend records none): a device stage mostly idle is the host's issuing, not the device's work.
   */
  segmentSummary(): string {
    const s = this.segmentTrace.filter((x): x is { segmentMs: number; hostWaitMs: number } => x !== undefined), layers = this.steps ? this.layerSteps / this.steps : 0;
    if (s.length === 0 || !layers) return "";
    const t = this.trace.filter((_, i) => this.segmentTrace[i] !== undefined);
    const inside = median(s.map((x) => x.segmentMs)), span = median(t.map((x) => x.tGpuMs + (x.tWaitMs ?? 0))), blocked = median(s.map((x) => x.hostWaitMs));
    const per = (ms: number) => (ms / layers).toFixed(3);
    return `; recorded segments per layer: the device in them ${per(inside)} ms, idle between them ${per(Math.max(0, span - inside))} ms; the driving thread blocked on the device ${per(blocked)} ms`;
  }

  /** "; device index: evicted rows folded and uploaded in … ms a step (median)" on the driving thread, before the step's device work (empty without a device index). */
  syncSummary(): string {
    const s = this.syncTrace.filter((x): x is number => x !== undefined);
    return s.length ? `; device index: evicted rows folded and uploaded in ${median(s).toFixed(3)} ms a step (median, driving thread, before the step's device work)` : "";
  }

  /** "; scheduler: K 8 → 96 (range 8–128), post, 1 timing switch" from the trace (empty without one). */
  schedulerSummary(): string {
    const t = this.trace;
    if (t.length === 0) return "";
    let lo = Infinity, hi = 0;
    for (const r of t) {
      lo = Math.min(lo, r.k);
      hi = Math.max(hi, r.k);
    }
    const first = t[0]!, last = t[t.length - 1]!;
    const n = this.timingSwitches;
    return `; scheduler: K ${first.k} → ${last.k} (range ${lo}–${hi}), ${last.timing}, ${n} timing switch${n === 1 ? "" : "es"}`;
  }

  /** "; CPU stage split per layer: score … ms, top-K … ms, gather … ms, hand-offs … ms" of the median step (when the stage splits its time). */
  splitSummary(): string {
    const m = this.steadySplit(), layers = this.steps ? this.layerSteps / this.steps : 0;
    if (!m || !layers || m.every((x) => x === 0)) return "";
    const per = (ms: number) => (ms / layers).toFixed(3);
    return `; CPU stage split per layer: score ${per(m[0]!)} ms, top-K ${per(m[1]!)} ms, ` +
      `gather ${per(m[2]!)} ms, hand-offs ${per(m[3]!)} ms` + (this.scoring ? ` (scoring ${this.scoring})` : "");
  }
}

function median(v: readonly number[]): number {
  if (v.length === 0) return 0;
  const s = [...v].sort((a, b) => a - b), m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}
