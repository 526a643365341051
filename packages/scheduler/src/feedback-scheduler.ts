/**
 * The paper's feedback scheduler (Algorithm 1), made to converge and bounded by the device:
 *
 *   load = T_cpu + T_tx
 *   load > T_gpu and K > kMin          → shrink K, never below kMin (nor above kCap)
 *   load > T_gpu and K = kMin, post    → switch to pre-QKᵀ (score only the K chosen tokens)
 *   K > kCap                           → shrink K toward kCap, within maxStep
 *   load ≤ (1 − deadband)·T_gpu        → grow K (more tokens, better accuracy), up to kCap
 *   otherwise                          → hold
 *
 * kCap is the K at which T_gpu is predicted to reach (1 + gpuGrowth)·T_gpu at kMin. Algorithm 1
 * takes T_gpu as independent of K, so more K is free while the load hides behind it; here the
 * device gathers and aggregates (and, verified, re-scores) the K rows, so T_gpu grows with K,
 * the load stays under it, and without the cap K runs to the offloaded count
 * (apps/bench/notes/scheduler.md). kCap = kMin + gpuGrowth·T_gpu(kMin) / (T_gpu per K), with
 * T_gpu(kMin) the window's steps moved to kMin along that slope (median). The slope is the
 * device line: least squares of T_gpu against K over the timing's stretch (older steps weigh
 * less), taken once well determined and kept, across stretches too, until another is. Before
 * one there is no cap and K grows by at most maxStep a step, which spreads K enough to fit it.
 *
 * The load and T_gpu compared are not one step's but the last WINDOW steps' of the current
 * timing, each moved to the current K along the slopes, as medians (one step is noisier than
 * the deadband). Step size: the scheduler learns the marginal cost of one more selected token
 * (ms per K: a well-determined least-squares line through the window, else secants over
 * consecutive steps of the same timing, smoothed) and jumps to the K whose load lands in the
 * middle of the deadband of its T_gpu, limited to a factor `maxStep` per step; before it has a
 * slope it sizes the step as if the load were proportional to K. Separate slopes are kept for
 * pre and post, whose costs per K differ, and neither spans a stretch of the other timing.
 *
 * Algorithm 1 never leaves pre-QKᵀ. With `returnToPost` it does, when post at kMin is predicted
 * to fit again: its load is the last post step's load per offloaded token × today's offloaded
 * count, and its budget is that post step's T_gpu scaled by how much the device stage has grown
 * since (pre T_gpu now, brought back to kMin by the learnt T_gpu-per-K slope, over pre T_gpu
 * right after the switch) — not the pre step's own T_gpu, which includes work post steps do
 * not have. It must fit within (1 − postMargin) of that budget. A timing is kept at least
 * `minDwellSteps` steps after a switch, and a return to post that turns out over budget at
 * kMin doubles that dwell, so a wrong prediction cannot flap every few steps.
 *
 * The engine runs a timing the selector supports: a step measured in the other timing than the
 * one asked for means the selector cannot run it, and the scheduler stops asking for it.
 */
import { SPEC_VERSION, clampK, parseStepTimings, type Scheduler, type SchedulerDecision, type SelectionTiming, type StepTimings } from "@hybridgen/spec";
import { FeedbackSchedulerOptionsSchema, type FeedbackSchedulerOptions, type ResolvedFeedbackOptions } from "./options.js";
import { parseOptions } from "./parse-options.js";

interface SlopeEstimate {
  /** Smoothed ms per unit of K; undefined until two usable observations exist. */
  msPerK?: number;
  lastK?: number;
  lastMs?: number;
}

/** The last post step, the reference for predicting post's load and budget from pre. */
interface PostReference {
  loadPerOffloaded: number;
  gpuMs: number;
}

/** What the scheduler believes, for stats lines and tests. */
export interface FeedbackSchedulerState {
  readonly k: number;
  readonly timing: SelectionTiming;
  readonly msPerKPost?: number;
  readonly msPerKPre?: number;
  /** Post load per offloaded token, from the last post step. */
  readonly postMsPerOffloaded?: number;
  /** Timing switches the scheduler decided (not the engine's fallbacks). */
  readonly switches: number;
  readonly stepsInTiming: number;
  /** Steps required in a timing after a switch (minDwellSteps, doubled by failed returns). */
  readonly dwellSteps: number;
  /** Timings the engine could not run (the selector lacks them), learnt from its reports. */
  readonly unavailable: readonly SelectionTiming[];
  /** T_gpu per K of the current timing's device line (the one kCap comes from). */
  readonly gpuMsPerK?: number;
  /** The last decision's cap on K from the device stage; undefined while there is none. */
  readonly kCap?: number;
}

