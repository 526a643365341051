/**
 * InfiniGen-style partial keys, pre-QKᵀ: per KV head a few channels of q and K are kept; every
 * offloaded token is scored with those channels alone and the top K per KV head are chosen.
 * Channels are chosen once per sequence and layer at the first selection (a calibration pass
 * over the prompt's offloaded keys): rotary pairs (c, c + headDim/2) ranked by Σ over the
 * group's query heads of |q_c|·max|K_c| + |q_c'|·max|K_c'| — a pair keeps its q·k term whole
 * whatever the rotation angle, and large |q|·|K| channels carry most of q·k. The chosen
 * channels of K are packed (f32) as tokens are offloaded, so a step reads r channels a token,
 * not the whole row.
 */
import { bf16BitsToF32, offloadedKeys, pageSummaries, type OffloadedKeys, type SelectorPrimitives } from "@hybridgen/spec";
import { z } from "zod";
import { defineSelector } from "../define-selector.js";
import { BUILTIN } from "../builtin-mark.js";
import { layerKeys } from "./layer-keys.js";
import { newScratch, scratchView, type Scratch } from "./scratch.js";

export const InfiniGenOptionsSchema = z.object({
  /** Channels of q and K scored per KV head (capped at headDim; even values keep rotary pairs whole). */
  channels: z.number().int().min(1).max(4096).default(8),
}).strict();

export interface InfiniGenState {
  /** [kvHeads · r] chosen channels, ascending per KV head; null until calibrated. */
  channels: Int32Array | null;
  /** The chosen channels of every offloaded K row, f32 [kvHeads, capacity, r]. */
  packed: OffloadedKeys | null;
  /** Offloaded rows packed so far. */
  packedCount: number;
  query: Float32Array;
  scores: Scratch;
}

/** Per KV head the r channels (whole rotary pairs when r and headDim are even) with the largest Σ_h |q_hc|·max|K_c|. */
export function chooseChannels(query: Float32Array, groupSize: number, keys: OffloadedKeys, offloaded: number, r: number, P: SelectorPrimitives): Int32Array {
  const { kvHeads, headDim: d } = keys;
  const range = pageSummaries(kvHeads, d, keys.capacity, Math.max(1, keys.capacity));
  P.summarizePages(keys, 0, offloaded, range);
  const paired = r % 2 === 0 && d % 2 === 0, half = d / 2;
  const out = new Int32Array(kvHeads * r);
  const weight = new Float32Array(paired ? half : d);
  for (let g = 0; g < kvHeads; g++) {
    weight.fill(0);
    for (let c = 0; c < d; c++) {
      // `range` is one page of every row; its min and max are bf16 rounded outward, so |K_c| ≤ k still.
      const k = Math.max(Math.abs(bf16BitsToF32(range.min[g * d + c]!)), Math.abs(bf16BitsToF32(range.max[g * d + c]!)));
      let q = 0;
      for (let j = 0; j < groupSize; j++) q += Math.abs(query[(g * groupSize + j) * d + c]!);
      weight[paired ? c % half : c] += q * k;
    }
    const best = P.topK(weight, paired ? r / 2 : r);
    const chosen = paired ? Int32Array.from([...best, ...Array.from(best, (c) => c + half)]).sort() : best;
    out.set(chosen, g * r);
  }
  return out;
}

export const infinigen = defineSelector<z.output<typeof InfiniGenOptionsSchema>, InfiniGenState>({
  name: "infinigen",
  description: "pre-QKᵀ partial keys (InfiniGen): q·k over a few calibrated channels of every offloaded token, top K per KV head",
  timings: ["pre"],
  needsKeys: true,
  options: InfiniGenOptionsSchema,
  initState: () => ({ channels: null, packed: null, packedCount: 0, query: new Float32Array(0), scores: newScratch() }),
  select(input, options) {
    const { offloaded: n, k, layout, primitives: P, state, query } = input;
    const keys = layerKeys(input);
    const { kvHeads, groupSize: G, headDim: d, heads } = layout;
    const r = Math.min(options.channels, d);
    if (!state.channels || !state.packed || state.packed.capacity < keys.capacity || n < state.packedCount) {
      state.channels = chooseChannels(query, G, keys, n, r, P);
      state.packed = offloadedKeys("f32", kvHeads, keys.capacity, r);
      state.packedCount = 0;
      state.query = new Float32Array(heads * r);
    }
    const ch = state.channels;
    P.gatherChannels(keys, ch, state.packedCount, n, state.packed);
    state.packedCount = n;
    if (k === 0) return { kind: "shared", ids: new Int32Array(0) };
    const q = state.query;
    for (let h = 0; h < heads; h++) {
      const g = Math.floor(h / G);
      for (let i = 0; i < r; i++) q[h * r + i] = query[h * d + ch[g * r + i]!]!;
    }
    const scores = P.keyScores(q, G, state.packed, 0, n, scratchView(state.scores, kvHeads * n));
    const ids: Int32Array[] = [];
    for (let g = 0; g < kvHeads; g++) ids.push(P.topK(scores.subarray(g * n, (g + 1) * n), k));
    return { kind: "perKvHead", ids };
  },
}, BUILTIN);
