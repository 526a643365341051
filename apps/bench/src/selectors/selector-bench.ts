/**
 * Per-layer cost of the pre-QKᵀ selectors' select() at a large shape, native key primitives
 * (./bun apps/bench/src/selectors/selector-bench.ts [--tokens 32768] [--k 256] [--cpu-stage-threads 1] [--ts-topk 1]): Llama-3.1-8B's
 * heads (32 query, 8 KV, headDim 128), bf16 K in a CPU tensor, one step after the store holds
 * --tokens rows (the state already folded in, as in steady decode), next to scoring every row
 * (keyScores over the store: what post-QKᵀ top-K reads). --cpu-stage-threads > 1: the primitives of an
 * idle native CPU stage of that many threads (its pool); --ts-topk 1: core's TypeScript topK
 * instead of the native one. --k and --cpu-stage-threads are the runtime's options, parsed by its schema (args.ts).
 * Run `bun run build` first.
 */
import { headLayout, referencePrimitives, type PreSelectionInput, type SelectorPrimitives, type TokenSelector } from "@hybridgen/core";
import { createCpuBackend, NativeCpuStage, nativeSelectorPrimitives, storeKeys, type CpuTensor } from "@hybridgen/kernels-cpu";
import { createSelector } from "@hybridgen/selectors";
import { arg, hybridArg } from "../args.js";

const N = Number(arg("tokens", "32768")), K = hybridArg("k", 256), REPS = Number(arg("reps", "20")), THREADS = hybridArg("cpu-stage-threads", 1), TS_TOPK = arg("ts-topk", "0") === "1";
const layout = headLayout(32, 8, 128);
using be = createCpuBackend({ threads: 1 });
const t = be.alloc([8, N + 64, 128], "bf16") as CpuTensor;
const vals = new Float32Array(8 * (N + 64) * 128);
let seed = 1;
for (let i = 0; i < vals.length; i++) vals[i] = ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32 - 0.5) * 2;
be.write(t, vals);
using stage = new NativeCpuStage(be, { threads: THREADS });
const native = THREADS > 1 ? stage.primitives : nativeSelectorPrimitives();
const keys = storeKeys(t), P: SelectorPrimitives = TS_TOPK ? { ...native, topK: referencePrimitives.topK } : native;
const query = Float32Array.from({ length: 32 * 128 }, (_, i) => Math.sin(i));
const positions = P.range(0, N); // the engine's, built once

function time(fn: () => void): number {
  fn();
  const t0 = performance.now();
  for (let i = 0; i < REPS; i++) fn();
  return (performance.now() - t0) / REPS;
}

const rows: [string, number][] = [];
rows.push(["keyScores over every row (post-QKᵀ scoring)", time(() => P.keyScores(query, 4, keys, 0, N))]);
for (const [name, opts] of [["quest", {}], ["quest", { pageSize: 32 }], ["infinigen", {}], ["infinigen", { channels: 16 }]] as const) {
  const sel = createSelector(name, opts) as TokenSelector<unknown>;
  const state = sel.initState({ layer: 0, sequence: 0, layout });
  const input = (n: number): PreSelectionInput<unknown> => ({
    timing: "pre", layer: 0, step: 0, sequence: 0, offloaded: n, k: K, layout, state, query, speculative: false,
    positions, primitives: P, keys,
  });
  sel.select(input(N - 1)); // the state folds the store in once, as decode would have
  rows.push([`${name} ${JSON.stringify(opts)}`, time(() => sel.select(input(N)))]);
}
const topk = TS_TOPK ? "TypeScript topK" : "native topK";
console.log(`select() per layer, ${N} offloaded bf16 rows, 32 heads / 8 KV heads × 128, K = ${K}, native primitives (${THREADS} thread(s), ${topk}):`);
for (const [label, ms] of rows) console.log(`  ${label.padEnd(48)} ${ms.toFixed(3)} ms`);
