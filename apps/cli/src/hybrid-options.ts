/**
 * `hybridgen generate --attention hybrid` flags, kept apart from the generic generate flags:
 * splitHybridArgs() takes them out of argv (the rest goes to parseGenerateArgs), and
 * attachHybrid() hands them to @hybridgen/runtime's createHybridAttention, which composes the
 * hybrid runtime (selector, scheduler, native CPU stage, host store) onto a loaded model. The
 * stats line comes from HybridAttention.stats.summary(), the --json trace from stats.trace.
 */
import { z } from "zod";
import { DEFAULT_K, DEFAULT_SINK_TOKENS, GPU_KV_BUDGET_AUTO, GpuKvBudgetSchema, HybridgenError, KSchema, SelectionTimingSchema, SinkTokensSchema, type Backend, type GpuKvBudget, type KvStoreAllocator } from "@hybridgen/core";
import { DEFAULT_MASS_TARGET, HYBRID_DEFAULTS, LogitsModeSchema, MassTargetSchema, RowPathRequestSchema, type CachedCalibration, type HybridAttention, type HybridProfile } from "@hybridgen/runtime";
import { isRegisteredSpec, loadSelectorSpec } from "@hybridgen/selectors";
import {
  HYBRID_OPTION_FLAGS, HybridRuntimeOptionsSchema, parseHybridFlag, SchedulerNameSchema, SelectorTextSchema, createBatchHybridAttention, type HybridOptionFlag, createHybridAttention, hybridPlan, resolveHybrid, type HybridPlan, type HybridRuntimeOptions, type SequenceModel,
} from "@hybridgen/runtime";

/** The runtime's option schemas, each used as is. */
const RT = HybridRuntimeOptionsSchema.shape;

export const HybridCliOptionsSchema = z
  .object({
    attention: z.enum(["full", "hybrid"], { error: "must be full or hybrid" }).default("full"),
    /** Tokens per sequence resident in the (device) window, sinks included, or "auto"; older ones are
     * offloaded (full attention still attends them exactly). Absent: every token resident. */
    gpuKvBudget: GpuKvBudgetSchema.optional(),
    sinkTokens: SinkTokensSchema.default(DEFAULT_SINK_TOKENS),
    /** A registered scheduler: fixed (--k, --timing every step), feedback (K and timing from the measured stage times), a plugin's. Default: see the runtime. */
    scheduler: SchedulerNameSchema.optional(),
    // The runtime's options, as the runtime's schema defines them (bounds, spellings, messages):
    // only the selector is narrowed to its text form (a name, a module or POST+PRE).
    /** A registered selector, a plugin module (PATH|PACKAGE[:export]), or POST+PRE. */
    selector: SelectorTextSchema.optional(),
    selectorOptions: RT.selectorOptions,
    k: RT.k,
    kMin: RT.kMin,
    timing: RT.timing,
    logits: RT.logits,
    exactLayers: RT.exactLayers,
    massTarget: RT.massTarget,
    candidates: RT.candidates,
    keep: RT.keep,
    cpuStageThreads: RT.cpuStageThreads,
    scoring: RT.scoring,
    rescoreFactor: RT.rescoreFactor,
    rowPath: RT.rowPath,
  })
  .strict()
  .refine((o) => o.sinkTokens === 0 || o.gpuKvBudget !== undefined || o.attention === "hybrid", { message: "--sink-tokens needs --gpu-kv-budget", path: ["sinkTokens"] })
  .refine((o) => typeof o.gpuKvBudget !== "number" || o.sinkTokens < o.gpuKvBudget, { message: "--sink-tokens must be smaller than --gpu-kv-budget", path: ["sinkTokens"] })
  .refine((o) => o.attention === "hybrid" || HYBRID_ONLY.every((key) => o[key] === undefined), {
    message: `${Object.keys(HYBRID_OPTION_FLAGS).map((f) => `--${f}`).join(", ").replace(/, (--[a-z-]+)$/, " and $1")} need --attention hybrid`, path: ["attention"],
  })
  .refine((o) => o.kMin === undefined || o.scheduler !== "fixed", { message: "--k-min sets the feedback scheduler's floor; --scheduler fixed uses --k", path: ["kMin"] })
  .refine((o) => o.k === undefined || o.kMin === undefined || o.k >= o.kMin, { message: "--k (the feedback scheduler's first K) must be at least --k-min", path: ["k"] })
  // Hybrid attention's window defaults to what the device's memory holds (auto-budget.ts).
  .transform((o) => (o.attention === "hybrid" && o.gpuKvBudget === undefined ? { ...o, gpuKvBudget: GPU_KV_BUDGET_AUTO as GpuKvBudget } : o));
