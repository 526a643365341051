import { describe, expect, it } from "vitest";
import { type DType } from "@hybridgen/spec";
import { topKSelection } from "@hybridgen/spec/kit";
import { cpuFeatures, createCpuBackend, NativeCpuStage, type NativeCpuStageOptions } from "../src/index.js";
import { sketchKeys, sketchRowBytes, sketchScores } from "../src/key-scoring.js";
import { encode, randn, rng, SEED } from "./helpers.js";
import { refEncode, refRowBytes, refScores } from "./kq-reference.js";

const FORMS = ["int8", "int4"] as const;
const features = cpuFeatures();
// 0 portable, 1 AVX2, 2 AVX-512: every kernel this CPU runs
const isas = [0, ...(features.avx2 ? [1] : []), ...(features.avx512 ? [2] : [])];
const isaNames = ["portable", "AVX2", "AVX-512"];

describe(`compressed K rows: native == the TypeScript reference (seed ${SEED})`, () => {
  // head dims of recall-4l (32), stories15M (48), Llama-3.1-8B (128), and one off the 32-channel blocks
  for (const [heads, kvHeads, d] of [[8, 2, 32], [6, 6, 48], [8, 2, 128], [6, 2, 40]] as const) {
    for (const dtype of ["f32", "bf16"] as DType[]) {
      it(`${heads}/${kvHeads} heads × ${d}, ${dtype}: records and scores bit for bit (${isas.map((i) => isaNames[i]).join(", ")}), 37 rows`, () => {
        const r = rng(d * 7 + heads), n = 37;
        const raw = randn(r, kvHeads * n * d, 2);
        for (let i = 0; i < d; i++) raw[5 * d + i] = 0; // an all-zero row: scale 0
        raw[3 * d + 1] = 40; // one large channel: its row's other codes are small
        const { bytes, decoded } = encode(raw, dtype);
        const q = randn(r, heads * d);
        for (let i = 0; i < d; i++) q[i] = 0; // a zero query head
        for (const form of FORMS) {
          expect(sketchRowBytes(form, d)).toBe(refRowBytes(form, d));
          const rec = sketchKeys(form, bytes, dtype, kvHeads, n, d);
          expect(Buffer.from(rec).equals(Buffer.from(refEncode(form, decoded, kvHeads, n, d))), `${form} records`).toBe(true);
          const want = refScores(form, q, heads, kvHeads, d, rec, n);
          for (const isa of isas) expect(Array.from(sketchScores(form, q, heads, kvHeads, d, rec, n, isa)), `${form} isa ${isa}`).toEqual(Array.from(want));
        }
      });
    }
  }
});