const SLOPE_SMOOTHING = 0.5;
/** Steps of the current timing whose load and T_gpu are averaged before deciding: one H200 step
 * is ±10% noisy, more than the deadband, so single steps alone make K wander. */
const WINDOW = 8;
/** Steps after which a step's weight in the device line has halved (the line needs the steps
 * far from the cap that growth left: at the cap K barely moves). */
const DEVICE_HALF_LIFE = 64;
/** A device line is taken when its slope's standard error is ≤ this share of the slope: a false
 * slope caps K below the balance for good, so it asks more than the window's lines (½). */
const DEVICE_SE = 0.25;

interface Sample {
  k: number;
  load: number;
  gpu: number;
}

/** Load and T_gpu expected at the current K from the recent steps, and their slopes per K. */
interface Estimate {
  load: number;
  gpu: number;
  slope?: number;
  gpuSlope: number;
}

export class FeedbackScheduler implements Scheduler {
  readonly spec = SPEC_VERSION;
  readonly name = "feedback";
  readonly options: Readonly<ResolvedFeedbackOptions>;
  private k = 0;
  private timing: SelectionTiming = "post";
  private slopes: Record<SelectionTiming, SlopeEstimate> = { pre: {}, post: {} };
  /** T_gpu per unit of K, per timing (the device aggregates K more rows). */
  private gpuSlopes: Record<SelectionTiming, SlopeEstimate> = { pre: {}, post: {} };
  /** T_gpu against K over the current stretch of each timing, for the device line. */
  private deviceFits: Record<SelectionTiming, LineSums> = { pre: emptyLine(), post: emptyLine() };
  /** T_gpu per K of the last device line well determined, per timing (a row costs the device
   * the same in the next stretch: kept across them). */
  private deviceLines: Partial<Record<SelectionTiming, number>> = {};
  private kCap = Infinity;
  private postRef: PostReference | undefined;
  /** Pre T_gpu at kMin right after the last switch to pre. */
  private preGpuRef: number | undefined;
  private switches = 0;
  private stepsInTiming = 0;
  private switched = false;
  private dwell = 0;
  /** In post after a return from pre, until a post step fits (or the dwell passes). */
  private trialPost = false;
  private unavailable = new Set<SelectionTiming>();
  /** The current timing's last WINDOW steps. */
  private recent: Sample[] = [];

  constructor(options: FeedbackSchedulerOptions = {}) {
    this.options = Object.freeze(parseOptions(FeedbackSchedulerOptionsSchema, options, "feedback scheduler"));
    this.reset();
  }

