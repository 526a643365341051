/** Options of createHybridAttention(), validated once at the boundary. */
import { z } from "zod";
import { schedulerNames } from "@hybridgen/scheduler";
import { HybridgenError, KSchema, SelectionTimingSchema, type Backend, type CpuStage, type KvStoreAllocator, type Scheduler, type TokenSelector } from "@hybridgen/core";
import { CandidatesSchema, LogitsModeSchema, MassTargetSchema, RowPathRequestSchema } from "./hybrid/index.js";

const isSelector = (v: unknown): v is TokenSelector =>
  typeof v === "object" && v !== null && typeof (v as TokenSelector).select === "function" && Array.isArray((v as TokenSelector).timings);
const isScheduler = (v: unknown): v is Scheduler =>
  typeof v === "object" && v !== null && typeof (v as Scheduler).next === "function" && typeof (v as Scheduler).initial === "function";

/** Whether `v` has a KvStoreAllocator's methods (a factory's result is checked with it too). */
export const isAllocator = (v: unknown): v is KvStoreAllocator =>
  typeof v === "object" && v !== null && typeof (v as KvStoreAllocator).alloc === "function" &&
  typeof (v as KvStoreAllocator).pinnable === "function" && typeof (v as KvStoreAllocator).release === "function";

/** What HybridRuntimeOptions.cpuStage is handed: the native stage the options describe, and the CPU backend holding the store. */
export type CpuStageWrap = (stage: CpuStage, host: Backend) => CpuStage;

/** Each sequence's store allocator: `sequence` is 0 for the model's own, then 1, 2, … in the order sequences are made. */
export type StoreAllocatorFactory = (sequence: number) => KvStoreAllocator;

/** A registered scheduler's name (@hybridgen/scheduler's registerScheduler: "fixed", "feedback", a plugin's). */
export const SchedulerNameSchema = z.string().superRefine((n, ctx) => {
  const names = schedulerNames();
  // An invalid value (not a custom issue): it names its own option, as an enum's would.
  if (!names.includes(n)) ctx.addIssue({ code: "invalid_value", values: names, input: n, message: `must be ${names.join(" or ")}` });
});

const count = (min: number) => z.number().int("must be an integer").min(min, `must be at least ${min}`);

/** What the runtime reads of a model's hybrid profile (HybridProfile, read by readHybridProfile, has these and more). */
export const ProfileDefaultsSchema = z
  .object({
    kMin: KSchema,
    exactLayers: z.array(count(0)),
    /** The candidate multiplier exactLayers was measured with (verified logits). */
    candidates: CandidatesSchema.optional(),
    perSelector: z.record(z.string(), z.object({ kMin: KSchema.nullable() }).loose()).optional(),
  })
  .loose();
export type ProfileDefaults = z.infer<typeof ProfileDefaultsSchema>;

/** What a runtime takes of a calibration (CalibrationResult has these and more). */
export const CalibrationStartSchema = z.object({ k: KSchema, exactLayers: z.array(count(0)), layerK: z.array(KSchema).optional() }).loose();
export type CalibrationStart = z.infer<typeof CalibrationStartSchema>;

