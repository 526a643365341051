/**
 * Where the asked record stands in Quest's page ranking and in the exact top-K, per layer, as the
 * context grows: the eval's needle prompts (retrieval-tasks.ts), prefilled once; the question fed
 * twice, with exact logits (the true query q) and with speculative logits (q̃), a probe selector
 * reading, at the answer's step, every layer's ranks of the record's tokens (`kA vB .`) by q·k and
 * of their pages by Quest's bound. Per layer the KV head where the record ranks best by q·k counts.
 *
 *   ./bun apps/bench/src/eval/quest-rank.ts [--model ../shared/models/recall-4l] [--lengths 4096,8192,16384] [--prompts 4]
 *     [--window 256] [--sinks 4] [--records 64] [--page 16] [--seed 1] [--json FILE]
 */
import { resolve } from "node:path";
import { writeFileSync } from "node:fs";
import { LlamaModel, openModelDir, questPages, seededRandom, validateSelection, type OffloadedKeys, type QuestPageState, type TokenSelector } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { createHybridAttention } from "@hybridgen/runtime";
import { arg, list } from "../args.js";
import { retrievalPrompt, retrievalVocabulary } from "./retrieval-tasks.js";

const MODEL = resolve(arg("model", new URL("../../../../../shared/models/recall-4l", import.meta.url).pathname));
const LENGTHS = list("lengths", "4096,8192,16384").map(Number);
const PROMPTS = Number(arg("prompts", "4"));
const WINDOW = Number(arg("window", "256")), SINKS = Number(arg("sinks", "4")), RECORDS = Number(arg("records", "64"));
const PAGE = Number(arg("page", "16")), SEED = Number(arg("seed", "1"));

/** One layer's ranks at the answer's step (0 = first): the record's best token by q·k and its best page by Quest's bound, on the KV head where the token ranks best. */
interface Ranks { token: number; page: number; pages: number; offloaded: number }

const rankOf = (scores: Float32Array, i: number) => {
  let above = 0;
  for (let j = 0; j < scores.length; j++) if (scores[j]! > scores[i]!) above++;
  return above;
};
const head = (keys: OffloadedKeys, g: number): OffloadedKeys => ({ ...keys, kvHeads: 1, data: keys.data.subarray(g * keys.capacity * keys.headDim, (g + 1) * keys.capacity * keys.headDim) });

/** A pre-QKᵀ selector that keeps every token (the answer is full attention's) and records, per layer, the record's ranks at the last call. */
function probe(slots: number[], out: Ranks[]): TokenSelector<QuestPageState> {
  return {
    name: "quest-rank-probe", timings: ["pre"], needsScores: false, usesBudget: false, needsKeys: true,
    initState: () => ({ pages: null, summarized: 0 }),
    select(i) {
      if (i.timing !== "pre" || !i.keys) throw new Error("pre with keys only");
      const P = i.primitives, G = i.layout.groupSize, d = i.layout.headDim, n = i.offloaded, count = Math.ceil(n / PAGE);
      const bounds = P.pageBounds(i.query, G, questPages(P, i.state, i.keys, n, PAGE), count);
      let best: Ranks | null = null;
      for (let g = 0; g < i.layout.kvHeads; g++) {
        const s = P.keyScores(i.query.subarray(g * G * d, (g + 1) * G * d), G, head(i.keys, g), 0, n);
        const b = bounds.subarray(g * count, (g + 1) * count);
        const token = Math.min(...slots.map((x) => rankOf(s, x)));
        const page = Math.min(...slots.map((x) => rankOf(b, Math.floor(x / PAGE))));
        if (!best || token < best.token) best = { token, page, pages: count, offloaded: n };
      }
      out[i.layer] = best!;
      return validateSelection({ kind: "shared", ids: Int32Array.from({ length: n }, (_, j) => j) }, { offloaded: n, kvHeads: i.layout.kvHeads, k: n, source: "quest-rank-probe" });
    },
  };
}

using files = openModelDir(MODEL);
const V = retrievalVocabulary(files.tokenizer, MODEL);
using be = createCpuBackend({ threads: 2 });
const rows: { length: number; query: string; layer: number; token: number[]; page: number[]; pages: number; offloaded: number }[] = [];
console.log(`${MODEL.split("/").pop()}: the asked record's rank (0 = first) by q·k among the offloaded tokens and of its page by Quest's bound (pages of ${PAGE}), at the answer's step; median (max) over ${PROMPTS} prompts, window ${WINDOW} + ${SINKS} sinks, ${RECORDS} records`);
console.log("| context | query | layer | token rank by q·k | page rank by Quest's bound | pages |");
console.log("| ---: | --- | ---: | ---: | ---: | ---: |");
for (const length of LENGTHS) {
  using model = LlamaModel.load(files, be, { maxContext: length, gpuKvBudget: WINDOW, sinkTokens: SINKS, kvEvictBlock: 16 });
  const r = seededRandom(SEED * 1000 + length);
  const got: Record<string, Ranks[][]> = { q: [], "q̃": [] };
  for (let p = 0; p < PROMPTS; p++) {
    const prompt = retrievalPrompt(V, "needle", r, length, RECORDS);
    const key = prompt.question[1]!, at = prompt.context.lastIndexOf(key);
    // The record `kA vB .` at context positions at..at+2; offloaded slot = position − sinks (the window holds the last tokens).
    const slots = [at, at + 1, at + 2].map((x) => x - SINKS);
    model.reset();
    model.forward(Int32Array.from(prompt.context), 0);
    using cp = model.cache.checkpoint();
    for (const [query, logits] of [["q", "exact"], ["q̃", "speculative"]] as const) {
      const ranks: Ranks[] = [];
      const h = await createHybridAttention(model, be, { scheduler: "fixed", timing: "pre", selector: probe(slots, ranks), logits, exactLayers: [], calibrate: false, k: 1, cpuStageThreads: 1 });
      try {
        let pos = prompt.context.length;
        for (const tok of prompt.question) model.forward(Int32Array.of(tok), pos++);
      } finally {
        h.close();
        model.cache.restore(cp);
      }
      got[query]!.push(ranks);
    }
    process.stderr.write(`\r${length}: prompt ${p + 1}/${PROMPTS}`);
  }
  process.stderr.write("\n");
  const med = (x: number[]) => [...x].sort((a, b) => a - b)[Math.floor((x.length - 1) / 2)]!;
  for (const query of ["q", "q̃"]) {
    const per = got[query]!;
    for (let l = 0; l < per[0]!.length; l++) {
      const token = per.map((x) => x[l]!.token), page = per.map((x) => x[l]!.page);
      rows.push({ length, query, layer: l, token, page, pages: per[0]![l]!.pages, offloaded: per[0]![l]!.offloaded });
      console.log(`| ${length} | ${query} | ${l} | ${med(token)} (${Math.max(...token)}) | ${med(page)} (${Math.max(...page)}) | ${per[0]![l]!.pages} |`);
    }
  }
}
const json = arg("json", "");
if (json) writeFileSync(json, `${JSON.stringify({ model: MODEL.split("/").pop(), prompts: PROMPTS, window: WINDOW, sinks: SINKS, records: RECORDS, page: PAGE, seed: SEED, rows }, null, 1)}\n`);
