/**
 * The page index's recall of the exact top-K per form, on a model's own keys: recall-eval.ts's
 * recall-4l prompts (a haystack, then `? kA` as two decode steps, K = 5% of the context, window
 * 256 + 4 sinks), with a probe selector that at every pre step and layer takes the exact top-K per
 * KV head by q·k (the true query: exact logits), then per form — Quest's bf16 summaries, the
 * index's int8 and int4 — the best ⌈K/page⌉ + 1 pages, and tallies the share of the exact top-K
 * those pages hold, the page summaries each choice read and their bytes, against Quest's every
 * page. It answers with the exact top-K.
 *
 *   ./bun apps/bench/src/eval/index-recall.ts [--model ../shared/models/recall-4l] [--lengths 4096,8192,16384]
 *     [--prompts 8] [--page 16] [--super 16] [--seed 1]
 *
 * Run `bun run build` first (this imports the built packages).
 */
import { resolve } from "node:path";
import {
  indexFor, LlamaModel, openModelDir, questPages, seededRandom, type OffloadedKeys, type PageIndexForm, type PageIndexState, type QuestPageState,
  type SelectorPrimitives, type TokenSelector,
} from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { arg, list } from "../args.js";
import { answerWithProbe } from "./probe-answer.js";
import { makeRecallPrompt, recallVocabulary } from "./recall-prompts.js";

const MODEL = resolve(arg("model", new URL("../../../../../shared/models/recall-4l", import.meta.url).pathname));
const LENGTHS = list("lengths", "4096,8192,16384").map(Number);
const PROMPTS = Number(arg("prompts", "8"));
const PAGE = Number(arg("page", "16")), SUPER = Number(arg("super", "16")), SEED = Number(arg("seed", "1"));
const WINDOW = 256, SINKS = 4, K_FRAC = 0.05, RECORDS = 128;
const FORMS = ["quest", "int8", "int4"] as const;
type Form = (typeof FORMS)[number];

interface Tally { recall: number; lists: number; pagesRead: number; pages: number; bytes: number; questBytes: number }
const tally = (): Record<Form, Tally> => Object.fromEntries(FORMS.map((f) => [f, { recall: 0, lists: 0, pagesRead: 0, pages: 0, bytes: 0, questBytes: 0 }])) as Record<Form, Tally>;

interface ProbeState { quest: QuestPageState; int8: PageIndexState; int4: PageIndexState }

/** Head g's rows as a one-head view. */
function head(keys: OffloadedKeys, g: number): OffloadedKeys {
  const span = keys.capacity * keys.headDim;
  return { ...keys, kvHeads: 1, data: keys.data.subarray(g * span, (g + 1) * span) };
}

/** Exact top-K per KV head, and each form's pages' recall of it. */
function probe(t: Record<Form, Tally>): TokenSelector<ProbeState> {
  return {
    name: "index-probe", timings: ["pre"], needsScores: false, usesBudget: true, needsKeys: true,
    initState: () => ({ quest: { pages: null, summarized: 0 }, int8: { index: null, summarized: 0 }, int4: { index: null, summarized: 0 } }),
    select(i) {
      if (i.timing !== "pre" || !i.keys) throw new Error("pre with keys only");
      const P: SelectorPrimitives = i.primitives, G = i.layout.groupSize, d = i.layout.headDim, n = i.offloaded, k = i.k, keys = i.keys;
      const count = Math.ceil(n / PAGE), want = Math.min(count, Math.ceil(k / PAGE) + 1), kv = i.layout.kvHeads;
      const exact = Array.from({ length: kv }, (_, g) => P.topK(P.keyScores(i.query.subarray(g * G * d, (g + 1) * G * d), G, head(keys, g), 0, n), k));
      const chosen: Record<Form, { pages: Int32Array; read: number; bytesPerPage: number; supers: number }> = {} as never;
      const q = questPages(P, i.state.quest, keys, n, PAGE), qb = P.pageBounds(i.query, G, q, count);
      chosen.quest = { pages: Int32Array.from({ length: kv * want }, () => 0), read: kv * count, bytesPerPage: 4 * d, supers: 0 };
      for (let g = 0; g < kv; g++) chosen.quest.pages.set(P.topK(qb.subarray(g * count, (g + 1) * count), want), g * want);
      for (const f of ["int8", "int4"] as PageIndexForm[]) {
        const x = indexFor(P, i.state[f], keys, n, PAGE, SUPER, f), got = P.indexPages(i.query, G, x, n, want);
        chosen[f] = { pages: got.pages, read: got.pagesRead, bytesPerPage: x.codeBytes + 4, supers: kv * Math.ceil(count / SUPER) };
      }
      for (const f of FORMS) {
        const c = chosen[f], s = t[f];
        for (let g = 0; g < kv; g++) {
          const inPages = new Set(Array.from(c.pages.subarray(g * want, (g + 1) * want)));
          s.recall += Array.from(exact[g]!).filter((id) => inPages.has(Math.floor(id / PAGE))).length / k;
          s.lists++;
        }
        s.pagesRead += c.read;
        s.pages += kv * count;
        s.bytes += (c.read + c.supers) * c.bytesPerPage;
        s.questBytes += kv * count * 4 * d;
      }
      return { kind: "perKvHead", ids: exact.map((e) => e.slice().sort()) };
    },
  };
}

using files = openModelDir(MODEL);
const V = recallVocabulary(files.tokenizer, MODEL);
using be = createCpuBackend({ threads: 2 });
console.log(`recall-4l, pages of ${PAGE}, super-pages of ${SUPER} pages, K = ${K_FRAC * 100}% of the context, window ${WINDOW} + ${SINKS} sinks, ${PROMPTS} prompts a length, exact logits (the true query):`);
console.log("| context | K | form | recall of the exact top-K (mean over steps × layers × KV heads) | pages bounded | bytes read / Quest's | answers right (exact top-K) |");
console.log("| ---: | ---: | --- | ---: | ---: | ---: | ---: |");
for (const length of LENGTHS) {
  const k = Math.max(1, Math.round(K_FRAC * length));
  using model = LlamaModel.load(files, be, { maxContext: length, gpuKvBudget: WINDOW, sinkTokens: SINKS, kvEvictBlock: 16 });
  const r = seededRandom(SEED * 1000 + length), t = tally();
  let right = 0;
  for (let p = 0; p < PROMPTS; p++) {
    if (await answerWithProbe(model, be, makeRecallPrompt(V, r, length, RECORDS), V.ask, probe(t), k)) right++;
    process.stderr.write(`\r${length}: prompt ${p + 1}/${PROMPTS}`);
  }
  process.stderr.write("\n");
  for (const f of FORMS) {
    const s = t[f];
    console.log(`| ${length} | ${k} | ${f === "quest" ? "Quest bf16" : `index ${f}`} | ${(s.recall / s.lists).toFixed(4)} | ${((100 * s.pagesRead) / s.pages).toFixed(1)}% | ${(s.bytes / s.questBytes).toFixed(3)} | ${right} / ${PROMPTS} |`);
  }
}