  reset(): void {
    const o = this.options;
    this.k = clampK(o.k ?? o.kMin, o);
    this.timing = o.timing;
    this.slopes = { pre: {}, post: {} };
    this.gpuSlopes = { pre: {}, post: {} };
    this.deviceFits = { pre: emptyLine(), post: emptyLine() };
    this.deviceLines = {};
    this.kCap = Infinity;
    this.postRef = undefined;
    this.preGpuRef = undefined;
    this.switches = 0;
    this.stepsInTiming = 0;
    this.switched = false;
    this.dwell = o.minDwellSteps;
    this.trialPost = false;
    this.unavailable = new Set();
    this.recent = [];
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
      postMsPerOffloaded: this.postRef?.loadPerOffloaded,
      switches: this.switches,
      stepsInTiming: this.stepsInTiming,
      dwellSteps: this.dwell,
      unavailable: [...this.unavailable],
      gpuMsPerK: this.deviceLines[this.timing],
      kCap: Number.isFinite(this.kCap) ? this.kCap : undefined,
    };
  }

  next(raw: StepTimings): SchedulerDecision {
    const t = parseStepTimings(raw);
    const o = this.options;
    const load = t.tCpuMs + t.tTxMs;
    const budget = t.tGpuMs;

    // The engine ran another timing than the one asked for: the selector cannot run it.
    if (t.timing !== this.timing) {
      this.unavailable.add(this.timing);
      this.enter(t.timing);
      this.trialPost = false;
    }
    this.learn(t, load);
    this.stepsInTiming++;

    const k = Math.max(t.k, 1);
    this.recent.push({ k: t.offloaded > 0 ? Math.min(k, t.offloaded) : k, load, gpu: budget });
    if (this.recent.length > WINDOW) this.recent.shift();
    const canSwitch = !this.switched || this.stepsInTiming >= this.dwell;

    if (this.timing === "pre" && o.returnToPost && !this.unavailable.has("post") && canSwitch && this.postFits(t, k)) {
      this.switchTo("post");
      this.trialPost = true;
      this.k = this.quantized(o.kMin, o);
      return this.initial();
    }

    const e = this.estimate(k);
    const cap = (this.kCap = this.gpuCap());
    // Past the cap a larger K lengthens the step itself: back toward it, within maxStep.
    const toCap = Math.max(cap, k / o.maxStep);
    if (e.load > e.gpu) {
      if (k > o.kMin) {
        this.k = this.quantized(Math.min(this.resize(k, e, "shrink"), toCap), o);
      } else {
        this.k = this.quantized(o.kMin, o);
        const preOk = o.allowPre && !this.unavailable.has("pre");
        if (this.timing === "post" && preOk && (canSwitch || this.trialPost)) {
          if (this.trialPost) this.dwell = Math.max(1, this.dwell) * 2; // the return was wrong: wait longer next time
          this.trialPost = false;
          this.switchTo("pre");
        }
      }
    } else if (k >= cap + o.kQuantum) {
      this.k = this.quantized(toCap, o);
    } else if (e.load <= (1 - o.deadband) * e.gpu) {
      // The load hides behind T_gpu, but T_gpu grows with K: more K is free only up to the cap.
      this.k = this.quantized(Math.min(this.resize(k, e, "grow"), Math.max(k, cap)), o);
    } else {
      this.k = this.quantized(k, o);
    }
    if (this.trialPost && this.timing === "post" && (e.load <= e.gpu || this.stepsInTiming >= this.dwell)) this.trialPost = false;
    // K beyond the offloaded count buys nothing (the engine clamps it) and would take many
    // steps to walk back once the CPU stage gets tight, so keep it within reach.
    if (t.offloaded > 0) this.k = this.quantized(Math.min(this.k, Math.max(o.kMin, t.offloaded)), o);
    return this.initial();
  }

  /**
   * The next K from a target: the current one when the target is the same or below the next
   * point of K's grid (gridFloor), kMax when it reaches kMax, else the grid point below the target.
   */
  private quantized(target: number, o: { kMin: number; kMax?: number; kQuantum: number; maxStep: number }): number {
    const k = this.k;
    if (target === k) return k;
    if (o.kMax !== undefined && target >= o.kMax) return clampK(o.kMax, o);
    const floor = target >= o.kMin ? gridFloor(target, o) : target;
    if (target > k && floor <= k) return k;
    return clampK(floor, o);
  }

  private switchTo(timing: SelectionTiming): void {
    this.switches++;
    this.switched = true;
    this.enter(timing);
  }

  /** Starts a stretch of `timing`: secants and the window restart, the pre reference is taken afresh. */
  private enter(timing: SelectionTiming): void {
    this.timing = timing;
    this.stepsInTiming = 0;
    this.recent = [];
    for (const s of [this.slopes[timing], this.gpuSlopes[timing]]) s.lastK = s.lastMs = undefined;
    this.deviceFits[timing] = emptyLine();
    if (timing === "pre") this.preGpuRef = undefined;
  }

  /**
   * The window's load and T_gpu at K: each step moved to K along the slopes — a least-squares
   * line's through the window when its K spread by 20% or more and the line is well determined,
   * else the secants' — then the median T_gpu and the median load/T_gpu ratio. One step alone is
   * taken as it is.
   */
  private estimate(k: number): Estimate {
    const r = this.recent, n = r.length;
    let slope = this.slopes[this.timing].msPerK;
    let gpuSlope = this.gpuSlopes[this.timing].msPerK ?? 0;
    const mk = r.reduce((a, x) => a + x.k, 0) / n;
    const ml = r.reduce((a, x) => a + x.load, 0) / n;
    const mg = r.reduce((a, x) => a + x.gpu, 0) / n;
    let lo = Infinity, hi = 0, sxx = 0, sxl = 0, sxg = 0;
    for (const x of r) {
      lo = Math.min(lo, x.k);
      hi = Math.max(hi, x.k);
      sxx += (x.k - mk) ** 2;
      sxl += (x.k - mk) * (x.load - ml);
      sxg += (x.k - mk) * (x.gpu - mg);
    }
    if (n >= 3 && hi >= 1.2 * lo && sxx > 0) {
      // A line's slope is taken only where the window determines it (standard error ≤ half of it).
      const fit = (sxy: number, m: number, y: (x: Sample) => number) => {
        const b = sxy / sxx;
        const sse = r.reduce((a, x) => a + (y(x) - m - b * (x.k - mk)) ** 2, 0);
        return b > 0 && Math.sqrt(sse / ((n - 2) * sxx)) <= 0.5 * b ? b : undefined;
      };
      slope = fit(sxl, ml, (x) => x.load) ?? slope;
      gpuSlope = fit(sxg, mg, (x) => x.gpu) ?? gpuSlope;
    }
    // Medians, not means: a few steps of the H200 traces are 1.5–2× off (the host preempted).
    const gpus = r.map((x) => Math.max(1e-9, x.gpu + gpuSlope * (k - x.k)));
    const ratios = r.map((x, i) => (x.load + (slope ?? 0) * (k - x.k)) / gpus[i]!);
    const gpu = median(gpus);
    return { load: median(ratios) * gpu, gpu, slope, gpuSlope };
  }

  /**
   * The K at which T_gpu is predicted to reach (1 + gpuGrowth)·T_gpu at kMin, T_gpu at kMin being
   * the window's steps moved there along the device slope (median); Infinity without a slope.
   */
  private gpuCap(): number {
    const g = this.deviceSlope();
    if (g === undefined || g <= 0) return Infinity;
    const kMin = this.options.kMin;
    const atKMin = median(this.recent.map((x) => Math.max(0, x.gpu - g * Math.max(0, x.k - kMin))));
    return kMin + (this.options.gpuGrowth * atKMin) / g;
  }

  /**
   * T_gpu per K for the cap: the last well-determined device line (see DEVICE_SE), undefined
   * before one. Not the window's line: at the cap K barely moves, and eight steps ±10% noisy
   * cannot tell a slope worth 10% of T_gpu from none. Not the secants: they keep only rises, so
   * they find a slope where T_gpu is flat, and K held near where one noisy step fooled them
   * soon fits a false line as well; doubling K until a line is determined spreads the steps.
   */
  private deviceSlope(): number | undefined {
    const line = fitLine(this.deviceFits[this.timing]);
    if (line && line.b > 0 && line.se <= DEVICE_SE * line.b) this.deviceLines[this.timing] = line.b;
    return this.deviceLines[this.timing];
  }

  /** K whose predicted load sits mid-deadband of its predicted T_gpu, within a factor maxStep of the current K. */
  private resize(k: number, e: Estimate, dir: "grow" | "shrink"): number {
    const o = this.options;
    const f = 1 - o.deadband / 2;
    // Without a slope, as if the load were proportional to K (the largest slope a load with a
    // non-negative fixed part can have: the cautious step).
    let next = e.load > 0 ? (k * f * e.gpu) / e.load : dir === "grow" ? k * o.maxStep : k / o.maxStep;
    // load + s·ΔK = f·(gpu + g·ΔK): only when the load rises faster than the budget does.
    const net = e.slope === undefined ? 0 : e.slope - f * e.gpuSlope;
    if (e.slope !== undefined && e.slope > 0 && net > 0) next = k + (f * e.gpu - e.load) / net;
    const lo = k / o.maxStep;
    const hi = k * o.maxStep;
    next = Math.min(hi, Math.max(lo, next));
    // Always move at least one token in the chosen direction, so a tiny slope cannot stall it.
    return dir === "grow" ? Math.max(next, k + 1) : Math.min(next, k - 1);
  }

  private learn(t: StepTimings, load: number): void {
    secant(this.slopes[t.timing], t.k, load);
    secant(this.gpuSlopes[t.timing], t.k, t.tGpuMs);
    addToLine(this.deviceFits[t.timing], t.offloaded > 0 ? Math.min(t.k, t.offloaded) : t.k, t.tGpuMs);
    if (t.timing === "post" && t.offloaded > 0) {
      // Post's load at kMin, from this step's at K (scoring scales with the offloaded count).
      const slope = this.slopes.post.msPerK ?? 0;
      const atKMin = Math.max(0.5 * load, load - slope * Math.max(0, Math.min(t.k, t.offloaded) - this.options.kMin));
      this.postRef = { loadPerOffloaded: atKMin / t.offloaded, gpuMs: t.tGpuMs };
    }
    if (t.timing === "pre" && this.preGpuRef === undefined) this.preGpuRef = this.preGpuAtKMin(t);
  }

  /** This pre step's T_gpu brought back to kMin by the learnt T_gpu-per-K slope. */
  private preGpuAtKMin(t: StepTimings): number {
    const slope = this.gpuSlopes.pre.msPerK ?? 0;
    // An over-estimated slope only delays a return (failed returns back off); keep it positive.
    return Math.max(0.05 * t.tGpuMs, t.tGpuMs - slope * Math.max(0, Math.min(t.k, t.offloaded || t.k) - this.options.kMin));
  }

  /** Would post-QKᵀ at kMin fit under the GPU stage now? */
  private postFits(t: StepTimings, k: number): boolean {
    if (t.offloaded === 0) return true;
    const margin = 1 - this.options.postMargin;
    const ref = this.postRef;
    if (!ref) {
      // Never ran post: the pre load per scored token over every offloaded token, an
      // over-estimate (random gathers cost more than a streaming pass).
      return ((t.tCpuMs + t.tTxMs) / k) * t.offloaded <= margin * t.tGpuMs;
    }
    const growth = this.preGpuRef ? this.preGpuAtKMin(t) / this.preGpuRef : 1;
    return ref.loadPerOffloaded * t.offloaded <= margin * ref.gpuMs * growth;
  }
}

