/**
 * The hybrid profile (schema, cache path, atomic write, read, malformed files) and the
 * measurements behind it: the speculation recall probe against a brute-force count over the
 * same steps, and teacher-forced agreement.
 */
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { HybridgenError, LlamaModel, ReferenceBackend, type DecodeAttention, type Tensor } from "@hybridgen/core";
import { AgreementMeter, SpeculationRecallProbe, forcedSteps, hybridProfilePath, readHybridProfile, referenceStep, teacherForce, writeHybridProfile, type HybridProfile } from "../src/index.js";
import { randomIds, testSeed, tinyModel } from "@hybridgen/core/testing";

let tmp = "";
beforeAll(() => {
  tmp = mkdtempSync(join(tmpdir(), "hybridgen-profile-"));
});
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

function modelDir(name: string, config: object): string {
  const dir = join(tmp, name);
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "config.json"), JSON.stringify(config));
  return dir;
}

const PROFILE: HybridProfile = {
  version: 1, model: "/models/x", tolerance: 0.99, selector: "topk", kMin: 32,
  perSelector: {
    topk: { kMin: 32, agreement: [[16, 0.97, 0.01], [32, 0.995, 0.002]] },
    streaming: { kMin: null, agreement: [[16, 0.8, 0.3], [32, 0.85, 0.2]] },
  },
  exactLayers: [1], layerRecall: [1, 0.4, 0.95], layerMassRecall: [1, 0.7, 0.99], recallMetric: "tokens", candidates: 4, recallK: 32, recallThreshold: 0.9,
  gpuKvBudget: 64, sinkTokens: 4, steps: 200, createdAt: "2026-12-02T22:00:00.000Z",
};

