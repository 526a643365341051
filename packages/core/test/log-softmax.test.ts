/** logSoftmax64 (the KL measures' one definition) and logSoftmax, its float32 rounding. */
import { describe, expect, it } from "vitest";
import { logSoftmax, logSoftmax64, seededRandom } from "../src/index.js";

describe("logSoftmax", () => {
  it("float64 values normalise, and the float32 ones are those rounded once", () => {
    const r = seededRandom(5), l = Float32Array.from({ length: 1000 }, () => (r() - 0.5) * 40);
    const lp = logSoftmax64(l);
    expect(lp.reduce((s, v) => s + Math.exp(v), 0)).toBeCloseTo(1, 12);
    expect(Array.from(logSoftmax(l))).toEqual(Array.from(lp, Math.fround));
  });
});
