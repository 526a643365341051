import { describe, it } from "vitest";
import type { DType } from "@hybridgen/spec";
import { CONFIGS, backend, encode, expectClose, randn, rng } from "./helpers.js";
import { refMatmul } from "./reference.js";

// Tolerance: |got - ref| <= 1e-5 * sum_t |x_t w_t| + 1e-6. f32 accumulation error grows like
// sqrt(k) * 2^-24 * sum|x w| (~1e-6 relative at k = 289); an indexing or tail bug is O(1).
const DTYPES: DType[] = ["f32", "f16", "bf16"];
// k and m deliberately not multiples of 8/16; the larger ones cross the threading threshold.
const SHAPES = [
  { n: 1, k: 37, m: 13 },
  { n: 1, k: 289, m: 133 },
  { n: 1, k: 288, m: 288 },
  { n: 2, k: 40, m: 9 },
  { n: 5, k: 37, m: 13 },
  { n: 7, k: 289, m: 35 },
  { n: 13, k: 100, m: 67 },
];

describe.each(CONFIGS)("matmul isa=$isa threads=$threads", (cfg) => {
  it.each(DTYPES)("matches the f64 reference with %s weights", (dtype) => {
    using be = backend(cfg);
    let seed = 1;
    for (const { n, k, m } of SHAPES) {
      for (const biasType of [undefined, "f32", "bf16"] as const) {
        const r = rng(seed++ * 7919 + dtype.length);
        const w = encode(randn(r, m * k), dtype);
        const x = randn(r, n * k);
        const wt = be.loadWeight(w.bytes, dtype, [m, k]);
        const xt = be.alloc([n + 1, k]); // one spare row: ops use only n
        be.write(xt, x);
        const ot = be.alloc([n + 1, m]);
        let bias: Float64Array | undefined;
        let bt;
        if (biasType) {
          const b = encode(randn(r, m), biasType);
          bias = b.decoded;
          bt = be.loadWeight(b.bytes, biasType, [m]);
        }
        be.matmul(ot, xt, wt, n, bt);
        const ref = refMatmul(x, w.decoded, n, k, m, bias);
        const tol = ref.mag.map((a) => 1e-5 * a + 1e-6);
        expectClose(be.read(ot, 0, n * m), ref.out, tol, `matmul ${dtype} n=${n} k=${k} m=${m} bias=${biasType}`);
        expectClose(be.read(ot, n * m, m), new Float64Array(m), 0, "matmul leaves rows past n untouched");
      }
    }
  });
});