export const HybridRuntimeOptionsSchema = z
  .object({
    /**
     * A registered selector's name ("topk", "quest", a plugin's), a plugin module ("./my.ts",
     * "a-package", "./many.ts:named"; createHybridAttention loads it), "POST+PRE" for a pair that
     * runs POST under post-QKᵀ and PRE under pre-QKᵀ ("topk+streaming"), or a TokenSelector.
     * Default: "topk+quest" (Quest page summaries keep retrieval under pre) with the feedback scheduler (it may switch); with the fixed one,
     * "topk" for post and "streaming" for pre.
     */
    selector: z.union([z.string().min(1), z.custom<TokenSelector>(isSelector, { message: "must be a selector name or a TokenSelector" })]).optional(),
    /** Options of a selector given by name or module (its factory validates them; an unknown key is an error). */
    selectorOptions: z.record(z.string(), z.unknown()).optional(),
    /** "fixed", "feedback", or a Scheduler. Default: feedback with kMin, fixed with k or timing
     * alone; else feedback on a device backend (the CPU stage hides behind the GPU's) and fixed
     * on the CPU backend (both stages share its cores). */
    scheduler: z.union([SchedulerNameSchema, z.custom<Scheduler>(isScheduler)], { error: () => `must be ${schedulerNames().join(" or ")} or a Scheduler` }).optional(),
    /** Fixed: K every step (default: the profile's K_min, else core's DEFAULT_K). Feedback: the first step's K (default kMin). */
    k: KSchema.optional(),
    /** Feedback: the accuracy floor (default: the profile's K_min, else core's DEFAULT_K). */
    kMin: KSchema.optional(),
    /** Fixed: the timing every step; feedback: the first step's. Default: post when the selector can run it. */
    timing: SelectionTimingSchema.optional(),
    /** Logits mode (default: the engine's, HybridOptionsSchema). */
    logits: LogitsModeSchema.optional(),
    /** Layers whose selection waits for the true query (default: the profile's). */
    exactLayers: z.array(count(0)).optional(),
    /** Verified logits: candidates·K tokens chosen for the device to score (default: the profile's, else the engine's). */
    candidates: CandidatesSchema.optional(),
    /** Verified logits: keep·K of the candidates kept once scored, only their V rows brought up (HybridOptions.keep; default: all). */
    keep: CandidatesSchema.optional(),
    /** Where a device backend gets the selected rows (the hybrid step's HybridOptions.rowPath): "auto" (default: mapped wherever it can run), "mapped" or "staged". */
    rowPath: z.enum(RowPathRequestSchema.options, { error: "must be auto, mapped or staged" }).optional(),
    /** Native CPU-stage threads. Default: 1 on the CPU backend, cores − 3 on a device backend (defaultStageThreads). */
    cpuStageThreads: count(1).max(256, "must be ≤ 256").optional(),
    /** Disk-tier rows (a storeAllocator's files): explicit reads in flight per stage thread (kernels-cpu NativeCpuStage
     * readDepth; default its DEFAULT_READ_DEPTH); 0 reads them through the mapping (a page fault a row). */
    readDepth: count(0).max(64, "must be ≤ 64").optional(),
    /** µs the idle stage thread spins before sleeping (default 0). */
    idleSpinUs: count(0).max(1_000_000, "must be ≤ 1000000").optional(),
    /** How the stage's top-K scores the offloaded K (kernels-cpu NativeCpuStage): "full" (default),
     * or compressed copies first ("int8", "int4") with rescoreFactor·K candidates rescored in full. */
    scoring: z.enum(["full", "int8", "int4"], { error: "must be full, int8 or int4" }).optional(),
    /** Candidates per selected token that compressed scoring passes to the full rows (default 4). */
    rescoreFactor: count(1).max(64, "must be ≤ 64").optional(),
    /** Where the offloaded store's memory comes from (NUMA nodes, the disk tier): @hybridgen/kernels-cpu's
     * TieredStore over a @hybridgen/memtier layout, or a function making one per sequence (what a batch
     * needs: each sequence its own regions and files). Each cache releases its own when it closes. Default: the host backend's alloc(). */
    storeAllocator: z
      .custom<KvStoreAllocator | StoreAllocatorFactory>((v) => isAllocator(v) || typeof v === "function", { message: "must be a KvStoreAllocator or a function (sequence) => KvStoreAllocator" })
      .optional(),
    /** Keep accumulated scores even when the selector does not ask for them (the hybrid step's HybridOptions.trackScores). */
    trackScores: z.boolean().optional(),
    /** A wrapper or stand-in for the CPU stage the runtime built from these options (a bench that meters or
     * shadows it), given that stage and the CPU backend the store is on; the result owns the built stage. */
    cpuStage: z.custom<CpuStageWrap>((v) => typeof v === "function", { message: "must be a function (stage, host) => CpuStage" }).optional(),
    /** The model's hybrid profile (readHybridProfile): default kMin, exactLayers and candidates. */
    profile: ProfileDefaultsSchema.nullable().optional(),
    /** Calibrate from each prompt's prefill what neither an option nor the profile gives: K (the
     * feedback floor or the fixed K) and exactLayers (default true; false keeps the constant defaults). */
    calibrate: z.boolean().optional(),
    /** The share of the attention mass the calibrated K captures on every layer, 0 < x ≤ 1 (default DEFAULT_MASS_TARGET). */
    massTarget: MassTargetSchema.optional(),
    /** A calibration already made (an earlier prompt's, the model's cached one): its K and exactLayers
     * stand for what calibration would choose until a prompt's prefill calibrates afresh. */
    calibration: CalibrationStartSchema.nullable().optional(),
  })
  .strict();
