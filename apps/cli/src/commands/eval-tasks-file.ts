/**
 * `hybridgen eval --tasks FILE.jsonl`: one task item a line, either
 *
 *   {"context": "…", "choices": [" a", " b"], "answer": 1}   multiple choice, scored by log-likelihood
 *   {"context": "…", "answer": "v17"}                         exact match of the greedy continuation
 *
 * Blank lines are skipped; a bad line is a one-line error naming the file and line.
 */
import { readFileSync } from "node:fs";
import { z } from "zod";
import { HybridgenError } from "@hybridgen/core";

const ChoiceSchema = z.object({
  context: z.string({ error: "must be a string" }).min(1, "must not be empty"),
  choices: z.array(z.string({ error: "must be strings" }).min(1, "must not be empty")).min(2, "needs at least 2 choices"),
  answer: z.number({ error: "must be the index of the right choice" }).int("must be an integer").min(0, "must be ≥ 0"),
}).strict().refine((t) => t.answer < t.choices.length, { message: "is not the index of a choice", path: ["answer"] });
const ExactSchema = z.object({
  context: z.string({ error: "must be a string" }).min(1, "must not be empty"),
  answer: z.string({ error: "must be a string (or an index with choices)" }).min(1, "must not be empty"),
}).strict();

export type TaskItem =
  | { readonly kind: "choice"; readonly context: string; readonly choices: readonly string[]; readonly answer: number; readonly line: number }
  | { readonly kind: "exact"; readonly context: string; readonly answer: string; readonly line: number };

export function parseTasksJsonl(text: string, source: string): TaskItem[] {
  const out: TaskItem[] = [];
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const raw = lines[i]!.replace(/\r$/, "");
    if (raw.trim() === "") continue;
    const where = `${source} line ${i + 1}`;
    let value: unknown;
    try {
      value = JSON.parse(raw);
    } catch {
      throw new HybridgenError(`${where}: not valid JSON`, "EUSAGE");
    }
    const isChoice = typeof value === "object" && value !== null && "choices" in value;
    const r = (isChoice ? ChoiceSchema : ExactSchema).safeParse(value);
    if (!r.success) {
      const issue = r.error.issues[0]!;
      const path = issue.path.join(".");
      throw new HybridgenError(`${where}: ${path ? `"${path}" ` : ""}${issue.message}`, "EUSAGE");
    }
    out.push(isChoice ? { kind: "choice", ...(r.data as z.infer<typeof ChoiceSchema>), line: i + 1 } : { kind: "exact", ...(r.data as z.infer<typeof ExactSchema>), line: i + 1 });
  }
  if (out.length === 0) throw new HybridgenError(`${source}: no task items (one JSON object a line)`, "EUSAGE");
  return out;
}

export function readTasksJsonl(file: string): TaskItem[] {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (e) {
    const code = (e as { code?: string }).code;
    throw new HybridgenError(`cannot read --tasks ${file}: ${code === "ENOENT" ? "no such file" : code ?? String(e)}`, "EUSAGE");
  }
  return parseTasksJsonl(text, file);
}
