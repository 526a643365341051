import { describe, expect, it } from "vitest";
import { HybridgenError, seededRandom } from "@hybridgen/core";
import { DEFAULT_K } from "@hybridgen/spec";
import { CAP_REFERENCE, calibrationGrid, calibrationSummary, checkMassTarget, decideCalibration, DEFAULT_MAX_SHARE, layerKCap, LayerCalibration, type CalibrationSample } from "../src/index.js";

/** `n` distinct values at least 1.25% apart (the bucket sort ties values within 0.8%), from 1 up, shuffled. */
function distinct(r: () => number, n: number): Float32Array {
  const v = Float32Array.from({ length: n }, (_, i) => 1.0125 ** i);
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(r() * (i + 1));
    [v[i], v[j]] = [v[j]!, v[i]!];
  }
  return v;
}

function softmax(x: Float32Array): Float32Array {
  const m = Math.max(...x);
  const e = x.map((v) => Math.exp(v - m));
  const z = e.reduce((a, b) => a + b, 0);
  return e.map((v) => v / z);
}

/** A sample of one query head: logits over `total` positions, the offloaded ones [from, to); q̃'s logits `spec`. */
function sample(logits: Float32Array, spec: Float32Array | null, from: number, to: number): CalibrationSample {
  return { logits: [logits], specLogits: spec ? [spec] : null, probs: [softmax(logits)], from, to };
}

/** Reference by full sorts: the share of mass the window plus the top-K offloaded tokens under `rank` hold. */
function refShare(logits: Float32Array, rank: Float32Array, from: number, to: number, k: number): number {
  const p = softmax(logits);
  const off = [...Array(to - from).keys()].map((j) => j + from);
  const top = [...off].sort((a, b) => rank[b]! - rank[a]!).slice(0, k);
  const offMass = off.reduce((s, j) => s + p[j]!, 0);
  return Math.min(1, 1 - offMass + top.reduce((s, j) => s + p[j]!, 0));
}

