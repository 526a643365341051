/**
 * What a read-only selection input costs: the copy the wrapper makes for a plugin (InputCopier)
 * against reading through a Proxy view, at 32 query heads × N offloaded tokens, and against the
 * selection itself (group maxima + top-K, what a top-K plugin does). Run:
 *   ./bun apps/bench/src/selectors/readonly-input.ts [--heads 32] [--n 8192,32768,131072]
 */
import { headLayout, referencePrimitives, type PostSelectionInput } from "@hybridgen/core";
import { InputCopier } from "@hybridgen/selectors/lab";

const arg = (name: string, dflt: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1]! : dflt;
};
const heads = Number(arg("heads", "32"));
const sizes = arg("n", "8192,32768,131072").split(",").map(Number);

/** Group maxima in a plain loop (a plugin's own JS; maxRows itself refuses a Proxy: it calls subarray). */
function loopMax(rows: readonly Float32Array[], n: number, out: Float32Array): void {
  for (let j = 0; j < n; j++) out[j] = rows[0]![j]!;
  for (let r = 1; r < rows.length; r++) {
    const row = rows[r]!;
    for (let j = 0; j < n; j++) if (row[j]! > out[j]!) out[j] = row[j]!;
  }
}

function mean(fn: () => void, reps: number): number {
  for (let i = 0; i < 3; i++) fn();
  const t0 = performance.now();
  for (let i = 0; i < reps; i++) fn();
  return (performance.now() - t0) / reps;
}

/** A read-only view of a Float32Array: element reads go through the handler, writes throw. */
function readOnly(a: Float32Array): Float32Array {
  return new Proxy(a, {
    get: (t, p) => (typeof p === "string" && /^\d+$/.test(p) ? t[Number(p)] : Reflect.get(t, p, t)),
    set: () => {
      throw new TypeError("read-only");
    },
  });
}

let frozen = "no error";
try {
  Object.freeze(new Float32Array(4));
} catch (e) {
  frozen = (e as Error).message;
}
console.log(`Object.freeze(new Float32Array(4)): ${frozen}`);
console.log("heads\tN\tcopy ms\tJS max loop direct ms\tJS max loop via Proxy ms\ttop-K select ms (maxRows + topK, 8 KV heads)");
for (const n of sizes) {
  const layout = headLayout(heads, 8, 128);
  const logits = Array.from({ length: heads }, () => Float32Array.from({ length: n }, () => Math.random()));
  const input: PostSelectionInput = {
    timing: "post", layer: 0, step: 0, sequence: 0, offloaded: n, positions: referencePrimitives.range(0, n), k: 256, layout,
    state: undefined, primitives: referencePrimitives, logits, query: new Float32Array(heads * 128), speculative: false,
  };
  const copier = new InputCopier();
  const reps = Math.max(3, Math.round(2e7 / (heads * n)));
  const copy = mean(() => copier.copy(input), reps);
  const out = new Float32Array(n);
  const direct = mean(() => loopMax(logits, n, out), reps);
  const proxied = logits.map(readOnly);
  const viaProxy = mean(() => loopMax(proxied, n, out), Math.max(1, Math.round(reps / 10)));
  const group = heads / 8;
  const select = mean(() => {
    for (let g = 0; g < 8; g++) referencePrimitives.topK(referencePrimitives.maxRows(logits.slice(g * group, (g + 1) * group), n, out), 256, n);
  }, reps);
  console.log(`${heads}\t${n}\t${copy.toFixed(3)}\t${direct.toFixed(2)}\t${viaProxy.toFixed(1)}\t${select.toFixed(2)}`);
}
