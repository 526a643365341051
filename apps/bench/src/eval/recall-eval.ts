/**
 * Retrieval accuracy of hybrid attention on recall-4l (a 4-layer Llama trained to answer
 * `? kA` with the `vB` of a record `kA vB .` hidden far back in a haystack of fillers).
 *
 *   ./bun apps/bench/src/eval/recall-eval.ts [--model ../shared/models/recall-4l] [--lengths 4096,8192,16384]
 *     [--prompts 40] [--window 256] [--sinks 4] [--k-frac 0.05] [--records 128] [--threads 2]
 *     [--modes full,exact,speculative,verified,...] [--exact-layers 1] [--seed 1] [--json FILE]
 *
 * Per prompt the context is prefilled once (prefill is exact full attention in every mode) and
 * checkpointed; each mode then attaches its hybrid attention, feeds `?` and `kA` as decode steps
 * (so the answer depends on decode-time attention) and checks the greedy next token against
 * `vB`, and the cache goes back to the checkpoint. "full" is "all" + exact logits, which equals
 * full attention (core's tests hold that). Run `bun run build` first (this imports the built packages).
 */
import { resolve } from "node:path";
import { writeFileSync } from "node:fs";
import { argmax, LlamaModel, openModelDir, seededRandom } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { createHybridAttention, type HybridRuntimeOptions } from "@hybridgen/runtime";
import { makeRecallPrompt, recallVocabulary } from "./recall-prompts.js";

const arg = (name: string, def: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1]! : def;
};
const list = (name: string, def: string) => arg(name, def).split(",").filter((x) => x !== "");
const MODEL = resolve(arg("model", new URL("../../../../../shared/models/recall-4l", import.meta.url).pathname));
const LENGTHS = list("lengths", "4096,8192,16384").map(Number);
const PROMPTS = Number(arg("prompts", "40"));
const WINDOW = Number(arg("window", "256")), SINKS = Number(arg("sinks", "4"));
const K_FRAC = Number(arg("k-frac", "0.05"));
const RECORDS = Number(arg("records", "128"));
const THREADS = Number(arg("threads", "2"));
const SEED = Number(arg("seed", "1"));
const PROFILE_EXACT = list("exact-layers", "1").map(Number);

/** A mode's hybrid runtime options; K (the fixed K, or the feedback scheduler's kMin) is added per length. */
interface Mode { label: string; options: HybridRuntimeOptions; kAs: "k" | "kMin" }
const fixed = (label: string, options: HybridRuntimeOptions): Mode => ({ label, options: { scheduler: "fixed", timing: "post", selector: "topk", ...options }, kAs: "k" });
const MODES: Record<string, Mode> = {
  full: fixed("full attention", { selector: "all", logits: "exact" }),
  exact: fixed("top-K, exact", { logits: "exact" }),
  speculative: fixed("top-K, speculative", { logits: "speculative" }),
  verified: fixed("top-K, verified", { logits: "verified", candidates: 1 }),
  "verified-c2": fixed("top-K, verified, 2× candidates", { logits: "verified", candidates: 2 }),
  "verified-c4": fixed("top-K, verified, 4× candidates", { logits: "verified", candidates: 4 }),
  "verified-exact": fixed(`top-K, verified, exact selection at layers ${PROFILE_EXACT.join(",")}`, { logits: "verified", candidates: 1, exactLayers: PROFILE_EXACT }),
  "speculative-exact": fixed(`top-K, speculative, exact selection at layers ${PROFILE_EXACT.join(",")}`, { logits: "speculative", exactLayers: PROFILE_EXACT }),
  default: fixed("top-K, the default logits (verified, 4× candidates)", {}),
  "default-keep1": fixed("top-K, verified, 4× candidates, K of them kept once scored (keep 1)", { keep: 1 }),
  "exact-int8": fixed("top-K, exact, int8 two-step scoring (2·K rescored)", { logits: "exact", scoring: "int8", rescoreFactor: 2 }),
  "exact-int4": fixed("top-K, exact, int4 two-step scoring (4·K rescored)", { logits: "exact", scoring: "int4", rescoreFactor: 4 }),
  "default-int8": fixed("top-K, default logits, int8 two-step scoring (2·K rescored)", { scoring: "int8", rescoreFactor: 2 }),
  "default-int4": fixed("top-K, default logits, int4 two-step scoring (4·K rescored)", { scoring: "int4", rescoreFactor: 4 }),
  streaming: fixed("StreamingLLM (pre)", { selector: "streaming", timing: "pre", logits: "exact" }),
  quest: fixed("Quest page bounds (pre), verified", { selector: "quest", timing: "pre", logits: "verified" }),
  infinigen: fixed("InfiniGen partial keys (pre), verified", { selector: "infinigen", timing: "pre", logits: "verified" }),
  "quest-exact": fixed("Quest page bounds (pre), exact", { selector: "quest", timing: "pre", logits: "exact" }),
  "infinigen-exact": fixed("InfiniGen partial keys (pre), exact", { selector: "infinigen", timing: "pre", logits: "exact" }),
  feedback: { label: "feedback scheduler (topk+streaming, kMin = K), default logits", options: { scheduler: "feedback", selector: "topk+streaming" }, kAs: "kMin" },
  "feedback-quest": { label: "feedback scheduler (topk+quest, kMin = K), default logits", options: { scheduler: "feedback", selector: "topk+quest" }, kAs: "kMin" },
  index: fixed("page index int8 (pre), verified", { selector: "index", timing: "pre", logits: "verified" }),
  "index-keep1": fixed("page index int8 (pre), verified, K of the 4·K candidates kept once scored (keep 1)", { selector: "index", timing: "pre", logits: "verified", keep: 1 }),
  "index-c2-keep1": fixed("page index int8 (pre), verified, 2·K candidates, K of them kept once scored", { selector: "index", timing: "pre", logits: "verified", candidates: 2, keep: 1 }),
  "index-int4": fixed("page index int4 (pre), verified", { selector: "index", selectorOptions: { form: "int4" }, timing: "pre", logits: "verified" }),
  "index-exact": fixed("page index int8 (pre), exact", { selector: "index", timing: "pre", logits: "exact" }),
  "feedback-index": { label: "feedback scheduler (topk+index, kMin = K), default logits", options: { scheduler: "feedback", selector: "topk+index" }, kAs: "kMin" },
  "feedback-infinigen": { label: "feedback scheduler (topk+infinigen, kMin = K), default logits", options: { scheduler: "feedback", selector: "topk+infinigen" }, kAs: "kMin" },
};
const modeNames = list("modes", "full,exact,speculative,verified,verified-c2,verified-c4,verified-exact,streaming");
for (const m of modeNames) if (!MODES[m]) throw new Error(`unknown mode ${m} (modes: ${Object.keys(MODES).join(", ")})`);

