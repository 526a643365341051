/**
 * Property-based fuzzing of config.json: every preset's config (Llama, Qwen2, OPT) and
 * stories15M's, with any JSON put at any key path, keys deleted, or the file's bytes changed.
 * Each is described (family, shape, tensor list) or refused with one HybridgenError line.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import { describeModel, tensorSpecsOf } from "../src/architectures.js";
import { readJsonFile } from "../src/json-file.js";
import { PRESET_NAMES, presetConfig } from "../src/presets.js";
import { keyPaths, loadsOrOneLineError, withValueAt } from "./fuzz-helpers.js";

// One seed per run of the suite, so CI is repeatable; HYBRIDGEN_FUZZ_SEED explores others.
fc.configureGlobal({ seed: Number(process.env.HYBRIDGEN_FUZZ_SEED ?? 20261203) });

const STORIES15M = {
  architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 288, intermediate_size: 768, num_hidden_layers: 6,
  num_attention_heads: 6, num_key_value_heads: 6, head_dim: 48, hidden_act: "silu", vocab_size: 32000, max_position_embeddings: 256,
  rms_norm_eps: 0.00001, rope_theta: 10000, attention_bias: false, mlp_bias: false, tie_word_embeddings: true, bos_token_id: 1, eos_token_id: 2,
};
const SEEDS: unknown[] = [STORIES15M, ...PRESET_NAMES.map((n) => presetConfig(n))];
const dir = mkdtempSync(join(tmpdir(), "hybridgen-fuzz-config-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A config that is described must give a sane shape and a tensor list of sane size. */
function describe_(json: unknown): "ok" | "error" {
  return loadsOrOneLineError(() => {
    const { config, shape } = describeModel(json, "config.json");
    for (const v of [shape.layers, shape.heads, shape.kvHeads, shape.headDim, shape.vocabSize]) expect(Number.isSafeInteger(v) && v > 0).toBe(true);
    const specs = tensorSpecsOf(config, shape);
    expect(specs.length).toBeGreaterThan(0);
  });
}

// Values that configs get wrong in practice, mixed with anything JSON can hold.
const nasty = fc.oneof(
  fc.jsonValue(),
  fc.constantFrom(0, -1, 1.5, 2 ** 31, 2 ** 53, 1e308, -0, "", "32", null, [], {}, true, "__proto__"),
  fc.integer({ min: -10, max: 1 << 30 }),
);

describe("config.json under fuzzing", () => {
  it("the seeds describe", () => {
    for (const s of SEEDS) expect(describe_(s)).toBe("ok");
  });

  it("a lying size is refused before it sizes anything (it used to loop over 2^31 layers)", () => {
    const json = { ...STORIES15M, num_hidden_layers: 2 ** 31 };
    expect(() => describeModel(json, "config.json")).toThrow(`config.json: num_hidden_layers: must be at most 1024 (got ${2 ** 31})`);
    expect(() => describeModel({ ...STORIES15M, vocab_size: 1e12 }, "config.json")).toThrow(/vocab_size: must be at most 16777216/);
  });

  it("any value at any key path, and deleted keys", () => {
    fc.assert(
      fc.property(fc.nat(), fc.nat(), nasty, fc.boolean(), (seed, pick, value, remove) => {
        const json = SEEDS[seed % SEEDS.length] as Record<string, unknown>;
        const paths = keyPaths(json);
        const path = paths[pick % paths.length];
        let mutated: unknown;
        if (remove && path.length === 1) {
          mutated = { ...json };
          delete (mutated as Record<string, unknown>)[path[0]];
        } else {
          mutated = withValueAt(json, path, value);
        }
        describe_(mutated);
      }),
      { numRuns: 2000 },
    );
  });

  it("any JSON document at all", () => {
    fc.assert(fc.property(fc.jsonValue(), (json) => void describe_(json)), { numRuns: 500 });
  });

  it("changed bytes of the file (read with readJsonFile)", () => {
    fc.assert(
      fc.property(fc.nat(), fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { minLength: 1, maxLength: 6 }), (seed, edits) => {
        const bytes = new TextEncoder().encode(JSON.stringify(SEEDS[seed % SEEDS.length], null, 2));
        for (const [at, v] of edits) bytes[at % bytes.length] = v;
        const path = join(dir, "config.json");
        writeFileSync(path, bytes);
        const outcome = loadsOrOneLineError(() => describe_(readJsonFile(path)));
        // Bytes that are not UTF-8 are refused, never read as U+FFFD.
        if (outcome === "ok") expect(() => new TextDecoder("utf-8", { fatal: true }).decode(bytes)).not.toThrow();
      }),
      { numRuns: 500 },
    );
  });
});
