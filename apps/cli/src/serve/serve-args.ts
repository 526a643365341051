/**
 * `hybridgen serve` flags: the server's own (address, batch, queue, body limit, prefill chunk),
 * generate's model flags, and the hybrid-attention and KV-tier flags, which generate's own
 * splitters take out and check.
 */
import { parseArgs } from "node:util";
import { MAX_BATCH } from "@hybridgen/core";
import { backendChoices, BackendChoiceSchema } from "@hybridgen/runtime";
import { integer, usage } from "../commands/flag-values.js";
import { HYBRID_HELP, splitHybridArgs, type HybridCliOptions } from "../hybrid-options.js";
import { KV_TIER_HELP, parseSize, splitKvTierArgs, type KvTierCliOptions } from "../kv-tier-options.js";
import { parseArgsError } from "../parse-args-error.js";
import { parseGpuMem } from "../commands/workload-args.js";

export interface ServeOptions {
  readonly help: boolean;
  readonly host: string;
  readonly port: number;
  readonly model?: string;
  /** The name /v1/models lists and responses carry (any `model` a request sends is accepted). */
  readonly servedName?: string;
  readonly dtype?: "f32" | "f16" | "bf16";
  /** Storage dtype of the KV cache (core's kvDtype; default f32). */
  readonly kvDtype?: "f32" | "f16" | "bf16";
  /** Rows a prefill forward takes (core's prefillBlock; the window's ring keeps as many slots). */
  readonly prefillBlock?: number;
  readonly device: string;
  readonly threads?: number;
  readonly context?: number;
  readonly dummyWeights: boolean;
  /** --gpu-mem: device memory the backend may use, in bytes (the CUDA arena; the CPU backend's cap); requests are admitted within it. */
  readonly gpuMem?: number;
  readonly maxBatch: number;
  readonly maxQueue: number;
  readonly maxBodyBytes: number;
  readonly prefillChunk?: number;
  /** Every slot's sequence (and hybrid attention's store) made at load at the model's context and kept: no admission renews or pins. */
  readonly preallocate: boolean;
  /** Seconds running requests get to finish after SIGINT/SIGTERM before they are cancelled. */
  readonly shutdownGrace: number;
  readonly hybrid: HybridCliOptions;
  readonly tier: KvTierCliOptions;
}

export const SERVE_HELP = `Usage: hybridgen serve [options]

An OpenAI-compatible HTTP server with continuous batching: POST /v1/chat/completions and
/v1/completions (stream or not), GET /v1/models, /health, /metrics (Prometheus) and a chat
page at /. Requests join and leave the running batch between decode steps; with --attention
hybrid each has its own window and offloaded store, placed on the KV tiers left.

      --host H                 address to listen on (default 127.0.0.1)
      --port N                 port (default 8080; 0 picks a free one, printed on stderr)
  -m, --model DIR|preset:NAME  the model (default stories15M, fetched on first use)
      --served-model-name S    the model's name in /v1/models and in responses (default: the directory's name)
      --dtype f32|f16|bf16     weight dtype at load
      --kv-dtype f32|f16|bf16  KV cache dtype (default f32)
      --prefill-block N        rows a prefill forward takes (default 64; --prefill-chunk follows it)
      --device auto|cpu|cuda   where the model runs (default auto; or a backend module ./FILE.ts)
      --threads N              CPU threads (default $HYBRIDGEN_THREADS, else every core)
      --context N              KV positions per request: prompt + max_tokens (default the model's, at most 4096)
      --dummy-weights          random weights of the model's shape (benchmarks)
      --gpu-mem SIZE           device memory the backend may use (e.g. 40G; the CPU backend's cap on its
                               "device" memory): each request's KV is sized to its prompt + max_tokens and
                               admitted while it fits, the others wait (default: the whole device)
      --max-batch N            requests decoded together, 1…${MAX_BATCH - 1} (default 8)
      --max-queue N            requests waiting for a slot or for KV room before 429s (default 64)
      --max-body SIZE          largest request body (default 1M; larger: 413)
      --prefill-chunk N        prompt positions prefilled between two decode steps (default the model's prefill block)
      --shutdown-grace S       seconds running requests get to finish after SIGINT/SIGTERM (default 10)
      --preallocate            make every slot's sequence at load for the whole --context (with --attention
                               hybrid its store placed and pinned) and keep it: no request waits for one to be
                               made, and the memory and tiers they take are held while idle
${HYBRID_HELP}${KV_TIER_HELP}`;