describe("hybrid profile file", () => {
  it("round-trips through the cache, atomically, under a key of the directory and its config", () => {
    const cache = join(tmp, "cache");
    const dir = modelDir("m1", { a: 1 });
    expect(readHybridProfile(dir, cache)).toBeNull();
    const path = writeHybridProfile(dir, PROFILE, cache);
    expect(path).toBe(hybridProfilePath(dir, cache));
    expect(path.startsWith(join(cache, "profiles", "m1-"))).toBe(true);
    expect(readHybridProfile(dir, cache)).toEqual(PROFILE);
    expect(readdirSync(join(cache, "profiles"))).toEqual([path.slice(path.lastIndexOf("/") + 1)]); // no temp file left
    // Another config in the same directory is another model; so is another directory.
    writeFileSync(join(dir, "config.json"), JSON.stringify({ a: 2 }));
    expect(hybridProfilePath(dir, cache)).not.toBe(path);
    expect(readHybridProfile(dir, cache)).toBeNull();
    expect(hybridProfilePath(modelDir("m2", { a: 1 }), cache)).not.toBe(path);
    expect(hybridProfilePath("preset:llama-3.1-8b", cache)).toBe(join(cache, "profiles", "preset-llama-3.1-8b.json"));
  });

  it("a malformed file, a missing model and an invalid profile are one-line errors naming them", () => {
    const cache = join(tmp, "cache-bad");
    const dir = modelDir("m3", { b: 1 });
    const path = hybridProfilePath(dir, cache);
    mkdirSync(join(cache, "profiles"), { recursive: true });
    writeFileSync(path, "{ not json");
    expect(() => readHybridProfile(dir, cache)).toThrow(HybridgenError);
    expect(() => readHybridProfile(dir, cache)).toThrow(new RegExp(`^${path.replace(/[.]/g, "\\.")}: a hybrid profile is not valid JSON`));
    writeFileSync(path, JSON.stringify({ ...PROFILE, kMin: 0 }));
    expect(() => readHybridProfile(dir, cache)).toThrow(/: not a valid hybrid profile \(kMin: .*\); run hybridgen profile-kmin again$/);
    writeFileSync(path, JSON.stringify({ ...PROFILE, exactLayers: [3] }));
    expect(() => readHybridProfile(dir, cache)).toThrow(/exactLayers names a layer beyond layerRecall/);
    expect(() => hybridProfilePath(join(tmp, "nope"), cache)).toThrow(/nope: no such model directory/);
    expect(() => hybridProfilePath(join(tmp, "cache"), cache)).toThrow(/config\.json: cannot read \(ENOENT\)/);
    expect(() => writeHybridProfile(dir, { ...PROFILE, tolerance: 2 }, cache)).toThrow(/not a valid hybrid profile \(tolerance/);
  });
});

/** Recall by an independent count: f64 dot products, sets of indices (not the probe's ranks). */
class BruteRecall implements DecodeAttention {
  sums: number[][] = [];
  massSums: number[][] = [];
  counts: number[][] = [];
  private spec: (Float32Array | null)[] = [];
  private pos = 0;
  constructor(
    private readonly model: LlamaModel, private readonly inner: DecodeAttention, private readonly ks: number[], private readonly specQ: Tensor,
    private readonly candidates: number,
  ) {
    const L = model.shape.layers;
    this.sums = Array.from({ length: L }, () => ks.map(() => 0));
    this.massSums = Array.from({ length: L }, () => ks.map(() => 0));
    this.counts = Array.from({ length: L }, () => ks.map(() => 0));
  }
  newSequence() { this.inner.newSequence(); }
  beginStep(pos: number) {
    this.pos = pos;
    this.spec = [];
    this.inner.beginStep(pos);
  }
  layerInput(layer: number, x: Tensor) {
    if (layer + 1 < this.model.shape.layers) {
      this.model.projectQuery(layer + 1, x, this.pos, this.specQ);
      this.spec[layer + 1] = this.model.backend.read(this.specQ).slice();
    }
    this.inner.layerInput(layer, x);
  }
  attend(layer: number, q: Tensor, out: Tensor) {
    const c = this.model.cache, n = c.storeCount, s = this.model.shape, hd = s.headDim, group = s.heads / s.kvHeads;
    const spec = this.spec[layer];
    if (n > 0 && layer > 0 && spec) {
      const trueQ = this.model.backend.read(q).slice();
      const k = this.model.backend.read(c.stageStoreK(layer)); // [kvHeads, cap, hd]
      for (let g = 0; g < s.kvHeads; g++) {
        const best = (qq: Float32Array) => Array.from({ length: n }, (_, j) => {
          let m = -Infinity;
          for (let h = g * group; h < (g + 1) * group; h++) {
            let d = 0;
            for (let e = 0; e < hd; e++) d += qq[h * hd + e] * k[(g * c.storeCapacity + j) * hd + e];
            m = Math.max(m, d);
          }
          return m;
        });
        const top = (v: number[], kk: number) => new Set(v.map((x, i) => i).sort((a, b) => v[b] - v[a] || a - b).slice(0, kk));
        const bt = best(trueQ), bs = best(spec);
        // Each query head's attention over the offloaded tokens alone.
        const probs = Array.from({ length: group }, (_, o) => {
          const h = g * group + o;
          const l = Array.from({ length: n }, (_, j) => {
            let d = 0;
            for (let e = 0; e < hd; e++) d += trueQ[h * hd + e] * k[(g * c.storeCapacity + j) * hd + e];
            return d / Math.sqrt(hd);
          });
          const m = Math.max(...l), e = l.map((x) => Math.exp(x - m)), z = e.reduce((x, y) => x + y);
          return e.map((x) => x / z);
        });
        this.ks.forEach((kk, i) => {
          if (n <= kk) return;
          const a = top(bt, kk), b = top(bs, kk * this.candidates);
          this.sums[layer][i] += [...a].filter((x) => b.has(x)).length / kk;
          const mass = (p: number[], set: Set<number>) => [...set].reduce((acc, j) => acc + p[j], 0);
          this.massSums[layer][i] += probs.reduce((acc, p) => acc + Math.min(1, mass(p, b) / mass(p, a)), 0) / group;
          this.counts[layer][i]++;
        });
      }
    }
    this.inner.attend(layer, q, out);
  }
  endStep() { this.inner.endStep(); }
}

describe("speculation recall probe and teacher-forced agreement", () => {
  it.each([1, 3])("recall equals a brute-force count; logits stay full attention's; layer 0 and K ≥ offloaded give 1 (candidates %i×)", (candidates) => {
    const { files } = tinyModel({ seed: testSeed(900), layers: 3, heads: 4, kvHeads: 2, maxPositions: 64 });
    const ids = randomIds(testSeed(901), 48);
    const be = new ReferenceBackend();
    const plain = LlamaModel.load(files, be, { maxContext: 48, gpuKvBudget: 12, sinkTokens: 2 });
    const want: Float32Array[] = [];
    teacherForce(plain, ids, 12, (l) => want.push(l.slice()));
    expect(want.length).toBe(forcedSteps(ids.length, 12));

    const ks = [2, 5, 40];
    const probe = new SpeculationRecallProbe(plain.attention, plain, ks, candidates);
    const specQ = be.alloc([1, files.shape.heads * files.shape.headDim]);
    const brute = new BruteRecall(plain, probe, ks, specQ, candidates);
    plain.attention.setDecodeAttention(brute);
    const got: Float32Array[] = [];
    teacherForce(plain, ids, 12, (l) => got.push(l.slice()));
    expect(got).toEqual(want);

    const r = probe.recall(), mr = probe.massRecall();
    expect(r[0]).toEqual([1, 1, 1]);
    expect(mr[0]).toEqual([1, 1, 1]);
    for (let l = 1; l < 3; l++) {
      for (let i = 0; i < 2; i++) {
        expect(probe.samples(l, i)).toBe(brute.counts[l][i]);
        expect(brute.counts[l][i]).toBeGreaterThan(0);
        expect(r[l][i]).toBeCloseTo(brute.sums[l][i] / brute.counts[l][i], 9);
        expect(mr[l][i]).toBeCloseTo(brute.massSums[l][i] / brute.counts[l][i], 5);
      }
      expect(r[l][2]).toBe(1); // 40 ≥ every offloaded count here: nothing to miss
      expect(mr[l][2]).toBe(1);
      expect(probe.samples(l, 2)).toBe(0);
    }
    expect(r.slice(1).some((row) => row[0] < 1)).toBe(true); // q̃ is not q: the count is not trivial
    plain.attention.setDecodeAttention(null);
    probe.close();
    be.free(specQ);
    plain.close();
    expect(be.liveTensors()).toBe(0);
  });

  it("AgreementMeter: top-1 agreement and KL(full ‖ other), 0 for identical logits", () => {
    const a = Float32Array.of(1, 3, 2), b = Float32Array.of(3, 1, 2);
    const m = new AgreementMeter();
    m.add(referenceStep(a), a);
    expect(m.top1).toBe(1);
    expect(m.meanKl).toBeCloseTo(0, 12);
    m.add(referenceStep(a), b);
    expect(m.steps).toBe(2);
    expect(m.top1).toBe(0.5);
    const p = [Math.exp(1), Math.exp(3), Math.exp(2)], z = p.reduce((x, y) => x + y);
    const kl = (p[0] / z) * (1 - 3) + (p[1] / z) * (3 - 1) + 0; // log p − log q, shared normaliser
    expect(m.meanKl).toBeCloseTo(kl / 2, 6);
  });
});
