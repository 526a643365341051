/**
 * zod objects drop keys they do not know; a misspelled selector option would then be ignored
 * silently. unknownOptionKey() finds the first key of `raw` that an object schema (under
 * optional/default/pipe wrappers) does not declare, unless the schema lets unknown keys through.
 */
import type { z } from "zod";

interface ZodInternals {
  _zod?: { def?: { type?: string; shape?: Record<string, unknown>; catchall?: { _zod?: { def?: { type?: string } } }; innerType?: unknown; in?: unknown } };
}

function objectDef(schema: unknown): { shape: Record<string, unknown>; open: boolean } | undefined {
  for (let s = schema as ZodInternals | undefined, depth = 0; s && depth < 8; depth++) {
    const def = s._zod?.def;
    if (!def) return undefined;
    if (def.type === "object" && def.shape) {
      const catchall = def.catchall?._zod?.def?.type;
      return { shape: def.shape, open: catchall !== undefined && catchall !== "never" };
    }
    s = (def.innerType ?? def.in) as ZodInternals | undefined;
  }
  return undefined;
}

/** The first key of `raw` the schema does not declare, with the keys it does; undefined when every key is known. */
export function unknownOptionKey(schema: z.ZodType, raw: unknown): { key: string; known: string[] } | undefined {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) return undefined;
  const obj = objectDef(schema);
  if (!obj || obj.open) return undefined;
  const known = Object.keys(obj.shape);
  const key = Object.keys(raw).find((k) => !Object.hasOwn(obj.shape, k));
  return key === undefined ? undefined : { key, known };
}
