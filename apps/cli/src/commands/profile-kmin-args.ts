/** `hybridgen profile-kmin` flags: parsed strictly, every bad value a one-line HybridgenError. */
import { parseArgs } from "node:util";
import { HybridgenError } from "@hybridgen/core";
import { HYBRID_DEFAULTS } from "@hybridgen/runtime";
import { builtinSelectors } from "@hybridgen/selectors";
import { parseArgsError } from "../parse-args-error.js";
import { hybridInteger } from "./flag-values.js";

export interface ProfileKminOptions {
  readonly help: boolean;
  /** A model directory or preset:NAME; default stories15M. */
  readonly model?: string;
  readonly text?: string;
  readonly prompts?: string;
  readonly tolerance: number;
  readonly selectors: readonly string[];
  /** --selectors was given (else the defaults, of which one that fails is left out). */
  readonly selectorsGiven: boolean;
  /** Ascending, distinct. */
  readonly ks: readonly number[];
  readonly gpuKvBudget: number;
  readonly sinkTokens: number;
  /** Tokens of each text used (default: all, up to the context). */
  readonly tokens?: number;
  readonly recallThreshold: number;
  /** K of the recall that decides exactLayers (default: K_min). */
  readonly recallK?: number;
  /** Which recall decides exactLayers: shared tokens, or shared attention mass. */
  readonly recallMetric: "tokens" | "mass";
  /** q̃ chooses candidates·K tokens in the recall. */
  readonly candidates: number;
  readonly threads: number;
  readonly json: boolean;
  readonly write: boolean;
}

export const PROFILE_KMIN_DEFAULTS = {
  tolerance: 0.99, ks: [8, 16, 32, 64, 128], gpuKvBudget: 32, sinkTokens: 0, recallThreshold: 0.9, threads: 1,
} as const;

/** Every built-in selector but "all" (full attention over the offloaded tokens, the reference itself). */
export const defaultProfileSelectors = (): string[] => Object.keys(builtinSelectors).filter((n) => n !== "all");

/** Hybrid attention's own default candidate multiplier, so the recall measures what generate runs. */
const DEFAULT_CANDIDATES = HYBRID_DEFAULTS.candidates;

export const PROFILE_KMIN_HELP = `Usage: hybridgen profile-kmin [options]

Finds K_min: teacher-forced over a text, hybrid attention (exact logits, CPU backend) is
compared with full attention for every selector and K; K_min of a selector is the smallest
K whose top-1 next-token agreement reaches the tolerance. Also measures, per layer, how well
the speculative query q̃ (projected from the previous layer's input) recalls the true query's
top-K; layers below the recall threshold go in exactLayers (their selection waits for the
true query). Prints the tables and writes the profile where generate reads it.

  -m, --model DIR|preset:X     model directory (preset:NAME runs random weights); default stories15M
      --text FILE              a UTF-8 text to teacher-force (default: a built-in short story)
      --prompts FILE.jsonl     many texts, one {"prompt": "..."} a line, each run on its own
      --tolerance X            top-1 agreement K_min must reach, 0 < X ≤ 1 (default 0.99)
      --selectors A,B,...      selectors to profile: registered names or plugin modules
                               (PATH|PACKAGE[:export]); default: every built-in but "all"
      --ks K1,K2,...           K values to sweep (default 8,16,32,64,128)
      --gpu-kv-budget N        tokens in the device window, sinks included (default 32)
      --sink-tokens S          attention sinks pinned in the window (default 0)
      --tokens N               use the first N tokens of each text (default: all, up to the context)
      --recall-threshold X     layers whose q̃ recall is below X must select exactly (default 0.9)
      --recall-k K             K of that recall (default: the default selector's K_min)
      --recall-metric tokens|mass  tokens: the share of the true top-K that q̃'s top-K holds;
                               mass: the share of the true top-K's attention mass it holds
                               (a miss among near-equal weights costs little). Default tokens
      --candidates C           in the recall, q̃ chooses its top C·K, as verified logits do
                               (default: hybrid attention's, ${DEFAULT_CANDIDATES})
      --threads N              CPU threads of the model (default 1; the CPU stage has its own)
      --json                   print one JSON object (profile, path, recall per layer and K)
      --no-write               measure and print, but write no profile
  -h, --help                   this help

The profile goes to $HYBRIDGEN_CACHE/profiles/ (default ~/.cache/hybridgen/profiles/), keyed
by the model directory's real path and config.json (or the preset name).
`;

const usage = (msg: string) => new HybridgenError(msg, "EUSAGE");