using files = openModelDir(MODEL);
const V = recallVocabulary(files.tokenizer, MODEL);
const makePrompt = (r: () => number, length: number) => makeRecallPrompt(V, r, length, RECORDS);

using be = createCpuBackend({ threads: THREADS });
const results: Record<string, Record<number, { correct: number; total: number; meanK: number; cpuMsPerLayer: number }>> = {};
for (const m of modeNames) results[m] = {};

for (const length of LENGTHS) {
  const k = Math.max(1, Math.round(K_FRAC * length));
  using model = LlamaModel.load(files, be, { maxContext: length, gpuKvBudget: WINDOW, sinkTokens: SINKS, kvEvictBlock: 16 });
  const r = seededRandom(SEED * 1000 + length);
  for (const m of modeNames) results[m]![length] = { correct: 0, total: 0, meanK: 0, cpuMsPerLayer: 0 };
  const t0 = performance.now();
  for (let p = 0; p < PROMPTS; p++) {
    const { context, key, answer } = makePrompt(r, length);
    model.reset();
    model.forward(Int32Array.from(context), 0);
    using cp = model.cache.checkpoint();
    for (const name of modeNames) {
      const mode = MODES[name]!;
      const h = await createHybridAttention(model, be, { ...mode.options, [mode.kAs]: k, cpuStageThreads: 1 });
      try {
        model.forward(Int32Array.of(V.ask), context.length);
        const logits = model.forward(Int32Array.of(key), context.length + 1);
        const res = results[name]![length]!;
        res.total++;
        if (argmax(logits) === answer) res.correct++;
        res.meanK += h.stats.meanRows;
        res.cpuMsPerLayer += h.stats.layerSteps ? (h.stats.cpuStageMs + h.stats.cpuJsMs) / h.stats.layerSteps : 0;
      } finally {
        h.close();
        model.cache.restore(cp);
      }
    }
    process.stderr.write(`\r${length}: prompt ${p + 1}/${PROMPTS} (${((performance.now() - t0) / 1000).toFixed(0)} s)`);
  }
  process.stderr.write("\n");
}

const head = ["mode", ...LENGTHS.map((l) => `${l}`)];
const rows = modeNames.map((m) => [MODES[m]!.label, ...LENGTHS.map((l) => {
  const x = results[m]![l]!;
  return (x.correct / x.total).toFixed(3);
})]);
const w = head.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i]!.length)));
console.log(`\nrecall-4l retrieval accuracy (${PROMPTS} prompts per length, ${RECORDS} records each, window ${WINDOW} with ${SINKS} sinks, K = ${K_FRAC * 100}% of the context, CPU backend):`);
console.log(`| ${head.map((h, i) => h.padEnd(w[i]!)).join(" | ")} |`);
console.log(`| ${w.map((n) => "-".repeat(n)).join(" | ")} |`);
for (const row of rows) console.log(`| ${row.map((c, i) => c.padEnd(w[i]!)).join(" | ")} |`);
const json = arg("json", "");
if (json) writeFileSync(json, `${JSON.stringify({ model: MODEL, prompts: PROMPTS, records: RECORDS, window: WINDOW, sinks: SINKS, kFrac: K_FRAC, results }, null, 2)}\n`);
