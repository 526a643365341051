import { afterAll, describe, expect, it } from "vitest";
import type { TokenSelector } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { createSelector } from "@hybridgen/selectors";
import { decodePreTiny, PROMPT, STEPS } from "./tiny-model.js";

describe("hybrid decode with streaming pre-QKᵀ on the CPU backend", () => {
  const backend = createCpuBackend({ threads: 1 });
  afterAll(() => backend.close());
  const prompt = Int32Array.from({ length: PROMPT }, (_, i) => (i * 29 + 5) % 256);

  async function decode(selector: TokenSelector, logits: "exact" | "verified") {
    const r = await decodePreTiny(backend, 6, prompt, selector, logits);
    expect(r.steps).toBe(STEPS);
    return r;
  }


  for (const logits of ["exact", "verified"] as const) {
    it(`${logits}: the native stage's streaming kernel gives the tokens and logits of streaming's select() in JS, and no JS selection time`, async () => {
      const streaming = createSelector("streaming", { sinks: 2 });
      expect(streaming.kernel).toEqual({ name: "streaming", sinks: 2 });
      const inJs: TokenSelector = { ...streaming, kernel: undefined }; // select() on this thread, then a selected job
      const a = await decode(streaming, logits), b = await decode(inJs, logits);
      expect(a.tokens).toEqual(b.tokens);
      a.logits.forEach((l, i) => expect(l, `forward ${i}`).toEqual(b.logits[i]));
      expect(a.jsMs).toBe(0);
      expect(b.jsMs).toBeGreaterThan(0);
    });
  }
});
