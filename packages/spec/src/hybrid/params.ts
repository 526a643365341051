/**
 * The four knobs of hybrid attention, each with one name, one schema and one default, used
 * unchanged from the CLI flag through the runtime and the schedulers to the engine:
 *
 * - `k` (`--k`): offloaded tokens selected per KV head and layer; `kMin` (`--k-min`) is the
 *   feedback scheduler's floor on that same K, so it shares the schema and the default.
 * - `gpuKvBudget` (`--gpu-kv-budget`): tokens per sequence resident in the device window,
 *   sinks included, or "auto" (resolved by resolveGpuKvBudget alone).
 * - `sinkTokens` (`--sink-tokens`): the first positions pinned in the window for good.
 * - `timing` (`--timing`): post- or pre-QKᵀ selection (SelectionTimingSchema).
 */
import { z } from "zod";
import { HybridgenError } from "../errors.js";
import { SelectionTimingSchema, type SelectionTiming } from "../contracts/selector.js";

/** K when neither the caller nor a model's hybrid profile gives one: the fixed scheduler's K, the feedback scheduler's floor. */
export const DEFAULT_K = 64;

/** K, and the feedback scheduler's kMin/kMax: a positive integer. */
export const KSchema = z.number().int("must be an integer").min(1, "must be at least 1");

/** The budget's value asking for the window to be sized from device memory. */
export const GPU_KV_BUDGET_AUTO = "auto";

/** The budget once resolved: tokens per sequence resident in the device window, sinks included. */
export const GpuKvBudgetTokensSchema = z.number({ error: 'must be a positive integer or "auto"' }).int("must be an integer").min(1, "must be at least 1");

/** Tokens per sequence resident in the device window (sinks included), or "auto". */
export const GpuKvBudgetSchema = z.union([z.literal(GPU_KV_BUDGET_AUTO), GpuKvBudgetTokensSchema], { error: 'must be a positive integer or "auto"' });
export type GpuKvBudget = z.infer<typeof GpuKvBudgetSchema>;

/** Sink tokens pinned in the window: a non-negative integer, none by default. */
export const SinkTokensSchema = z.number().int("must be an integer").min(0, "must be ≥ 0");
export const DEFAULT_SINK_TOKENS = 0;

/** The timing a built-in scheduler starts with when the selector can run it. */
export const DEFAULT_TIMING: SelectionTiming = "post";
export { SelectionTimingSchema };

export interface GpuKvBudgetContext {
  /** Positions the KV cache holds: no window is larger. */
  readonly maxContext: number;
  /** Tokens the device memory can keep resident (a capacity planner's answer); absent: no planner ran. */
  readonly fitTokens?: number;
}

/**
 * The window size a budget stands for, in tokens: a number is taken as is (capped at the
 * context), "auto" is what fits the device (`fitTokens`), or the whole context when no planner
 * measured the device (everything resident: nothing is offloaded).
 */
export function resolveGpuKvBudget(budget: GpuKvBudget | undefined, ctx: GpuKvBudgetContext): number {
  if (!Number.isInteger(ctx.maxContext) || ctx.maxContext < 1) throw new HybridgenError(`gpuKvBudget: maxContext must be a positive integer, got ${ctx.maxContext}`);
  const r = GpuKvBudgetSchema.optional().safeParse(budget);
  if (!r.success) throw new HybridgenError(`gpuKvBudget: ${r.error.issues[0]?.message ?? "invalid"}, got ${JSON.stringify(budget)}`);
  const b = r.data;
  if (b === undefined) return ctx.maxContext;
  if (b !== GPU_KV_BUDGET_AUTO) return Math.min(b, ctx.maxContext);
  const fit = ctx.fitTokens;
  if (fit === undefined) return ctx.maxContext;
  if (!Number.isInteger(fit) || fit < 1) throw new HybridgenError(`gpuKvBudget "auto": the planner's fitTokens must be a positive integer, got ${fit}`);
  return Math.min(fit, ctx.maxContext);
}
