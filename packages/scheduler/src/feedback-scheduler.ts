/**
 * The paper's feedback scheduler (Algorithm 1), made to converge:
 *
 *   load = T_cpu + T_tx
 *   load ≤ (1 − deadband)·T_gpu        → grow K (more tokens, better accuracy)
 *   load > T_gpu and K > kMin          → shrink K, never below kMin
 *   load > T_gpu and K = kMin, post    → switch to pre-QKᵀ (score only the K chosen tokens)
 *   otherwise                          → hold
 *
 * Step size: the scheduler learns the marginal cost of one more selected token (ms per K,
 * a secant over consecutive steps of the same timing, smoothed) and jumps to the K whose load
 * lands in the middle of the deadband, limited to a factor `maxStep` per step; before it has a
 * slope it moves by the factor `maxStep` itself. Separate slopes are kept for pre and post,
 * whose costs per K differ.
 *
 * Algorithm 1 never leaves pre-QKᵀ. With `returnToPost` it does, when the post stage is
 * predicted to fit again: the predicted post load is (load per offloaded token measured in the
 * last post step) × today's offloaded count — or, never having run post, the pre load per
 * scored token × the offloaded count, which over-estimates (random gathers cost more than a
 * streaming pass). It must fit within (1 − postMargin)·T_gpu, and a timing is kept at least
 * `minDwellSteps` steps after a switch, so the two never flap.
 */
import { clampK, parseStepTimings, type Scheduler, type SchedulerDecision, type SelectionTiming, type StepTimings } from "@hybridgen/core";
import { FeedbackSchedulerOptionsSchema, type FeedbackSchedulerOptions, type ResolvedFeedbackOptions } from "./options.js";
import { parseOptions } from "./parse-options.js";

interface SlopeEstimate {
  /** Smoothed ms of load per unit of K; undefined until two usable observations exist. */
  msPerK?: number;
  lastK?: number;
  lastLoad?: number;
}

/** What the scheduler believes, for stats lines and tests. */
export interface FeedbackSchedulerState {
  readonly k: number;
  readonly timing: SelectionTiming;
  readonly msPerKPost?: number;
  readonly msPerKPre?: number;
  /** Post load per offloaded token, from the last post step. */
  readonly postMsPerOffloaded?: number;
  readonly switches: number;
  readonly stepsInTiming: number;
}

const SLOPE_SMOOTHING = 0.5;

export class FeedbackScheduler implements Scheduler {
  readonly name = "feedback";
  readonly options: Readonly<ResolvedFeedbackOptions>;
  private k = 0;
  private timing: SelectionTiming = "post";
  private slopes: Record<SelectionTiming, SlopeEstimate> = { pre: {}, post: {} };
  private postMsPerOffloaded: number | undefined;
  private switches = 0;
  private stepsInTiming = 0;

  constructor(options: FeedbackSchedulerOptions = {}) {
    this.options = Object.freeze(parseOptions(FeedbackSchedulerOptionsSchema, options, "feedback scheduler"));
    this.reset();
  }

  reset(): void {
    const o = this.options;
    this.k = clampK(o.kInitial ?? o.kMin, o);
    this.timing = o.initialTiming;
    this.slopes = { pre: {}, post: {} };
    this.postMsPerOffloaded = undefined;
    this.switches = 0;
    this.stepsInTiming = 0;
  }

  initial(): SchedulerDecision {
    return { k: this.k, timing: this.timing };
  }

  state(): FeedbackSchedulerState {
    return {
      k: this.k,
      timing: this.timing,
      msPerKPost: this.slopes.post.msPerK,
      msPerKPre: this.slopes.pre.msPerK,
      postMsPerOffloaded: this.postMsPerOffloaded,
      switches: this.switches,
      stepsInTiming: this.stepsInTiming,
    };
  }

  next(raw: StepTimings): SchedulerDecision {
    const t = parseStepTimings(raw);
    const o = this.options;
    const load = t.tCpuMs + t.tTxMs;
    const budget = t.tGpuMs;
    this.learn(t, load);
    this.stepsInTiming++;

    // The measurement describes the decision the engine actually ran; follow its timing.
    if (t.timing !== this.timing) this.setTiming(t.timing);
    const k = Math.max(t.k, 1);
    const canSwitch = this.stepsInTiming >= o.minDwellSteps;

    if (this.timing === "pre" && o.returnToPost && canSwitch && this.postFits(t, k, budget)) {
      this.setTiming("post");
      this.k = clampK(o.kMin, o);
      return this.initial();
    }

    if (load <= (1 - o.deadband) * budget) {
      this.k = clampK(this.resize(k, load, budget, "grow"), o);
    } else if (load > budget) {
      if (k > o.kMin) {
        this.k = clampK(this.resize(k, load, budget, "shrink"), o);
      } else {
        this.k = clampK(o.kMin, o);
        if (this.timing === "post" && o.allowPre && canSwitch) this.setTiming("pre");
      }
    } else {
      this.k = clampK(k, o);
    }
    // K beyond the offloaded count buys nothing (the engine clamps it) and would take many
    // steps to walk back once the CPU stage gets tight, so keep it within reach.
    if (t.offloaded > 0) this.k = clampK(Math.min(this.k, Math.max(o.kMin, t.offloaded)), o);
    return this.initial();
  }

  private setTiming(timing: SelectionTiming): void {
    if (timing === this.timing) return;
    this.timing = timing;
    this.switches++;
    this.stepsInTiming = 0;
  }

  /** K whose predicted load sits mid-deadband, within a factor maxStep of the current K. */
  private resize(k: number, load: number, budget: number, dir: "grow" | "shrink"): number {
    const o = this.options;
    const slope = this.slopes[this.timing].msPerK;
    const target = (1 - o.deadband / 2) * budget;
    let next = dir === "grow" ? k * o.maxStep : k / o.maxStep;
    if (slope !== undefined && slope > 0) next = k + (target - load) / slope;
    const lo = k / o.maxStep;
    const hi = k * o.maxStep;
    next = Math.min(hi, Math.max(lo, next));
    // Always move at least one token in the chosen direction, so a tiny slope cannot stall it.
    return dir === "grow" ? Math.max(next, k + 1) : Math.min(next, k - 1);
  }

  private learn(t: StepTimings, load: number): void {
    const s = this.slopes[t.timing];
    if (s.lastK !== undefined && s.lastLoad !== undefined) {
      const dK = t.k - s.lastK;
      // Secants over a tiny change of K are mostly noise; skip them.
      if (Math.abs(dK) >= Math.max(1, 0.05 * Math.max(t.k, s.lastK))) {
        const m = (load - s.lastLoad) / dK;
        if (Number.isFinite(m) && m > 0) s.msPerK = s.msPerK === undefined ? m : SLOPE_SMOOTHING * m + (1 - SLOPE_SMOOTHING) * s.msPerK;
      }
    }
    s.lastK = t.k;
    s.lastLoad = load;
    if (t.timing === "post" && t.offloaded > 0) this.postMsPerOffloaded = load / t.offloaded;
  }

  /** Would post-QKᵀ at kMin fit under the GPU stage now? */
  private postFits(t: StepTimings, k: number, budget: number): boolean {
    if (t.offloaded === 0) return true;
    const perToken = this.postMsPerOffloaded ?? (t.tCpuMs + t.tTxMs) / k;
    return perToken * t.offloaded <= (1 - this.options.postMargin) * budget;
  }
}
