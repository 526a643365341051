/**
 * A hybrid configuration's byte model for the planner (@hybridgen/memtier's planRun): what its CPU
 * stage reads to choose the offloaded rows — every offloaded K for top-K and the default's pair,
 * Quest's page bounds, nothing for StreamingLLM, the page index its own bytes — and how many rows
 * its logits send up (verified: candidates·K with their K, V rows of keep·K where it keeps some; exact
 * and speculative: K rows of V).
 */
import { HYBRID_DEFAULTS } from "./hybrid/options.js";
import type { HybridRuntimeOptions } from "./options.js";

export interface PlanSelection {
  readonly selection: "scan" | "bounds" | "none";
  readonly boundsPageSize?: number;
  readonly candidates: number;
  /** Verified layers keep keep·K of their candidates (HybridOptions.keep). */
  readonly keep?: number;
  readonly index?: { readonly form?: "int8" | "int4"; readonly pageSize?: number; readonly superPages?: number; readonly placement: "auto" | "host" | "device" };
}

/** `options`' byte model; `ranksOnDevice`: the backend ranks a page index (else the index stays on the stage, whatever its placement). */
export function planSelection(options: HybridRuntimeOptions, ranksOnDevice: boolean): PlanSelection {
  const opts = (options.selectorOptions ?? {}) as Record<string, unknown>;
  const candidates = (options.logits ?? "verified") === "verified" ? (options.candidates ?? HYBRID_DEFAULTS.candidates) : 1;
  const kept = candidates > 1 && options.keep !== undefined ? { keep: options.keep } : {};
  const num = (key: "pageSize" | "superPages") => (typeof opts[key] === "number" ? { [key]: opts[key] as number } : {});
  switch (typeof options.selector === "string" ? options.selector : undefined) {
    case "index": {
      const asked = opts.placement === "host" || opts.placement === "device" ? opts.placement : "auto";
      const placement = ranksOnDevice ? asked : "host";
      return { selection: "none", candidates, ...kept, index: { ...num("pageSize"), ...num("superPages"), ...(opts.form === "int4" || opts.form === "int8" ? { form: opts.form } : {}), placement } };
    }
    case "quest":
      return { selection: "bounds", boundsPageSize: typeof opts.pageSize === "number" ? opts.pageSize : 16, candidates, ...kept };
    case "streaming":
      return { selection: "none", candidates, ...kept };
    default:
      return { selection: "scan", candidates, ...kept };
  }
}