export type HybridCliOptions = z.infer<typeof HybridCliOptionsSchema>;

/** The window's flags (the model's load options), then the runtime's (HYBRID_OPTION_FLAGS). */
const FLAGS = { attention: "attention", "gpu-kv-budget": "gpuKvBudget", "sink-tokens": "sinkTokens", ...HYBRID_OPTION_FLAGS } as const;
/** Flags that only mean something to hybrid attention: the runtime's. */
const HYBRID_ONLY = Object.values(HYBRID_OPTION_FLAGS);
/** Old spellings of one concept, refused with the one name. */
const RENAMED: Readonly<Record<string, string>> = { "kv-window": "--gpu-kv-budget", "kv-sinks": "--sink-tokens", selection: "--timing" };

export const HYBRID_HELP = `KV window and hybrid attention (paper §4.2):
      --attention full|hybrid  hybrid: split each layer's attention between resident and offloaded tokens
      --gpu-kv-budget N|auto   tokens kept in the device window per sequence (sinks included); older ones are
                               offloaded (full attention still attends them exactly). auto: what fits the
                               device (hybridgen plan's arithmetic; a GPU only). Default: auto with
                               --attention hybrid, else every token resident
      --sink-tokens S          pin the first S tokens in the window (attention sinks, default ${DEFAULT_SINK_TOKENS})
      --scheduler fixed|feedback  feedback: K and post/pre from the measured stage times; fixed: --k and
                               --timing every step. Default: feedback with --k-min, fixed with --k or
                               --timing alone, else feedback on a GPU and fixed on the CPU (feedback's K
                               follows the measured stage times: a --seed run repeats its text only with fixed)
      --k N                    fixed: offloaded tokens selected per KV head and layer (clamped); feedback:
                               the first step's K (default: the model's profiled K_min or its prompt's
                               calibration, else ${DEFAULT_K})
      --k-min N                feedback: K never goes below N (default: as --k)
      --mass-target X          the share of attention mass the calibrated K captures on every layer,
                               0 < X ≤ 1 (default ${DEFAULT_MASS_TARGET})
      --timing post|pre        post: score all offloaded tokens, keep top-K; pre: choose first (feedback: first step)
      --logits exact|speculative|verified  how the CPU stage's query is formed (default ${HYBRID_DEFAULTS.logits})
      --exact-layers L,L…      layers that select with the true query ("none" for none; default: the
                               profile's, else those whose q̃ misses in the prompt's calibration)
      --candidates N           verified: choose N·K candidates for the device to score (default: the
                               profile's, else ${HYBRID_DEFAULTS.candidates})
      --keep N                 verified: keep N·K of the scored candidates a KV head and bring up only
                               their V rows (at most --candidates; default: every candidate's)
      --selector NAME|PATH|PACKAGE[:export]  a registered selector (topk, streaming, all, h2o, quest,
                               index, infinigen, keyformer), a plugin module exporting one made with defineSelector
                               (./my-selector.ts, a package name; :name picks a named export), or POST+PRE
                               (e.g. topk+quest); default topk+quest with feedback, else topk for post,
                               streaming for pre ("all" = exact)
      --selector-options JSON  the selector's options, e.g. '{"pageSize":32}', '{"form":"int4"}' for index (unknown keys are errors)
      --cpu-stage-threads N    native threads of the CPU stage (default 1 on the CPU backend, cores − 3 on a GPU)
      --scoring full|int8|int4 top-K scores compressed copies of the offloaded K first (int8: 0.52 of bf16's
                               bytes, int4: 0.28) and rescores the best --rescore-factor·K rows in full (default full)
      --rescore-factor N       compressed scoring: candidates per selected token (default 4)
      --row-path auto|mapped|staged  GPU: selected rows read in place (mapped) or copied up (staged); default ${HYBRID_DEFAULTS.rowPath}
`;

