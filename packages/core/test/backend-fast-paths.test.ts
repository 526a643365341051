// Core's use of the optional Backend fast paths (beginStep/endStep around a decode step,
// attnCausal for blocks over a contiguous cache, matvec fusions in decode steps), on a
// ReferenceBackend given a TypeScript f64 attnCausal, a matvec composed of its plain ops, and a
// step recorder that defers every op to endStep().
import { describe, expect, it } from "vitest";
import { LlamaModel, ReferenceBackend, type Backend, type MatvecFusion, type Tensor } from "../src/index.js";
import { maxAbsDiff, randomIds, testSeed, tinyModel } from "../src/testing/index.js";

const TOL = 1e-5; // f64 reference attention vs the f32 stage ops, on O(1) activations

/** out[i,h,:] = Σ_{j ≤ firstPos+i} softmax(scale·q·K) V, in f64 from the tensors' values. */
function causalReference(be: Backend, out: Tensor, q: Tensor, n: number, k: Tensor, v: Tensor, start: number, firstPos: number, scale: number): void {
  const [kvHeads, cap, hd] = k.shape;
  const width = q.shape[q.shape.length - 1], heads = width / hd, group = heads / kvHeads;
  const qv = be.read(q, 0, n * width), kv = be.read(k), vv = be.read(v);
  const res = new Float32Array(n * width);
  for (let i = 0; i < n; i++) {
    for (let h = 0; h < heads; h++) {
      const g = Math.floor(h / group), keys = firstPos + i + 1;
      const s = new Float64Array(keys);
      let max = -Infinity;
      for (let j = 0; j < keys; j++) {
        let dot = 0;
        for (let d = 0; d < hd; d++) dot += qv[i * width + h * hd + d] * kv[(g * cap + start + j) * hd + d];
        s[j] = dot * scale;
        max = Math.max(max, s[j]);
      }
      let sum = 0;
      for (let j = 0; j < keys; j++) sum += (s[j] = Math.exp(s[j] - max));
      for (let d = 0; d < hd; d++) {
        let acc = 0;
        for (let j = 0; j < keys; j++) acc += s[j] * vv[(g * cap + start + j) * hd + d];
        res[i * width + h * hd + d] = acc / sum;
      }
    }
  }
  be.write(out, res);
}

/**
 * A ReferenceBackend with the fast paths. Ops between beginStep and endStep are queued and run
 * at endStep (as a graph-replaying backend would), except reads, which run the queue first.
 */
function fastPathBackend(opts: { matvec?: boolean } = {}): { be: Backend; log: string[] } {
  const inner = new ReferenceBackend();
  const log: string[] = [];
  let queue: (() => void)[] | null = null;
  const flush = () => {
    const q = queue;
    queue = null;
    q?.forEach((f) => f());
    if (q) queue = [];
  };
  const extra: Record<string, (...a: never[]) => unknown> = {
    beginStep: (key: string) => { log.push(`beginStep:${key}`); queue = []; },
    endStep: () => { log.push("endStep"); flush(); queue = null; },
    attnCausal: (out: Tensor, q: Tensor, n: number, k: Tensor, v: Tensor, start: number, firstPos: number, scale: number) => {
      log.push(`attnCausal:${n}@${firstPos}`);
      const run = () => causalReference(inner, out, q, n, k, v, start, firstPos, scale);
      if (queue) queue.push(run);
      else run();
    },
  };
  if (opts.matvec) {
    extra.matvec = (out: Tensor, x: Tensor, w: Tensor, f: MatvecFusion) => {
      log.push(`matvec${f.normWeight ? "+norm" : ""}${f.siluMul ? "+silu" : ""}${f.accumulate ? "+acc" : ""}`);
      const run = () => matvecByParts(inner, out, x, w, f);
      if (queue) queue.push(run);
      else run();
    };
  }
  const be = new Proxy(inner, {
    get(target, prop) {
      if (typeof prop === "string" && prop in extra) return extra[prop];
      const v = Reflect.get(target, prop, target);
      if (typeof v !== "function") return v;
      return (...args: unknown[]) => {
        if (typeof prop === "string") log.push(prop);
        if (queue && prop !== "read" && prop !== "argmax") {
          // Arrays the caller reuses (ids, positions) are copied, as a recorder must.
          const copy = args.map((a) => (a instanceof Int32Array ? a.slice() : a));
          queue.push(() => (v as (...a: unknown[]) => unknown).apply(target, copy));
          return undefined;
        }
        if (queue) flush();
        return (v as (...a: unknown[]) => unknown).apply(target, args);
      };
    },
  }) as unknown as Backend;
  return { be, log };
}

/** Backend.matvec's definition, from the plain ops (the fused model must match the plain one). */
function matvecByParts(be: Backend, out: Tensor, x: Tensor, w: Tensor, f: MatvecFusion): void {
  const [rows, k] = w.shape, m = f.siluMul ? rows / 2 : rows;
  const h = be.alloc([1, k]), y = be.alloc([1, rows]);
  if (f.normWeight) be.rmsNorm(h, x, f.normWeight, 1, f.normEps ?? 0);
  else be.copyRows(h, 0, be.view(x, 0, [1, k]), 0, 1);
  be.matmul(y, h, w, 1, f.bias);
  const r = f.siluMul ? be.alloc([1, m]) : y;
  if (f.siluMul) be.siluMul(r, be.view(y, 0, [1, m]), be.view(y, m, [1, m]), 1);
  if (f.accumulate) be.add(out, out, r, 1);
  else be.copyRows(be.view(out, 0, [1, m]), 0, r, 0, 1);
  for (const t of new Set([h, y, r])) be.free(t);
}

