/**
 * The TokenSelector contract (paper §4.3/§4.5): which offloaded tokens take part in a layer's
 * attention this step.
 *
 * Offloaded tokens are addressed by *slot*: slot i is the i-th token the eviction engine moved
 * to the host store for this sequence. Slots are stable for the life of a sequence (the store
 * only appends), so per-slot state such as accumulated scores stays valid across steps, and
 * slot order is position order (eviction is oldest-first), which lets the concatenator keep
 * logits in token order without sorting.
 *
 * Two timings:
 * - "pre"  — choose slots from cheap information (positions, accumulated scores, the
 *            speculative query), then only the chosen tokens are scored.
 * - "post" — every offloaded token is scored first; the selector chooses from those logits.
 */
import { z } from "zod";
import type { DType } from "../backend.js";
import { HybridgenError } from "../errors.js";
import type { SpecVersion } from "../version.js";
import type { IndexFoldItem, IndexPages, PageIndex, PageIndexForm } from "./page-index.js";

export const SelectionTimingSchema = z.enum(["pre", "post"]);
export type SelectionTiming = z.infer<typeof SelectionTimingSchema>;

/** Grouped-query attention layout: query head h reads KV head floor(h / groupSize). */
export interface HeadLayout {
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  /** heads / kvHeads. */
  readonly groupSize: number;
}

export const HeadLayoutSchema = z
  .object({
    heads: z.number().int().positive(),
    kvHeads: z.number().int().positive(),
    headDim: z.number().int().positive(),
    groupSize: z.number().int().positive(),
  })
  .refine((l) => l.heads === l.kvHeads * l.groupSize, {
    message: "heads must equal kvHeads × groupSize",
    path: ["groupSize"],
  });

/** Builds a checked layout from head counts. */
export function headLayout(heads: number, kvHeads: number, headDim: number): HeadLayout {
  if (!Number.isInteger(heads) || !Number.isInteger(kvHeads) || heads <= 0 || kvHeads <= 0 || heads % kvHeads !== 0) {
    throw new HybridgenError(`head layout: ${heads} query heads is not a positive multiple of ${kvHeads} KV heads`);
  }
  if (!Number.isInteger(headDim) || headDim <= 0) throw new HybridgenError(`head layout: headDim must be a positive integer, got ${headDim}`);
  return { heads, kvHeads, headDim, groupSize: heads / kvHeads };
}

/**
 * Vector primitives handed to selectors, so a plugin never loops per token in JS for heavy
 * lifting. The engine passes native implementations where it has them (kernels-cpu) and
 * `referencePrimitives` otherwise; both follow exactly these semantics.
 */
