/**
 * The attention configurations `hybridgen bench` and `hybridgen eval` compare on one engine and
 * one model (the paper's §5 baselines and HybridGen's ablation), by name:
 *
 *   full            every KV row on the device, exact attention (the reference where the KV fits)
 *   flexgen         AoG: the offloaded KV streamed to the device every step, layer by layer
 *   moe-lightning   AoC: attention over the offloaded KV on the CPU, merged by log-sum-exp
 *   h2o, keyformer  post-QKᵀ accumulated-score selectors (fixed K, exact logits)
 *   streamingllm    pre-QKᵀ sinks + newest tokens (fixed K)
 *   infinigen       pre-QKᵀ partial-channel prediction, waiting for each layer's true query
 *                   (exact logits: the selection and the fetch on the critical path, no overlap)
 *   hybridgen-post  fixed K post-QKᵀ top-K, verified logits (Fig. 21 "fixed post")
 *   hybridgen-pre   fixed K pre-QKᵀ (Quest page bounds chosen ahead), verified logits
 *   hybridgen-adaptive  the feedback scheduler's K, post-QKᵀ only
 *   hybridgen       the full feedback scheduler (K and the timing) with the runtime's default pair, verified
 *   hybridgen-index fixed K chosen by the page index (ranked on the device where it has room, else by the
 *                   stage), verified: no offloaded K is read to choose, so a step's bytes do not grow with the context
 *   all-tokens      hybrid attention over every offloaded token, exact logits (the oracle)
 *
 * or `hybrid:KEY=VALUE,…` with any createHybridAttention option (selector, scheduler, timing,
 * logits, k, kMin, candidates, keep), e.g. `hybrid:selector=quest,timing=pre,logits=exact`.
 * Every name but `full` runs with the device window (`gpuKvBudget`) and the rest offloaded.
 */
import { AoCAttention, AoGAttention, HybridgenError, type Backend } from "@hybridgen/core";
import { hybridBuilder, hybridPlan, type HybridModel } from "./create-hybrid-attention.js";
import type { HybridRuntimeOptions } from "./options.js";

export type AttentionKind = "full" | "aog" | "aoc" | "hybrid";

export interface AttentionConfig {
  /** The name as given (a built-in's, or the hybrid:… spec). */
  readonly name: string;
  readonly kind: AttentionKind;
  /** "baseline" or "hybridgen": which side of the speed-up tables it is on. */
  readonly family: "baseline" | "hybridgen";
  /** For kind "hybrid": the createHybridAttention options. */
  readonly hybrid?: HybridRuntimeOptions;
}

type Builder = (k: number) => Omit<AttentionConfig, "name">;
const hybrid = (family: AttentionConfig["family"], o: (k: number) => HybridRuntimeOptions): Builder => (k) => ({ kind: "hybrid", family, hybrid: o(k) });

const BUILTIN: Readonly<Record<string, Builder>> = {
  full: () => ({ kind: "full", family: "baseline" }),
  flexgen: () => ({ kind: "aog", family: "baseline" }),
  "moe-lightning": () => ({ kind: "aoc", family: "baseline" }),
  h2o: hybrid("baseline", (k) => ({ selector: "h2o", scheduler: "fixed", k, timing: "post", logits: "exact" })),
  keyformer: hybrid("baseline", (k) => ({ selector: "keyformer", scheduler: "fixed", k, timing: "post", logits: "exact" })),
  streamingllm: hybrid("baseline", (k) => ({ selector: "streaming", scheduler: "fixed", k, timing: "pre", logits: "exact" })),
  infinigen: hybrid("baseline", (k) => ({ selector: "infinigen", scheduler: "fixed", k, timing: "pre", logits: "exact" })),
  "hybridgen-post": hybrid("hybridgen", (k) => ({ selector: "topk", scheduler: "fixed", k, timing: "post", logits: "verified" })),
  "hybridgen-pre": hybrid("hybridgen", (k) => ({ selector: "quest", scheduler: "fixed", k, timing: "pre", logits: "verified" })),
  "hybridgen-adaptive": hybrid("hybridgen", (k) => ({ selector: "topk", scheduler: "feedback", kMin: k, logits: "verified" })),
  hybridgen: hybrid("hybridgen", (k) => ({ scheduler: "feedback", kMin: k, logits: "verified" })),
  "hybridgen-index": hybrid("hybridgen", (k) => ({ selector: "index", scheduler: "fixed", k, timing: "pre", logits: "verified" })),
  "all-tokens": hybrid("baseline", () => ({ selector: "all", scheduler: "fixed", timing: "post", logits: "exact" })),
};

/** The built-in configuration names, in the order tables list them. */
export const ATTENTION_CONFIG_NAMES: readonly string[] = Object.freeze(Object.keys(BUILTIN));

const NUMERIC = new Set(["k", "kMin", "candidates", "keep", "cpuStageThreads"]);
const TEXT = new Set(["selector", "scheduler", "timing", "logits"]);

