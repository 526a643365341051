/**
 * Quest's choice on recall-4l's own keys with bf16 page summaries rounded outward (core's
 * summarizePages) against f32 summaries: recall-eval.ts's
 * prompts (a haystack, then `? kA` as two decode steps, K = 5% of the context, pages of 16),
 * with a probe selector that, at every pre step and layer, makes both choices on the reference
 * primitives (so only the summaries' format differs), records the share of the f32 choice's ids
 * the bf16 one keeps per KV head, and answers with the bf16 choice (exact logits).
 *
 *   ./bun apps/bench/src/eval/quest-recall-4l.ts [--model ../shared/models/recall-4l] [--lengths 4096,8192,16384] [--prompts 40] [--seed 1]
 *
 * Run `bun run build` first (this imports the built packages).
 */
import { resolve } from "node:path";
import {
  LlamaModel, openModelDir, questPages, questSelection, referencePrimitives as P, seededRandom, validateSelection,
  type QuestPageState, type TokenSelector,
} from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { f32Pages, f32Primitives, idsKept } from "../cpu/quest-recall.js";
import { answerWithProbe } from "./probe-answer.js";
import { makeRecallPrompt, recallVocabulary } from "./recall-prompts.js";

const arg = (name: string, def: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1]! : def;
};
const MODEL = resolve(arg("model", new URL("../../../../../shared/models/recall-4l", import.meta.url).pathname));
const LENGTHS = arg("lengths", "4096,8192,16384").split(",").map(Number);
const PROMPTS = Number(arg("prompts", "40"));
const SEED = Number(arg("seed", "1"));
const WINDOW = 256, SINKS = 4, K_FRAC = 0.05, RECORDS = 128, PAGE = 16;

using files = openModelDir(MODEL);
const V = recallVocabulary(files.tokenizer, MODEL);
const makePrompt = (r: () => number, length: number) => makeRecallPrompt(V, r, length, RECORDS);

interface Tally { kept: number; lists: number; same: number; worst: number }

/** Quest (pre) that also makes the f32-summary choice and tallies how many of its ids the bf16 one keeps. */
function probe(t: Tally): TokenSelector<QuestPageState> {
  return {
    name: "quest-probe", timings: ["pre"], needsScores: false, usesBudget: true, needsKeys: true,
    initState: () => ({ pages: null, summarized: 0 }),
    select(i) {
      if (i.timing !== "pre" || !i.keys) throw new Error("pre with keys only");
      const G = i.layout.groupSize, n = i.offloaded;
      const bf = questSelection(P, i.query, G, i.keys, questPages(P, i.state, i.keys, n, PAGE), n, i.k);
      const old = questSelection(f32Primitives, i.query, G, i.keys, f32Pages(i.keys, n, PAGE), n, i.k);
      for (const share of idsKept(old, bf, i.layout.kvHeads)) {
        t.kept += share;
        t.lists++;
        if (share === 1) t.same++;
        t.worst = Math.min(t.worst, share);
      }
      return validateSelection(bf, { offloaded: n, kvHeads: i.layout.kvHeads, k: i.k, source: "quest-probe" });
    },
  };
}

using be = createCpuBackend({ threads: 2 });
console.log(`recall-4l, Quest pages of ${PAGE} (pre, exact logits), K = ${K_FRAC * 100}% of the context, window ${WINDOW} + ${SINKS} sinks, ${PROMPTS} prompts a length:`);
console.log("| context | K | ids of the f32-summary choice kept (mean over steps × layers × KV heads) | worst list | lists identical | answers right (bf16 summaries) |");
console.log("| ---: | ---: | ---: | ---: | ---: | ---: |");
for (const length of LENGTHS) {
  const k = Math.max(1, Math.round(K_FRAC * length));
  using model = LlamaModel.load(files, be, { maxContext: length, gpuKvBudget: WINDOW, sinkTokens: SINKS, kvEvictBlock: 16 });
  const r = seededRandom(SEED * 1000 + length);
  const t: Tally = { kept: 0, lists: 0, same: 0, worst: 1 };
  let right = 0;
  for (let p = 0; p < PROMPTS; p++) {
    if (await answerWithProbe(model, be, makePrompt(r, length), V.ask, probe(t), k)) right++;
    process.stderr.write(`\r${length}: prompt ${p + 1}/${PROMPTS}`);
  }
  process.stderr.write("\n");
  console.log(`| ${length} | ${k} | ${(t.kept / t.lists).toFixed(4)} | ${t.worst.toFixed(4)} | ${t.same} / ${t.lists} | ${right} / ${PROMPTS} |`);
}