export type HybridRuntimeOptions = z.input<typeof HybridRuntimeOptionsSchema>;
export type ParsedHybridRuntimeOptions = z.output<typeof HybridRuntimeOptionsSchema>;

/**
 * The options a command line sets, by flag (this order is the order the CLI names them in): the
 * CLI's generate/serve flags, its bench and eval, and apps/bench take these names and parse each
 * value with parseHybridFlag, so a bound or a spelling lives only in the schema above.
 */
export const HYBRID_OPTION_FLAGS = {
  selector: "selector", "selector-options": "selectorOptions", scheduler: "scheduler", k: "k", "k-min": "kMin", timing: "timing", logits: "logits",
  "exact-layers": "exactLayers", candidates: "candidates", keep: "keep", "cpu-stage-threads": "cpuStageThreads", scoring: "scoring", "rescore-factor": "rescoreFactor",
  "row-path": "rowPath", "mass-target": "massTarget",
} as const satisfies Record<string, keyof HybridRuntimeOptions>;
export type HybridOptionFlag = keyof typeof HYBRID_OPTION_FLAGS;
type FlagKey = (typeof HYBRID_OPTION_FLAGS)[HybridOptionFlag];

const INTEGER_KEYS: ReadonlySet<FlagKey> = new Set(["k", "kMin", "candidates", "keep", "cpuStageThreads", "rescoreFactor"]);

/** The text of a flag as its option's value (a number, a layer list, a JSON object, or the text itself), not yet checked. */
function flagValue(flag: HybridOptionFlag, key: FlagKey, text: string): unknown {
  const bad = (want: string) => new HybridgenError(`invalid value for --${flag}: ${JSON.stringify(text)} is not ${want}`, "EUSAGE");
  const t = text.trim();
  if (INTEGER_KEYS.has(key)) {
    if (!/^\d+$/.test(t)) throw bad("a non-negative integer");
    return Number(t);
  }
  if (key === "massTarget") {
    if (t === "" || !Number.isFinite(Number(t))) throw bad("a number");
    return Number(t);
  }
  if (key === "exactLayers") {
    if (!/^(none|\d+(,\d+)*)$/.test(t)) throw bad(`a comma-separated list of layers or "none"`);
    return t === "none" ? [] : t.split(",").map(Number);
  }
  if (key === "selectorOptions") {
    let v: unknown;
    try {
      v = JSON.parse(text);
    } catch {
      throw bad("JSON");
    }
    if (typeof v !== "object" || v === null || Array.isArray(v)) throw bad("a JSON object");
    return v;
  }
  return text;
}

/** A selector as text (a name, a module, POST+PRE): the string form of the selector option. */
export const SelectorTextSchema = z.string().min(1, "must not be empty");

/**
 * A flag's text as `[option key, value]`, checked by that option's schema: the one-line error a bad
 * value gives is the same from every entry point ("invalid value for --k: must be at least 1").
 */
export function parseHybridFlag(flag: HybridOptionFlag, text: string): [FlagKey, unknown] {
  const key = HYBRID_OPTION_FLAGS[flag];
  const value = flagValue(flag, key, text);
  const r = (key === "scheduler" ? SchedulerNameSchema : key === "selector" ? SelectorTextSchema : HybridRuntimeOptionsSchema.shape[key]).safeParse(value);
  if (!r.success) throw new HybridgenError(`invalid value for --${flag}: ${r.error.issues[0]!.message}`, "EUSAGE");
  return [key, r.data];
}
