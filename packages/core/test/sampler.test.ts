import { describe, expect, it } from "vitest";
import { Sampler, SamplingOptionsSchema, Xoshiro128, parseSamplingOptions } from "../src/index.js";
import { makeRng, randomArray, testSeed } from "../src/testing/index.js";

function softmax(logits: ArrayLike<number>, ids: number[], temperature: number): Map<number, number> {
  const m = Math.max(...ids.map((i) => logits[i]));
  const e = ids.map((i) => Math.exp((logits[i] - m) / temperature));
  const z = e.reduce((a, v) => a + v, 0);
  return new Map(ids.map((id, j) => [id, e[j] / z]));
}

/** Draw `n` samples; check every pick is allowed and frequencies match `want` within 5 σ. */
function checkDistribution(sampler: Sampler, logits: Float32Array, want: Map<number, number>, n: number) {
  const counts = new Map<number, number>();
  for (let i = 0; i < n; i++) {
    const id = sampler.sample(logits.slice());
    expect(want.has(id), `picked ${id} outside the allowed set`).toBe(true);
    counts.set(id, (counts.get(id) ?? 0) + 1);
  }
  for (const [id, p] of want) {
    const sigma = Math.sqrt(n * p * (1 - p)) + 1;
    expect(Math.abs((counts.get(id) ?? 0) - n * p), `token ${id}: p=${p}`).toBeLessThan(5 * sigma);
  }
}

const byLogit = (logits: Float32Array) => Array.from(logits.keys()).sort((a, b) => logits[b] - logits[a] || a - b);

describe("Sampler", () => {
  const rng = makeRng(testSeed(21));

  it("same seed → same picks; another seed → different picks", () => {
    const logits = randomArray(rng, 300, 3);
    const run = (seed: number) => {
      const s = new Sampler(300, { temperature: 1, topK: 40, topP: 0.95, seed });
      return Array.from({ length: 200 }, () => s.sample(logits.slice()));
    };
    expect(run(7)).toEqual(run(7));
    expect(run(7)).not.toEqual(run(8));
    const a = new Sampler(300, { seed: 5 });
    const first = Array.from({ length: 50 }, () => a.sample(logits.slice()));
    a.reset();
    expect(Array.from({ length: 50 }, () => a.sample(logits.slice()))).toEqual(first);
  });

  it("the PRNG is uniform enough (mean and bucket counts)", () => {
    const r = new Xoshiro128(testSeed(3));
    const buckets = new Array(10).fill(0);
    let sum = 0;
    for (let i = 0; i < 100000; i++) {
      const v = r.next();
      expect(v >= 0 && v < 1).toBe(true);
      sum += v;
      buckets[Math.floor(v * 10)]++;
    }
    expect(Math.abs(sum / 100000 - 0.5)).toBeLessThan(0.005);
    for (const b of buckets) expect(Math.abs(b - 10000)).toBeLessThan(500);
  });

  it("temperature 0 is argmax (first index on ties), whatever top-k/top-p say", () => {
    for (let t = 0; t < 20; t++) {
      const logits = randomArray(rng, 97, 4);
      const s = new Sampler(97, { temperature: 0, topK: 3, topP: 0.5 });
      expect(s.sample(logits.slice())).toBe(byLogit(logits)[0]);
    }
    const tie = Float32Array.from([0, 2, 1, 2]);
    expect(new Sampler(4, { temperature: 0 }).sample(tie)).toBe(1);
  });

  it("top-k never picks outside the k best, with softmax frequencies over them", () => {
    const logits = randomArray(rng, 1000, 2);
    const top = byLogit(logits).slice(0, 5);
    const s = new Sampler(1000, { temperature: 0.7, topK: 5, topP: 1, seed: testSeed(4) });
    checkDistribution(s, logits, softmax(logits, top, 0.7), 20000);
  });

  it("top-p keeps the smallest nucleus reaching p (with and without top-k)", () => {
    const logits = randomArray(rng, 400, 4);
    const order = byLogit(logits);
    const all = softmax(logits, order, 1.3);
    let cum = 0, keep = 0;
    while (cum < 0.8) cum += all.get(order[keep++])!;
    const nucleus = softmax(logits, order.slice(0, keep), 1.3);
    expect(keep).toBeGreaterThan(1);
    checkDistribution(new Sampler(400, { temperature: 1.3, topP: 0.8, seed: testSeed(5) }), logits, nucleus, 20000);
    const k = Math.max(1, keep - 1); // top-k tighter than the nucleus: the cut applies within it
    const topK = softmax(logits, order.slice(0, k), 1.3);
    let c2 = 0, keep2 = 0;
    while (c2 < 0.8 && keep2 < k) c2 += topK.get(order[keep2++])!;
    checkDistribution(new Sampler(400, { temperature: 1.3, topK: k, topP: 0.8, seed: testSeed(6) }), logits,
      softmax(logits, order.slice(0, keep2), 1.3), 20000);
  });

  it("plain sampling follows the softmax of all tokens", () => {
    const logits = randomArray(rng, 8, 1.5);
    const s = new Sampler(8, { temperature: 1, topP: 1, seed: testSeed(7) });
    checkDistribution(s, logits, softmax(logits, [...logits.keys()], 1), 40000);
  });

  it("repetition penalty lowers observed ids (divide positive logits, multiply negative ones)", () => {
    const logits = Float32Array.from([3, -1, 2.5, 0.5, -2]);
    const s = new Sampler(5, { temperature: 0, repetitionPenalty: 2 });
    s.observeAll([0, 1, 0]);
    const l = logits.slice();
    expect(s.sample(l)).toBe(2); // 3 / 2 = 1.5 < 2.5
    expect(Array.from(l)).toEqual([1.5, -2, 2.5, 0.5, -2]);
    const plain = new Sampler(5, { temperature: 0 });
    plain.observe(0);
    expect(plain.sample(logits.slice())).toBe(0); // penalty 1 = off
  });

  it("validates options with one-line errors naming the option", () => {
    expect(() => parseSamplingOptions({ temperature: -1 })).toThrow(/invalid sampling option temperature/);
    expect(() => parseSamplingOptions({ topP: 0 })).toThrow(/invalid sampling option topP/);
    expect(() => parseSamplingOptions({ topP: 1.5 })).toThrow(/invalid sampling option topP/);
    expect(() => parseSamplingOptions({ topK: 2.5 })).toThrow(/invalid sampling option topK/);
    expect(() => parseSamplingOptions({ repetitionPenalty: 0.9 })).toThrow(/invalid sampling option repetitionPenalty/);
    expect(() => new Sampler(5).sample(new Float32Array(4))).toThrow(/4 logits for a vocabulary of 5/);
    const o = parseSamplingOptions({});
    expect(Number.isInteger(o.seed)).toBe(true);
    expect(SamplingOptionsSchema.parse({})).toMatchObject({ temperature: 1, topK: 0, topP: 0.9, repetitionPenalty: 1 });
  });
});