export interface SelectorPrimitives {
  /**
   * Indices of the `k` largest of `values[0..length)` (length defaults to values.length),
   * returned in ascending index order. Ties go to the lower index; NaN ranks below every
   * number. k is clamped to [0, length].
   */
  topK(values: Float32Array, k: number, length?: number): Int32Array;
  /** out[j] = max over rows r of rows[r][j], for j < length. */
  maxRows(rows: readonly Float32Array[], length: number, out?: Float32Array): Float32Array;
  /** out[j] = Σ over rows r of rows[r][j], for j < length. */
  sumRows(rows: readonly Float32Array[], length: number, out?: Float32Array): Float32Array;
  /** [start, start + 1, …, start + count − 1]. */
  range(start: number, count: number): Int32Array;
  /**
   * Folds K rows [from, to) of every KV head into their pages' per-channel min and max
   * (page p holds slots [p·pageSize, (p + 1)·pageSize)); a row at a page's first slot resets
   * that page first, so pages are written once as they fill and a partial page stays current.
   * Each value is rounded outward to bf16 (toward −∞ for the min, +∞ for the max) before it is
   * compared (a NaN never replaces a value): an implementation must store the same bits.
   */
  summarizePages(keys: OffloadedKeys, from: number, to: number, pages: PageSummaries): void;
  /**
   * Quest's upper bound of q·k over a page: out[g · count + p] = max over the query heads h of
   * KV head g (h = g·groupSize …) of Σ_c max(q[h,c]·min[g,p,c], q[h,c]·max[g,p,c]), p < count,
   * the bf16 summaries widened to f32. query is [kvHeads · groupSize, pages.headDim].
   */
  pageBounds(query: Float32Array, groupSize: number, pages: PageSummaries, count: number, out?: Float32Array): Float32Array;
  /**
   * out[g · (to − from) + slot − from] = max over the query heads h of KV head g of
   * Σ_c q[h,c]·K[g,slot,c] (unscaled), for slots [from, to). query is [kvHeads · groupSize, keys.headDim].
   */
  keyScores(query: Float32Array, groupSize: number, keys: OffloadedKeys, from: number, to: number, out?: Float32Array): Float32Array;
  /**
   * Packs a few channels of K rows [from, to) as f32: out row (g, slot) = K[g, slot, channels[g·r + i]]
   * for i < r = out.headDim (channels holds r per KV head). out is an f32 OffloadedKeys.
   */
  gatherChannels(keys: OffloadedKeys, channels: Int32Array, from: number, to: number, out: OffloadedKeys): void;
  /**
   * Folds K rows [from, to) of every KV head into a compact page index (page-index.ts): each page
   * they touch is summarized afresh from its rows, then its super-page from its pages. An
   * implementation must store the same bytes.
   */
  indexFold(keys: OffloadedKeys, from: number, to: number, index: PageIndex): void;
  /**
   * Optional: indexFold of many items at once — a batched step's rows × layers in one call, which a
   * native implementation runs as one pool op. The same bytes as each item's indexFold (indexFoldAll
   * loops where it is missing).
   */
  indexFoldMany?(items: readonly IndexFoldItem[]): void;
  /**
   * The best `want` pages of rows [0, n) per KV head by the index's bounds (max over the group's
   * query heads), highest first, ties to the lower page: the flat choice over every page, found
   * by reading the super-pages and only the pages of those that can still reach it.
   */
  indexPages(query: Float32Array, groupSize: number, index: PageIndex, n: number, want: number): IndexPages;
}

/**
 * A read-only view of a layer's offloaded K rows (the host store), for selectors that read keys
 * before scoring (pre-QKᵀ). Element (g, slot, c) is data[(g · capacity + slot) · headDim + c];
 * f16/bf16 rows are their bit patterns in a Uint16Array. Rows ≥ offloaded hold no token yet.
 * The engine hands the store itself (no copy) where its CPU stage can: read it, never write it.
 */
export interface OffloadedKeys {
  readonly dtype: DType;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly capacity: number;
  readonly data: Float32Array | Uint16Array;
}

/**
 * Per-page, per-channel min and max of K ([kvHeads, pageCapacity, headDim] each, bf16 bit patterns):
 * min rounded toward −∞ and max toward +∞, so Σ_c max(q_c·min_c, q_c·max_c) still bounds q·k while
 * the bounds read half the bytes of f32 summaries (Quest is bound by those bytes at long context).
 */
export interface PageSummaries {
  readonly pageSize: number;
  readonly kvHeads: number;
  readonly headDim: number;
  /** Pages per KV head the arrays hold. */
  readonly pageCapacity: number;
  readonly min: Uint16Array;
  readonly max: Uint16Array;
}

/**
 * Accumulated attention (H2O / Keyformer style), maintained by the engine when a selector asks
 * for it (`needsScores`). perKvHead[g][slot] is the softmax probability the slot's token received,
 * summed over the query heads of group g and over every past decode step (0 for steps in which
 * it was not attended). Arrays are at least `offloaded` long.
 */
export interface AccumulatedScores {
  readonly perKvHead: readonly Float32Array[];
  /** Decode steps summed so far. */
  readonly steps: number;
}

/** What every select() call receives, whatever the timing. One call = one layer of one sequence. */
export interface SelectionBase<S = unknown> {
  readonly layer: number;
  /** Decode step (0 = the first token after the prompt). */
  readonly step: number;
  /** Row of the batch this sequence occupies. */
  readonly sequence: number;
  /** Number of offloaded tokens: valid slots are 0 … offloaded − 1. */
  readonly offloaded: number;
  /** positions[slot] = the token's position in the sequence; ascending; length ≥ offloaded. */
  readonly positions: Int32Array;
  /** K from the scheduler, already clamped to [0, offloaded]: ids to return per list, at most. */
  readonly k: number;
  readonly layout: HeadLayout;
  /** The state this selector's initState() made for (layer, sequence); the selector may mutate it. */
  readonly state: S;
  /** Present when the selector declared `needsScores`. */
  readonly scores?: AccumulatedScores;
  readonly primitives: SelectorPrimitives;
  /** The layer's offloaded K rows: present when the selector declared `needsKeys` and the engine's CPU stage exposes them. */
  readonly keys?: OffloadedKeys;
}