/** A configuration by name or `hybrid:KEY=VALUE,…`; `k` is the K of the fixed ones and the floor of the adaptive ones. */
export function attentionConfig(spec: string, k: number): AttentionConfig {
  const builder = BUILTIN[spec];
  if (builder) return { name: spec, ...builder(k) };
  if (!spec.startsWith("hybrid:")) {
    throw new HybridgenError(`unknown attention configuration "${spec}" (built-ins: ${ATTENTION_CONFIG_NAMES.join(", ")}; or hybrid:KEY=VALUE,…)`);
  }
  const options: Record<string, string | number> = {};
  for (const part of spec.slice("hybrid:".length).split(",").filter((p) => p !== "")) {
    const eq = part.indexOf("=");
    const key = eq < 0 ? part : part.slice(0, eq), value = eq < 0 ? "" : part.slice(eq + 1);
    if (!NUMERIC.has(key) && !TEXT.has(key)) {
      throw new HybridgenError(`attention configuration "${spec}": unknown key "${key}" (keys: ${[...TEXT, ...NUMERIC].join(", ")})`);
    }
    if (value === "") throw new HybridgenError(`attention configuration "${spec}": ${key} needs a value (${key}=…)`);
    if (NUMERIC.has(key)) {
      const n = Number(value);
      if (!Number.isInteger(n) || n < 1) throw new HybridgenError(`attention configuration "${spec}": ${key} must be a positive integer, got "${value}"`);
      options[key] = n;
    } else {
      options[key] = value;
    }
  }
  const named = options.scheduler;
  // Like the CLI: a K alone means the fixed scheduler at that K; with the feedback one it is the floor.
  if (options.k === undefined && options.kMin === undefined) {
    if (named === "feedback") options.kMin = k;
    else options.k = k;
  }
  return { name: spec, kind: "hybrid", family: "hybridgen", hybrid: options as HybridRuntimeOptions };
}

/** A configuration attached to a model: detach with close(). */
export interface AttachedAttention extends Disposable {
  readonly config: AttentionConfig;
  /** One line for logs (the hybrid plan and stats, or the baseline's counters). */
  summary(): string;
  /** Per step of hybrid configurations: the scheduler's K and timing and the stage times it saw (ms); else empty. */
  trace(): readonly { readonly k: number; readonly timing: string; readonly tGpuMs: number; readonly tCpuMs: number; readonly tTxMs: number }[];
  close(): void;
}

/**
 * The host store of a device backend, attached before the first token so that every
 * offloading configuration finds the offloaded KV in host memory (no-op on a host backend or
 * with one attached). `threads`: the host backend's (AoC computes on it).
 */
export async function prepareHostStore(model: HybridModel, backend: Backend, threads: number): Promise<void> {
  const { CpuBackend, createCpuBackend } = await import("@hybridgen/kernels-cpu");
  if (backend instanceof CpuBackend || model.cache.hostBackend || model.cache.storeCapacity === 0) return;
  if (!backend.hostTransfers) throw new HybridgenError(`offloading needs the CPU backend or a device backend with host transfers (got ${backend.name})`);
  const host = createCpuBackend({ threads });
  try {
    model.cache.attachHostStore(host, backend.hostTransfers(), true);
  } catch (e) {
    host.close();
    throw e;
  }
}

/**
 * Routes `model`'s decode steps through `config` ("full" attaches nothing: the model's own
 * attention). `model` may be one sequence of a batch (sequenceModel); a batch's sequences go
 * through attachAttentionConfigs, which gives their CPU stages one native stage.
 */
export async function attachAttentionConfig(model: HybridModel, backend: Backend, config: AttentionConfig, extra: HybridRuntimeOptions = {}): Promise<AttachedAttention> {
  return (await attachAttentionConfigs([model], backend, config, extra))[0]!;
}

/** attachAttentionConfig for every sequence of a batch decoded at once: a hybrid configuration's stages share one native stage (hybridBuilder's sequences). */
export async function attachAttentionConfigs(
  models: readonly HybridModel[], backend: Backend, config: AttentionConfig, extra: HybridRuntimeOptions = {},
): Promise<AttachedAttention[]> {
  const attached = (summary: () => string, close: () => void, trace: AttachedAttention["trace"] = () => []): AttachedAttention =>
    ({ config, summary, trace, close, [Symbol.dispose]: close });
  if (config.kind === "full") return models.map(() => attached(() => "full attention", () => {}));
  for (const model of models) {
    if (model.cache.storeCapacity === 0) {
      throw new HybridgenError(`configuration "${config.name}" offloads, but the KV window holds the whole context (${model.maxContext}); load the model with a smaller gpuKvBudget`);
    }
  }
  const out: AttachedAttention[] = [];
  try {
    if (config.kind === "aog" || config.kind === "aoc") {
      for (const model of models) {
        if (!model.cache.hostBackend) await prepareHostStore(model, backend, 1);
        const a = config.kind === "aog" ? AoGAttention.attach(model.attention) : AoCAttention.attach(model.attention);
        out.push(attached(() => a.stats.summary(config.name), () => a.close()));
      }
      return out;
    }
    const build = await hybridBuilder(backend, { ...config.hybrid, ...extra }, { first: models[0], sequences: models.length });
    for (const model of models) {
      const ha = build(model);
      out.push(attached(
        () => {
          const p = hybridPlan(ha);
          const g = ha.stageGroup?.groupCounts();
          return `${config.name}: ${p ? `${p.selector}, ${p.scheduler} K ${p.k}, ${p.timing}, ${p.logits}; ` : ""}${ha.stats.summary()}` +
            (g ? `; the batch's stage: ${g.atOnce} groups of jobs run at once, ${g.inTurn} one after another` : "");
        },
        () => ha.close(),
        () => ha.stats.trace.map((t) => ({ k: t.k, timing: t.timing, tGpuMs: t.tGpuMs, tCpuMs: t.tCpuMs, tTxMs: t.tTxMs })),
      ));
    }
    return out;
  } catch (e) {
    for (const a of out) a.close();
    throw e;
  }
}
