import { describe, expect, it } from "vitest";
import { createCpuBackend, cpuFeatures, type CpuBackend } from "../src/index.js";
import { encode, expectClose, randn, rng, supportedIsas } from "./helpers.js";
import { refAggregate } from "./reference.js";

// Multithreaded results must equal single-threaded ones: matmul and logits rows are computed
// identically whatever the split (bit-equal); aggregate sums per-thread partials in another
// order, so it is compared at 1e-5 * sum |p v| (the f32 accumulation bound used elsewhere).
describe.each(supportedIsas())("thread pool isa=%s", (isa) => {
  it("really runs on several OS threads", () => {
    using two = createCpuBackend({ isa, threads: 2 });
    using four = createCpuBackend({ isa, threads: 4 });
    expect(two.threads).toBe(2);
    expect(two.probeThreads()).toBe(2);
    expect(four.probeThreads()).toBe(4); // more threads than cores still works
  });

  it("gives the same results with 1, 2 and 3 threads", () => {
    const backs: CpuBackend[] = [1, 2, 3].map((threads) => createCpuBackend({ isa, threads }));
    const r = rng(53);
    const m = 1001, k = 289, n = 3;
    const w = encode(randn(r, m * k), "bf16");
    const x = randn(r, n * k);
    const heads = 8, kvHeads = 2, d = 64, cap = 2000;
    const kv = randn(r, kvHeads * cap * d);
    const q = randn(r, heads * d);
    const probs = Float32Array.from(randn(r, heads * cap), Math.abs);
    const results = backs.map((be) => {
      const wt = be.loadWeight(w.bytes, "bf16", [m, k]);
      const xt = be.alloc([n, k]);
      be.write(xt, x);
      const ot = be.alloc([n, m]);
      be.matmul(ot, xt, wt, n);
      const kt = be.alloc([kvHeads, cap, d]);
      be.write(kt, kv);
      const qt = be.alloc([1, heads * d]);
      be.write(qt, q);
      const lt = be.alloc([heads, cap]);
      be.attnLogits(lt, 0, qt, 0, kt, 0, cap, 0.125);
      const pt = be.alloc([heads, cap]);
      be.write(pt, probs);
      const at = be.alloc([1, heads * d]);
      be.attnAggregate(at, 0, pt, 0, kt, 0, cap, false);
      return { mm: be.read(ot), lg: be.read(lt), ag: be.read(at) };
    });
    const mag = refAggregate(probs, cap, kv, heads, kvHeads, d, cap, Array.from({ length: cap }, (_, j) => j)).mag;
    for (const [i, res] of results.entries()) {
      expect(Buffer.from(res.mm.buffer).equals(Buffer.from(results[0].mm.buffer)), `matmul ${i + 1} threads`).toBe(true);
      expect(Buffer.from(res.lg.buffer).equals(Buffer.from(results[0].lg.buffer)), `logits ${i + 1} threads`).toBe(true);
      expectClose(res.ag, results[0].ag, mag.map((a) => 1e-5 * a + 1e-6), `aggregate ${i + 1} threads`);
    }
    for (const be of backs) be.close();
  });

  it("streamSum reads every element", () => {
    using be = createCpuBackend({ isa, threads: 2 });
    const x = randn(rng(59), 100_003);
    const t = be.alloc([x.length]);
    be.write(t, x);
    const want = x.reduce((a, b) => a + b, 0);
    expect(Math.abs(be.streamSum(t) - want)).toBeLessThan(1e-3);
  });
});

it("cpuFeatures reports a usable ISA", () => {
  const f = cpuFeatures();
  expect(["generic", "avx2", "avx512"]).toContain(f.best);
  expect(f.cpus).toBeGreaterThan(0);
  if (f.avx512) expect(f.avx2).toBe(true);
});
