/**
 * Parity with Hugging Face transformers on the production CPU backend: the checkpoints and
 * reference logits of core's parity suite (core/test/parity, fixtures/parity/refs.json,
 * made by transformers in float64), run through CpuBackend's native kernels in f32.
 * Tolerance: 1e-4 relative error (max |Δ| / max |ref| per row).
 */
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { PARITY_CASES, parseParityRefs, runParityCase } from "@hybridgen/core";
import { createCpuBackend } from "../src/index.js";

const TOL = 1e-4;
// The references sit beside core's own parity test (in the repository, not in core's package files).
const refsFile = new URL("test/fixtures/parity/refs.json", import.meta.resolve("@hybridgen/core/package.json"));
const refs = parseParityRefs(readFileSync(fileURLToPath(refsFile), "utf8"));

describe("parity with transformers (CpuBackend, f32)", () => {
  for (const c of PARITY_CASES) {
    it(`${c.name}: ${c.covers}`, () => {
      using backend = createCpuBackend({ threads: 2 });
      // prefill blocks of 24 rows: blocks that do not divide the 64-token prompt
      const r = runParityCase(c, refs.get(c.name)!, backend, TOL, 24);
      expect(r.sequence).toBeLessThan(TOL);
      expect(r.prefill).toBeLessThan(TOL);
      expect(r.decode).toBeLessThan(TOL);
      expect(r.greedyMismatches).toBe(0);
    });
  }
});
