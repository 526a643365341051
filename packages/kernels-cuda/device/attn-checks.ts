/**
 * Checks of the clustered decode attention (DecodeTuning.attnCluster, native/decode_attn_cluster.cu) on
 * the GPU, against core's ReferenceBackend (f64 accumulation) and against the split-K kernels:
 *  - attnCausal with one row: every dtype, head dims 32–256, GQA groups 1–6 (6: two head groups a
 *    KV head), spans of 1 to 40 000 tokens, start offsets; twice on NaN-poisoned outputs (same bits);
 *  - the K/V append folded in (core's writeRows copies, then attnCausal), eager: the caches bit
 *    for bit as the split-K path leaves them, the output within 1e-5 of the reference;
 *  - recorded decode steps (rope + K/V append + attention folded into one launch): the output,
 *    the rotated q/k row (written back as the rope kernel leaves it) and the caches against the
 *    reference and, bit for bit, against the split-K path; 1 capture, the rest replayed, one
 *    recorded command a step; a read in the middle of a step; graphs on = graphs off, same bits.
 * Run by op-checks.ts (runOpChecks) and device/attn-bench.ts.
 */
import { ReferenceBackend, seededRandom, type Backend, type DType, type Tensor } from "@hybridgen/core";
import type { CudaBackend } from "../src/index.js";
import { maxAbs, relErr, type CheckResult } from "./op-checks.js";

const DTYPES: readonly DType[] = ["f32", "f16", "bf16"];

