import type { z } from "zod";
import { HybridgenError } from "@hybridgen/spec";

/** zod parse with a one-line HybridgenError naming the scheduler and the bad field. */
export function parseOptions<S extends z.ZodType>(schema: S, raw: unknown, who: string): z.output<S> {
  const r = schema.safeParse(raw ?? {});
  if (r.success) return r.data;
  const i = r.error.issues[0];
  throw new HybridgenError(`${who} options: ${i?.path.join(".") || "value"}: ${i?.message ?? "invalid"}`);
}