export interface PreSelectionInput<S = unknown> extends SelectionBase<S> {
  readonly timing: "pre";
  /**
   * The query that will be scored against the chosen tokens, heads × headDim, RoPE applied.
   * In speculative mode it is q̃ of this layer computed from the previous layer's input.
   */
  readonly query: Float32Array;
  readonly speculative: boolean;
}

export interface PostSelectionInput<S = unknown> extends SelectionBase<S> {
  readonly timing: "post";
  /** logits[h][slot], one Float32Array view per query head, at least `offloaded` long (scaled by 1/√d). */
  readonly logits: readonly Float32Array[];
  /** The query the logits were computed from (heads × headDim). */
  readonly query: Float32Array;
  readonly speculative: boolean;
}

export type SelectionInput<S = unknown> = PreSelectionInput<S> | PostSelectionInput<S>;

/**
 * The chosen slots: one list shared by every KV head, or one list per KV head. Order inside a
 * list is free; `validateSelection` returns it sorted ascending (= position order). Per-KV-head
 * lists may differ in length; an engine that wants a rectangular logits block pads the short
 * ones with −∞ logits (zero probability), which leaves the softmax exact.
 */
export type Selection =
  | { readonly kind: "shared"; readonly ids: Int32Array }
  | { readonly kind: "perKvHead"; readonly ids: readonly Int32Array[] };

/** An Int32Array, or a plain or typed array of numbers whose elements checkIds() vets one by one. */
const IdsSchema = z.union([
  z.instanceof(Int32Array),
  z.array(z.unknown()),
  z.custom<ArrayLike<number>>((v) => ArrayBuffer.isView(v) && !(v instanceof DataView) && !(v instanceof BigInt64Array) && !(v instanceof BigUint64Array)),
], { error: "ids must be an Int32Array or an array of integers" });

/** Accepts typed arrays or plain integer arrays (plugins written loosely); validateSelection emits Int32Array. */
export const SelectionSchema = z.discriminatedUnion("kind", [
  z.object({ kind: z.literal("shared"), ids: IdsSchema }),
  z.object({ kind: z.literal("perKvHead"), ids: z.array(IdsSchema).min(1) }),
]);

/** A value as an error message shows it: NaN, 3.5, "3", undefined. */
const shown = (v: unknown): string => (typeof v === "number" || v === undefined ? String(v) : typeof v === "bigint" ? `${v}n` : JSON.stringify(v) ?? String(v));

export interface SelectionLimits {
  /** Slots 0 … offloaded − 1 are valid. */
  readonly offloaded: number;
  readonly kvHeads: number;
  /** K: the most ids per list; omit for selectors that ignore K (e.g. "all"). */
  readonly k?: number;
  /** Names the culprit in error messages, e.g. `selector "h2o"`. */
  readonly source?: string;
}

function checkIds(raw: ArrayLike<unknown>, limits: SelectionLimits, where: string, who: string): Int32Array {
  const max = limits.k ?? limits.offloaded;
  if (!(raw instanceof Int32Array)) {
    // Vetted before the conversion, which would truncate 3.5 and wrap 2³² to 0.
    for (let i = 0; i < raw.length; i++) {
      const v = raw[i];
      if (typeof v !== "number" || !Number.isInteger(v)) throw new HybridgenError(`${who}: ${where}[${i}] is ${shown(v)}, not an integer slot`);
      if (v < 0 || v >= limits.offloaded) throw new HybridgenError(`${who}: ${where} has id ${v} out of range [0, ${limits.offloaded})`);
    }
  }
  const sorted = Int32Array.from(raw as ArrayLike<number>).sort();
  if (sorted.length > max) {
    throw new HybridgenError(`${who}: ${where} holds ${sorted.length} ids, more than ${limits.k === undefined ? "the offloaded count" : "K ="} ${max}`);
  }
  for (let i = 0; i < sorted.length; i++) {
    const id = sorted[i]!;
    if (id < 0 || id >= limits.offloaded) {
      throw new HybridgenError(`${who}: ${where} has id ${id} out of range [0, ${limits.offloaded})`);
    }
    if (i > 0 && sorted[i - 1] === id) throw new HybridgenError(`${who}: ${where} has duplicate id ${id}`);
  }
  return sorted;
}

