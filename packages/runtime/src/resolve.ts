/**
 * From options to decisions, with no native code: which selector, which scheduler with which
 * K / kMin / timing, which logits mode and exact layers, how many stage threads. Every default
 * is taken here, and every contradiction is a one-line HybridgenError.
 */
import { DEFAULT_K, DEFAULT_TIMING, HybridgenError, type Scheduler, type SelectionTiming, type TokenSelector } from "@hybridgen/core";
import { DEFAULT_MASS_TARGET, type CalibrationResult, HYBRID_DEFAULTS, keepProblem, type HybridOptions, type RowPathRequest, type TransportName } from "./hybrid/index.js";
import { lookupScheduler } from "@hybridgen/scheduler";
import { selectorFromSpec } from "@hybridgen/selectors";
import { defaultStageThreads } from "./stage-threads.js";
import { CalibratedScheduler } from "./calibrated-scheduler.js";
import { HybridRuntimeOptionsSchema, type HybridRuntimeOptions, type ParsedHybridRuntimeOptions, type ProfileDefaults } from "./options.js";

/** What createHybridAttention builds, as plain data (for stats, --json, logs). */
export interface HybridPlan {
  readonly selector: string;
  /** The timings the selector can run. */
  readonly selectorTimings: readonly SelectionTiming[];
  /** "fixed", "feedback", or a given Scheduler's name. */
  readonly scheduler: string;
  /** Fixed: K every step; feedback: the first step's K. */
  readonly k: number;
  /** Feedback only. */
  readonly kMin?: number;
  /** Fixed: every step's timing; feedback: the first step's. */
  readonly timing: SelectionTiming;
  /** Where kMin (or the fixed K) came from: a calibration is this prompt's prefill's, or `calibration`'s given. */
  readonly kSource: "option" | "profile" | "calibration" | "default";
  /** What each prompt's prefill calibrates (absent: nothing, an option or the profile gave it all). */
  readonly calibrates?: { readonly k: boolean; readonly exactLayers: boolean; readonly massTarget: number };
  /** The last calibration applied. */
  readonly calibrated?: CalibrationResult;
  readonly logits: NonNullable<HybridOptions["logits"]>;
  readonly exactLayers: readonly number[];
  readonly candidates?: number;
  /** Verified logits: keep·K of the candidates kept once scored (HybridOptions.keep; absent: all). */
  readonly keep?: number;
  /** Where a device backend gets the selected rows (HybridOptions.rowPath). */
  readonly rowPath: RowPathRequest;
  readonly cpuStageThreads: number;
  readonly idleSpinUs: number;
  /** Disk-tier reads in flight per stage thread; absent: the stage's default (kernels-cpu DEFAULT_READ_DEPTH, kept out of this native-free module). */
  readonly readDepth?: number;
  readonly scoring: "full" | "int8" | "int4";
  readonly rescoreFactor: number;
  /** How the stage's rows reach the device (chooseTransport), once the hybrid attention is built; "handed-off+fetch": rows fetched ahead. */
  readonly transport?: TransportName | `${TransportName}+fetch`;
}

export interface ResolvedHybrid {
  readonly plan: HybridPlan;
  readonly selector: TokenSelector;
  readonly scheduler: Scheduler;
  readonly hybridOptions: HybridOptions;
  /** Set when K is calibrated: moves the scheduler's K (the fixed K, or the feedback floor) for the next sequence's steps. */
  readonly retune?: (k: number) => void;
}

/** Where the hybrid runtime runs: a device backend (the store in host memory, the stage hidden behind the GPU) or the CPU backend. */
export interface RuntimeTarget {
  readonly device: boolean;
  /** The machine's cores (default: availableParallelism()). */
  readonly cores?: number;
}

