/**
 * createHybridAttention: options in, a ready HybridAttention out — the selector, the scheduler,
 * the native CPU stage of @hybridgen/kernels-cpu, and on a device backend the KV store moved to
 * host memory (a CPU backend of its own holds it, pinned through the device's host link). The
 * CLI, the benches, the tests and library users all assemble hybrid attention through it.
 */
import { HybridgenError, type Attention, type Backend, type CpuStage, type KvCache, type KvStoreAllocator, type QueryProjector, type Scheduler } from "@hybridgen/core";
import { calibrationSummary, HYBRID_DEFAULTS, HybridAttention, PrefillCalibrator, type CalibrationResult, type CalibrationSums } from "./hybrid/index.js";
import { loadSelectorSpec } from "@hybridgen/selectors";
import { isAllocator, type HybridRuntimeOptions } from "./options.js";
import { resolveHybrid, type HybridPlan } from "./resolve.js";
import { ReadAheadStage } from "./read-ahead-stage.js";

/** A loaded decoder model as hybrid attention needs it (LlamaModel and the other families). */
export type HybridModel = { readonly attention: Attention; readonly cache: KvCache; readonly maxContext: number } & QueryProjector;

/**
 * Attaches hybrid attention to `model`'s decode steps on `backend` (the backend the model was
 * loaded on: the CPU backend, or a device backend with hostTransfers). The model must have been
 * loaded with a KV window smaller than its context (`gpuKvBudget`, `sinkTokens`). Dispose the result
 * (or close() it) to detach it and free the stage.
 */
export async function createHybridAttention(model: HybridModel, backend: Backend, options: HybridRuntimeOptions = {}): Promise<HybridAttention> {
  const build = await hybridBuilder(backend, options, { first: model });
  return build(model);
}

/**
 * The asynchronous half of createHybridAttention (the native library, a selector plugin, every
 * option checked), then a synchronous build per model or sequence: a selector, a scheduler and a
 * CPU stage of its own each time, and a storeAllocator function's store for `sequence` (default 0).
 * `first`: checked for a window before a plugin loads; `sequences`: sequences decoded at once (more
 * than one: every sequence's stage is a lane of one native stage of the plan's threads, NativeStageGroup).
 */
export async function hybridBuilder(
  backend: Backend, options: HybridRuntimeOptions = {}, { first, sequences = 1 }: { first?: HybridModel; sequences?: number } = {},
): Promise<(model: HybridModel, sequence?: number) => HybridAttention> {
  const { NativeCpuStage, NativeStageGroup, CpuBackend, createCpuBackend, createNativeCalibrationSums } = await import("@hybridgen/kernels-cpu");
  const onCpu = backend instanceof CpuBackend;
  if (!onCpu && !backend.hostTransfers) {
    throw new HybridgenError(`hybrid attention needs the CPU backend or a device backend with host transfers (got ${backend.name})`);
  }
  const windowed = (model: HybridModel) => {
    if (model.cache.storeCapacity === 0) {
      throw new HybridgenError(`the KV window holds the whole context (${model.maxContext}): nothing would be offloaded; load the model with a smaller gpuKvBudget`);
    }
  };
  if (first) windowed(first);
  // A plugin named by module is imported and registered first; then every option is checked before anything is allocated.
  const named = typeof options.selector === "string" ? { ...options, selector: await loadSelectorSpec(options.selector) } : options;
  resolveHybrid(named, { device: !onCpu });
  const storeFor = storeAllocatorOf(options.storeAllocator);
  // Sequences decoded at once share one native stage, a lane each: a layer's jobs of every row run as one op over its pool.
  let group: InstanceType<typeof NativeStageGroup> | null = null;
  return (model, sequence = 0) => {
    windowed(model);
    const resolved = resolveHybrid(named, { device: !onCpu });
    const { selector, scheduler, hybridOptions, plan } = resolved;
    const attached = model.cache.hostBackend;
    const allocator = storeFor(sequence);
    const place = (): InstanceType<typeof CpuBackend> => {
      if (onCpu) {
        if (allocator) model.cache.placeStore(allocator);
        return backend;
      }
      if (attached) {
        if (allocator) throw new HybridgenError("the KV cache's host store is already attached: a storeAllocator can only place a new one");
        // The store is already in host memory (an earlier hybrid attention, or a prefill that needed it): reuse it.
        if (!(attached instanceof CpuBackend)) throw new HybridgenError(`the KV cache's host store is on ${attached.name}, not the CPU backend the native stage reads`);
        return attached;
      }
      const host = createCpuBackend({ threads: 1 }); // holds the host store; the stage has threads of its own
      try {
        model.cache.attachHostStore(host, backend.hostTransfers!(), true, allocator);
      } catch (e) {
        host.close();
        throw e;
      }
      return host;
    };
    let host: InstanceType<typeof CpuBackend>;
    try {
      host = place();
    } catch (e) {
      allocator?.release(); // the cache never took it (its own failures released it already; release is idempotent)
      throw e;
    }
    const pool = { threads: plan.cpuStageThreads, idleSpinUs: plan.idleSpinUs, ...(plan.readDepth === undefined ? {} : { readDepth: plan.readDepth }) };
    const scoring = { scoring: plan.scoring, rescoreFactor: plan.rescoreFactor };
    if (sequences > 1) group ??= new NativeStageGroup(host, pool);
    const native = group ? new NativeCpuStage(host, scoring, group) : new NativeCpuStage(host, { ...pool, ...scoring });
    // A placed store hears which rows each layer gathered: the disk tier reads the next layer's ahead.
    const built = allocator?.readAhead ? new ReadAheadStage(native, allocator.readAhead.bind(allocator)) : native;
    let stage: CpuStage = built;
    if (options.cpuStage) {
      try {
        stage = options.cpuStage(built, host);
      } catch (e) {
        built.close();
        throw e;
      }
    }
    try {
      const ha = HybridAttention.attach({ attention: model.attention, projector: model, stage, selector, scheduler, ...(group ? { stageGroup: group } : {}) }, hybridOptions);
      const t = ha.transportChoice;
      plans.set(ha, { ...plan, transport: t.fetchAhead ? `${t.name}+fetch` : t.name });
      const start = options.calibration?.layerK;
      if (plan.calibrates?.k && start) ha.recalibrate(null, start); // a calibration given: its per-layer shares of K
      // The samples' sums run native on every core: at the block's end the model waits for them.
      if (plan.calibrates) calibrateFromPrefill(ha, model, plans.get(ha)!, scheduler, resolved.retune, createNativeCalibrationSums());
      return ha;
    } catch (e) {
      stage.close();
      throw e;
    }
  };
}