/** Takes the hybrid flags out of argv; returns the remaining args and the validated options. */
export function splitHybridArgs(argv: readonly string[]): { rest: string[]; hybrid: HybridCliOptions } {
  const rest: string[] = [];
  const raw: Record<string, unknown> = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const m = /^--([a-z-]+)(?:=(.*))?$/.exec(arg);
    if (m && RENAMED[m[1]!]) throw new HybridgenError(`--${m[1]} is now ${RENAMED[m[1]!]}`);
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
    if (m[1]! in HYBRID_OPTION_FLAGS) {
      raw[key] = parseHybridFlag(m[1] as HybridOptionFlag, value)[1];
    } else if (key === "gpuKvBudget" && value.trim() === GPU_KV_BUDGET_AUTO) {
      raw[key] = GPU_KV_BUDGET_AUTO;
    } else if (key === "gpuKvBudget" || key === "sinkTokens") {
      if (!/^\d+$/.test(value.trim())) {
        const want = key === "gpuKvBudget" ? `a positive integer or "${GPU_KV_BUDGET_AUTO}"` : "a non-negative integer";
        throw new HybridgenError(`invalid value for --${m[1]}: ${JSON.stringify(value)} is not ${want}`);
      }
      raw[key] = Number(value);
    } else raw[key] = value;
  }
  const r = HybridCliOptionsSchema.safeParse(raw);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    const flag = Object.entries(FLAGS).find(([, k]) => k === issue.path[0])?.[0];
    const cross = issue.code === "custom"; // a refine: its message names the flags itself
    throw new HybridgenError(flag && !cross ? `invalid value for --${flag}: ${issue.message}` : issue.message);
  }
  // Flag-only contradictions (a selector that cannot run --timing) fail before any model loads;
  // a plugin's are checked once it is loaded (loadHybridSelector).
  if (r.data.attention === "hybrid" && (r.data.selector === undefined || isRegisteredSpec(r.data.selector))) {
    resolveHybrid(runtimeOptions(r.data, null), { device: false });
  }
  return { rest, hybrid: r.data };
}

/**
 * Imports and registers the plugin modules --selector names (paths from `cwd`, packages
 * installed there), then checks the flags against the loaded selector, before any model loads.
 */
export async function loadHybridSelector(h: HybridCliOptions, cwd: string): Promise<HybridCliOptions> {
  if (h.attention !== "hybrid" || h.selector === undefined) return h;
  const loaded = { ...h, selector: await loadSelectorSpec(h.selector, { cwd }) };
  resolveHybrid(runtimeOptions(loaded, null), { device: false });
  return loaded;
}

export const HYBRID_FLAG_NAMES = Object.keys(FLAGS);

/** Full attention, as when no hybrid flag is given. */
export const FULL_ATTENTION: HybridCliOptions = HybridCliOptionsSchema.parse({});

/** LlamaModel.load options for the window (empty when every token stays resident). */
export function windowLoadOptions(h: HybridCliOptions): { gpuKvBudget?: GpuKvBudget; sinkTokens?: number } {
  return h.gpuKvBudget === undefined ? {} : { gpuKvBudget: h.gpuKvBudget, sinkTokens: h.sinkTokens };
}

/** The flags as createHybridAttention options (only those given: the runtime owns the defaults). */
export function runtimeOptions(h: HybridCliOptions, profile: HybridProfile | null): HybridRuntimeOptions {
  const o: Record<string, unknown> = {
    selector: h.selector, selectorOptions: h.selectorOptions, scheduler: h.scheduler, k: h.k, kMin: h.kMin, timing: h.timing, logits: h.logits,
    exactLayers: h.exactLayers, candidates: h.candidates, keep: h.keep, cpuStageThreads: h.cpuStageThreads, scoring: h.scoring, rescoreFactor: h.rescoreFactor, rowPath: h.rowPath, profile,
    massTarget: h.massTarget,
  };
  for (const key of Object.keys(o)) if (o[key] === undefined) delete o[key];
  return o as HybridRuntimeOptions;
}

/** The hybrid attention of every sequence: the model's own, then one per further batch slot. */
export interface AttachedHybrid extends Disposable {
  readonly own: HybridAttention;
  readonly all: readonly HybridAttention[];
}

/** How attachHybrid attaches: where each sequence's store goes, how many decode at once, what it starts from. */
export interface HybridAttachment {
  /** The model's `hybridgen profile-kmin` result: the defaults of --k-min and --exact-layers. */
  readonly profile?: HybridProfile | null;
  /** Places each sequence's offloaded store (storeAllocatorFor's, a server's ledger). */
  readonly storeAllocator?: (sequence: number) => KvStoreAllocator;
  /** Sequences that decode at once: they share the runtime's default CPU-stage threads (default 1). */
  readonly batch?: number;
  /** The model's own sequence never decodes (a server's idle slot 0): every sequence it makes gets one, even at batch 1. */
  readonly ownIdle?: boolean;
  /** --kv-disk-read-depth. */
  readonly readDepth?: number;
  /** The model's cached calibration: where K and the exact layers start. */
  readonly calibration?: CachedCalibration | null;
}

