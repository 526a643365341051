/**
 * `hybridgen generate --attention hybrid` flags, kept apart from the generic generate flags:
 * splitHybridArgs() takes them out of argv (the rest goes to parseGenerateArgs), and
 * attachHybrid() composes the hybrid runtime (selector, scheduler, native CPU stage) onto a
 * loaded model. The stats line comes from HybridAttention.stats.summary().
 */
import { availableParallelism } from "node:os";
import { z } from "zod";
import {
  HybridAttention, HybridgenError, LogitsModeSchema, SelectionTimingSchema, type Attention, type Backend, type KvCache, type QueryProjector,
} from "@hybridgen/core";
import { createSelector } from "@hybridgen/selectors";
import { FixedScheduler } from "@hybridgen/scheduler";

export const HybridCliOptionsSchema = z
  .object({
    attention: z.enum(["full", "hybrid"], { error: "must be full or hybrid" }).default("full"),
    /** Tokens per sequence resident in the (device) window, sinks included. */
    gpuKvBudget: z.number().int("must be an integer").min(1, "must be at least 1").optional(),
    sinkTokens: z.number().int("must be an integer").min(0, "must be ≥ 0").default(0),
    /** Selected offloaded tokens per KV head and layer (clamped to the offloaded count). */
    k: z.number().int("must be an integer").min(1, "must be at least 1").default(64),
    selection: SelectionTimingSchema.default("post"),
    logits: LogitsModeSchema.default("speculative"),
    /** Default: "topk" for post, "streaming" for pre. */
    selector: z.string().min(1).optional(),
    /** Default: 1 on the CPU backend (its own ops use the other cores); on a device backend every
     * core but one (the one JS drives the device from: a 16th stage thread on 16 cores shares a core
     * with it, and each layer's stage then waits for whichever thread lost its core). */
    cpuStageThreads: z.number().int("must be an integer").min(1, "must be at least 1").max(256, "must be ≤ 256").optional(),
  })
  .strict()
  .refine((o) => o.attention === "full" || o.gpuKvBudget !== undefined, { message: "--attention hybrid needs --gpu-kv-budget N", path: ["gpuKvBudget"] })
  .refine((o) => o.gpuKvBudget === undefined || o.sinkTokens < o.gpuKvBudget, { message: "--sink-tokens must be smaller than --gpu-kv-budget", path: ["sinkTokens"] })
  .refine((o) => o.attention === "hybrid" || (o.gpuKvBudget === undefined && o.selector === undefined), {
    message: "--gpu-kv-budget and --selector need --attention hybrid", path: ["attention"],
  });
export type HybridCliOptions = z.infer<typeof HybridCliOptionsSchema>;

const FLAGS = {
  attention: "attention", "gpu-kv-budget": "gpuKvBudget", "sink-tokens": "sinkTokens", k: "k",
  selection: "selection", logits: "logits", selector: "selector", "cpu-stage-threads": "cpuStageThreads",
} as const;
const NUMERIC = new Set(["gpuKvBudget", "sinkTokens", "k", "cpuStageThreads"]);

export const HYBRID_HELP = `Hybrid attention (paper §4.2):
      --attention full|hybrid  hybrid: split each layer's attention between resident and offloaded tokens
      --gpu-kv-budget N        tokens kept in the device window per sequence (sinks included)
      --sink-tokens S          pin the first S tokens in the window (attention sinks, default 0)
      --k N                    offloaded tokens selected per KV head and layer (default 64; clamped)
      --selection post|pre     post: score all offloaded tokens, keep top-K; pre: StreamingLLM positions
      --logits exact|speculative  speculative (default): score layer i+1 with q̃ from layer i's input
      --selector NAME          a built-in selector (default topk for post, streaming for pre; "all" = exact)
      --cpu-stage-threads N    native threads of the CPU stage (default 1 on the CPU backend, cores − 1 on a GPU)
`;