/** Validates the options once, then takes every decision (see HybridPlan). */
export function resolveHybrid(options: HybridRuntimeOptions, target: RuntimeTarget): ResolvedHybrid {
  const o = parseRuntimeOptions(options);
  const given = typeof o.scheduler === "object" ? o.scheduler : undefined;
  const named = typeof o.scheduler === "string" ? o.scheduler : undefined;
  // kMin asks for feedback; a K or a timing alone is a fixed choice; else the device decides.
  const implied = o.kMin !== undefined ? "feedback" : o.k !== undefined || o.timing !== undefined ? "fixed" : undefined;
  const kind = given ? undefined : (named ?? implied ?? (target.device ? "feedback" : "fixed"));
  const entry = kind === undefined ? undefined : lookupScheduler(kind);
  if (o.kMin !== undefined && !entry?.takesKMin) {
    throw new HybridgenError(given ? "kMin configures the built-in feedback scheduler; a Scheduler object brings its own" : `kMin applies to a scheduler with a floor such as feedback, not ${kind}`);
  }
  if (given && (o.k !== undefined || o.timing !== undefined)) {
    throw new HybridgenError("k and timing configure a built-in scheduler; a Scheduler object brings its own");
  }

  // A scheduler with a floor may switch timings: its default selector runs both.
  const selector = resolveSelector(o.selector, entry ? !entry.takesKMin : false, o.timing, o.selectorOptions);
  const can = selector.timings;
  if (o.timing !== undefined && !can.includes(o.timing)) {
    throw new HybridgenError(`selector "${selector.name}" cannot run ${o.timing}-QKᵀ selection (it supports ${can.join(", ")})`);
  }
  const timing: SelectionTiming = o.timing ?? (can.includes(DEFAULT_TIMING) ? DEFAULT_TIMING : can[0]!);

  const profileK = o.profile ? profileKMin(o.profile, selector.name) : undefined;
  const logits = o.logits ?? HYBRID_DEFAULTS.logits;
  // The prefill calibrates what no option and no profile gives; a calibration given stands in until it does.
  const calibrating = o.calibrate !== false && !o.profile;
  // The feedback scheduler's floor, or the fixed scheduler's K: the option, the profile's K_min, a calibration, or the default.
  const own = entry?.takesKMin ? o.kMin : o.k;
  const calibrateK = calibrating && !given && own === undefined;
  const calibrateExact = calibrating && o.exactLayers === undefined && logits !== "exact";
  const start = o.calibration ?? undefined;
  const kSource = given || own !== undefined ? "option" : profileK !== undefined ? "profile" : calibrateK && start ? "calibration" : "default";
  const floor = own ?? profileK ?? (calibrateK && start ? start.k : DEFAULT_K);
  if (entry?.takesKMin && !calibrateK && o.k !== undefined && o.k < floor) {
    throw new HybridgenError(`k ${o.k} (the ${entry.name} scheduler's first K) is below kMin ${floor}`);
  }
  // A calibrated floor above a given first K lifts the first K with it.
  const make = (f: number): Scheduler => entry!.build({ k: entry!.takesKMin ? Math.max(f, o.k ?? f) : f, kMin: f, timing, timings: can });

  let scheduler: Scheduler;
  let k: number;
  let kMin: number | undefined;
  let retune: ((k: number) => void) | undefined;
  if (given) {
    scheduler = given;
    ({ k } = given.initial());
  } else {
    const calibrated = calibrateK ? new CalibratedScheduler(make, floor) : null;
    scheduler = calibrated ?? make(floor);
    if (calibrated) retune = (next) => calibrated.retune(next);
    ({ k } = scheduler.initial());
    if (entry!.takesKMin) kMin = floor;
  }

  const exactLayers = o.exactLayers ?? o.profile?.exactLayers ?? (calibrateExact && start ? start.exactLayers : []);
  const candidates = o.candidates ?? o.profile?.candidates;
  const keepBad = keepProblem(o.keep, logits, candidates ?? HYBRID_DEFAULTS.candidates);
  if (keepBad) throw new HybridgenError(keepBad);
  const rowPath = o.rowPath ?? HYBRID_DEFAULTS.rowPath;
  const hybridOptions: HybridOptions = {
    logits, exactLayers, rowPath, ...(candidates === undefined ? {} : { candidates }), ...(o.trackScores ? { trackScores: true } : {}), ...(o.keep === undefined ? {} : { keep: o.keep }),
  };
  // A batch's sequences share one native stage of these threads (hybridBuilder's NativeStageGroup).
  const cpuStageThreads = o.cpuStageThreads ?? defaultStageThreads(target.device, target.cores);
  return {
    plan: {
      selector: selector.name, selectorTimings: [...can], scheduler: scheduler.name, k, ...(kMin === undefined ? {} : { kMin }), timing, kSource,
      logits, exactLayers, ...(candidates === undefined ? {} : { candidates }), ...(o.keep === undefined ? {} : { keep: o.keep }), rowPath, cpuStageThreads, idleSpinUs: o.idleSpinUs ?? 0,
      ...(calibrateK || calibrateExact
        ? { calibrates: { k: calibrateK, exactLayers: calibrateExact, massTarget: o.massTarget ?? DEFAULT_MASS_TARGET } }
        : {}),
      ...(o.readDepth === undefined ? {} : { readDepth: o.readDepth }),
      scoring: o.scoring ?? "full", rescoreFactor: o.rescoreFactor ?? 4,
    },
    selector,
    scheduler,
    hybridOptions,
    ...(retune ? { retune } : {}),
  };
}

function parseRuntimeOptions(options: HybridRuntimeOptions): ParsedHybridRuntimeOptions {
  const r = HybridRuntimeOptionsSchema.safeParse(options ?? {});
  if (r.success) return r.data;
  const i = r.error.issues[0];
  throw new HybridgenError(`hybrid runtime option ${i?.path.join(".") || "value"}: ${i?.message ?? "invalid"}`);
}

/** A registered name, "POST+PRE", or a given selector; the default depends on the scheduler (see the options). */
function resolveSelector(s: string | TokenSelector | undefined, fixedTiming: boolean, timing: SelectionTiming | undefined, options?: Record<string, unknown>): TokenSelector {
  if (typeof s === "object") {
    if (options !== undefined) throw new HybridgenError("selectorOptions apply to a selector given by name; a TokenSelector has its options already");
    return s;
  }
  return selectorFromSpec(s ?? (fixedTiming ? (timing === "pre" ? "streaming" : "topk") : "topk+quest"), options);
}

/** The profile's K_min for this selector: its own entry, a pair's post half's, else the profile's. */
export function profileKMin(profile: ProfileDefaults, selectorName: string): number {
  const own = profile.perSelector?.[selectorName]?.kMin ?? profile.perSelector?.[selectorName.split("+")[0]!]?.kMin;
  return own ?? profile.kMin;
}
