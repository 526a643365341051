/** `hybridgen bench` flags: parsed strictly, every bad value a one-line usage error. */
import { parseArgs } from "node:util";
import { ATTENTION_CONFIG_NAMES, attentionConfig, backendChoices, BackendChoiceSchema } from "@hybridgen/runtime";
import { parseArgsError } from "../parse-args-error.js";
import { configList, hybridInteger, integer, integers, list, usage } from "./flag-values.js";
import { DEFAULT_K } from "@hybridgen/core";
import { parseGatherGBs, parseGpuMem, parseRowLayerMs, parseWorkload, type Workload } from "./workload-args.js";

export const DEFAULT_BENCH_CONFIGS = ATTENTION_CONFIG_NAMES.filter((n) => n !== "all-tokens" && n !== "hybridgen-index");
/** --workload's default: full attention, the default hybrid, the page index's (bytes a step flat in the context) and the offloading baselines the issue compares. */
export const DEFAULT_WORKLOAD_CONFIGS = ["full", "hybridgen", "hybridgen-index", "flexgen", "infinigen", "streamingllm"];

export interface BenchOptions {
  readonly help: boolean;
  /** Model directories or preset:NAME (default: stories15M). */
  readonly models: readonly string[];
  readonly dummyWeights: boolean;
  readonly configs: readonly string[];
  readonly contexts: readonly number[];
  readonly batches: readonly number[];
  readonly steps: number;
  readonly warmup: number;
  readonly gpuKvBudget: number;
  readonly sinkTokens: number;
  readonly k: number;
  readonly device: string;
  readonly threads?: number;
  readonly cpuStageThreads?: number;
  readonly kvDtype: "f32" | "f16" | "bf16";
  readonly dtype?: "f32" | "f16" | "bf16";
  readonly seed: number;
  readonly out?: string;
  readonly json: boolean;
  /** --workload NxC: the workload bench (bench-workload.ts) instead of the per-figure tables. */
  readonly workload?: Workload;
  /** --gpu-mem: device memory the backend may use, in bytes (the CUDA arena; the CPU backend's cap). */
  readonly gpuMem?: number;
  /** --synthetic-kv (with --workload): the contexts' KV as seeded random rows, no prefill. */
  readonly syntheticKv: boolean;
  /** --issue-ms / --stage-ms (with --workload): the host's per-row costs of a batched step, ms a row a layer, for the planner's window and prediction. */
  readonly issueMs?: number;
  readonly stageMs?: number;
  /** --gather-gbs (with --workload): the device's rate gathering rows from pinned host memory (GB/s), for the planner's device part. */
  readonly gatherGBs?: number;
  /** --full-batch (with --workload): full attention's batch, taken as given instead of searched for. */
  readonly fullBatch?: number;
}

