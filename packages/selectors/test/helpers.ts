import { headLayout, referencePrimitives, type AccumulatedScores, type HeadLayout, type PostSelectionInput, type PreSelectionInput, type TokenSelector } from "@hybridgen/spec";

/** Seeded PRNG (core's mulberry32) so failures reproduce. */
export { seededRandom as rng } from "@hybridgen/spec";

export interface Case {
  layout: HeadLayout;
  offloaded: number;
  k: number;
  logits: Float32Array[];
  query: Float32Array;
  scores: AccumulatedScores;
}

/** Random GQA layout, store size, K, logits (with spare capacity past `offloaded`) and scores. */
export function randomCase(r: () => number): Case {
  const kvHeads = 1 + Math.floor(r() * 4);
  const groupSize = 1 + Math.floor(r() * 4);
  const layout = headLayout(kvHeads * groupSize, kvHeads, 8);
  const offloaded = 1 + Math.floor(r() * 2000);
  const cap = offloaded + Math.floor(r() * 64); // views longer than the live store
  const k = Math.floor(r() * (offloaded + 1));
  const logits = Array.from({ length: layout.heads }, () => Float32Array.from({ length: cap }, () => (r() - 0.5) * 12));
  const query = Float32Array.from({ length: layout.heads * layout.headDim }, () => r() - 0.5);
  const scores = { steps: 10, perKvHead: Array.from({ length: kvHeads }, () => Float32Array.from({ length: cap }, () => r() * 3)) };
  return { layout, offloaded, k, logits, query, scores };
}

function base<S>(sel: TokenSelector<S>, c: Case) {
  return {
    layer: 3,
    step: 17,
    sequence: 0,
    offloaded: c.offloaded,
    positions: Int32Array.from({ length: c.offloaded }, (_, i) => 4 + i),
    k: c.k,
    layout: c.layout,
    state: sel.initState({ layer: 3, sequence: 0, layout: c.layout }),
    scores: sel.needsScores ? c.scores : undefined,
    primitives: referencePrimitives,
    query: c.query,
    speculative: false,
  };
}

export function postInput<S>(sel: TokenSelector<S>, c: Case): PostSelectionInput<S> {
  return { ...base(sel, c), timing: "post", logits: c.logits };
}

export function preInput<S>(sel: TokenSelector<S>, c: Case): PreSelectionInput<S> {
  return { ...base(sel, c), timing: "pre" };
}

/** Plain reference: indices of the k largest (ties → lower index), ascending. */
export function refTopK(values: ArrayLike<number>, k: number, n: number): number[] {
  const idx = Array.from({ length: n }, (_, i) => i);
  idx.sort((a, b) => values[b]! - values[a]! || a - b);
  return idx.slice(0, k).sort((a, b) => a - b);
}