/** Takes the hybrid flags out of argv; returns the remaining args and the validated options. */
export function splitHybridArgs(argv: readonly string[]): { rest: string[]; hybrid: HybridCliOptions } {
  const rest: string[] = [];
  const raw: Record<string, unknown> = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const m = /^--([a-z-]+)(?:=(.*))?$/.exec(arg);
    const key = m ? FLAGS[m[1] as keyof typeof FLAGS] : undefined;
    if (!m || !key) {
      rest.push(arg);
      continue;
    }
    let value = m[2];
    if (value === undefined) {
      if (i + 1 >= argv.length) throw new HybridgenError(`${arg} needs a value`);
      value = argv[++i]!;
    }
    if (NUMERIC.has(key)) {
      if (!/^\d+$/.test(value.trim())) throw new HybridgenError(`invalid value for --${m[1]}: ${JSON.stringify(value)} is not a non-negative integer`);
      raw[key] = Number(value);
    } else raw[key] = value;
  }
  const r = HybridCliOptionsSchema.safeParse(raw);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    const flag = Object.entries(FLAGS).find(([, k]) => k === issue.path[0])?.[0];
    throw new HybridgenError(flag ? `invalid value for --${flag}: ${issue.message}` : issue.message);
  }
  return { rest, hybrid: r.data };
}

export const HYBRID_FLAG_NAMES = Object.keys(FLAGS);

/** Full attention, as when no hybrid flag is given. */
export const FULL_ATTENTION: HybridCliOptions = HybridCliOptionsSchema.parse({});

/** LlamaModel.load options for the hybrid window (empty for full attention). */
export function hybridLoadOptions(h: HybridCliOptions): { kvWindow?: number; kvSinks?: number } {
  return h.attention === "hybrid" ? { kvWindow: h.gpuKvBudget!, kvSinks: h.sinkTokens } : {};
}

/**
 * Attach hybrid attention to a loaded model: the named (or default) selector, a fixed scheduler
 * with --k and --selection, and the native CPU stage. On the CPU backend the stage reads the
 * cache's store in place; on a device backend (CUDA) the store is kept in host memory of a CPU
 * backend made for it (pinned, filled by device → host copies on eviction) and the stage's
 * logits and V rows go to the device on the copy stream.
 */
export async function attachHybrid(
  model: { readonly attention: Attention; readonly cache: KvCache; readonly maxContext: number } & QueryProjector,
  backend: Backend,
  h: HybridCliOptions,
): Promise<HybridAttention | null> {
  if (h.attention !== "hybrid") return null;
  if (model.cache.storeCapacity === 0) {
    throw new HybridgenError(`--gpu-kv-budget ${h.gpuKvBudget} holds the whole context (${model.maxContext}): nothing would be offloaded`);
  }
  const { NativeCpuStage, CpuBackend, createCpuBackend } = await import("@hybridgen/kernels-cpu");
  let host: InstanceType<typeof CpuBackend>;
  if (backend instanceof CpuBackend) {
    host = backend;
  } else if (backend.hostTransfers) {
    const link = backend.hostTransfers();
    host = createCpuBackend({ threads: 1 }); // holds the host store; the stage has threads of its own
    try {
      model.cache.attachHostStore(host, link, true);
    } catch (e) {
      host.close();
      throw e;
    }
  } else {
    throw new HybridgenError(`--attention hybrid needs the CPU backend or a device backend with host transfers (got ${backend.name})`);
  }
  const selector = createSelector(h.selector ?? (h.selection === "post" ? "topk" : "streaming"));
  const scheduler = new FixedScheduler({ k: h.k, timing: h.selection });
  const threads = h.cpuStageThreads ?? (host === backend ? 1 : Math.max(1, availableParallelism() - 1));
  const stage = new NativeCpuStage(host, { threads });
  try {
    return HybridAttention.attach({ attention: model.attention, projector: model, stage, selector, scheduler }, { logits: h.logits });
  } catch (e) {
    stage.close();
    throw e;
  }
}
