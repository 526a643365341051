import { describe, expect, it } from "vitest";
import { DEFAULT_K, HybridgenError, type SelectionTiming } from "@hybridgen/spec";
import { FeedbackScheduler, FixedScheduler } from "../src/index.js";
import { load, measure, rng, run, type Machine } from "./simulate.js";

// A CPU stage dominated by per-K costs: post at N = 8192 costs 0.5 + 0.82 + 0.003·K ms.
const balanced: Machine = { gpuMs: 5, fixedMs: 0.5, scoreMs: 1e-4, preScoreMs: 4e-4, gatherMs: 1e-3, txMs: 2e-3 };

describe("FeedbackScheduler: Algorithm 1, one decision at a time", () => {
  // Plain reference of the branch Algorithm 1 takes (with the deadband): the sign of ΔK and the timing.
  function reference(kMin: number, k: number, timing: SelectionTiming, loadMs: number, gpuMs: number, deadband: number) {
    if (loadMs <= (1 - deadband) * gpuMs) return { dir: 1, timing };
    if (loadMs > gpuMs) return k > kMin ? { dir: -1, timing } : { dir: 0, timing: "pre" as const };
    return { dir: 0, timing };
  }

  it("grows, shrinks, holds or switches to pre exactly where Algorithm 1 says (random single steps)", () => {
    const r = rng(42);
    for (let trial = 0; trial < 500; trial++) {
      const kMin = 16 + Math.floor(r() * 64);
      const k = r() < 0.3 ? kMin : kMin + 1 + Math.floor(r() * 2000);
      const offloaded = k + 1 + Math.floor(r() * 100_000);
      const gpu = 0.5 + r() * 10;
      const total = gpu * (0.3 + r() * 1.4);
      const cpuShare = r();
      const s = new FeedbackScheduler({ kMin, k, minDwellSteps: 0, kQuantum: 1 });
      const t = { step: 0, tGpuMs: gpu, tCpuMs: total * cpuShare, tTxMs: total * (1 - cpuShare), k, timing: "post" as const, offloaded };
      const d = s.next(t);
      const want = reference(kMin, k, "post", total, gpu, s.options.deadband);
      expect(Math.sign(d.k - k), `trial ${trial}`).toBe(want.dir);
      expect(d.timing, `trial ${trial}`).toBe(want.timing);
      expect(d.k).toBeGreaterThanOrEqual(kMin);
      expect(d.k).toBeLessThanOrEqual(k * s.options.maxStep);
    }
  });
});

