/** parseHybridFlag: every command line's hybrid flag becomes its option's value by the runtime's own schema. */
import { describe, expect, it } from "vitest";
import { HybridgenError } from "@hybridgen/core";
import { HYBRID_OPTION_FLAGS, HybridRuntimeOptionsSchema, parseHybridFlag, type HybridOptionFlag } from "../src/index.js";

const message = (flag: HybridOptionFlag, text: string) => {
  try {
    parseHybridFlag(flag, text);
  } catch (e) {
    expect(e).toBeInstanceOf(HybridgenError);
    return (e as Error).message;
  }
  throw new Error(`--${flag} ${text} was accepted`);
};

describe("parseHybridFlag", () => {
  it("names an option of the runtime's schema for every flag", () => {
    for (const key of Object.values(HYBRID_OPTION_FLAGS)) expect(Object.keys(HybridRuntimeOptionsSchema.shape)).toContain(key);
  });

  it("turns text into the option's value", () => {
    expect(parseHybridFlag("k", " 32 ")).toEqual(["k", 32]);
    expect(parseHybridFlag("k-min", "8")).toEqual(["kMin", 8]);
    expect(parseHybridFlag("mass-target", "0.9")).toEqual(["massTarget", 0.9]);
    expect(parseHybridFlag("exact-layers", "0,3")).toEqual(["exactLayers", [0, 3]]);
    expect(parseHybridFlag("exact-layers", "none")).toEqual(["exactLayers", []]);
    expect(parseHybridFlag("selector-options", '{"pageSize":32}')).toEqual(["selectorOptions", { pageSize: 32 }]);
    expect(parseHybridFlag("logits", "verified")).toEqual(["logits", "verified"]);
    expect(parseHybridFlag("scheduler", "feedback")).toEqual(["scheduler", "feedback"]);
    expect(parseHybridFlag("selector", "topk+quest")).toEqual(["selector", "topk+quest"]);
  });

  it("a bad value is one line with the schema's bound", () => {
    expect(message("k", "0")).toBe("invalid value for --k: must be at least 1");
    expect(message("k", "1.5")).toBe('invalid value for --k: "1.5" is not a non-negative integer');
    expect(message("cpu-stage-threads", "257")).toBe("invalid value for --cpu-stage-threads: must be ≤ 256");
    expect(message("rescore-factor", "65")).toBe("invalid value for --rescore-factor: must be ≤ 64");
    expect(message("mass-target", "0")).toBe("invalid value for --mass-target: must be above 0");
    expect(message("scoring", "int2")).toBe("invalid value for --scoring: must be full, int8 or int4");
    expect(message("scheduler", "nope")).toBe("invalid value for --scheduler: must be fixed or feedback");
    expect(message("selector-options", "[1]")).toBe('invalid value for --selector-options: "[1]" is not a JSON object');
    expect(message("exact-layers", "1,,2")).toBe('invalid value for --exact-layers: "1,,2" is not a comma-separated list of layers or "none"');
  });
});
