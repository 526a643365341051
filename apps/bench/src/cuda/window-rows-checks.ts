/**
 * Device checks of a batched step's window ops (native/span_attn.cu): attnPartialRows of 5 rows equals
 * each row's own attnPartial bit for bit — recorded in a step (captured once, replayed twice with other
 * spans: the rows kernel) and eager (each row's own op) — for the tensor-core block (bf16, head dim
 * 128, the 8B shape's window) and the FMA block (f32, head dim 48); and appendKvRows writes what
 * copyRows of each KV head's new row writes, recorded and eager, nothing drained. hybrid-bench.ts runs
 * them with its checks (--skip-bench).
 */
import type { Tensor } from "@hybridgen/core";
import type { CudaBackend } from "@hybridgen/kernels-cuda";
import { cudaLab } from "@hybridgen/kernels-cuda/lab";

type Check = (ok: boolean, what: string) => void;

const sameBits = (a: Float32Array, b: Float32Array) => {
  if (a.length !== b.length) return false;
  const bb = new Uint32Array(b.buffer, b.byteOffset, b.length);
  return new Uint32Array(a.buffer, a.byteOffset, a.length).every((x, i) => x === bb[i] || (Number.isNaN(x) && Number.isNaN(b[i]!)));
};
const values = (n: number, seed: number) => Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37 + seed) * 0.5);

const SHAPES = [
  { dtype: "bf16", heads: 32, kvHeads: 8, headDim: 128, cap: 1028 + 64 },
  { dtype: "f32", heads: 12, kvHeads: 4, headDim: 48, cap: 300 },
] as const;

/** Row r's spans at step s: sinks, then a wrapped ring of a length that differs by row and step. */
function spansOf(cap: number, r: number, s: number): Int32Array {
  const ring = cap - 4 - 3 * r - 5 * s, cut = Math.floor(ring / (2 + r));
  return Int32Array.of(0, 4, 4 + cut, ring - cut, 4, cut);
}

export function windowRowsChecks(cuda: CudaBackend, check: Check): void {
  const R = 5;
  for (const x of SHAPES) {
    const what = `attnPartialRows of ${R} rows, ${x.dtype} head dim ${x.headDim}`;
    const made: Tensor[] = [];
    const alloc = (shape: number[], dtype: "f32" | "bf16" = "f32") => {
      const t = cuda.alloc(shape, dtype);
      made.push(t);
      return t;
    };
    try {
      const n = x.kvHeads * x.cap * x.headDim, scale = 1 / Math.sqrt(x.headDim);
      const q = alloc([R, x.heads * x.headDim]);
      const k = Array.from({ length: R }, () => alloc([x.kvHeads, x.cap, x.headDim], x.dtype)), v = Array.from({ length: R }, () => alloc([x.kvHeads, x.cap, x.headDim], x.dtype));
      const rows = Array.from({ length: R }, () => alloc([x.heads, x.headDim + 2])), alone = Array.from({ length: R }, () => alloc([x.heads, x.headDim + 2]));
      k.forEach((t, i) => cuda.write(t, values(n, 1 + i)));
      v.forEach((t, i) => cuda.write(t, values(n, 30 + i)));
      const qRow = (i: number) => cuda.view(q, i * x.heads * x.headDim, [1, x.heads * x.headDim]);
      const before = cudaLab(cuda).graphStats();
      for (const [s, recorded] of [[0, false], [1, true], [2, true], [3, true]] as const) {
        cuda.write(q, values(R * x.heads * x.headDim, 50 + s));
        const args = (i: number, part: Tensor) => ({ part, q: qRow(i), qRow: 0, k: k[i]!, v: v[i]!, spans: spansOf(x.cap, i, s), scale });
        if (recorded) cuda.beginStep(`window-rows-${x.dtype}`);
        cuda.attnPartialRows(Array.from({ length: R }, (_, i) => args(i, rows[i]!)));
        if (recorded) cuda.endStep();
        for (let i = 0; i < R; i++) {
          if (recorded) cuda.beginStep(`window-rows-${x.dtype}-alone-${i}`);
          const a = args(i, alone[i]!);
          cuda.attnPartial(a.part, a.q, a.qRow, a.k, a.v, a.spans, a.scale);
          if (recorded) cuda.endStep();
        }
        const same = rows.every((t, i) => sameBits(cuda.read(t), cuda.read(alone[i]!)));
        check(same, `${what}, ${recorded ? `recorded step ${s}` : "eager"}: each row's partial equals its own attnPartial bit for bit`);
      }
      const after = cudaLab(cuda).graphStats();
      const captures = after.captures - before.captures, drained = after.drained - before.drained;
      check(drained === 0 && captures === 1 + R, `${what}: recorded steps captured once each (${captures} captures for 1 + ${R} keys), none drained (${drained})`);
      // appendKvRows against copyRows of each KV head's row, into a second set of windows.
      const kNew = alloc([R, x.kvHeads * x.headDim]), vNew = alloc([R, x.kvHeads * x.headDim]);
      const k2 = Array.from({ length: R }, () => alloc([x.kvHeads, x.cap, x.headDim], x.dtype)), v2 = Array.from({ length: R }, () => alloc([x.kvHeads, x.cap, x.headDim], x.dtype));
      k2.forEach((t, i) => cuda.write(t, values(n, 1 + i)));
      v2.forEach((t, i) => cuda.write(t, values(n, 30 + i)));
      const headRows = (t: Tensor, i: number) => cuda.view(t, i * x.kvHeads * x.headDim, [x.kvHeads, x.headDim]);
      let same = true;
      for (const [s, recorded] of [[0, false], [1, true], [2, true]] as const) {
        cuda.write(kNew, values(R * x.kvHeads * x.headDim, 70 + s));
        cuda.write(vNew, values(R * x.kvHeads * x.headDim, 90 + s));
        const slot = (i: number) => (i * 97 + s * 13) % x.cap;
        if (recorded) cuda.beginStep(`window-append-${x.dtype}`);
        cuda.appendKvRows(Array.from({ length: R }, (_, i) => ({ k: k[i]!, v: v[i]!, slot: slot(i), kNew: headRows(kNew, i), vNew: headRows(vNew, i) })));
        if (recorded) cuda.endStep();
        for (let i = 0; i < R; i++) {
          for (let g = 0; g < x.kvHeads; g++) {
            cuda.copyRows(k2[i]!, g * x.cap + slot(i), headRows(kNew, i), g, 1);
            cuda.copyRows(v2[i]!, g * x.cap + slot(i), headRows(vNew, i), g, 1);
          }
        }
        same &&= k.every((t, i) => sameBits(cuda.read(t), cuda.read(k2[i]!))) && v.every((t, i) => sameBits(cuda.read(t), cuda.read(v2[i]!)));
      }
      check(same, `appendKvRows of ${R} rows, ${x.dtype} head dim ${x.headDim}, eager and 2 recorded steps: the windows equal copyRows of each KV head's row`);
    } catch (e) {
      check(false, `${what}: ${(e as Error).message}`);
    } finally {
      for (const t of made.reverse()) cuda.free(t);
    }
  }
}