/**
 * The allocator for each sequence: the one given, or the function's result, checked once per
 * sequence; one the function gave an earlier sequence is refused (two caches would share regions).
 */
function storeAllocatorOf(given: HybridRuntimeOptions["storeAllocator"]): (sequence: number) => KvStoreAllocator | undefined {
  if (typeof given !== "function") return () => given;
  const handed = new WeakMap<KvStoreAllocator, number>();
  return (sequence) => {
    let a: unknown;
    try {
      a = given(sequence);
    } catch (e) {
      throw new HybridgenError(`storeAllocator(${sequence}) failed: ${e instanceof Error ? e.message : String(e)}`);
    }
    if (!isAllocator(a)) throw new HybridgenError(`storeAllocator(${sequence}) must return a KvStoreAllocator (alloc, pinnable, release)`);
    const earlier = handed.get(a);
    if (earlier !== undefined) throw new HybridgenError(`storeAllocator(${sequence}) returned sequence ${earlier}'s allocator: each sequence needs a store of its own`);
    handed.set(a, sequence);
    return a;
  };
}

const plans = new WeakMap<HybridAttention, HybridPlan>();

/**
 * Each prompt's last prefill block calibrates what the plan leaves open (K, exactLayers): the
 * decision moves the scheduler and the exact layers before the first decode step, and lands in
 * the plan (hybridPlan) and the stats line.
 */
function calibrateFromPrefill(
  ha: HybridAttention, model: HybridModel, plan: HybridPlan, scheduler: Scheduler, retune: ((k: number) => void) | undefined, sums: CalibrationSums,
): void {
  const c = plan.calibrates!;
  const verified = plan.logits === "verified";
  const calibrator = PrefillCalibrator.attach(model.attention, model, {
    sums, massTarget: c.massTarget, candidates: verified ? (plan.candidates ?? HYBRID_DEFAULTS.candidates) : 1,
    ...(c.exactLayers ? {} : { exact: plan.logits === "exact" ? "all" : plan.exactLayers }),
    onResult: (r: CalibrationResult) => {
      if (c.k) retune?.(r.k);
      ha.recalibrate(c.exactLayers ? r.exactLayers : null, c.k ? r.layerK : null);
      const k = c.k ? { k: scheduler.initial().k, ...(plan.kMin === undefined ? {} : { kMin: r.k }), kSource: "calibration" as const } : {};
      plans.set(ha, { ...plans.get(ha)!, ...k, exactLayers: ha.exactLayers, calibrated: r });
      ha.stats.calibration = calibrationSummary(r);
    },
  });
  ha.adopt(calibrator);
}

/** What createHybridAttention chose for `ha` (selector, scheduler, K, kMin, timing, logits, threads, transport), or undefined for one it did not build. */
export function hybridPlan(ha: HybridAttention): HybridPlan | undefined {
  return plans.get(ha);
}
