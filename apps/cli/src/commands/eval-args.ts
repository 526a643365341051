/** `hybridgen eval` flags: parsed strictly, every bad value a one-line usage error. */
import { parseArgs } from "node:util";
import { ATTENTION_CONFIG_NAMES, attentionConfig } from "@hybridgen/runtime";
import { parseArgsError } from "../parse-args-error.js";
import { configList, hybridInteger, integer, integers, list, usage } from "./flag-values.js";

export const DEFAULT_EVAL_CONFIGS = ATTENTION_CONFIG_NAMES.filter((n) => n !== "all-tokens");

export interface EvalOptions {
  readonly help: boolean;
  readonly model?: string;
  readonly text?: string;
  readonly tasks: readonly string[];
  readonly configs: readonly string[];
  readonly ks: readonly number[];
  /** K of the per-method comparison (Fig. 20); default the middle of --ks. */
  readonly k: number;
  readonly gpuKvBudget: number;
  readonly sinkTokens: number;
  /** Text: tokens used (default: up to the context); prefix prefilled before teacher forcing. */
  readonly tokens?: number;
  readonly prefix: number;
  /** Tasks: the context's last tokens fed as decode steps; items per file. */
  readonly tail: number;
  readonly limit?: number;
  readonly threads: number;
  readonly out?: string;
  readonly json: boolean;
}

export const EVAL_HELP = `Usage: hybridgen eval [options] (--text FILE | --tasks FILE.jsonl,... | both)

Accuracy of attention configurations against full attention on the same model (CPU backend).
--text: teacher-forced over the text (a prefix prefilled, then every token fed as a decode step):
perplexity, top-1 agreement with full attention's next token and mean KL(full ‖ config), per
configuration and K. --tasks: JSONL items, multiple choice scored by log-likelihood of each
choice ({"context", "choices", "answer": index}, as LM-eval-harness scores PIQA/COPA) or exact
match of the greedy continuation ({"context", "answer": text}); the context is prefilled but its
last --tail tokens, which are fed as decode steps, and the continuation is decoded, so
decode-time attention is what is measured. Prints tables; with --out writes eval.json and the
charts of accuracy vs K (Fig. 14) and per method (Fig. 20).

  -m, --model DIR              model directory (default stories15M)
      --text FILE              UTF-8 text to teacher-force
      --tasks A.jsonl,...      task files (each one a column of Fig. 20)
      --configs A,B,...        configurations (default: ${DEFAULT_EVAL_CONFIGS.join(", ")}; see hybridgen bench --help)
      --ks K1,K2,...           K values (default 4,8,16,32)
      --k K                    K of the per-method table and Fig. 20 (default: the middle of --ks)
      --gpu-kv-budget N        device window, sinks included (default 32)
      --sink-tokens S          attention sinks pinned in the window (default 4)
      --tokens N               text: use the first N tokens (default: as many as the context holds)
      --prefix P               text: tokens prefilled before teacher forcing (default 16)
      --tail T                 tasks: context tokens fed as decode steps (default 2)
      --limit N                tasks: the first N items of each file
      --threads N              CPU threads (default 1; the hybrid CPU stage has its own)
      --out DIR                write eval.json, fig14-accuracy-vs-k.svg and fig20-accuracy-per-method.svg
      --json                   print eval.json on stdout instead of the tables
  -h, --help                   this help
`;

export function parseEvalArgs(argv: readonly string[]): EvalOptions {
  let v: Record<string, string | boolean | undefined>;
  try {
    v = parseArgs({
      args: [...argv], strict: true, allowPositionals: false,
      options: {
        model: { type: "string", short: "m" }, text: { type: "string" }, tasks: { type: "string" }, configs: { type: "string" },
        ks: { type: "string" }, k: { type: "string" }, "gpu-kv-budget": { type: "string" }, "sink-tokens": { type: "string" },
        tokens: { type: "string" }, prefix: { type: "string" }, tail: { type: "string" }, limit: { type: "string" }, threads: { type: "string" },
        out: { type: "string" }, json: { type: "boolean" }, help: { type: "boolean", short: "h" },
      },
    }).values;
  } catch (e) {
    throw parseArgsError(e, "hybridgen eval");
  }
  const str = (k: string) => v[k] as string | undefined;
  const help = v.help === true;
  if (!help && str("text") === undefined && str("tasks") === undefined) throw usage("give --text FILE, --tasks FILE.jsonl or both (see hybridgen eval --help)");
  if (str("model") === "") throw usage("--model needs a directory");
  const ks = integers("ks", str("ks"), [4, 8, 16, 32], 1);
  const k = hybridInteger("k", str("k")) ?? ks[Math.floor((ks.length - 1) / 2)]!;
  const configs = str("configs") === undefined ? [...DEFAULT_EVAL_CONFIGS] : configList("configs", str("configs")!);
  for (const c of configs) attentionConfig(c, k);
  const gpuKvBudget = integer("gpu-kv-budget", str("gpu-kv-budget"), 1) ?? 32;
  const sinkTokens = integer("sink-tokens", str("sink-tokens"), 0) ?? 4;
  if (sinkTokens >= gpuKvBudget) throw usage(`--sink-tokens ${sinkTokens} must be smaller than --gpu-kv-budget ${gpuKvBudget}`);
  const prefix = integer("prefix", str("prefix"), 1) ?? 16;
  const tokens = integer("tokens", str("tokens"), 2);
  if (tokens !== undefined && prefix >= tokens) throw usage(`--prefix ${prefix} must be smaller than --tokens ${tokens}`);
  return {
    help,
    model: str("model"),
    text: str("text"),
    tasks: str("tasks") === undefined ? [] : list("tasks", str("tasks")!),
    configs,
    ks,
    k,
    gpuKvBudget,
    sinkTokens,
    tokens,
    prefix,
    tail: integer("tail", str("tail"), 1) ?? 2,
    limit: integer("limit", str("limit"), 1),
    threads: integer("threads", str("threads"), 1, 256) ?? 1,
    out: str("out"),
    json: v.json === true,
  };
}