describe("FeedbackScheduler: closed loop on synthetic timings", () => {
  it("converges so the CPU stage fills but does not exceed the GPU stage (post, fixed context)", () => {
    const s = new FeedbackScheduler({ kMin: 32 });
    const N = 8192;
    const tr = run(s, 40, () => balanced, () => N);
    const kStar = (balanced.gpuMs - balanced.fixedMs - balanced.scoreMs * N) / (balanced.gatherMs + balanced.txMs);
    const tail = tr.k.slice(-10);
    for (const k of tail) {
      const l = load(balanced, k, "post", N);
      expect(l).toBeLessThanOrEqual(balanced.gpuMs); // never stalls the pipeline once converged
      expect(l).toBeGreaterThanOrEqual((1 - s.options.deadband) * balanced.gpuMs * 0.99); // and uses the slack
      expect(Math.abs(k - kStar) / kStar).toBeLessThan(0.06);
    }
    expect(tr.timing.every((t) => t === "post")).toBe(true);
    expect(tr.k[0]).toBe(32); // Algorithm 1 starts at kMin
  });

  it("stays near the balance point under ±5% timing noise", () => {
    const s = new FeedbackScheduler({ kMin: 32 });
    const N = 8192;
    const tr = run(s, 200, () => balanced, () => N, 0.05, 7);
    const tail = tr.k.slice(-100).map((k) => load(balanced, k, "post", N) / balanced.gpuMs);
    const mean = tail.reduce((a, b) => a + b, 0) / tail.length;
    expect(mean).toBeGreaterThan(0.85);
    expect(mean).toBeLessThan(1.05);
    expect(Math.max(...tail)).toBeLessThan(1.25);
  });

  it("never leaves [kMin, kMax] on random machines, contexts and noise", () => {
    const r = rng(3);
    for (let trial = 0; trial < 40; trial++) {
      const kMin = 8 + Math.floor(r() * 200);
      const kMax = kMin + Math.floor(r() * 3000);
      const m: Machine = { gpuMs: 0.1 + r() * 20, fixedMs: r(), scoreMs: r() * 1e-3, preScoreMs: r() * 4e-3, gatherMs: r() * 3e-3, txMs: r() * 3e-3 };
      const s = new FeedbackScheduler({ kMin, kMax, minDwellSteps: Math.floor(r() * 6) });
      const tr = run(s, 150, () => m, (step) => Math.floor(r() * 10) + step * 97, r() * 0.3, trial);
      for (const k of tr.k) {
        expect(Number.isInteger(k)).toBe(true);
        expect(k).toBeGreaterThanOrEqual(kMin);
        expect(k).toBeLessThanOrEqual(kMax);
      }
    }
  });

  it("grows K from every kMin in 1…64 when the CPU stage is cheap, on the quantum's grid above kQuantum", () => {
    // Load a tenth of T_gpu at any K: growth is free up to the offloaded count.
    const cheap: Machine = { gpuMs: 5, fixedMs: 0.05, scoreMs: 0, preScoreMs: 0, gatherMs: 1e-6, txMs: 1e-6 };
    for (let kMin = 1; kMin <= 64; kMin++) {
      const s = new FeedbackScheduler({ kMin });
      const tr = run(s, 12, () => cheap, () => 8192);
      const at = `kMin ${kMin}: ${tr.k.join(" ")}`;
      expect(tr.k[0], at).toBe(kMin);
      expect(tr.k[1], at).toBeGreaterThan(kMin); // the first cheap step already grows it
      for (let i = 1; i < tr.k.length; i++) {
        expect(tr.k[i]!, at).toBeGreaterThanOrEqual(tr.k[i - 1]!);
        expect(tr.k[i]!, at).toBeLessThanOrEqual(tr.k[i - 1]! * s.options.maxStep);
      }
      expect(tr.k[tr.k.length - 1]!, at).toBeGreaterThanOrEqual(Math.min(8192, 64 * kMin, kMin + 8 * 16));
      // Past kQuantum, K stays on whole quanta from its first point there (graphs are re-recorded per K).
      const big = tr.k.filter((k) => k >= s.options.kQuantum);
      for (const k of big) expect((k - big[0]!) % s.options.kQuantum, at).toBe(0);
    }
  });

  it("pins K at kMax when even kMax leaves the GPU stage idle", () => {
    const s = new FeedbackScheduler({ kMin: 32, kMax: 500 });
    const tr = run(s, 30, () => balanced, () => 8192);
    expect(tr.k.slice(-5)).toEqual([500, 500, 500, 500, 500]);
  });

  it("switches to pre-QKᵀ when post is CPU-bound at kMin, then grows K under pre", () => {
    // Scoring all 64K offloaded tokens alone (6.5 ms) exceeds the 5 ms GPU stage.
    const N = 65536;
    const s = new FeedbackScheduler({ kMin: 64, k: 1024 });
    const tr = run(s, 60, () => balanced, () => N);
    const firstPre = tr.timing.indexOf("pre");
    expect(firstPre).toBeGreaterThan(0);
    expect(tr.k[firstPre - 1]).toBe(64); // it shrank to kMin first, as Algorithm 1 requires
    expect(tr.timing.slice(firstPre).every((t) => t === "pre")).toBe(true); // post cannot fit: no flapping back
    const kPre = (balanced.gpuMs - balanced.fixedMs) / (balanced.preScoreMs + balanced.gatherMs + balanced.txMs);
    const kEnd = tr.k[tr.k.length - 1]!;
    expect(Math.abs(kEnd - kPre) / kPre).toBeLessThan(0.06);
    expect(load(balanced, kEnd, "pre", N)).toBeLessThanOrEqual(balanced.gpuMs);
  });

  it("as the context grows, switches to pre only once post at kMin no longer fits", () => {
    const kMin = 64;
    const s = new FeedbackScheduler({ kMin });
    const N = (step: number) => 1000 + step * 200;
    const tr = run(s, 400, () => balanced, N);
    const firstPre = tr.timing.indexOf("pre");
    expect(firstPre).toBeGreaterThan(0);
    // Post at kMin is over budget only from this context on:
    const nCross = (balanced.gpuMs - balanced.fixedMs - (balanced.gatherMs + balanced.txMs) * kMin) / balanced.scoreMs;
    expect(N(firstPre - 1)).toBeGreaterThan(nCross);
    // ... and the switch follows the crossing within a few steps (walk K down, then dwell).
    const stepCross = Math.ceil((nCross - 1000) / 200);
    expect(firstPre - stepCross).toBeLessThan(12);
    expect(tr.timing.slice(firstPre).every((t) => t === "pre")).toBe(true);
  });

  it("returns to post when the GPU stage grows enough for post to fit again (and not before dwelling)", () => {
    const N = 65536;
    const s = new FeedbackScheduler({ kMin: 64, minDwellSteps: 5 });
    // The GPU stage triples at step 40 (e.g. a larger batch): post over 64K tokens fits again.
    const tr = run(s, 80, (step) => ({ ...balanced, gpuMs: step < 40 ? 5 : 15 }), () => N);
    expect(tr.timing[39]).toBe("pre");
    const back = tr.timing.indexOf("post", 40);
    expect(back).toBeGreaterThan(40);
    expect(back).toBeLessThan(48);
    expect(tr.k[back]).toBe(64); // comes back at the accuracy floor, then grows
    expect(tr.timing.slice(back).every((t) => t === "post")).toBe(true);
    expect(load(balanced, tr.k[79]!, "post", N)).toBeLessThanOrEqual(15);
    expect(tr.k[79]!).toBeGreaterThan(1000);
  });

  it("with allowPre false it stays post and holds kMin when CPU-bound", () => {
    const s = new FeedbackScheduler({ kMin: 64, allowPre: false });
    const tr = run(s, 30, () => balanced, () => 65536);
    expect(tr.timing.every((t) => t === "post")).toBe(true);
    expect(tr.k.slice(-5)).toEqual([64, 64, 64, 64, 64]);
  });

  it("follows the timing the engine actually ran, stops asking for one it could not run, and resets", () => {
    const s = new FeedbackScheduler({ kMin: 16 });
    s.next(measure(balanced, 0, 16, "pre", 4096));
    expect(s.state().timing).toBe("pre");
    expect(s.state().unavailable).toEqual(["post"]);
    expect(s.state().switches).toBe(0); // the engine's fallback is not a decision of the scheduler
    s.reset();
    expect(s.initial()).toEqual({ k: 16, timing: "post" });
    expect(s.state().switches).toBe(0);
  });
});

