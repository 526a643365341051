/**
 * The compact hierarchical page index, pre-QKᵀ (the spec's page-index.ts defines it): per page of
 * `pageSize` offloaded tokens and KV head, int8 or int4 bounds of K with a scale of their own, and
 * super-pages of `superPages` pages over them, so choosing K tokens reads the super-pages and the
 * few pages that can still win, not every row nor every bf16 page summary. The best pages' tokens,
 * K per KV head, as Quest fills its lists. The same choice runs inside a CpuStage as the "index"
 * kernel; select() is the definition for engines without one.
 */
import { indexFor, indexSelection, PAGE_INDEX_FORMS, type PageIndexState } from "@hybridgen/spec";
import { z } from "zod";
import { defineSelector } from "../define-selector.js";
import { BUILTIN } from "../builtin-mark.js";
import { layerKeys } from "./layer-keys.js";

export const PageIndexOptionsSchema = z.object({
  /** How page bounds are stored: int8 (2·headDim bytes a page) or int4 (headDim bytes). */
  form: z.enum(PAGE_INDEX_FORMS, { error: (i) => `form ${JSON.stringify(i.input)} does not exist (forms: ${PAGE_INDEX_FORMS.join(", ")})` }).default("int8"),
  /** Offloaded tokens per page. */
  pageSize: z.number().int().min(1).max(4096).default(16),
  /** Pages per super-page (the index's second level). */
  superPages: z.number().int().min(1).max(4096).default(16),
  /** Where the pages are ranked: "device" (the page level in GPU memory, Backend.indexRank; the stage
   * fills the lists from the chosen pages), "host" (the CPU stage searches its own index), or "auto"
   * (the device when the backend ranks and the index fits its free memory). */
  placement: z.enum(["auto", "host", "device"], { error: (i) => `placement ${JSON.stringify(i.input)} does not exist (auto, host, device)` }).default("auto"),
}).strict();

export const pageIndexSelector = defineSelector<z.output<typeof PageIndexOptionsSchema>, PageIndexState>({
  name: "index",
  description: "pre-QKᵀ compact page index: int8/int4 page bounds under super-pages; the best pages' tokens, K per KV head",
  timings: ["pre"],
  needsKeys: true,
  options: PageIndexOptionsSchema,
  kernel: ({ form, pageSize, superPages, placement }) => ({ name: "index", form, pageSize, superPages, placement }),
  initState: () => ({ index: null, summarized: 0 }),
  select(input, { form, pageSize, superPages }) { // the definition: where the pages are ranked changes only f32 rounding ties
    const { offloaded: n, k, layout, primitives: P, state, query } = input;
    const keys = layerKeys(input);
    const index = indexFor(P, state, keys, n, pageSize, superPages, form);
    return indexSelection(P, query, layout.groupSize, keys, index, n, k);
  },
}, BUILTIN);