export const BENCH_HELP = `Usage: hybridgen bench [options]

Decode speed of attention configurations on one engine: for every model, context and batch
size, the context is prefilled with random tokens (synthetic fill: its speed, not its text,
is what is measured), then --steps greedy tokens are decoded under each configuration from
the same prefilled KV cache. Prints one table per figure of the HybridGen paper (Fig. 15:
latency per model; Fig. 16: per context; Fig. 17: per batch size; Fig. 21: the scheduler
ablation) with ms/token, tokens/s, the ratio to full attention with every KV row on the device
and HybridGen's speed-up over each baseline; with --out, writes those figures as SVG charts
and bench.json with every number. Progress goes to stderr.

  -m, --model A,B,...          model directories or preset:NAME (default stories15M)
      --dummy-weights          random weights (needed by presets)
      --configs A,B,...        attention configurations (default: ${DEFAULT_BENCH_CONFIGS.join(", ")};
                               with --workload: ${DEFAULT_WORKLOAD_CONFIGS.join(", ")});
                               built-ins: ${ATTENTION_CONFIG_NAMES.join(", ")},
                               or hybrid:KEY=VALUE,… (selector, scheduler, timing, logits, k, kMin, candidates, keep)
      --contexts N,...         context lengths in tokens (default 2048,8192)
      --batch N,...            batch sizes (default 1); at batch > 1 each sequence has its own window,
                               offloaded store and configuration (stage, scheduler)
      --steps N                decode steps measured per point (default 32)
      --warmup N               steps left out of the median (default 4)
      --gpu-kv-budget N        device window per sequence, sinks included (default 1024)
      --sink-tokens S          attention sinks pinned in the window (default 4)
      --k K                    K of the fixed configurations, K_min of the adaptive ones (default ${DEFAULT_K})
      --device auto|cpu|cuda   backend (default auto; or a backend module ./FILE.ts)
      --threads N              CPU backend threads (default: all cores)
      --cpu-stage-threads N    hybrid CPU stage threads (default: the runtime's)
      --kv-dtype f32|f16|bf16  KV cache dtype (default bf16)
      --dtype f32|f16|bf16     weight dtype (default: stored; dummy weights bf16)
      --seed N                 seed of the synthetic fill (default 1)
      --out DIR                write bench.json and fig15/16/17/21 SVG charts there
                               (with --workload: workload.json and the workload figure)
      --workload NxC           N sequences of C context tokens each, decoded --steps tokens each under
                               --gpu-mem: full attention in waves of the largest batch that fits,
                               the offloading configurations all N at once (the window from the planner)
      --gpu-mem SIZE           device memory the backend may use (e.g. 80G; the CPU backend's
                               "device" memory on the CPU), so a larger card stands in for a smaller one
      --synthetic-kv           with --workload: no prefill; each context's KV is seeded random rows
                               (the window's, carried to the offloaded store by the cache's own evictions)
      --issue-ms MS            with --workload: the driving thread's issuing of one row's layer and
      --stage-ms MS            the CPU stage's cost of one row's layer (ms; a hybrid run's stats line
                               gives both): the planner predicts the step with them and shrinks the
                               window until the device's part is no longer than the host's
      --gather-gbs GB/s        with --workload: the rate at which the device gathers the selected rows
                               from pinned host memory (measured): the planner charges them inside the
                               device's part of the step at it, not at the link probe's bulk rate
      --full-batch N           with --workload: full attention runs batches of N (an earlier run's
                               search result) instead of searching for the largest that fits;
                               N sequences must fit under --gpu-mem
      --json                   print bench.json on stdout instead of the tables
  -h, --help                   this help
`;

const DTYPES = ["f32", "f16", "bf16"] as const;

function dtype(flag: string, raw: string | undefined): (typeof DTYPES)[number] | undefined {
  if (raw === undefined) return undefined;
  if (!(DTYPES as readonly string[]).includes(raw)) throw usage(`invalid value for --${flag}: ${JSON.stringify(raw)} must be f32, f16 or bf16`);
  return raw as (typeof DTYPES)[number];
}

