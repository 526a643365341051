import { parseArgs } from "node:util";
import { HybridgenError } from "@hybridgen/core";
import { FLAG_OF, GenerateCliOptionsSchema, type GenerateCliOptions } from "./generate-options.js";
import { parseArgsError } from "./parse-args-error.js";

const NUMERIC = new Set(["batch", "maxTokens", "temperature", "topK", "topP", "repetitionPenalty", "seed", "threads", "context"]);

/** A strict decimal number: "1", "-2", "0.5", "1e-3". Rejects "", "0x10", "1abc", "Infinity". */
function toNumber(flag: string, raw: string): number {
  const s = raw.trim();
  if (!/^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/.test(s)) {
    throw new HybridgenError(`invalid value for ${flag}: ${JSON.stringify(raw)} is not a number`);
  }
  const n = Number(s);
  if (!Number.isFinite(n)) throw new HybridgenError(`invalid value for ${flag}: ${JSON.stringify(raw)} is out of range`);
  return n;
}

const camel = (flag: string) => flag.replace(/-([a-z])/g, (_, c: string) => c.toUpperCase());

/** `hybridgen generate` flags → validated options, or a HybridgenError naming the flag. */
export function parseGenerateArgs(argv: readonly string[]): GenerateCliOptions & { help: boolean } {
  let parsed;
  try {
    parsed = parseArgs({
      args: [...argv],
      strict: true,
      allowPositionals: false,
      options: {
        model: { type: "string", short: "m" },
        prompt: { type: "string", short: "p" },
        "prompt-file": { type: "string", short: "f" },
        prompts: { type: "string" },
        batch: { type: "string" },
        "max-tokens": { type: "string", short: "n" },
        temperature: { type: "string", short: "t" },
        "top-k": { type: "string" },
        "top-p": { type: "string" },
        "repetition-penalty": { type: "string" },
        seed: { type: "string", short: "s" },
        stop: { type: "string", multiple: true },
        threads: { type: "string" },
        context: { type: "string" },
        dtype: { type: "string" },
        json: { type: "boolean" },
        verbose: { type: "boolean" },
        "dummy-weights": { type: "boolean" },
        device: { type: "string" },
        chat: { type: "boolean" },
        system: { type: "string" },
        help: { type: "boolean", short: "h" },
      },
    });
  } catch (e) {
    throw parseArgsError(e, "hybridgen generate");
  }
  const { help, ...values } = parsed.values;
  const input: Record<string, unknown> = {};
  for (const [flagName, value] of Object.entries(values)) {
    const key = camel(flagName);
    input[key] = NUMERIC.has(key) ? toNumber(`--${flagName}`, value as string) : value;
  }
  const result = GenerateCliOptionsSchema.safeParse(input);
  if (!result.success) {
    const issue = result.error.issues[0]!;
    const key = String(issue.path[0] ?? "");
    const flag = FLAG_OF[key];
    const got = key in input && typeof input[key] !== "object" ? ` (got ${JSON.stringify(input[key])})` : "";
    throw new HybridgenError(flag && issue.code !== "custom" ? `invalid value for ${flag}: ${issue.message}${got}` : issue.message);
  }
  return { ...result.data, help: help === true };
}