/**
 * Checks a selector's result and returns it normalised (Int32Array, ascending). Throws a
 * HybridgenError naming the problem for a malformed object, out-of-range or duplicate ids, a
 * list longer than K, or a per-KV-head result with the wrong number of lists.
 */
export function validateSelection(raw: unknown, limits: SelectionLimits): Selection {
  const who = limits.source ?? "selection";
  // The built-ins' shape (Int32Array lists) needs no schema pass; anything else goes through zod.
  const r = raw as { kind?: unknown; ids?: unknown };
  if (r && r.kind === "perKvHead" && Array.isArray(r.ids) && r.ids.length > 0 && r.ids.every((l) => l instanceof Int32Array)) {
    return perKvHeadSelection(r.ids as Int32Array[], limits, who);
  }
  if (r && r.kind === "shared" && r.ids instanceof Int32Array) return { kind: "shared", ids: checkIds(r.ids, limits, "ids", who) };
  const parsed = SelectionSchema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const path = issue && issue.path.length ? ` at ${issue.path.join(".")}` : "";
    throw new HybridgenError(`${who}: not a selection${path}: ${issue?.message ?? "invalid"} (expected {kind: "shared", ids} or {kind: "perKvHead", ids: [...]})`);
  }
  const sel = parsed.data;
  if (sel.kind === "shared") return { kind: "shared", ids: checkIds(sel.ids, limits, "ids", who) };
  return perKvHeadSelection(sel.ids, limits, who);
}

/** Both paths' per-KV-head result: one list per KV head, each vetted by checkIds. */
function perKvHeadSelection(lists: readonly ArrayLike<unknown>[], limits: SelectionLimits, who: string): Selection {
  if (lists.length !== limits.kvHeads) {
    throw new HybridgenError(`${who}: perKvHead selection has ${lists.length} lists, expected one per KV head (${limits.kvHeads})`);
  }
  return { kind: "perKvHead", ids: lists.map((ids, g) => checkIds(ids, limits, `KV head ${g}`, who)) };
}

/**
 * The budget a selector receives: the scheduler's K clamped to [0, offloaded]. `clamped` tells
 * the engine to say so (once) when K exceeded the offloaded tokens.
 */
export function clampBudget(k: number, offloaded: number): { budget: number; clamped: boolean } {
  if (!Number.isInteger(k) || k < 0) throw new HybridgenError(`selection budget: K must be a non-negative integer, got ${k}`);
  if (!Number.isInteger(offloaded) || offloaded < 0) throw new HybridgenError(`selection budget: offloaded count must be a non-negative integer, got ${offloaded}`);
  return k > offloaded ? { budget: offloaded, clamped: true } : { budget: k, clamped: false };
}

/** The ids KV head g attends to under a selection. */
export function selectionForKvHead(sel: Selection, g: number): Int32Array {
  return sel.kind === "shared" ? sel.ids : sel.ids[g]!;
}

/** Quest's page choice run by a CpuStage (pre-QKᵀ): pages of `pageSize` offloaded tokens, as questSelection defines it. */
export interface QuestKernel {
  readonly name: "quest";
  readonly pageSize: number;
}

/** Where an index's page level is ranked: by the CpuStage, on the device (Backend.indexRank), or as the engine decides. */
export type IndexPlacement = "auto" | "host" | "device";

/** The page index's choice run by a CpuStage (pre-QKᵀ): indexSelection over an index the stage keeps per store, or over pages a device ranked. */
export interface IndexKernel {
  readonly name: "index";
  readonly form: PageIndexForm;
  readonly pageSize: number;
  readonly superPages: number;
  /** Absent: "auto". */
  readonly placement?: IndexPlacement;
}

/**
 * StreamingLLM's choice run by a CpuStage (pre-QKᵀ): the `sinks` oldest offloaded slots plus the
 * newest, K in all, one list shared by every KV head (streamingSelection).
 */
export interface StreamingKernel {
  readonly name: "streaming";
  readonly sinks: number;
}