// The H200 figures of apps/bench/notes/scheduler.md's runaway: 8B shape, 32K context, window 4 096, verified logits, pre-QKᵀ.
// The device gathers, aggregates and re-scores the K rows: T_gpu 15 ms at K 256, 252 ms at every
// offloaded token (28 704); T_cpu 5 → 113 ms; the copy small. The load never catches T_gpu up.
const OFFLOADED = 28_704;
const GPU_PER_K = (252 - 15) / (OFFLOADED - 256);
const CPU_PER_K = (113 - 5) / (OFFLOADED - 256);
const h200 = (gpuPerKMs = GPU_PER_K): Machine => ({
  gpuMs: 15 - 256 * gpuPerKMs, gpuPerKMs, fixedMs: 5 - 256 * CPU_PER_K + 0.3, scoreMs: 0, preScoreMs: 0, gatherMs: CPU_PER_K, txMs: 0.001,
});
/** A step's noise-free wall time: the longer stage. */
const stepMs = (m: Machine, k: number) => Math.max(m.gpuMs + (m.gpuPerKMs ?? 0) * Math.min(k, OFFLOADED), load(m, k, "pre", OFFLOADED));

describe("FeedbackScheduler: a device stage that grows with K", () => {
  it("settles K at the cap where T_gpu has grown by gpuGrowth, not at the offloaded count (the 32K H200 runaway)", () => {
    const m = h200(), t0 = stepMs(m, 256);
    const cap = 256 + (0.1 * t0) / GPU_PER_K; // 436
    for (let seed = 1; seed <= 10; seed++) {
      const s = new FeedbackScheduler({ kMin: 256, timing: "pre" });
      const tr = run(s, 80, () => m, (step) => OFFLOADED + step, 0.1, seed);
      const at = `seed ${seed}: ${tr.k.join(" ")}`;
      // K doubles until a device line is determined (four steps), then walks back to the cap.
      expect(Math.max(...tr.k), at).toBeLessThanOrEqual(8 * 256);
      for (const k of tr.k.slice(-40)) {
        expect(Math.abs(k - cap) / cap, at).toBeLessThan(0.25);
        expect(stepMs(m, k) / t0, at).toBeLessThanOrEqual(1 + s.options.gpuGrowth + 0.05);
      }
      const mean = tr.k.reduce((a, k) => a + stepMs(m, k), 0) / tr.k.length;
      expect(mean / t0, at).toBeLessThan(1.2); // the doubling costs a few steps once
      expect(s.state().gpuMsPerK! / GPU_PER_K).toBeCloseTo(1, 0);
      expect(Math.abs(s.state().kCap! - cap) / cap).toBeLessThan(0.25);
    }
  });

  it("moves K in whole quanta and holds it while the cap jitters within one (each new K re-records the device's step)", () => {
    const m = h200();
    for (let seed = 1; seed <= 10; seed++) {
      const s = new FeedbackScheduler({ kMin: 256, timing: "pre" });
      const tr = run(s, 80, () => m, (step) => OFFLOADED + step, 0.1, seed);
      const tail = tr.k.slice(-40), at = `seed ${seed}: ${tr.k.join(" ")}`;
      for (const k of tr.k) expect((k - 256) % s.options.kQuantum, at).toBe(0);
      const changes = tail.filter((k, i) => i > 0 && k !== tail[i - 1]).length;
      expect(changes, at).toBeLessThanOrEqual(4);
      // Without the quantum the same loop changes K most steps: what made the device re-record its graphs.
      const fine = run(new FeedbackScheduler({ kMin: 256, timing: "pre", kQuantum: 1 }), 80, () => m, (step) => OFFLOADED + step, 0.1, seed).k.slice(-40);
      expect(fine.filter((k, i) => i > 0 && k !== fine[i - 1]).length, at).toBeGreaterThan(changes);
    }
  });

  it("scales the cap with gpuGrowth (0: back to kMin)", () => {
    const m = h200(), t0 = stepMs(m, 256);
    for (const gpuGrowth of [0, 0.3, 1]) {
      const cap = 256 + (gpuGrowth * t0) / GPU_PER_K;
      for (let seed = 1; seed <= 5; seed++) {
        const s = new FeedbackScheduler({ kMin: 256, timing: "pre", gpuGrowth });
        const tr = run(s, 80, () => m, (step) => OFFLOADED + step, 0.1, seed);
        const at = `gpuGrowth ${gpuGrowth}, seed ${seed}: ${tr.k.join(" ")}`;
        // The slope comes from the few steps K doubled through, ±10% noisy: ±30% at worst, so
        // the growth beyond T_gpu(kMin) is gpuGrowth within a third.
        for (const k of tr.k.slice(-40)) {
          expect(k, at).toBeLessThanOrEqual(cap * s.options.maxStep);
          expect(k, at).toBeGreaterThanOrEqual(cap / s.options.maxStep);
          expect(stepMs(m, k) / t0, at).toBeLessThanOrEqual(1 + 1.35 * gpuGrowth + 0.05);
        }
        if (gpuGrowth === 0) expect(tr.k.slice(-40).every((k) => k === 256)).toBe(true);
      }
    }
  });

  it("with T_gpu independent of K, grows K until the load balances, as Algorithm 1 does", () => {
    const m = h200(0);
    const f = 1 - new FeedbackScheduler().options.deadband / 2;
    const kBalance = (f * m.gpuMs - m.fixedMs) / (m.gatherMs + m.txMs); // ≈ 2 150
    for (let seed = 1; seed <= 10; seed++) {
      const s = new FeedbackScheduler({ kMin: 256, timing: "pre" });
      const tr = run(s, 80, () => m, (step) => OFFLOADED + step, 0.1, seed);
      const tail = tr.k.slice(-40);
      const mean = tail.reduce((a, k) => a + k, 0) / tail.length;
      expect(Math.abs(mean - kBalance) / kBalance, `seed ${seed}: ${tr.k.join(" ")}`).toBeLessThan(0.1);
    }
    // Without noise the device line is flat: no cap at all.
    const s = new FeedbackScheduler({ kMin: 256, timing: "pre" });
    const tr = run(s, 40, () => m, (step) => OFFLOADED + step);
    expect(s.state().kCap).toBeUndefined();
    expect(Math.abs(tr.k[39]! - kBalance) / kBalance).toBeLessThan(0.06);
  });
});

