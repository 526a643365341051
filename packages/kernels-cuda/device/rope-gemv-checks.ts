/**
 * Checks of gemvRope (DecodeTuning.gemvRope, native/gemv_stream.cu): in recorded steps, core's
 * decode pattern — the qkv stream GEMV, RoPE of its q and k heads in place, the K/V append of the
 * new rows into the cache — with the RoPE and the append folded into the GEMV, against the same
 * steps with them apart (every buffer bit for bit: the same arithmetic) and against core's
 * ReferenceBackend. Positions move every step (the first step captures, the rest replay), and the
 * folded step must record one command less. Shapes: the 8B layout, a small f16 one with biases
 * and the norm, and partial rotary (half < head dim / 2). Run by device-check.ts and
 * decode-tuning-check.ts.
 */
import { ReferenceBackend, seededRandom, type Backend, type DType, type Tensor } from "@hybridgen/core";
import type { CudaBackend } from "../src/index.js";
import { matvecByParts, maxAbs, relErr, type CheckResult } from "./op-checks.js";

interface Shape {
  name: string;
  heads: number;
  kvHeads: number;
  hd: number;
  half: number;
  k: number;
  dt: DType; // weights and cache
  bias: boolean;
  norm: boolean;
}

const SHAPES: Shape[] = [
  { name: "8B layout: 32/8 heads d128, k 4096, bf16, norm", heads: 32, kvHeads: 8, hd: 128, half: 64, k: 4096, dt: "bf16", bias: false, norm: true },
  { name: "8/2 heads d64, k 512, f16, bias", heads: 8, kvHeads: 2, hd: 64, half: 32, k: 512, dt: "f16", bias: true, norm: false },
  { name: "partial rotary: 12/4 heads d64 (half 16), k 768, bf16, bias and norm", heads: 12, kvHeads: 4, hd: 64, half: 16, k: 768, dt: "bf16", bias: true, norm: true },
];

