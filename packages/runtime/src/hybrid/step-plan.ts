/**
 * A hybrid step's plan: from the scheduler's decision and the offloaded count, the timing the
 * selector runs under, K, the step's width, and what the CPU stage does — and per layer the
 * width and budget (verified layers score candidates·K) and the job's work. Pure functions.
 */
import {
  type SchedulerDecision, clampBudget, stageKernel, type SelectionTiming, type SelectorKernel, type TokenSelector, type CpuStageWork,
} from "@hybridgen/spec";

export interface StepPlan {
  readonly timing: SelectionTiming;
  readonly budget: number;
  readonly kmax: number;
  readonly offloaded: number;
  /** What the stage does; "score" means a JS selector chooses after the logits are back, "pre" before submitting. */
  readonly work: "kernel" | "score" | "pre";
  /** The stage kernel that chooses (work "kernel"). */
  readonly kernel: SelectorKernel | undefined;
}

export interface PlannedStep {
  readonly plan: StepPlan;
  /** The decision's timing, when the selector cannot run it (the plan takes the selector's first). */
  readonly refusedTiming?: SelectionTiming;
  /** The decision's K exceeded the offloaded tokens (the plan's budget is the offloaded count). */
  readonly clamped: boolean;
}

export function planStep(selector: TokenSelector, decision: SchedulerDecision, offloaded: number): PlannedStep {
  let timing = decision.timing;
  const refused = selector.timings.includes(timing) ? undefined : timing;
  if (refused) timing = selector.timings[0]!;
  const { budget, clamped } = clampBudget(decision.k, offloaded);
  const kernel = stageKernel(selector, timing);
  const work = kernel ? "kernel" : timing === "post" ? "score" : "pre";
  const kmax = selector.usesBudget ? budget : offloaded;
  return { plan: { timing, budget, kmax, offloaded, work, kernel }, refusedTiming: refused, clamped: clamped && selector.usesBudget };
}

/** Per layer, how verification widens it: `rescore` layers score `candidates`·K tokens. */
export interface LayerWidths {
  readonly rescore: readonly boolean[];
  readonly candidates: number;
  readonly usesBudget: boolean;
  /** Per layer, the share of K it selects (a calibration's per-layer K; absent: all of it). */
  readonly kShare?: readonly number[] | null;
}

/**
 * Pages a layer's share of K covers at least when the step chooses pages (Quest, the page index),
 * never more than K itself: a calibrated share is a count of the best tokens, and page bounds rank
 * pages too coarsely for the few pages such a share would buy (16 pages: Quest's smallest budget).
 */
export const PAGE_FLOOR = 16;

/** Quest's candidates cover at least this share of the offloaded pages (never more than candidates·K): its bounds rank the needed page among a share of the pages, and that rank grows with their count. */
export const QUEST_PAGE_SHARE = 1 / 8;

/** Layer `layer`'s share of K (at least 1; at least PAGE_FLOOR pages when the step's kernel chooses pages). */
function share(plan: StepPlan, w: LayerWidths, layer: number, k: number): number {
  if (!w.kShare) return k;
  const kernel = plan.kernel, pages = typeof kernel === "object" && "pageSize" in kernel ? PAGE_FLOOR * kernel.pageSize : 0;
  return Math.min(k, Math.max(1, pages, Math.ceil(k * w.kShare[layer]!)));
}

/** Layer `layer`'s width from K: its share, `candidates` times on verified layers, and for calibrated Quest at least QUEST_PAGE_SHARE of the pages on every layer (exact ones too: their choice is final). */
function widened(plan: StepPlan, w: LayerWidths, layer: number, k: number): number {
  const s = share(plan, w, layer, k), kernel = plan.kernel;
  const wide = w.rescore[layer] ? s * w.candidates : s;
  const quest = w.kShare && typeof kernel === "object" && kernel.name === "quest"
    ? Math.min(k * w.candidates, Math.ceil((QUEST_PAGE_SHARE * plan.offloaded) / kernel.pageSize) * kernel.pageSize)
    : 0;
  return Math.min(plan.offloaded, Math.max(wide, quest));
}

/** The step's width at `layer`: its share of K; verified layers score `candidates`·K tokens. */
export function layerKmax(plan: StepPlan, w: LayerWidths, layer: number): number {
  if (!w.usesBudget) return plan.kmax;
  return widened(plan, w, layer, plan.kmax);
}

/** The selection budget at `layer` (its share of K, widened on verified layers). */
export function layerBudget(plan: StepPlan, w: LayerWidths, layer: number): number {
  return widened(plan, w, layer, plan.budget);
}

/** The stage job's work of a kernel step at `layer` (budget: layerBudget). */
export function kernelWork(plan: StepPlan, budget: number): CpuStageWork {
  const kernel = plan.kernel!;
  if (kernel === "all") return { kind: "topk", budget: plan.offloaded, shared: true };
  if (typeof kernel === "string") return { kind: "topk", budget, shared: kernel === "topk-shared" };
  if (kernel.name === "index") return { kind: "index", budget, form: kernel.form, pageSize: kernel.pageSize, superPages: kernel.superPages };
  return kernel.name === "quest"
    ? { kind: "quest", budget, pageSize: kernel.pageSize }
    : { kind: "streaming", budget, sinks: kernel.sinks };
}