describe("optional Backend fast paths", () => {
  it("prefill through attnCausal and recorded decode steps give the plain backend's logits", () => {
    const { files } = tinyModel({ seed: testSeed(41) });
    const ids = Int32Array.from(randomIds(testSeed(42), 30, 50));
    using plain = LlamaModel.load(files, new ReferenceBackend(), { prefillBlock: 8 });
    const { be, log } = fastPathBackend();
    using fast = LlamaModel.load(files, be, { prefillBlock: 8 });
    expect(maxAbsDiff(fast.forward(ids.subarray(0, 20), 0), plain.forward(ids.subarray(0, 20), 0))).toBeLessThan(TOL);
    // 20 tokens in blocks of 8: three blocks at positions 0, 8, 16, each layer once.
    expect(log.filter((s) => s.startsWith("attnCausal"))).toEqual(["attnCausal:8@0", "attnCausal:8@0", "attnCausal:8@8", "attnCausal:8@8", "attnCausal:4@16", "attnCausal:4@16"]);
    expect(log).not.toContain("attnLogits");
    expect(log.some((s) => s.startsWith("beginStep"))).toBe(false);
    for (let t = 20; t < ids.length; t++) {
      log.length = 0;
      expect(maxAbsDiff(fast.forward(ids.subarray(t, t + 1), t), plain.forward(ids.subarray(t, t + 1), t))).toBeLessThan(TOL);
      // The step is bracketed: beginStep first, endStep after the last matmul, then the read.
      expect(log[0]).toMatch(/^beginStep:decode-\d+$/);
      expect(log.indexOf("endStep")).toBe(log.lastIndexOf("matmul") + 1);
      expect(log[log.length - 1]).toBe("read");
      // A decode step over the contiguous cache is one attnCausal call a layer, no stage ops.
      expect(log.filter((s) => s.startsWith("attnCausal"))).toEqual([`attnCausal:1@${t}`, `attnCausal:1@${t}`]);
      expect(log).not.toContain("attnLogits");
    }
    expect(fast.argmaxLogits()).toBe(plain.argmaxLogits());
  });

  for (const attentionBias of [false, true]) {
    it(`decode steps through matvec fusions give the plain backend's logits (biases: ${attentionBias})`, () => {
      const { files } = tinyModel({ seed: testSeed(45), attentionBias });
      const ids = Int32Array.from(randomIds(testSeed(46), 24, 50));
      using plain = LlamaModel.load(files, new ReferenceBackend(), { prefillBlock: 8 });
      const { be, log } = fastPathBackend({ matvec: true });
      using fast = LlamaModel.load(files, be, { prefillBlock: 8 });
      expect(maxAbsDiff(fast.forward(ids.subarray(0, 16), 0), plain.forward(ids.subarray(0, 16), 0))).toBeLessThan(TOL);
      expect(log.some((s) => s.startsWith("matvec"))).toBe(false); // prefill keeps the matmuls
      for (let t = 16; t < ids.length; t++) {
        log.length = 0;
        expect(maxAbsDiff(fast.forward(ids.subarray(t, t + 1), t), plain.forward(ids.subarray(t, t + 1), t))).toBeLessThan(TOL);
        // Per layer: norm+qkv, o (+= x), norm+gate/up with SiLU·up, down (+= x); then norm+lm_head.
        const layer = ["matvec+norm", "matvec+acc", "matvec+norm+silu", "matvec+acc"];
        expect(log.filter((s) => s.startsWith("matvec"))).toEqual([...layer, ...layer, "matvec+norm"]);
        for (const op of ["rmsNorm", "matmul", "add", "siluMul"]) expect(log).not.toContain(op);
      }
      expect(fast.argmaxLogits()).toBe(plain.argmaxLogits());
    });
  }

  it("a KV window that offloads falls back to the stage ops", () => {
    const { files } = tinyModel({ seed: testSeed(43) });
    const ids = Int32Array.from(randomIds(testSeed(44), 28, 50));
    const opts = { prefillBlock: 8, gpuKvBudget: 12, kvEvictBlock: 4 };
    using plain = LlamaModel.load(files, new ReferenceBackend(), opts);
    const { be, log } = fastPathBackend();
    using fast = LlamaModel.load(files, be, opts);
    expect(maxAbsDiff(fast.forward(ids.subarray(0, 24), 0), plain.forward(ids.subarray(0, 24), 0))).toBeLessThan(TOL);
    // Blocks at 0 and 8 still see one span (eviction runs after a block); the block at 16
    // sees the offloaded store.
    expect(log.filter((s) => s.startsWith("attnCausal"))).toEqual(["attnCausal:8@0", "attnCausal:8@0", "attnCausal:8@8", "attnCausal:8@8"]);
    expect(log).toContain("attnLogits");
    for (let t = 24; t < ids.length; t++) {
      expect(maxAbsDiff(fast.forward(ids.subarray(t, t + 1), t), plain.forward(ids.subarray(t, t + 1), t))).toBeLessThan(TOL);
    }
  });
});