/**
 * A CpuStage kernel whose choice equals a selector's select() at the kernel's own timing:
 * "topk" (post-QKᵀ exact top-K per KV head, max over the group's query heads, ties to the lower
 * slot), "topk-shared" (one list from the max over all heads), "all" (every slot, either timing),
 * a QuestKernel (pre-QKᵀ page bounds, questSelection), an IndexKernel (pre-QKᵀ, indexSelection), a StreamingKernel (pre-QKᵀ sinks plus the
 * newest slots, streamingSelection).
 */
export type SelectorKernel = "topk" | "topk-shared" | "all" | QuestKernel | StreamingKernel | IndexKernel;

/**
 * StreamingLLM's slots for `k` ids out of `offloaded`: [0, s) ∪ [offloaded − (k − s), offloaded) with
 * s = min(sinks, k, offloaded), ascending. k ≤ offloaded keeps the two ranges apart. The selector and
 * every stage that runs the "streaming" kernel produce exactly this list.
 */
export function streamingSelection(offloaded: number, k: number, sinks: number): Int32Array {
  const s = Math.min(sinks, k, offloaded), recent = k - s;
  const ids = new Int32Array(k);
  for (let i = 0; i < s; i++) ids[i] = i;
  for (let i = 0; i < recent; i++) ids[s + i] = offloaded - recent + i;
  return ids;
}

/** The timing a kernel chooses at; null for "all", which fits either. */
export function kernelTiming(kernel: SelectorKernel): SelectionTiming | null {
  return kernel === "all" ? null : typeof kernel === "object" ? "pre" : "post";
}

/** The kernel a CpuStage may run instead of `selector.select()` at `timing`, if the selector declares one. */
export function stageKernel(selector: Pick<TokenSelector, "kernel">, timing: SelectionTiming): SelectorKernel | undefined {
  const k = selector.kernel;
  const list: readonly SelectorKernel[] = k === undefined ? [] : Array.isArray(k) ? k : [k as SelectorKernel];
  return list.find((x) => (kernelTiming(x) ?? timing) === timing);
}

/** Static facts about a layer handed to initState(). */
export interface SelectorLayerInfo {
  readonly layer: number;
  readonly sequence: number;
  readonly layout: HeadLayout;
}

/** A token-selection algorithm. Implement with `defineSelector()` from @hybridgen/selectors. */
export interface TokenSelector<S = unknown> {
  /** The spec version it was written for (SPEC_VERSION); absent: written before the field. */
  readonly spec?: SpecVersion;
  readonly name: string;
  /** The timings it can run under; the scheduler picks one per step among these. */
  readonly timings: readonly SelectionTiming[];
  /** Ask the engine to maintain AccumulatedScores (costs a pass over the probabilities). */
  readonly needsScores: boolean;
  /** False for selectors that return every token whatever K is ("all"). */
  readonly usesBudget: boolean;
  /** Ask the engine for the layer's offloaded K rows (SelectionBase.keys); absent: false. */
  readonly needsKeys?: boolean;
  /**
   * Optional: this selector's choice equals a kernel a CpuStage can run on its own threads,
   * so the engine may skip select() and run selection there (no JS on the critical path). Each
   * kernel chooses at its own timing (kernelTiming); a list holds one per timing (a pair's halves).
   */
  readonly kernel?: SelectorKernel | readonly SelectorKernel[];
  /** Fresh per-(layer, sequence) state; called once when the sequence starts. */
  initState(info: SelectorLayerInfo): S;
  /** Chooses slots. Returns a validated, normalised selection (see validateSelection). */
  select(input: SelectionInput<S>): Selection;
}

export { referencePrimitives, offloadedKeys, pageSummaries, keyPrimitiveChecks } from "./selector-primitives.js";
export { questSelection, questPages, type QuestPageState } from "./quest-selection.js";
export {
  indexChosenOffset, indexFold, indexFoldAll, indexFor, indexPageBounds, indexPages, indexSelection, indexSelectionFrom, indexWant, pageIndex, pageIndexChecks, pageIndexForm, pageIndexLayout, PAGE_INDEX_FORM_CODE, PAGE_INDEX_FORMS,
  PAGE_INDEX_SLACK, type IndexFoldItem, type IndexPages, type PageIndex, type PageIndexForm, type PageIndexLayout, type PageIndexState,
} from "./page-index.js";
