import type { SamplingOptionsInput } from "@hybridgen/core";
import { z } from "zod";
import { BackendChoiceSchema } from "@hybridgen/runtime";

/**
 * Options of `hybridgen generate`, after the flags are parsed. Exported so programs that
 * drive the CLI (or build their own front end) can validate the same way. Numbers here are
 * numbers: the flag layer (parse-generate-args.ts) turns strings into numbers first.
 */
export const GenerateCliOptionsSchema = z
  .object({
    /** Model directory (Hugging Face layout). Absent: stories15M, fetched on first use. */
    model: z.string().min(1, "must not be empty").optional(),
    prompt: z.string().optional(),
    promptFile: z.string().min(1, "must not be empty").optional(),
    /** A JSONL file of prompts ({"prompt": "...", optional "max_tokens", "temperature", "seed"} a line). */
    prompts: z.string().min(1, "must not be empty").optional(),
    /** Sequences decoded together with --prompts (continuous batching); default 1. */
    batch: z.number().int("must be an integer").min(1, "must be at least 1").max(32, "must be ≤ 32").optional(),
    /** Wrap the prompt as a user message in the model's chat template (instruct models). */
    chat: z.boolean().default(false),
    /** A system message before the user's (needs --chat). */
    system: z.string().optional(),
    maxTokens: z.number().int("must be an integer").min(1, "must be at least 1").default(256),
    /** 0 = greedy (argmax), as llama2.c. */
    temperature: z.number().min(0, "must be ≥ 0").max(100, "must be ≤ 100").default(1),
    /** 0 = off. */
    topK: z.number().int("must be an integer").min(0, "must be ≥ 0").default(0),
    topP: z.number().gt(0, "must be > 0").max(1, "must be ≤ 1").default(0.9),
    repetitionPenalty: z.number().min(1, "must be ≥ 1").max(100, "must be ≤ 100").default(1),
    /** Absent: a random seed, reported in --json output. */
    seed: z.number().int("must be an integer").min(0, "must be ≥ 0").max(0xffffffff, "must be < 2^32").optional(),
    stop: z.array(z.string().min(1, "must not be empty")).default([]),
    /** Absent: HYBRIDGEN_THREADS, else every core. */
    threads: z.number().int("must be an integer").min(1, "must be at least 1").max(256, "must be ≤ 256").optional(),
    /** KV cache positions; absent: min(model's max_position_embeddings, 4096). */
    context: z.number().int("must be an integer").min(1, "must be at least 1").optional(),
    /** Weight dtype at load; absent: as stored in the checkpoint. */
    dtype: z.enum(["f32", "f16", "bf16"], { error: "must be one of f32, f16, bf16" }).optional(),
    json: z.boolean().default(false),
    /** The detail behind device choices (the CUDA error when auto runs on the CPU). */
    verbose: z.boolean().default(false),
    /** Deterministic random weights (bf16 unless --dtype) instead of the checkpoint's; needed by preset:<name>. */
    dummyWeights: z.boolean().default(false),
    /** auto: the GPU when CUDA is usable, else the CPU (the reason goes to stderr); a registered backend; a backend module. */
    device: BackendChoiceSchema.default("auto"),
  })
  .strict()
  .refine((o) => o.system === undefined || o.chat, { message: "--system needs --chat", path: ["system"] })
  .refine((o) => o.prompt === undefined || o.promptFile === undefined, {
    message: "give either --prompt or --prompt-file, not both",
    path: ["promptFile"],
  })
  .refine((o) => o.prompts === undefined || (o.prompt === undefined && o.promptFile === undefined), {
    message: "give either --prompts or --prompt/--prompt-file, not both",
    path: ["prompts"],
  })
  .refine((o) => o.batch === undefined || o.prompts !== undefined, { message: "--batch needs --prompts FILE (a JSONL file of prompts)", path: ["batch"] });

export type GenerateCliOptions = z.infer<typeof GenerateCliOptionsSchema>;
export type GenerateCliInput = z.input<typeof GenerateCliOptionsSchema>;

/** The run's sampling options for core (generate and generateBatch); without --seed core draws one. */
export function samplingOf(opts: GenerateCliOptions): SamplingOptionsInput {
  return {
    temperature: opts.temperature,
    topK: opts.topK,
    topP: opts.topP,
    repetitionPenalty: opts.repetitionPenalty,
    ...(opts.seed === undefined ? {} : { seed: opts.seed }),
  };
}

/** A tokens/s figure of the stderr summary: one decimal, "n/a" when nothing was timed. */
export const formatRate = (x: number): string => (Number.isFinite(x) ? x.toFixed(1) : "n/a");

/** Option key → the flag a user typed, for error messages. */
export const FLAG_OF: Readonly<Record<string, string>> = {
  model: "--model",
  prompt: "--prompt",
  promptFile: "--prompt-file",
  prompts: "--prompts",
  batch: "--batch",
  maxTokens: "--max-tokens",
  temperature: "--temperature",
  topK: "--top-k",
  topP: "--top-p",
  repetitionPenalty: "--repetition-penalty",
  seed: "--seed",
  stop: "--stop",
  threads: "--threads",
  context: "--context",
  device: "--device",
  dtype: "--dtype",
  json: "--json",
  verbose: "--verbose",
  dummyWeights: "--dummy-weights",
  chat: "--chat",
  system: "--system",
};