/**
 * Attach hybrid attention to a loaded model through createHybridAttention (createBatchHybridAttention
 * for a batch, or with the own sequence idle: one per sequence): the flags, with the profile's
 * defaults. On the CPU backend the stage reads the cache's store in place; on a device backend
 * (CUDA) the store is kept in pinned host memory and the stage's output goes up on the copy stream.
 */
export async function attachHybrid(
  model: SequenceModel, backend: Backend, h: HybridCliOptions, { profile = null, storeAllocator, batch = 1, ownIdle = false, readDepth, calibration = null }: HybridAttachment = {},
): Promise<AttachedHybrid | null> {
  if (h.attention !== "hybrid") return null;
  if (model.cache.storeCapacity === 0) {
    throw new HybridgenError(`--gpu-kv-budget ${h.gpuKvBudget} holds the whole context (${model.maxContext}): nothing would be offloaded`);
  }
  const options = {
    ...runtimeOptions(h, profile), ...(storeAllocator ? { storeAllocator } : {}), ...(readDepth === undefined ? {} : { readDepth }),
    ...(calibration && calibration.layerK.length === model.cache.layers ? { calibration } : {}),
  };
  if (batch > 1 || ownIdle) return createBatchHybridAttention(model, backend, options, batch);
  const ha = await createHybridAttention(model, backend, options);
  return { own: ha, all: [ha], [Symbol.dispose]: () => ha.close() };
}

/** The stats lines after a run: the one sequence's, or one per batch slot. */
export function hybridStatsLines(h: AttachedHybrid): string {
  const one = (ha: HybridAttention, prefix: string) => [prefix + ha.stats.summary(), ...ha.stats.notes.map((n) => prefix + n)];
  const lines = h.all.length === 1 ? one(h.own, "") : h.all.flatMap((ha, slot) => one(ha, `slot ${slot} `));
  return `${lines.join("\n")}\n`;
}

/** "hybrid: selector topk+streaming, feedback scheduler (K from 8, kMin 8 from --k-min), logits speculative, exact layers none, 1 stage thread, transport host" */
export function hybridPlanLine(ha: HybridAttention): string {
  const p = hybridPlan(ha);
  if (!p) return "";
  const from = p.kSource === "option" ? "from the flags" : p.kSource === "profile" ? "from the model's profile" : p.kSource === "calibration" ? "from a calibration" : "the default";
  const k = p.kMin === undefined ? `K ${p.k} ${p.timing}, ${from}` : `K from ${p.k} ${p.timing}, kMin ${p.kMin} ${from}`;
  return `hybrid: selector ${p.selector}, ${p.scheduler} scheduler (${k}), logits ${p.logits}, exact layers ${p.exactLayers.length ? p.exactLayers.join(",") : "none"}, ` +
    `${p.cpuStageThreads} stage thread${p.cpuStageThreads === 1 ? "" : "s"}, transport ${p.transport ?? "unknown"}` +
    (p.scoring === "full" ? "" : `, ${p.scoring} scoring (${p.rescoreFactor}·K rescored)`) +
    (p.readDepth === undefined ? "" : `, ${p.readDepth} disk reads in flight a thread`); // only when --kv-disk-read-depth set it
}

/** "calibration: the prompt's prefill chooses K and the exact layers (95% of the attention mass)" when it does (else ""). */
export function calibrationPlanLine(ha: HybridAttention): string {
  const c = hybridPlan(ha)?.calibrates;
  if (!c) return "";
  const what = [c.k ? "K" : "", c.exactLayers ? "the exact layers" : ""].filter(Boolean).join(" and ");
  return `calibration: the prompt's prefill chooses ${what} (${Math.round(c.massTarget * 1000) / 10}% of the attention mass)`;
}

/** The `scheduler` object of `generate --json`: what ran and, per step, the K, timing and stage times it decided from. */
export function schedulerJson(ha: HybridAttention): Record<string, unknown> {
  const plan: HybridPlan | undefined = hybridPlan(ha);
  const s = ha.stats;
  const last = s.trace[s.trace.length - 1];
  return {
    name: plan?.scheduler ?? null,
    kMin: plan?.kMin ?? null,
    kSource: plan?.kSource ?? null,
    selector: plan?.selector ?? null,
    logits: plan?.logits ?? null,
    exactLayers: plan?.exactLayers ?? null,
    candidates: plan?.candidates ?? null,
    keep: plan?.keep ?? null,
    transport: plan?.transport ?? null,
    calibration: plan?.calibrated ?? null,
    finalK: last?.k ?? null,
    finalTiming: last?.timing ?? null,
    timingSwitches: s.timingSwitches,
    droppedSteps: s.droppedSteps,
    steps: s.trace,
  };
}
