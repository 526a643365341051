/**
 * Checks of the weight-stream GEMV (native/gemv_stream.cu, sm_90's decode GEMV) in recorded
 * steps: chains of matvecs in a layer's pattern (o +=, norm + gate/up SiLU·up, down +=, norm +
 * qkv), where every GEMV reads what the one before wrote, each a programmatic launch whose
 * producer starts streaming weights before the kernel before it has finished. Against core's
 * ReferenceBackend (matvecByParts) over several recorded steps (fresh inputs each step; the first
 * captures, the rest replay): widths from 64 (rows fewer than the SMs) to the 8B shapes, biases,
 * f16 and bf16 in one chain; and the same chains with an sm_80 plan (the one-warp GEMV). Run by
 * device-check.ts.
 */
import { seededRandom, type Backend, type DType, type MatvecFusion, type Tensor } from "@hybridgen/spec";
import { ReferenceBackend, relL2Error } from "@hybridgen/spec/kit";
import type { CudaBackend } from "../src/index.js";
import { matvecByParts, pairedAlloc, type CheckResult } from "./op-checks.js";
import { cudaLab } from "../src/lab.js";

interface Link {
  out: string; // buffer names: "att" (attention output, d), "x" (residual, d), "h" (FFN, f), "qkv" (q)
  inp: string;
  dt: DType;
  norm: boolean;
  silu: boolean;
  acc: boolean;
  bias: boolean;
}

// A layer's decode GEMVs in the order a step records them: x += o(att), h = SiLU·up(norm x),
// x += down(h), qkv = norm x · Wqkv. Each phase reads what the one before wrote.
function layerChain(dt: DType, bias = false): Link[] {
  return [
    { out: "x", inp: "att", dt, norm: false, silu: false, acc: true, bias },
    { out: "h", inp: "x", dt, norm: true, silu: true, acc: false, bias },
    { out: "x", inp: "h", dt, norm: false, silu: false, acc: true, bias },
    { out: "qkv", inp: "x", dt, norm: true, silu: false, acc: false, bias },
  ];
}
const ATT_FROM_QKV: Link = { out: "att", inp: "qkv", dt: "bf16", norm: false, silu: false, acc: true, bias: false };

export function streamGemvChecks(cuda: CudaBackend, seed: number): CheckResult[] {
  const ref = new ReferenceBackend();
  const rnd = seededRandom(seed);
  const results: CheckResult[] = [];
  const savedFuse = cudaLab(cuda).matvecFusion();
  const record = (name: string, err: number, tol: number) => results.push({ name, err, tol, ok: err <= tol });
  const values = (n: number, scale = 1) => Float32Array.from({ length: n }, () => (rnd() * 2 - 1) * scale);
  // [name, links, widths d / f / q]
  const cases: [string, Link[], [number, number, number]][] = [
    ["layer bf16 d512 f1536 q768", layerChain("bf16"), [512, 1536, 768]],
    ["layer f16 d256 f688 q384, biases", layerChain("f16", true), [256, 688, 384]],
    ["layer bf16 d64 f96 q96 (rows < SMs)", layerChain("bf16"), [64, 96, 96]],
    ["layer bf16 d4096 f14336 q6144 (8B shapes)", layerChain("bf16"), [4096, 14336, 6144]],
    ["layer bf16 d5000 f1024 q768 (rows of several chunks, the last one short)", layerChain("bf16"), [5000, 1024, 768]],
    ["5 links, ending in attention-width +=", [...layerChain("bf16"), ATT_FROM_QKV], [256, 512, 256]],
    ["9 links, bf16 then f16", [...layerChain("bf16"), ATT_FROM_QKV, ...layerChain("f16")], [256, 512, 256]],
  ];
  try {
    for (const [name, links, [d, f, q]] of cases) {
      cudaLab(cuda).setMatvecFusion({ norm: true, siluMul: true, accumulate: true });
      const owned: [Backend, Tensor][] = [];
      const both = pairedAlloc(cuda, ref, owned);
      const width: Record<string, number> = { att: d, x: d, h: f, qkv: q };
      const bufs = Object.fromEntries(Object.entries(width).map(([k, n]) => [k, { ...both([1, n], "f32"), n }]));
      const weights = links.map((l) => {
        const m = width[l.out], k = width[l.inp], rows = l.silu ? 2 * m : m;
        return { w: both([rows, k], l.dt, values(rows * k, 1 / Math.sqrt(k))), nw: both([k], l.dt, values(k, 0.5).map((a) => a + 1)), b: both([rows], "f32", values(rows, 0.1)) };
      });
      const fusion = (l: Link, j: number, side: "c" | "r"): MatvecFusion => ({
        normWeight: l.norm ? weights[j].nw[side] : undefined, normEps: 1e-5, siluMul: l.silu, accumulate: l.acc, bias: l.bias ? weights[j].b[side] : undefined,
      });
      // Each case runs as this device's plan picks it, then as an sm_80 plan would, against the
      // reference (once a step: in JS the 8B shapes take seconds).
      const steps = 4;
      const inputs = Array.from({ length: steps }, () => Object.values(bufs).map((b) => values(b.n)));
      const expected = inputs.map((inp) => {
        Object.values(bufs).forEach((b, i) => ref.write(b.r, inp[i]));
        links.forEach((l, j) => matvecByParts(ref, bufs[l.out].r, bufs[l.inp].r, weights[j].w.r, fusion(l, j, "r")));
        return Object.values(bufs).map((b) => ref.read(b.r));
      });
      const forms: [string, number | null][] = [["the plan's slots and grid", null], ["planned for sm_80: the one-warp GEMV", 8]];
      for (const [how, major] of forms) {
        cudaLab(cuda).setPlanMajor(major === null ? null : Math.min(major, cuda.device.major));
        const before = cudaLab(cuda).graphStats();
        let worst = 0;
        for (let s = 0; s < steps; s++) {
          Object.values(bufs).forEach((b, i) => cuda.write(b.c, inputs[s][i]));
          cuda.beginStep(`stream-checks-${name}`);
          links.forEach((l, j) => cuda.matvec(bufs[l.out].c, bufs[l.inp].c, weights[j].w.c, fusion(l, j, "c")));
          cuda.endStep();
          const outs = Object.values(bufs).map((b) => cuda.read(b.c));
          outs.forEach((o, i) => (worst = Math.max(worst, relL2Error(o, expected[s][i]))));
        }
        const after = cudaLab(cuda).graphStats();
        record(`stream GEMV chain ${name}, ${how}, recorded x${steps}: every buffer vs the reference`, worst, 1e-4);
        record(`stream GEMV chain ${name}, ${how}: 1 capture, the rest replayed, none drained`, Math.abs(after.captures - before.captures - 1) + Math.abs(after.replays - before.replays - (steps - 1)) + (after.drained - before.drained), 0);
      }
      for (const [be, t] of owned.reverse()) be.free(t);
    }
  } catch (e) {
    record(`stream GEMV chains: ${(e as Error).message}`, Infinity, 0);
  } finally {
    cudaLab(cuda).setPlanMajor(null);
    cudaLab(cuda).setMatvecFusion(savedFuse);
  }
  return results;
}

