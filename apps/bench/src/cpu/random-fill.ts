/** Random-fill throughput: core's TypeScript fill vs the native one on 1 and 2 threads (prints a table). */
import { fillKey, randomFillTs } from "@hybridgen/core";
import { createNativeRandomFill } from "@hybridgen/kernels-cpu";
const n = 64 << 20; // 64M elements
for (const dtype of ["bf16", "f32"] as const) {
  const buf = new Uint8Array(n * (dtype === "f32" ? 4 : 2));
  const p = { key: fillKey(1, "x"), scale: 0.02, offset: 0 };
  let t = performance.now(); randomFillTs(buf.subarray(0, buf.length / 8), dtype, p); const ts = (n / 8) / (performance.now() - t) / 1e3;
  for (const th of [1, 2]) { const f = createNativeRandomFill(th); f(buf, dtype, p); t = performance.now(); f(buf, dtype, p); const nat = n / (performance.now() - t) / 1e3;
  console.log(`${dtype}: TS ${ts.toFixed(0)} M elem/s; native ${th} thread(s) ${nat.toFixed(0)} M elem/s`); }
}