describe("prefill calibration's arithmetic", () => {
  const r = seededRandom(11);
  const total = 300, from = 2, to = 250;

  it("mass shares and q̃'s recall equal a brute-force count on every grid K", () => {
    const grid = calibrationGrid(to - from);
    for (const c of [1, 3]) {
      const acc = new LayerCalibration(grid, c);
      const logits = distinct(r, total).map((v) => v / 4);
      const spec = distinct(r, total);
      acc.add(sample(logits, spec, from, to));
      grid.forEach((k, b) => {
        if (k >= to - from) return;
        expect(acc.meanShare(b, false)).toBeCloseTo(refShare(logits, logits, from, to, k), 6);
        expect(acc.meanShare(b, true)).toBeCloseTo(refShare(logits, spec, from, to, c * k), 6);
        const trueTop = new Set([...Array(to - from).keys()].map((j) => j + from).sort((x, y) => logits[y]! - logits[x]!).slice(0, k));
        const specTop = [...Array(to - from).keys()].map((j) => j + from).sort((x, y) => spec[y]! - spec[x]!).slice(0, c * k);
        expect(acc.meanRecall(b)).toBeCloseTo(specTop.filter((j) => trueTop.has(j)).length / k, 9);
      });
    }
  });

  /** Sharp attention: a few offloaded tokens far above the rest. */
  const sharp = () => {
    const x = Float32Array.from({ length: total }, () => r() * 2);
    for (let i = 0; i < 6; i++) x[from + Math.floor(r() * (to - from))] = 14 + r();
    return x;
  };

  it("a layer whose q̃ ranks the tokens backwards is exact; one whose q̃ is q is not; K reaches the target on every layer", () => {
    const grid = calibrationGrid(to - from);
    const layers = [0, 1, 2].map(() => new LayerCalibration(grid, 4));
    for (let s = 0; s < 8; s++) {
      const a = sharp(), b = sharp(), c = sharp();
      layers[0]!.add(sample(a, null, from, to));
      layers[1]!.add(sample(b, b.map((v) => -v), from, to));
      layers[2]!.add(sample(c, c, from, to));
    }
    const d = decideCalibration(layers, { massTarget: 0.95, offloaded: to - from, tokens: total, ms: 1, samples: 8 });
    expect(d.exactLayers).toEqual([1]);
    expect(d.layerRecall[1]).toBeLessThan(0.2);
    expect(d.layerRecall[2]).toBe(1);
    expect(d.k).toBe(Math.max(...d.layerK));
    expect(d.layerK.every((k) => k < 32)).toBe(true);
    for (const s of d.layerShare) expect(s).toBeGreaterThanOrEqual(0.95);
    // Exact layers given: no choice is made, those layers' K is the true query's.
    expect(decideCalibration(layers, { massTarget: 0.95, offloaded: to - from, tokens: total, ms: 1, samples: 8, exact: [] }).exactLayers).toEqual([]);
  });

  it("even attention needs most of the tokens; the cap bounds a broad layer's K, never a sharp one's", () => {
    const big = 4000, grid = calibrationGrid(big);
    const even = new LayerCalibration(grid, 1), sharpLayer = new LayerCalibration(grid, 1);
    for (let s = 0; s < 4; s++) {
      const x = Float32Array.from({ length: big + 10 }, () => r() * 0.01);
      even.add(sample(x, x, 2, big + 2));
      const y = Float32Array.from({ length: big + 10 }, () => r() * 2);
      for (let i = 0; i < 6; i++) y[2 + Math.floor(r() * big)] = 16 + r();
      sharpLayer.add(sample(y, y, 2, big + 2));
    }
    const o = { massTarget: 0.95, offloaded: big, tokens: big + 10, ms: 1, samples: 4 };
    const all = decideCalibration([even, sharpLayer], { ...o, maxShare: Infinity });
    expect(all.k).toBeGreaterThan(0.7 * big);
    expect(all.k).toBeLessThanOrEqual(big);
    const capped = decideCalibration([even, sharpLayer], o);
    expect(capped.kCap).toBe(layerKCap(big, DEFAULT_MAX_SHARE));
    expect(capped.kCap).toBe(Math.ceil(big * DEFAULT_MAX_SHARE));
    expect(capped.layerK[0]).toBe(capped.kCap);
    expect(capped.layerShare[0]).toBeLessThan(0.95);
    expect(capped.layerK[1]).toBe(all.layerK[1]);
    expect(capped.layerK[1]).toBeLessThan(32);
    expect(capped.exactLayers).toEqual(all.exactLayers);
    expect(calibrationSummary(capped)).toContain(`(at most ${capped.kCap} a layer)`);
    expect(calibrationSummary(all)).not.toContain("at most");
    // Short contexts keep DEFAULT_K, and never more than what is offloaded.
    expect(layerKCap(300, DEFAULT_MAX_SHARE)).toBe(DEFAULT_K);
    expect(layerKCap(40, DEFAULT_MAX_SHARE)).toBe(40);
  });

  it("the cap's share falls with the context past CAP_REFERENCE: its rows grow as the square root", () => {
    expect(layerKCap(CAP_REFERENCE, DEFAULT_MAX_SHARE)).toBe(CAP_REFERENCE / 8);
    expect(layerKCap(4 * CAP_REFERENCE, DEFAULT_MAX_SHARE)).toBe(CAP_REFERENCE / 4);
    expect(layerKCap(131072, DEFAULT_MAX_SHARE)).toBe(2897);
    expect(layerKCap(1 << 20, DEFAULT_MAX_SHARE)).toBe(8192);
    let share = 1;
    for (let n = 2048; n <= 1 << 22; n *= 2) {
      const cap = layerKCap(n, DEFAULT_MAX_SHARE);
      expect(cap / n).toBeLessThanOrEqual(share);
      expect(cap).toBeGreaterThan(layerKCap(n / 2, DEFAULT_MAX_SHARE));
      share = cap / n;
    }
    // Uncapped: every offloaded token.
    expect(layerKCap(131072, Infinity)).toBe(131072);
    expect(layerKCap(1, Infinity)).toBe(1);
  });

  it("a mass target must be in (0, 1]", () => {
    expect(checkMassTarget(1)).toBe(1);
    expect(checkMassTarget(0.5)).toBe(0.5);
    for (const bad of [0, -0.1, 1.01, Number.NaN, "0.9"]) expect(() => checkMassTarget(bad)).toThrow(HybridgenError);
    expect(() => checkMassTarget(0)).toThrow("massTarget must be above 0 (got 0)");
  });
});