/**
 * The largest point ≤ target of the grid K moves on: kMin, then each point the previous one plus
 * min(kQuantum, what one step of maxStep adds to it). Whole quanta alone never grow a K below
 * kQuantum (one step of ×maxStep cannot reach the next quantum); geometric points below it can.
 */
function gridFloor(target: number, o: { kMin: number; kQuantum: number; maxStep: number }): number {
  let k = o.kMin;
  for (;;) {
    const step = Math.max(1, Math.floor(k * (o.maxStep - 1)));
    if (step >= o.kQuantum) return k + Math.floor((target - k) / o.kQuantum) * o.kQuantum;
    if (k + step > target) return k;
    k += step;
  }
}

function median(v: readonly number[]): number {
  const s = [...v].sort((a, b) => a - b), m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/** Feeds one (K, ms) observation to a secant slope estimate. */
function secant(s: SlopeEstimate, k: number, ms: number): void {
  if (s.lastK !== undefined && s.lastMs !== undefined) {
    const dK = k - s.lastK;
    // Secants over a tiny change of K are mostly noise; skip them.
    if (Math.abs(dK) >= Math.max(1, 0.2 * Math.max(k, s.lastK))) {
      const m = (ms - s.lastMs) / dK;
      if (Number.isFinite(m) && m > 0) s.msPerK = s.msPerK === undefined ? m : SLOPE_SMOOTHING * m + (1 - SLOPE_SMOOTHING) * s.msPerK;
    }
  }
  s.lastK = k;
  s.lastMs = ms;
}

/** Sums for a least-squares line of T_gpu (y) against K, each step's weight decaying by half
 * every DEVICE_HALF_LIFE steps; n counts the steps. */
interface LineSums {
  n: number;
  w: number;
  w2: number;
  k: number;
  kk: number;
  y: number;
  ky: number;
  yy: number;
}

function emptyLine(): LineSums {
  return { n: 0, w: 0, w2: 0, k: 0, kk: 0, y: 0, ky: 0, yy: 0 };
}

function addToLine(s: LineSums, k: number, y: number): void {
  const d = 2 ** (-1 / DEVICE_HALF_LIFE);
  s.n++;
  s.w = s.w * d + 1;
  s.w2 = s.w2 * d * d + 1;
  s.k = s.k * d + k;
  s.kk = s.kk * d + k * k;
  s.y = s.y * d + y;
  s.ky = s.ky * d + k * y;
  s.yy = s.yy * d + y * y;
}

/** The line's slope and its standard error (over the effective count of steps); undefined before four steps. */
function fitLine(s: LineSums): { b: number; se: number } | undefined {
  if (s.n < 4) return undefined;
  const nEff = (s.w * s.w) / s.w2;
  const sxx = s.kk - (s.k * s.k) / s.w;
  if (!(sxx > 1e-9 * s.kk)) return undefined; // K (nearly) the same every step: no line
  const sxy = s.ky - (s.k * s.y) / s.w;
  // A rise across the K seen below 1e-9 of T_gpu is rounding (a flat line), not a slope.
  const b = Math.abs(sxy) > 1e-9 * Math.sqrt(sxx / s.w) * Math.abs(s.y) ? sxy / sxx : 0;
  const sse = Math.max(0, s.yy - (s.y * s.y) / s.w - b * sxy);
  return { b, se: Math.sqrt(sse / ((nEff - 2) * sxx)) };
}