export function parseServeArgs(argv: readonly string[]): ServeOptions {
  const { rest: afterTier, tier, given } = splitKvTierArgs(argv);
  const { rest, hybrid } = splitHybridArgs(afterTier);
  if (given && hybrid.attention !== "hybrid") throw usage("--kv-placement, --kv-disk and --host-kv-budget place hybrid attention's offloaded store: add --attention hybrid");
  let v: Record<string, string | boolean | undefined>;
  try {
    v = parseArgs({
      args: rest, strict: true, allowPositionals: false,
      options: {
        help: { type: "boolean", short: "h" }, host: { type: "string" }, port: { type: "string" }, model: { type: "string", short: "m" },
        "served-model-name": { type: "string" }, dtype: { type: "string" }, "kv-dtype": { type: "string" }, "prefill-block": { type: "string" }, device: { type: "string" }, threads: { type: "string" },
        context: { type: "string" }, "dummy-weights": { type: "boolean" }, "max-batch": { type: "string" }, "max-queue": { type: "string" },
        "max-body": { type: "string" }, "gpu-mem": { type: "string" }, "prefill-chunk": { type: "string" }, "shutdown-grace": { type: "string" },
        preallocate: { type: "boolean" },
      },
    }).values;
  } catch (e) {
    throw parseArgsError(e, "hybridgen serve");
  }
  const str = (k: string) => v[k] as string | undefined;
  const dtype = str("dtype");
  if (dtype !== undefined && !["f32", "f16", "bf16"].includes(dtype)) throw usage(`invalid value for --dtype: must be one of f32, f16, bf16`);
  const kvDtype = str("kv-dtype");
  if (kvDtype !== undefined && !["f32", "f16", "bf16"].includes(kvDtype)) throw usage(`invalid value for --kv-dtype: must be one of f32, f16, bf16`);
  const device = str("device") ?? "auto";
  if (!BackendChoiceSchema.safeParse(device).success) throw usage(`invalid value for --device: must be ${backendChoices()} (got ${JSON.stringify(device)})`);
  const host = str("host") ?? "127.0.0.1";
  if (host.trim() === "") throw usage("invalid value for --host: must not be empty");
  const model = str("model");
  if (model !== undefined && model.trim() === "") throw usage("invalid value for --model: must not be empty");
  const name = str("served-model-name");
  if (name !== undefined && name.trim() === "") throw usage("invalid value for --served-model-name: must not be empty");
  const maxBatch = integer("max-batch", str("max-batch"), 1, MAX_BATCH - 1) ?? 8;
  return {
    help: v.help === true, host, port: integer("port", str("port"), 0, 65535) ?? 8080, model, servedName: name,
    dtype: dtype as ServeOptions["dtype"], kvDtype: kvDtype as ServeOptions["kvDtype"], prefillBlock: integer("prefill-block", str("prefill-block"), 1), device: device as ServeOptions["device"], threads: integer("threads", str("threads"), 1, 256),
    context: integer("context", str("context"), 1), dummyWeights: v["dummy-weights"] === true, maxBatch,
    ...(str("gpu-mem") === undefined ? {} : { gpuMem: parseGpuMem(str("gpu-mem")!) }),
    maxQueue: integer("max-queue", str("max-queue"), 0) ?? 64,
    maxBodyBytes: str("max-body") === undefined ? 2 ** 20 : Math.max(1, parseSize(str("max-body")!, "--max-body")),
    prefillChunk: integer("prefill-chunk", str("prefill-chunk"), 1), shutdownGrace: integer("shutdown-grace", str("shutdown-grace"), 0) ?? 10,
    preallocate: v.preallocate === true, hybrid, tier,
  };
}
