/**
 * `--prompts FILE`: a JSONL file of prompts, one JSON object a line,
 *
 *   {"prompt": "Once upon a time", "max_tokens": 64, "temperature": 0.8, "seed": 7}
 *
 * where only "prompt" is required (the others fall back to the flags). Blank lines are
 * skipped. A line that is not such an object is a one-line error naming the file and line.
 */
import { z } from "zod";
import { HybridgenError } from "@hybridgen/core";
import { readTextFile } from "./read-prompt.js";

export const PromptLineSchema = z
  .object({
    prompt: z.string({ error: "must be a string" }).refine((t) => t.trim() !== "", "is empty"),
    max_tokens: z.number({ error: "must be a number" }).int("must be an integer").min(1, "must be at least 1").optional(),
    temperature: z.number({ error: "must be a number" }).min(0, "must be ≥ 0").max(100, "must be ≤ 100").optional(),
    seed: z.number({ error: "must be a number" }).int("must be an integer").min(0, "must be ≥ 0").max(0xffffffff, "must be < 2^32").optional(),
  })
  .strict();
export type PromptLine = z.infer<typeof PromptLineSchema>;

/** A prompt of the file and the line it came from (1-based). */
export interface JsonlPrompt extends PromptLine {
  readonly line: number;
}

const KEYS = Object.keys(PromptLineSchema.shape).join(", ");

/** Parses JSONL text; `source` names it in errors. */
export function parsePromptsJsonl(text: string, source: string): JsonlPrompt[] {
  const out: JsonlPrompt[] = [];
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const raw = lines[i].replace(/\r$/, "");
    if (raw.trim() === "") continue;
    const where = `${source} line ${i + 1}`;
    let value: unknown;
    try {
      value = JSON.parse(raw);
    } catch (e) {
      throw new HybridgenError(`${where}: not valid JSON (${e instanceof Error ? e.message : String(e)})`, "EPROMPT");
    }
    if (value === null || typeof value !== "object" || Array.isArray(value)) {
      throw new HybridgenError(`${where}: expected a JSON object like {"prompt": "..."}`, "EPROMPT");
    }
    const r = PromptLineSchema.safeParse(value);
    if (!r.success) {
      // A misspelt key explains a "missing" one: report it first.
      const issue = r.error.issues.find((x) => x.code === "unrecognized_keys") ?? r.error.issues[0]!;
      if (issue.code === "unrecognized_keys") {
        throw new HybridgenError(`${where}: unknown key ${JSON.stringify(issue.keys[0])} (keys: ${KEYS})`, "EPROMPT");
      }
      const key = String(issue.path[0]);
      const got = (value as Record<string, unknown>)[key];
      const message = key === "prompt" && got === undefined ? '"prompt" is missing' : `"${key}" ${issue.message} (got ${JSON.stringify(got)})`;
      throw new HybridgenError(`${where}: ${message}`, "EPROMPT");
    }
    out.push({ ...r.data, line: i + 1 });
  }
  if (out.length === 0) throw new HybridgenError(`${source} holds no prompts (one JSON object a line, {"prompt": "..."})`, "EPROMPT");
  return out;
}

/** The prompts of a JSONL file. */
export function readPromptsJsonl(path: string): JsonlPrompt[] {
  return parsePromptsJsonl(readTextFile(path, "prompts file"), path);
}
