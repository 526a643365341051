/**
 * Quest-style page selection, pre-QKᵀ: per page of `pageSize` offloaded tokens and KV head, the
 * per-channel min and max of K bound q·k; per KV head the best pages' tokens, K in all (core's
 * questSelection defines the choice). The same choice runs inside a CpuStage as the "quest"
 * kernel, so an engine with one skips select(); select() is the definition for engines without.
 */
import { questPages, questSelection, type QuestPageState } from "@hybridgen/spec";
import { z } from "zod";
import { defineSelector } from "../define-selector.js";
import { BUILTIN } from "../builtin-mark.js";
import { layerKeys } from "./layer-keys.js";
import { newScratch, scratchView, type Scratch } from "./scratch.js";

export const QuestOptionsSchema = z.object({
  /** Offloaded tokens per page (Quest uses 16). */
  pageSize: z.number().int().min(1).max(4096).default(16),
}).strict();

export interface QuestState extends QuestPageState {
  bounds: Scratch;
}

export const quest = defineSelector<z.output<typeof QuestOptionsSchema>, QuestState>({
  name: "quest",
  description: "pre-QKᵀ pages (Quest): per-page min/max of K bound q·k; the best pages' tokens, K per KV head",
  timings: ["pre"],
  needsKeys: true,
  options: QuestOptionsSchema,
  kernel: ({ pageSize }) => ({ name: "quest", pageSize }),
  initState: () => ({ pages: null, summarized: 0, bounds: newScratch() }),
  select(input, { pageSize }) {
    const { offloaded: n, k, layout, primitives: P, state, query } = input;
    const keys = layerKeys(input);
    const pages = questPages(P, state, keys, n, pageSize);
    const bounds = scratchView(state.bounds, layout.kvHeads * Math.ceil(n / pageSize));
    return questSelection(P, query, layout.groupSize, keys, pages, n, k, bounds);
  },
}, BUILTIN);
