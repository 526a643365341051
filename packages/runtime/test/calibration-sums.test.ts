import { describe, expect, it } from "vitest";
import { HybridgenError, seededRandom } from "@hybridgen/core";
import type { CalibrationBatch } from "@hybridgen/spec";
import { calibrationGrid, calibrationSumsTs, sampleSumsLength } from "../src/index.js";
import { createNativeCalibrationSums } from "@hybridgen/kernels-cpu";

/**
 * A stash of `samples` samples of a `group`-head group over `width` positions: logits with a few
 * sharp tokens and ties, q̃ logits (none on the first `layer0` samples), softmaxed probabilities.
 */
function batch(seed: number, samples: number, group: number, width: number, candidates: number, layer0: number): CalibrationBatch {
  const r = seededRandom(seed);
  const data = new Float32Array(samples * 3 * group * width);
  const fields: number[] = [];
  for (let s = 0; s < samples; s++) {
    const at = s * 3 * group;
    for (let h = 0; h < 3 * group; h++) {
      const row = data.subarray((at + h) * width, (at + h + 1) * width);
      for (let j = 0; j < width; j++) row[j] = (r() - 0.5) * 4 + (r() < 0.01 ? 12 : 0);
      if (h < group) for (let j = 0; j < width; j += 37) row[j] = 1.5; // equal keys: ties broken by position
    }
    for (let h = 0; h < group; h++) {
      const logits = data.subarray((at + h) * width, (at + h + 1) * width), p = data.subarray((at + 2 * group + h) * width, (at + 2 * group + h + 1) * width);
      const m = Math.max(...logits);
      let z = 0;
      for (let j = 0; j < width; j++) z += p[j] = Math.exp(logits[j]! - m);
      for (let j = 0; j < width; j++) p[j]! /= z;
    }
    const from = 4 + (s % 3), to = s === 1 ? from : width - 64 - (s % 5); // sample 1 has nothing offloaded
    fields.push(at, s < layer0 ? -1 : at + group, at + 2 * group, from, to);
  }
  return { data, width, group, samples: Int32Array.from(fields), grid: calibrationGrid(width), candidates };
}

describe("native calibration sums", () => {
  it("equal the JavaScript reference bit for bit, on one thread and on several", () => {
    for (const [group, candidates] of [[4, 4], [1, 1], [3, 2]] as const) {
      const b = batch(group * 7 + candidates, 9, group, 3000, candidates, 2);
      const ref = calibrationSumsTs(b);
      expect(ref.length).toBe(9 * sampleSumsLength(b.grid.length));
      // The reference counts every sample but the empty one, and group query heads each.
      const heads = (i: number) => ref[i * sampleSumsLength(b.grid.length) + 4 * (b.grid.length + 1)];
      expect([0, 1, 2].map(heads)).toEqual([group, 0, group]);
      for (const threads of [1, 3]) expect(Array.from(createNativeCalibrationSums(threads)(b))).toEqual(Array.from(ref));
    }
  });

  it("a sample outside the data, an unordered grid or bad threads are one-line errors", () => {
    const b = batch(3, 2, 2, 500, 1, 0);
    const sums = createNativeCalibrationSums(2);
    expect(() => sums({ ...b, samples: Int32Array.of(0, 2, 4, 4, 501) })).toThrow(/outside the data/);
    expect(() => sums({ ...b, samples: Int32Array.of(0, 2, 11, 4, 400) })).toThrow(HybridgenError);
    expect(() => sums({ ...b, grid: [4, 4, 8] })).toThrow(/not increasing/);
    expect(() => createNativeCalibrationSums(0)).toThrow(/threads must be an integer/);
  });
});
