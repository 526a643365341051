/**
 * Retrieval accuracy of the default hybrid configuration decoded in batches (issue 35): recall-4l's
 * prompts (recall-prompts.ts) in batches of B, each batch prefilled slot by slot (exact full
 * attention) and then asked `? kA` as two batched decode steps, the greedy answer checked against
 * `vB`; the same prompts decoded by full attention in the same batches. The batched default should
 * stay within 0.02 of full attention.
 *
 *   ./bun apps/bench/src/eval/recall-batch.ts [--model ../shared/models/recall-4l] [--lengths 4096,8192]
 *     [--prompts 40] [--batch 8] [--window 256] [--sinks 4] [--k-frac 0.05] [--records 128] [--threads 2] [--seed 1] [--json FILE]
 *
 * The default is `hybridgen bench`'s "hybridgen" configuration (the feedback scheduler from kMin =
 * K, verified logits, the runtime's default selector), one per sequence (createBatchHybridAttention).
 * Run `bun run build` first (this imports the built packages).
 */
import { resolve } from "node:path";
import { writeFileSync } from "node:fs";
import { argmax, BatchDecoder, LlamaModel, openModelDir, seededRandom } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { attentionConfig, createBatchHybridAttention } from "@hybridgen/runtime";
import { makeRecallPrompt, recallVocabulary } from "./recall-prompts.js";
import { arg, list } from "../args.js";

const MODEL = resolve(arg("model", new URL("../../../../../shared/models/recall-4l", import.meta.url).pathname));
const LENGTHS = list("lengths", "4096,8192").map(Number);
const PROMPTS = Number(arg("prompts", "40"));
const B = Number(arg("batch", "8"));
const WINDOW = Number(arg("window", "256")), SINKS = Number(arg("sinks", "4"));
const K_FRAC = Number(arg("k-frac", "0.05"));
const RECORDS = Number(arg("records", "128"));
const THREADS = Number(arg("threads", "2"));
const SEED = Number(arg("seed", "1"));
if (!(Number.isInteger(B) && B >= 2 && PROMPTS % B === 0)) throw new Error(`--batch ${B} must be ≥ 2 and divide --prompts ${PROMPTS}`);

using files = openModelDir(MODEL);
const V = recallVocabulary(files.tokenizer, MODEL);
using be = createCpuBackend({ threads: THREADS });
const MODES = ["full", "hybridgen"] as const;
const results: Record<string, Record<number, { correct: number; total: number }>> = { full: {}, hybridgen: {} };

for (const length of LENGTHS) {
  const k = Math.max(1, Math.round(K_FRAC * length));
  const r = seededRandom(SEED * 1000 + length);
  const prompts = Array.from({ length: PROMPTS }, () => makeRecallPrompt(V, r, length, RECORDS));
  const t0 = performance.now();
  for (const mode of MODES) {
    const res = (results[mode]![length] = { correct: 0, total: 0 });
    using model = LlamaModel.load(files, be, { maxContext: length, gpuKvBudget: WINDOW, sinkTokens: SINKS, kvEvictBlock: 16 });
    const config = attentionConfig(mode, k);
    // Every sequence the decoder makes gets its own hybrid attention (one stage thread each: the CPU backend shares these cores).
    using _hybrid = config.hybrid ? await createBatchHybridAttention(model, be, { ...config.hybrid, cpuStageThreads: 1 }, B) : null;
    using dec = new BatchDecoder(model, B);
    const slots = Array.from({ length: B }, (_, i) => i);
    for (let first = 0; first < PROMPTS; first += B) {
      const batch = prompts.slice(first, first + B);
      batch.forEach((p, i) => dec.prefill(i, Int32Array.from(p.context), 0));
      dec.step(slots, new Int32Array(B).fill(V.ask));
      dec.step(slots, Int32Array.from(batch, (p) => p.key));
      batch.forEach((p, i) => {
        res.total++;
        if (argmax(dec.logits(i)) === p.answer) res.correct++;
      });
      process.stderr.write(`\r${length} ${mode}: ${res.total}/${PROMPTS} (${((performance.now() - t0) / 1000).toFixed(0)} s)`);
    }
    process.stderr.write("\n");
  }
}

const acc = (m: string, l: number) => results[m]![l]!.correct / results[m]![l]!.total;
console.log(`\nrecall-4l retrieval accuracy at batch ${B} (${PROMPTS} prompts per length, ${RECORDS} records each, window ${WINDOW} with ${SINKS} sinks, K = ${K_FRAC * 100}% of the context, CPU backend):`);
console.log(`| configuration | ${LENGTHS.join(" | ")} |`);
console.log(`| --- | ${LENGTHS.map(() => "---:").join(" | ")} |`);
for (const m of MODES) console.log(`| ${m === "full" ? "full attention" : "hybridgen (default), batched"} | ${LENGTHS.map((l) => acc(m, l).toFixed(3)).join(" | ")} |`);
console.log(`| difference | ${LENGTHS.map((l) => (acc("hybridgen", l) - acc("full", l)).toFixed(3)).join(" | ")} |`);
const json = arg("json", "");
if (json) writeFileSync(json, `${JSON.stringify({ model: MODEL, batch: B, prompts: PROMPTS, records: RECORDS, window: WINDOW, sinks: SINKS, kFrac: K_FRAC, results }, null, 2)}\n`);
