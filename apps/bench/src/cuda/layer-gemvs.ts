/**
 * Device-script helper: a decode layer's four GEMVs in the 8B shapes as a step records them
 * (o_proj +=, norm + gate/up SiLU·up, down +=, the next layer's norm + qkv), on `layers` sets of
 * bf16 weights so L2 holds none of them; shared by bench.ts (the in-graph row) and trace-bench.ts.
 */
import type { Tensor } from "@hybridgen/core";
import type { CudaBackend } from "@hybridgen/kernels-cuda";
import { writeRepeating } from "./fill.js";

export const LAYER_GEMV_SHAPES: readonly [number, number][] = [[4096, 4096], [28672, 4096], [4096, 14336], [6144, 4096]];
export const LAYER_GEMV_NAMES = ["o_proj", "gate/up", "down", "qkv"] as const;

export interface LayerGemvs {
  ws: Tensor[][]; // [layer][o, gate/up, down, qkv]
  att: Tensor; // the attention output o_proj reads
  qkv: Tensor; // the qkv GEMV's output
  bytes: number; // weight bytes a layer
  run(l: number): void; // layer l % layers' four GEMVs
  free(): void;
}

export function layerGemvs(cuda: CudaBackend, chunk: Float32Array, layers: number): LayerGemvs {
  const ws = Array.from({ length: layers }, () =>
    LAYER_GEMV_SHAPES.map(([m, k]) => {
      const w = cuda.alloc([m, k], "bf16");
      writeRepeating(cuda, w, chunk, m * k);
      return w;
    }),
  );
  const nw = cuda.alloc([4096], "bf16");
  cuda.write(nw, chunk.subarray(0, 4096).map((a) => 1 + a));
  const xr = cuda.alloc([1, 4096]), att = cuda.alloc([1, 4096]), h = cuda.alloc([1, 14336]), qkv = cuda.alloc([1, 6144]);
  cuda.write(xr, chunk.subarray(0, 4096));
  cuda.write(att, chunk.subarray(4096, 8192));
  return {
    ws, att, qkv,
    bytes: LAYER_GEMV_SHAPES.reduce((t, [m, k]) => t + m * k * 2, 0),
    run(l) {
      const [wo, wgu, wd, wqkv] = ws[l % layers];
      cuda.matvec(xr, att, wo, { accumulate: true });
      cuda.matvec(h, xr, wgu, { normWeight: nw, normEps: 1e-5, siluMul: true });
      cuda.matvec(xr, h, wd, { accumulate: true });
      cuda.matvec(qkv, xr, wqkv, { normWeight: nw, normEps: 1e-5 });
    },
    free() {
      for (const t of [...ws.flat(), nw, xr, att, h, qkv]) cuda.free(t);
    },
  };
}
