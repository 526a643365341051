/**
 * Parity with Hugging Face transformers: small random-weight checkpoints of every family
 * (rebuilt here from their seeds) against reference logits computed by transformers in
 * float64 (test/parity/make_refs.py, run on the GPU machine; fixtures/parity/refs.json).
 * Tolerance: 1e-4 relative error (max |Δ| / max |ref| per row) for the engine in f32.
 */
import { describe, expect, it } from "vitest";
import { ReferenceBackend } from "@hybridgen/spec/kit";
import { PARITY_CASES, promptIds } from "./parity/cases.js";
import { loadRefs, runParityCase } from "./parity/run-parity.js";

const TOL = 1e-4;
const refs = loadRefs();

describe("parity with transformers (ReferenceBackend, f32)", () => {
  it("has a reference for every case, made from the same prompt", () => {
    for (const c of PARITY_CASES) {
      const ref = refs.get(c.name);
      expect(ref, c.name).toBeDefined();
      expect(ref!.ids).toEqual(promptIds(c));
      expect(ref!.prefill.length).toBe(64 * ref!.vocab);
      expect(ref!.decode.length).toBe(16 * ref!.vocab);
    }
  });

  for (const c of PARITY_CASES) {
    it(`${c.name}: ${c.covers}`, () => {
      using backend = new ReferenceBackend();
      const r = runParityCase(c, refs.get(c.name)!, backend, TOL);
      expect(r.sequence, "prompt logits, token by token").toBeLessThan(TOL);
      expect(r.prefill, "last prompt logits after a blocked prefill").toBeLessThan(TOL);
      expect(r.decode, "decode-step logits").toBeLessThan(TOL);
      expect(r.greedyMismatches).toBe(0);
    });
  }
});