describe("FeedbackScheduler options", () => {
  it("rejects bad options and bad measurements with one-line errors naming the field", () => {
    expect(() => new FeedbackScheduler({ kMin: 100, kMax: 10 })).toThrow(/feedback scheduler options: kMax/);
    expect(() => new FeedbackScheduler({ kMin: 0 })).toThrow(HybridgenError);
    expect(() => new FeedbackScheduler({ kMin: 10, k: 5 })).toThrow(/k \(the first step's\)/);
    expect(() => new FeedbackScheduler({ maxStep: 1 })).toThrow(/maxStep/);
    expect(() => new FeedbackScheduler({ gpuGrowth: -0.1 })).toThrow(/feedback scheduler options: gpuGrowth/);
    expect(() => new FeedbackScheduler({ gpuGrowth: 1.5 })).toThrow(/feedback scheduler options: gpuGrowth/);
    expect(new FeedbackScheduler().options.gpuGrowth).toBe(0.1);
    expect(() => new FeedbackScheduler({ allowPre: false, timing: "pre" })).toThrow("feedback scheduler options: timing: timing pre needs allowPre");
    const s = new FeedbackScheduler();
    expect(() => s.next({ step: 0, tGpuMs: NaN, tCpuMs: 1, tTxMs: 1, k: 64, timing: "post", offloaded: 10 })).toThrow(/step timings: tGpuMs/);
  });
});

describe("the one K default", () => {
  it("fixed K and feedback kMin both default to core's DEFAULT_K; unknown keys name the key", () => {
    expect(new FixedScheduler().initial()).toEqual({ k: DEFAULT_K, timing: "post" });
    expect(new FeedbackScheduler().initial()).toEqual({ k: DEFAULT_K, timing: "post" });
    expect(new FeedbackScheduler({ kMin: 8, k: 32, timing: "pre" }).initial()).toEqual({ k: 32, timing: "pre" });
    expect(() => new FixedScheduler({ topK: 4 } as never)).toThrow(/fixed scheduler options: .*"topK"/);
    expect(() => new FeedbackScheduler({ kInitial: 4 } as never)).toThrow(/feedback scheduler options: .*"kInitial"/);
  });
});