export function gemvRopeChecks(cuda: CudaBackend, seed: number): CheckResult[] {
  const ref = new ReferenceBackend();
  const rnd = seededRandom(seed);
  const results: CheckResult[] = [];
  const savedTuning = cuda.decodeTuning, savedFuse = cuda.matvecFusion;
  const record = (name: string, err: number, tol: number) => results.push({ name, err, tol, ok: err <= tol });
  const values = (n: number, scale = 1) => Float32Array.from({ length: n }, () => (rnd() * 2 - 1) * scale);
  try {
    for (const sh of SHAPES) {
      const { heads, kvHeads, hd, half, k, dt } = sh, m = (heads + 2 * kvHeads) * hd, cap = 24, steps = 6;
      const owned: [Backend, Tensor][] = [];
      const both = (shape: number[], type: DType, v?: Float32Array) => {
        const c = cuda.alloc(shape, type), r = ref.alloc(shape, type);
        owned.push([cuda, c], [ref, r]);
        if (v) {
          cuda.write(c, v);
          ref.write(r, v);
        }
        return { c, r };
      };
      const x = both([1, k], "f32"), qkv = both([1, m], "f32");
      const w = both([m, k], dt, values(m * k, 1 / Math.sqrt(k))), b = both([m], "f32", values(m, 0.1)), nw = both([k], dt, values(k, 0.5).map((a) => a + 1));
      const angles = Float32Array.from({ length: cap * half }, (_, i) => Math.floor(i / half) * Math.pow(10000, -(i % half) / half));
      const cos = both([cap, half], "f32", angles.map(Math.cos)), sin = both([cap, half], "f32", angles.map(Math.sin));
      const kc = both([kvHeads, cap, hd], dt), vc = both([kvHeads, cap, hd], dt);
      const zeros = new Float32Array(kvHeads * cap * hd);
      const inputs = Array.from({ length: steps }, () => values(k));
      const step = (be: Backend, side: "c" | "r", s: number) => {
        const t = (p: { c: Tensor; r: Tensor }) => p[side];
        const f = { bias: sh.bias ? t(b) : undefined, normWeight: sh.norm ? t(nw) : undefined, normEps: 1e-5 };
        if (be === cuda) cuda.matvec(t(qkv), t(x), t(w), f);
        else matvecByParts(be, t(qkv), t(x), t(w), f);
        be.rope(be.view(t(qkv), 0, [1, (heads + kvHeads) * hd]), 1, Int32Array.of(s), heads + kvHeads, hd, t(cos), t(sin));
        const kRows = be.view(t(qkv), heads * hd, [kvHeads, hd]), vRows = be.view(t(qkv), (heads + kvHeads) * hd, [kvHeads, hd]);
        for (let g = 0; g < kvHeads; g++) {
          be.copyRows(t(kc), g * cap + s, kRows, g, 1);
          be.copyRows(t(vc), g * cap + s, vRows, g, 1);
        }
      };
      // The reference, once: every step's qkv row and the caches after it.
      ref.write(kc.r, zeros);
      ref.write(vc.r, zeros);
      const expected = inputs.map((inp, s) => {
        ref.write(x.r, inp);
        step(ref, "r", s);
        return [ref.read(qkv.r), ref.read(kc.r), ref.read(vc.r)];
      });
      const runs: { outs: Float32Array[][]; ops: number; graphs: number }[] = [];
      for (const gemvRope of [false, true]) {
        cuda.setDecodeTuning({ ...savedTuning, gemvStream: 128, ropeAppend: true, gemvRope });
        cuda.setMatvecFusion({ norm: true, siluMul: true, accumulate: true });
        cuda.write(kc.c, zeros);
        cuda.write(vc.c, zeros);
        const before = cuda.graphStats();
        const outs: Float32Array[][] = [];
        for (let s = 0; s < steps; s++) {
          cuda.write(x.c, inputs[s]);
          cuda.beginStep(`rope-gemv-checks-${sh.name}`);
          step(cuda, "c", s);
          cuda.endStep();
          outs.push([cuda.read(qkv.c), cuda.read(kc.c), cuda.read(vc.c)]);
        }
        const after = cuda.graphStats();
        const graphs = Math.abs(after.captures - before.captures - 1) + Math.abs(after.replays - before.replays - (steps - 1)) + (after.drained - before.drained);
        runs.push({ outs, ops: (after.recordedOps - before.recordedOps) / steps, graphs });
        let worst = 0;
        outs.forEach((o, s) => o.forEach((a, i) => (worst = Math.max(worst, relErr(a, expected[s][i])))));
        const how = gemvRope ? "RoPE and K/V append in the GEMV (gemvRope)" : "apart";
        // the f32 norm + GEMV against the reference's f64 one: 1e-4, as stream-checks.ts (the H200: 2.3e-5 at the 8B shape)
        record(`qkv GEMV + RoPE + K/V append, ${sh.name}, ${how}, recorded x${steps}: qkv row and caches vs the reference`, worst, 1e-4);
        record(`qkv GEMV + RoPE + K/V append, ${sh.name}, ${how}: 1 capture, the rest replayed, none drained`, graphs, 0);
      }
      const [apart, folded] = runs;
      let diff = 0;
      folded.outs.forEach((o, s) => o.forEach((a, i) => (diff = Math.max(diff, maxAbs(a, apart.outs[s][i])))));
      record(`qkv GEMV + RoPE + K/V append, ${sh.name}: gemvRope = apart, bit for bit (max |Δ|)`, diff, 0);
      record(`qkv GEMV + RoPE + K/V append, ${sh.name}: gemvRope records ${folded.ops} commands a step, one less than apart with ropeAppend (${apart.ops})`, folded.ops === apart.ops - 1 ? 0 : 1, 0);
      for (const [be, t] of owned.reverse()) be.free(t);
    }
  } catch (e) {
    record(`qkv GEMV + RoPE + K/V append: ${(e as Error).message}`, Infinity, 0);
  } finally {
    cuda.setDecodeTuning(savedTuning);
    cuda.setMatvecFusion(savedFuse);
  }
  return results;
}