function integer(flag: string, raw: string | undefined, min: number): number | undefined {
  if (raw === undefined) return undefined;
  const t = raw.trim();
  if (!/^\d+$/.test(t) || !Number.isSafeInteger(Number(t)) || Number(t) < min) {
    throw usage(`invalid value for --${flag}: ${JSON.stringify(raw)} is not an integer ≥ ${min}`);
  }
  return Number(t);
}

function fraction(flag: string, raw: string | undefined, fallback: number, allowZero: boolean): number {
  if (raw === undefined) return fallback;
  const x = /^\s*(\d+(\.\d*)?|\.\d+)\s*$/.test(raw) ? Number(raw) : NaN;
  if (!(x <= 1 && (allowZero ? x >= 0 : x > 0))) {
    throw usage(`invalid value for --${flag}: ${JSON.stringify(raw)} must be a number in ${allowZero ? "[0, 1]" : "(0, 1]"}`);
  }
  return x;
}

function list(flag: string, raw: string): string[] {
  const items = raw.split(",").map((s) => s.trim()).filter((s) => s.length > 0);
  if (items.length === 0) throw usage(`--${flag} needs at least one value (a comma-separated list)`);
  return items;
}

export function parseProfileKminArgs(argv: readonly string[]): ProfileKminOptions {
  let v: Record<string, string | boolean | undefined>;
  try {
    v = parseArgs({
      args: [...argv], strict: true, allowPositionals: false,
      options: {
        model: { type: "string", short: "m" }, text: { type: "string" }, prompts: { type: "string" }, tolerance: { type: "string" },
        selectors: { type: "string" }, ks: { type: "string" }, "gpu-kv-budget": { type: "string" }, "sink-tokens": { type: "string" },
        tokens: { type: "string" }, "recall-threshold": { type: "string" }, "recall-k": { type: "string" }, "recall-metric": { type: "string" }, candidates: { type: "string" }, threads: { type: "string" },
        json: { type: "boolean" }, "no-write": { type: "boolean" }, help: { type: "boolean", short: "h" },
      },
    }).values;
  } catch (e) {
    throw parseArgsError(e, "hybridgen profile-kmin");
  }
  const str = (k: string) => v[k] as string | undefined;
  if (str("text") !== undefined && str("prompts") !== undefined) throw usage("--text and --prompts are exclusive: give one");
  if (str("model") === "") throw usage("--model needs a directory or preset:NAME");

  // Names that are not registered may be plugin modules: profile-kmin loads them before measuring.
  const selectors = str("selectors") === undefined ? defaultProfileSelectors() : [...new Set(list("selectors", str("selectors")!))];
  const ks = str("ks") === undefined
    ? [...PROFILE_KMIN_DEFAULTS.ks]
    : [...new Set(list("ks", str("ks")!).map((k) => integer("ks", k, 1)!))].sort((a, b) => a - b);

  const gpuKvBudget = integer("gpu-kv-budget", str("gpu-kv-budget"), 1) ?? PROFILE_KMIN_DEFAULTS.gpuKvBudget;
  const sinkTokens = integer("sink-tokens", str("sink-tokens"), 0) ?? PROFILE_KMIN_DEFAULTS.sinkTokens;
  if (sinkTokens >= gpuKvBudget) throw usage(`--sink-tokens ${sinkTokens} must be smaller than --gpu-kv-budget ${gpuKvBudget}`);
  const threads = integer("threads", str("threads"), 1) ?? PROFILE_KMIN_DEFAULTS.threads;
  const recallMetric = str("recall-metric") ?? "tokens";
  if (recallMetric !== "tokens" && recallMetric !== "mass") throw usage(`invalid value for --recall-metric: ${JSON.stringify(recallMetric)} must be tokens or mass`);
  const candidates = hybridInteger("candidates", str("candidates")) ?? DEFAULT_CANDIDATES;
  if (threads > 256) throw usage(`invalid value for --threads: ${threads} must be ≤ 256`);
  return {
    help: v.help === true,
    model: str("model"),
    text: str("text"),
    prompts: str("prompts"),
    tolerance: fraction("tolerance", str("tolerance"), PROFILE_KMIN_DEFAULTS.tolerance, false),
    selectors,
    selectorsGiven: str("selectors") !== undefined,
    ks,
    gpuKvBudget,
    sinkTokens,
    tokens: integer("tokens", str("tokens"), 2),
    recallThreshold: fraction("recall-threshold", str("recall-threshold"), PROFILE_KMIN_DEFAULTS.recallThreshold, true),
    recallK: integer("recall-k", str("recall-k"), 1),
    recallMetric,
    candidates,
    threads,
    json: v.json === true,
    write: v["no-write"] !== true,
  };
}