export function clusterAttnChecks(cuda: CudaBackend, seed: number): CheckResult[] {
  const ref = new ReferenceBackend();
  const rnd = seededRandom(seed);
  const results: CheckResult[] = [];
  const owned: [Backend, Tensor][] = [];
  const saved = cuda.decodeTuning;
  const record = (name: string, err: number, tol: number) => results.push({ name, err, tol, ok: err <= tol });
  const values = (n: number, scale = 1) => {
    const v = new Float32Array(n);
    for (let i = 0; i < n; i++) v[i] = (rnd() * 2 - 1) * scale;
    return v;
  };
  /** The same data in the reference and in one or more CUDA tensors. */
  const make = (shape: number[], dtype: DType = "f32", copies = 1, data?: Float32Array) => {
    const n = shape.reduce((a, b) => a * b, 1);
    const v = data ?? values(n);
    const r = ref.alloc(shape, dtype);
    ref.write(r, v);
    owned.push([ref, r]);
    const c = Array.from({ length: copies }, () => {
      const t = cuda.alloc(shape, dtype);
      cuda.write(t, v);
      owned.push([cuda, t]);
      return t;
    });
    return { r, c };
  };
  const refAttend = (out: Tensor, q: Tensor, k: Tensor, v: Tensor, heads: number, start: number, total: number, scale: number) => {
    const sc = ref.alloc([heads, total]);
    ref.attnLogits(sc, 0, q, 0, k, start, total, scale);
    ref.softmax(sc, heads, total);
    ref.attnAggregate(out, 0, sc, 0, v, start, total, false);
    ref.free(sc);
  };
  const on = (yes: boolean) => cuda.setDecodeTuning({ attnCluster: yes });
  try {
    // 1. One decode row over a span, the clustered kernel against the reference and the split-K kernels.
    const shapes: [number, number, number, number, number][] = [
      // heads, kvHeads, headDim, firstPos, start
      [32, 8, 128, 2047, 0], [8, 2, 64, 300, 7], [4, 1, 128, 5000, 0], [12, 2, 128, 777, 1], [4, 2, 80, 129, 0],
      [16, 16, 32, 0, 3], [8, 8, 256, 3000, 2], [32, 8, 128, 40000, 0], [6, 3, 64, 63, 1], [8, 2, 128, 64, 0],
    ];
    for (const dt of DTYPES) {
      for (const [heads, kvHeads, hd, firstPos, start] of shapes) {
        if (firstPos > 10000 && dt !== "bf16") continue;
        if (!cuda.attnDecodeIsSplitK(dt, hd)) continue; // the flash kernel serves it (no clustered form)
        const cap = start + firstPos + 1 + 3, total = firstPos + 1, scale = 1 / Math.sqrt(hd);
        const q = make([1, heads * hd]), k = make([kvHeads, cap, hd], dt), v = make([kvHeads, cap, hd], dt);
        const out = make([1, heads * hd], "f32", 1, new Float32Array(heads * hd).fill(NaN));
        refAttend(out.r, q.r, k.r, v.r, heads, start, total, scale);
        const want = ref.read(out.r);
        const tag = `${dt} h${heads}/${kvHeads} d${hd} @${firstPos} start ${start}`;
        on(false);
        cuda.attnCausal(out.c[0], q.c[0], 1, k.c[0], v.c[0], start, firstPos, scale);
        const splitK = cuda.read(out.c[0]);
        on(true);
        const got: Float32Array[] = [];
        for (let r = 0; r < 2; r++) {
          cuda.write(out.c[0], new Float32Array(heads * hd).fill(NaN));
          cuda.attnCausal(out.c[0], q.c[0], 1, k.c[0], v.c[0], start, firstPos, scale);
          got.push(cuda.read(out.c[0]));
        }
        record(`clustered decode attention ${tag} vs reference`, relErr(got[0], want), 1e-5);
        record(`clustered decode attention ${tag}: run twice, same bits`, maxAbs(got[0], got[1]), 0);
        record(`clustered decode attention ${tag} vs split-K`, relErr(got[0], splitK), 1e-5);
        for (const t of [q, k, v, out]) {
          ref.free(t.r);
          for (const c of t.c) cuda.free(c);
        }
        owned.length = 0;
      }
    }
    // 2. The K/V append folded in, eager: core's writeRows (one row a KV head, K then V) then attnCausal.
    for (const dt of DTYPES) {
      for (const [heads, kvHeads, hd, firstPos, start] of [[32, 8, 128, 1000, 0], [12, 2, 64, 70, 3], [8, 8, 32, 0, 1]] as const) {
        const cap = start + firstPos + 1 + 2, total = firstPos + 1, scale = 1 / Math.sqrt(hd), slot = start + firstPos;
        const q = make([1, heads * hd]), rows = make([2 * kvHeads, hd]); // K rows then V rows
        const k = make([kvHeads, cap, hd], dt, 2), v = make([kvHeads, cap, hd], dt, 2);
        const out = make([1, heads * hd], "f32", 2);
        const kRowsC = cuda.view(rows.c[0], 0, [kvHeads, hd]), vRowsC = cuda.view(rows.c[0], kvHeads * hd, [kvHeads, hd]);
        const kRowsR = ref.view(rows.r, 0, [kvHeads, hd]), vRowsR = ref.view(rows.r, kvHeads * hd, [kvHeads, hd]);
        for (const [be, kk, vv, kr, vr] of [[ref, k.r, v.r, kRowsR, vRowsR], [cuda, k.c[0], v.c[0], kRowsC, vRowsC], [cuda, k.c[1], v.c[1], kRowsC, vRowsC]] as const) {
          for (let g = 0; g < kvHeads; g++) {
            be.copyRows(kk, g * cap + slot, kr, g, 1);
            be.copyRows(vv, g * cap + slot, vr, g, 1);
          }
          if (be === ref) refAttend(out.r, q.r, k.r, v.r, heads, start, total, scale);
          else {
            const clustered = kk === k.c[1];
            on(clustered);
            cuda.attnCausal(clustered ? out.c[1] : out.c[0], q.c[0], 1, kk, vv, start, firstPos, scale);
          }
        }
        const tag = `${dt} h${heads}/${kvHeads} d${hd} @${firstPos}`;
        record(`clustered attention + K/V append ${tag}, eager: out vs reference`, relErr(cuda.read(out.c[1]), ref.read(out.r)), 1e-5);
        record(`clustered attention + K/V append ${tag}, eager: K cache vs split-K path (max |Δ|)`, maxAbs(cuda.read(k.c[1]), cuda.read(k.c[0])), 0);
        record(`clustered attention + K/V append ${tag}, eager: V cache vs split-K path (max |Δ|)`, maxAbs(cuda.read(v.c[1]), cuda.read(v.c[0])), 0);
        record(`clustered attention + K/V append ${tag}, eager: K cache vs reference`, relErr(cuda.read(k.c[1]), ref.read(k.r)), 0);
        for (const t of [kRowsC, vRowsC]) cuda.free(t);
        for (const t of [kRowsR, vRowsR]) ref.free(t);
        for (const [be, t] of owned) be.free(t);
        owned.length = 0;
      }
    }
    // 3. Recorded decode steps as core makes them: rope(q and k) → K/V append → attnCausal, one
    // launch a step with the switch on. Two CUDA sides on identical data (split-K, clustered) and
    // the reference; groups 4 (RoPE folded) and 6 (two head groups: the append alone folded).
    const clusteredOuts = new Map<string, Float32Array[]>();
    for (const [dt, heads, kvHeads, hd, graphs] of [["bf16", 32, 8, 128, true], ["f32", 8, 2, 64, true], ["f16", 12, 2, 64, true], ["bf16", 32, 8, 128, false]] as const) {
      const cap = 48, steps = 12, prompt = 20, scale = 1 / Math.sqrt(hd), half = hd / 2, width = (heads + 2 * kvHeads) * hd;
      cuda.setCudaGraphs(graphs);
      // The same data for a shape with graphs on and off (its own stream), to compare the two.
      const local = seededRandom(seed + 1000 + heads);
      const vals = (n: number) => Float32Array.from({ length: n }, () => local() * 2 - 1);
      const k = make([kvHeads, cap, hd], dt, 2, vals(kvHeads * cap * hd)), v = make([kvHeads, cap, hd], dt, 2, vals(kvHeads * cap * hd));
      const qkv = make([1, width], "f32", 2, vals(width)), out = make([1, heads * hd], "f32", 2, vals(heads * hd));
      const cos = make([cap, half], "f32", 1, vals(cap * half)), sin = make([cap, half], "f32", 1, vals(cap * half));
      const sides = [0, 1].map((i) => ({
        be: cuda as Backend, clustered: i === 1, k: k.c[i], v: v.c[i], qkv: qkv.c[i], out: out.c[i], cos: cos.c[0], sin: sin.c[0],
      }));
      const all = [{ be: ref as Backend, clustered: false, k: k.r, v: v.r, qkv: qkv.r, out: out.r, cos: cos.r, sin: sin.r }, ...sides];
      const fresh = Array.from({ length: steps }, () => vals(width));
      // Side by side, each side's steps in a row (a switch change drops the captured graphs).
      const outs: Float32Array[][] = [], rows: Float32Array[][] = [];
      let captures = 0, replays = 0, drained = 0, recorded = 0;
      const key = `attn-checks-${dt}-${heads}-${graphs}`;
      for (const t of all) {
        const be = t.be;
        if (be === cuda) on(t.clustered);
        const before = cuda.graphStats();
        const o: Float32Array[] = [], r: Float32Array[] = [];
        for (let s = 0; s < steps; s++) {
          const pos = prompt + s;
          be.write(t.qkv, fresh[s]);
          const views = [be.view(t.qkv, 0, [1, heads * hd]), be.view(t.qkv, 0, [1, (heads + kvHeads) * hd]), be.view(t.qkv, heads * hd, [kvHeads, hd]), be.view(t.qkv, (heads + kvHeads) * hd, [kvHeads, hd])];
          const [q, qk, kRows, vRows] = views;
          if (be === cuda) cuda.beginStep(`${key}-${t.clustered}`);
          be.rope(qk, 1, Int32Array.of(pos), heads + kvHeads, hd, t.cos, t.sin);
          for (let g = 0; g < kvHeads; g++) {
            be.copyRows(t.k, g * cap + pos, kRows, g, 1);
            be.copyRows(t.v, g * cap + pos, vRows, g, 1);
          }
          if (be === ref) refAttend(t.out, q, t.k, t.v, heads, 0, pos + 1, scale);
          else cuda.attnCausal(t.out, q, 1, t.k, t.v, 0, pos, scale);
          if (be === cuda) cuda.endStep();
          for (const vw of views) be.free(vw);
          o.push(be.read(t.out));
          r.push(be.read(t.qkv));
        }
        if (t.clustered) {
          const after = cuda.graphStats();
          captures = after.captures - before.captures;
          replays = after.replays - before.replays;
          drained = after.drained - before.drained;
          recorded = after.recordedOps - before.recordedOps;
        }
        outs.push(o);
        rows.push(r);
      }
      let worstOut = 0, worstQk = 0, bitsOut = 0, bitsQk = 0;
      for (let s = 0; s < steps; s++) {
        worstOut = Math.max(worstOut, relErr(outs[2][s], outs[0][s]));
        worstQk = Math.max(worstQk, relErr(rows[2][s], rows[0][s]));
        bitsOut = Math.max(bitsOut, relErr(outs[2][s], outs[1][s]));
        bitsQk = Math.max(bitsQk, maxAbs(rows[2][s], rows[1][s]));
      }
      const tag = `${dt} h${heads}/${kvHeads} d${hd}, ${steps} steps${graphs ? "" : ", graphs off"}`;
      record(`clustered recorded steps ${tag}: out vs reference`, worstOut, 1e-5);
      record(`clustered recorded steps ${tag}: out vs split-K path`, bitsOut, 1e-5);
      record(`clustered recorded steps ${tag}: rotated q/k row vs reference`, worstQk, 1e-6);
      record(`clustered recorded steps ${tag}: rotated q/k row vs split-K path (max |Δ|)`, bitsQk, 0);
      record(`clustered recorded steps ${tag}: K cache vs split-K path (max |Δ|)`, maxAbs(cuda.read(k.c[1]), cuda.read(k.c[0])), 0);
      record(`clustered recorded steps ${tag}: V cache vs split-K path (max |Δ|)`, maxAbs(cuda.read(v.c[1]), cuda.read(v.c[0])), 0);
      const key2 = `${dt}-${heads}`;
      if (graphs) clusteredOuts.set(key2, outs[2]);
      else if (clusteredOuts.has(key2)) {
        const g = clusteredOuts.get(key2)!;
        record(`clustered recorded steps ${tag}: out equal to the recorded (graphs on) run's (max |Δ|)`, Math.max(...outs[2].map((o, i) => maxAbs(o, g[i]))), 0);
      }
      if (graphs) {
        record(`clustered recorded steps ${tag}: 1 capture, the rest replayed, none drained`, Math.abs(captures - 1) + Math.abs(replays - (steps - 1)) + drained, 0);
        // rope + 2·kvHeads copies + attention in one command (group ≤ 4), or copy-free (group 6: RoPE apart)
        const perStep = heads / kvHeads <= 4 ? 1 : 2;
        record(`clustered recorded steps ${tag}: ${perStep} recorded command(s) a step (RoPE and K/V append folded)`, Math.abs(recorded - perStep * steps), 0);
      }
      for (const [be, t] of owned) be.free(t);
      owned.length = 0;
    }
    cuda.setCudaGraphs(true);
    // 4. A read right after the folded attention, inside a step: it sees the rotated row, the
    // appended caches and the output (the step drains there), same bits as the split-K path.
    {
      const dt: DType = "bf16", heads = 32, kvHeads = 8, hd = 128, cap = 32, pos = 9, width = (heads + 2 * kvHeads) * hd;
      const k = make([kvHeads, cap, hd], dt, 2), v = make([kvHeads, cap, hd], dt, 2), qkv = make([1, width], "f32", 2), out = make([1, heads * hd], "f32", 2);
      const cos = make([cap, hd / 2]), sin = make([cap, hd / 2]);
      const mid: Float32Array[][] = [];
      for (const i of [0, 1]) {
        on(i === 1);
        const views = [cuda.view(qkv.c[i], 0, [1, heads * hd]), cuda.view(qkv.c[i], 0, [1, (heads + kvHeads) * hd]), cuda.view(qkv.c[i], heads * hd, [kvHeads, hd]), cuda.view(qkv.c[i], (heads + kvHeads) * hd, [kvHeads, hd])];
        cuda.beginStep(`attn-checks-drain-${i}`);
        cuda.rope(views[1], 1, Int32Array.of(pos), heads + kvHeads, hd, cos.c[0], sin.c[0]);
        for (let g = 0; g < kvHeads; g++) {
          cuda.copyRows(k.c[i], g * cap + pos, views[2], g, 1);
          cuda.copyRows(v.c[i], g * cap + pos, views[3], g, 1);
        }
        cuda.attnCausal(out.c[i], views[0], 1, k.c[i], v.c[i], 0, pos, 0.088);
        mid.push([cuda.read(qkv.c[i]), cuda.read(k.c[i]), cuda.read(out.c[i])]);
        cuda.endStep();
        for (const vw of views) cuda.free(vw);
      }
      record("clustered attention, a read inside the step: q/k row as the split-K path (max |Δ|)", maxAbs(mid[1][0], mid[0][0]), 0);
      record("clustered attention, a read inside the step: K cache as the split-K path (max |Δ|)", maxAbs(mid[1][1], mid[0][1]), 0);
      record("clustered attention, a read inside the step: out vs the split-K path", relErr(mid[1][2], mid[0][2]), 1e-5);
      for (const [be, t] of owned) be.free(t);
      owned.length = 0;
    }
  } catch (e) {
    record(`clustered attention checks threw: ${(e as Error).message}`, Infinity, 0);
  } finally {
    for (const [be, t] of owned) be.free(t);
    cuda.setCudaGraphs(true);
    cuda.setDecodeTuning(saved);
  }
  return results;
}