export function parseBenchArgs(argv: readonly string[]): BenchOptions {
  let v: Record<string, string | boolean | undefined>;
  try {
    v = parseArgs({
      args: [...argv], strict: true, allowPositionals: false,
      options: {
        model: { type: "string", short: "m" }, "dummy-weights": { type: "boolean" }, configs: { type: "string" }, contexts: { type: "string" },
        batch: { type: "string" }, steps: { type: "string" }, warmup: { type: "string" }, "gpu-kv-budget": { type: "string" },
        "sink-tokens": { type: "string" }, k: { type: "string" }, device: { type: "string" }, threads: { type: "string" },
        "cpu-stage-threads": { type: "string" }, "kv-dtype": { type: "string" }, dtype: { type: "string" }, seed: { type: "string" },
        out: { type: "string" }, json: { type: "boolean" }, workload: { type: "string" }, "gpu-mem": { type: "string" }, "synthetic-kv": { type: "boolean" }, help: { type: "boolean", short: "h" },
        "issue-ms": { type: "string" }, "stage-ms": { type: "string" }, "full-batch": { type: "string" }, "gather-gbs": { type: "string" },
      },
    }).values;
  } catch (e) {
    throw parseArgsError(e, "hybridgen bench");
  }
  const str = (k: string) => v[k] as string | undefined;
  const k = hybridInteger("k", str("k")) ?? DEFAULT_K;
  const configs = str("configs") !== undefined ? configList("configs", str("configs")!) : str("workload") !== undefined ? [...DEFAULT_WORKLOAD_CONFIGS] : [...DEFAULT_BENCH_CONFIGS];
  for (const c of configs) attentionConfig(c, k); // names and specs checked before anything loads
  const gpuKvBudget = integer("gpu-kv-budget", str("gpu-kv-budget"), 1) ?? 1024;
  const sinkTokens = integer("sink-tokens", str("sink-tokens"), 0) ?? 4;
  if (sinkTokens >= gpuKvBudget) throw usage(`--sink-tokens ${sinkTokens} must be smaller than --gpu-kv-budget ${gpuKvBudget}`);
  const contexts = integers("contexts", str("contexts"), [2048, 8192], 2);
  const steps = integer("steps", str("steps"), 1) ?? 32;
  const warmup = integer("warmup", str("warmup"), 0) ?? 4;
  if (warmup >= steps) throw usage(`--warmup ${warmup} must be smaller than --steps ${steps}`);
  const device = str("device") ?? "auto";
  if (!BackendChoiceSchema.safeParse(device).success) throw usage(`invalid value for --device: must be ${backendChoices()} (got ${JSON.stringify(device)})`);
  if (str("model") === "") throw usage("--model needs a directory or preset:NAME");
  const workload = parseWorkload(str("workload"));
  if (workload) {
    for (const f of ["contexts", "batch", "gpu-kv-budget"]) if (str(f) !== undefined) throw usage(`--workload sets the sequences and their context; --${f} does not go with it`);
    if (str("model")?.includes(",")) throw usage("--workload measures one model at a time");
  } else if (v["synthetic-kv"] === true) {
    throw usage("--synthetic-kv goes with --workload (the figures' benches prefill their contexts)");
  } else {
    for (const f of ["issue-ms", "stage-ms"]) if (str(f) !== undefined) throw usage(`--${f} goes with --workload (the planner's batched step)`);
    if (str("full-batch") !== undefined) throw usage("--full-batch goes with --workload (full attention's waves)");
    if (str("gather-gbs") !== undefined) throw usage("--gather-gbs goes with --workload (the planner's batched step)");
  }
  const fullBatch = integer("full-batch", str("full-batch"), 1), gatherGBs = parseGatherGBs(str("gather-gbs"));
  const issueMs = parseRowLayerMs("issue-ms", str("issue-ms")), stageMs = parseRowLayerMs("stage-ms", str("stage-ms"));
  return {
    help: v.help === true,
    models: str("model") === undefined ? [] : list("model", str("model")!),
    dummyWeights: v["dummy-weights"] === true,
    configs,
    contexts,
    batches: integers("batch", str("batch"), [1], 1),
    steps,
    warmup,
    gpuKvBudget,
    sinkTokens,
    k,
    device,
    threads: integer("threads", str("threads"), 1, 256),
    cpuStageThreads: hybridInteger("cpu-stage-threads", str("cpu-stage-threads")),
    kvDtype: dtype("kv-dtype", str("kv-dtype")) ?? "bf16",
    dtype: dtype("dtype", str("dtype")),
    seed: integer("seed", str("seed"), 0) ?? 1,
    out: str("out"),
    json: v.json === true,
    ...(workload ? { workload } : {}),
    ...(str("gpu-mem") === undefined ? {} : { gpuMem: parseGpuMem(str("gpu-mem")) }),
    syntheticKv: v["synthetic-kv"] === true,
    ...(issueMs === undefined ? {} : { issueMs }),
    ...(stageMs === undefined ? {} : { stageMs }),
    ...(fullBatch === undefined ? {} : { fullBatch }),
    ...(gatherGBs === undefined ? {} : { gatherGBs }),
  };
}
