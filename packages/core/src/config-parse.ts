/** One-line errors for config files that fail their zod schema: file, key path, message, value. */
import type { z } from "zod";
import { fail } from "@hybridgen/spec";

function valueAt(root: unknown, path: readonly PropertyKey[]): unknown {
  let v = root;
  for (const k of path) {
    if (v === null || typeof v !== "object") return undefined;
    v = (v as Record<PropertyKey, unknown>)[k];
  }
  return v;
}

/** Parses `json` with `schema`; the first issue becomes `src: key.path: message (got value)`. */
export function parseConfigWith<S extends z.ZodType>(schema: S, json: unknown, src: string): z.output<S> {
  const r = schema.safeParse(json);
  if (r.success) return r.data;
  const issue = r.error.issues[0];
  const path = issue.path.map((k) => JSON.stringify(String(k)).slice(1, -1)).join(".") || "(root)";
  const value = valueAt(json, issue.path);
  const text = JSON.stringify(value);
  const shown = value === undefined ? "missing" : `got ${text.length > 80 ? `${text.slice(0, 80)}…` : text}`;
  fail(`${src}: ${path}: ${issue.message} (${shown})`);
}
