import { afterAll, describe, expect, it } from "vitest";
import { loadModel, relError } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { CONTEXT, PROMPT, STEPS, decodeTiny, tinyFiles as tinyModelFiles } from "./tiny-model.js";
import { ATTENTION_CONFIG_NAMES, attachAttentionConfig, attentionConfig } from "../src/index.js";

const tinyFiles = () => tinyModelFiles(9);

const backend = createCpuBackend({ threads: 1 });
afterAll(() => backend.close());
const prompt = Int32Array.from({ length: PROMPT }, (_, i) => (i * 53 + 7) % 256);
const load = (window?: number) => loadModel(tinyFiles(), backend, { maxContext: CONTEXT, ...(window ? { gpuKvBudget: window, sinkTokens: 2 } : {}) });

/** The prompt, then STEPS steps fed with `feed` (greedy when absent): every forward's logits. */
const decode = (model: ReturnType<typeof load>, feed?: number[]) => decodeTiny(model, prompt, feed);

describe("attention configurations", () => {
  it("flexgen (AoG), moe-lightning (AoC) and all-tokens equal full attention at every step; greedy text too", async () => {
    using full = load();
    const want = decode(full);
    for (const name of ["flexgen", "moe-lightning", "all-tokens"]) {
      using model = load(16);
      using a = await attachAttentionConfig(model, backend, attentionConfig(name, 8));
      const fed = decode(model, want.tokens);
      fed.logits.forEach((l, i) => expect(relError(l, want.logits[i]!), `${name} forward ${i}`).toBeLessThan(1e-5));
      expect(a.summary()).toContain(name);
      a.close();
      model.cache.reset();
      using b = await attachAttentionConfig(model, backend, attentionConfig(name, 8));
      expect(decode(model).tokens, `${name} greedy`).toEqual(want.tokens);
    }
  });

  it("every built-in runs; selective ones at K far below the offloaded count differ from full attention", async () => {
    using full = load();
    const want = decode(full);
    for (const name of ATTENTION_CONFIG_NAMES.filter((n) => n !== "full")) {
      using model = load(16);
      using a = await attachAttentionConfig(model, backend, attentionConfig(name, 2));
      const got = decode(model, want.tokens);
      const worst = Math.max(...got.logits.map((l, i) => relError(l, want.logits[i]!)));
      if (["flexgen", "moe-lightning", "all-tokens"].includes(name)) expect(worst, name).toBeLessThan(1e-5);
      else expect(worst, name).toBeGreaterThan(1e-4);
      if (a.config.kind === "hybrid") expect(a.trace().length, name).toBe(STEPS);
    }
  });

  it("hybrid:KEY=VALUE specs; bad names and keys are one-line errors", () => {
    expect(attentionConfig("hybrid:selector=quest,timing=pre,logits=exact", 32).hybrid).toEqual({ selector: "quest", timing: "pre", logits: "exact", k: 32 });
    expect(attentionConfig("hybrid:scheduler=feedback", 16).hybrid).toEqual({ scheduler: "feedback", kMin: 16 });
    expect(attentionConfig("keyformer", 24)).toMatchObject({ kind: "hybrid", family: "baseline", hybrid: { selector: "keyformer", k: 24, timing: "post" } });
    expect(() => attentionConfig("flexgen2", 8)).toThrow(/unknown attention configuration "flexgen2" \(built-ins: full, flexgen/);
    expect(() => attentionConfig("hybrid:sel=topk", 8)).toThrow(/unknown key "sel"/);
    expect(() => attentionConfig("hybrid:k=0", 8)).toThrow(/k must be a positive integer, got "0"/);
  });

  it("an offloading configuration on a model whose window holds everything is refused", async () => {
    using model = load();
    await expect(attachAttentionConfig(model, backend, attentionConfig("flexgen", 8))).rejects.toThrow(/offloads, but the KV window holds the whole context/);
  });
});