describe(`two-step top-K in NativeCpuStage (seed ${SEED})`, () => {
  const heads = 8, kvHeads = 2, d = 64;

  function setup(n: number, options: NativeCpuStageOptions) {
    const cpu = createCpuBackend({ threads: 2 });
    const stage = new NativeCpuStage(cpu, { threads: 2, ...options });
    stage.prepare({ heads, kvHeads, headDim: d, storeCapacity: n, dtype: "bf16" });
    return { cpu, stage };
  }

  it("with rescoreFactor·K covering every row, equals full scoring: ids, logits and V rows (1001 rows, per KV head and shared)", () => {
    const r = rng(91), n = 1001;
    const k = randn(r, kvHeads * n * d), v = randn(r, kvHeads * n * d), q = randn(r, heads * d);
    for (const form of FORMS) {
      const a = setup(n, { scoring: "full" }), b = setup(n, { scoring: form, rescoreFactor: 64 });
      const Ka = a.cpu.alloc([kvHeads, n, d], "bf16"), Va = a.cpu.alloc([kvHeads, n, d], "bf16");
      const Kb = b.cpu.alloc([kvHeads, n, d], "bf16"), Vb = b.cpu.alloc([kvHeads, n, d], "bf16");
      for (const [be, K, V] of [[a.cpu, Ka, Va], [b.cpu, Kb, Vb]] as const) {
        be.write(K, k);
        be.write(V, v);
      }
      for (const [budget, shared] of [[17, false], [40, true]] as const) {
        for (const s of [a.stage, b.stage]) s.query(0).set(q);
        a.stage.submit({ slot: 0, k: Ka, v: Va, offloaded: n, kmax: budget, scale: 0.125, work: { kind: "topk", budget, shared } });
        a.stage.wait();
        b.stage.submit({ slot: 0, k: Kb, v: Vb, offloaded: n, kmax: budget, scale: 0.125, work: { kind: "topk", budget, shared }, storeEpoch: 0 });
        b.stage.wait();
        const x = a.stage.output(0), y = b.stage.output(0);
        expect(Array.from(y.ids), `${form} ids`).toEqual(Array.from(x.ids));
        expect(Array.from(y.counts)).toEqual(Array.from(x.counts));
        expect(Array.from(y.logits.subarray(0, heads * budget)), `${form} logits`).toEqual(Array.from(x.logits.subarray(0, heads * budget)));
        expect(Array.from(b.cpu.read(y.values))).toEqual(Array.from(a.cpu.read(x.values)));
      }
      expect(b.stage.sketchBytes).toBe(kvHeads * n * sketchRowBytes(form, d));
      a.stage.close(); b.stage.close(); a.cpu.close(); b.cpu.close();
    }
  });

  it("with few candidates finds most of the exact top-K; rows appended or rewritten (a new epoch) are encoded again", () => {
    const r = rng(92), n = 3001, budget = 32;
    const k = randn(r, kvHeads * n * d), q = randn(r, heads * d);
    for (const form of FORMS) {
      const { cpu, stage } = setup(n, { scoring: form, rescoreFactor: 4 });
      const K = cpu.alloc([kvHeads, n, d], "bf16"), V = cpu.alloc([kvHeads, n, d], "bf16");
      cpu.write(K, k);
      stage.query(0).set(q);
      const run = (offloaded: number, storeEpoch: number) => {
        stage.submit({ slot: 0, k: K, v: V, offloaded, kmax: budget, scale: 0.125, work: { kind: "topk", budget, shared: false }, storeEpoch });
        stage.wait();
        return Array.from(stage.output(0).ids);
      };
      const exact = (offloaded: number) => {
        // the exact top-K from the stage's own full logits: score job, then the TS top-K
        using full = new NativeCpuStage(cpu, { threads: 1 });
        full.prepare({ heads, kvHeads, headDim: d, storeCapacity: n, dtype: "bf16" });
        full.query(0).set(q);
        full.submit({ slot: 0, k: K, v: V, offloaded, kmax: 0, scale: 0.125, work: { kind: "score" } });
        full.wait();
        const sel = topKSelection(full.allLogits(), offloaded, budget, false, { heads, kvHeads });
        return sel.kind === "perKvHead" ? sel.ids.map((x) => Array.from(x)) : [];
      };
      const recall = (got: number[], want: number[][]) => {
        let hit = 0;
        for (let g = 0; g < kvHeads; g++) {
          const s = new Set(got.slice(g * budget, (g + 1) * budget));
          hit += want[g].filter((id) => s.has(id)).length;
        }
        return hit / (kvHeads * budget);
      };
      expect(recall(run(2000, 0), exact(2000)), form).toBeGreaterThanOrEqual(0.9);
      const grown = run(n, 0); // rows [2000, 3001) are encoded now
      expect(recall(grown, exact(n)), form).toBeGreaterThanOrEqual(0.9);
      // the same rows, rewritten in place (a restored cache evicting other tokens): a new epoch
      const k2 = randn(r, kvHeads * n * d);
      cpu.write(K, k2);
      const again = run(n, 1);
      const fresh = new NativeCpuStage(cpu, { threads: 2, scoring: form, rescoreFactor: 4 });
      fresh.prepare({ heads, kvHeads, headDim: d, storeCapacity: n, dtype: "bf16" });
      fresh.query(0).set(q);
      fresh.submit({ slot: 0, k: K, v: V, offloaded: n, kmax: budget, scale: 0.125, work: { kind: "topk", budget, shared: false } });
      fresh.wait();
      expect(again, form).toEqual(Array.from(fresh.output(0).ids));
      fresh.close();
      stage.close();
      cpu.close();
    }
  });

  it("bad options are one-line errors", () => {
    using cpu = createCpuBackend({ threads: 1 });
    expect(() => new NativeCpuStage(cpu, { scoring: "int3" as "int8" })).toThrow(/scoring/);
    expect(() => new NativeCpuStage(cpu, { rescoreFactor: 0 })).toThrow(/rescoreFactor/);
  });
});
