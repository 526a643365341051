/**
 * Prefill calibration's arithmetic: from sampled prompt rows (a KV head's group of query heads at
 * one position), how much attention mass K offloaded tokens capture and how many of the true
 * top-K the speculative query q̃'s candidates hold, on a grid of K; then the decision — the layers
 * whose q̃ misses (they select with the true query) and the K that reaches the mass target.
 *
 * A sample's mass is the query heads' own softmax over every position up to the row's: the window
 * (sinks and the recent ring) keeps its share, and K offloaded tokens chosen as the engine chooses
 * them (per KV head, the group's largest logit) add theirs. Verified layers score q̃'s c·K
 * candidates with the true query, so their mass is what those candidates hold.
 */
import { z } from "zod";
import { DEFAULT_K, HybridgenError, type CalibrationBatch } from "@hybridgen/spec";

/** K grid: 4·√2ⁱ rounded (4, 6, 8, 11, 16, …), up to a bound. */
export function calibrationGrid(upTo: number): number[] {
  const ks: number[] = [];
  for (let i = 0; ; i++) {
    const k = Math.round(4 * Math.SQRT2 ** i);
    if (ks.length === 0 || k > ks[ks.length - 1]!) ks.push(k);
    if (k >= upTo) return ks;
  }
}

/** The share of attention mass K must capture: 0 < x ≤ 1. */
export const MassTargetSchema = z.number({ error: "must be a number" }).gt(0, "must be above 0").max(1, "must be at most 1");
export const DEFAULT_MASS_TARGET = 0.95;

/** Checks a mass target, with a one-line error naming `what`. */
export function checkMassTarget(x: unknown, what = "massTarget"): number {
  const r = MassTargetSchema.safeParse(x);
  if (!r.success) throw new HybridgenError(`${what} ${r.error.issues[0]?.message ?? "is invalid"} (got ${JSON.stringify(x)})`);
  return r.data;
}

/** One sampled row of one KV head: its group's logits under q and q̃, and q's probabilities. */
export interface CalibrationSample {
  /** Per query head of the group: logits over positions [0, length) under the true query. */
  readonly logits: readonly Float32Array[];
  /** The same under q̃ (null on layer 0, whose q̃ is q). */
  readonly specLogits: readonly Float32Array[] | null;
  /** Per query head: the true query's softmax over positions [0, length). */
  readonly probs: readonly Float32Array[];
  /** Offloaded positions [from, to): those outside the window when this row is decoded. */
  readonly from: number;
  readonly to: number;
}

/** Floats of one sample's sums on a grid of `points` K: share, q̃'s candidates' share, recall and its
 * count, each per grid K plus one bucket past the grid; then the query heads counted and the samples (0 or 1). */
export function sampleSumsLength(points: number): number {
  return 4 * (points + 1) + 2;
}

/** A batch's sums, [samples][sampleSumsLength]: calibrationSumsTs, or a native kernel giving the same doubles. */
export type CalibrationSums = (b: CalibrationBatch) => Float64Array;

/** The reference: each sample's sums in JavaScript, on the driving thread. */
export function calibrationSumsTs(b: CalibrationBatch): Float64Array {
  const n = b.samples.length / 5, len = sampleSumsLength(b.grid.length), out = new Float64Array(n * len);
  const rows = (first: number) => Array.from({ length: b.group }, (_, h) => b.data.subarray((first + h) * b.width, (first + h + 1) * b.width));
  for (let i = 0; i < n; i++) {
    const [q, spec, probs, from, to] = b.samples.subarray(5 * i, 5 * i + 5) as unknown as number[];
    sampleSums({ logits: rows(q!), specLogits: spec! < 0 ? null : rows(spec!), probs: rows(probs!), from: from!, to: to! }, b.grid, b.candidates, out.subarray(i * len, (i + 1) * len));
  }
  return out;
}

/** Sums over one layer's samples, on a K grid. */
export class LayerCalibration {
  /** Σ over (sample, query head) of window share + top-K share, per grid K. */
  readonly share: Float64Array;
  /** The same with q̃'s c·K candidates. */
  readonly verifiedShare: Float64Array;

  /** Σ over samples of |true top-K ∩ q̃'s top c·K| / K, and the samples counted (K < offloaded), per grid K. */
  readonly recall: Float64Array;
  readonly recallCount: Float64Array;
  heads = 0;
  samples = 0;

  constructor(readonly grid: readonly number[], readonly candidates: number) {
    const g = grid.length + 1; // + one bucket for tokens past the grid's largest K
    this.share = new Float64Array(g);
    this.verifiedShare = new Float64Array(g);
    this.recall = new Float64Array(g);
    this.recallCount = new Float64Array(g);
  }

  add(s: CalibrationSample): void {
    const sums = new Float64Array(sampleSumsLength(this.grid.length));
    sampleSums(s, this.grid, this.candidates, sums);
    this.accumulate(sums);
  }

  /** Adds one sample's sums (sampleSumsLength floats from `at`). */
  accumulate(sums: Float64Array, at = 0): void {
    const g = this.grid.length + 1;
    for (let b = 0; b < g; b++) {
      this.share[b] += sums[at + b]!;
      this.verifiedShare[b] += sums[at + g + b]!;
      this.recall[b] += sums[at + 2 * g + b]!;
      this.recallCount[b] += sums[at + 3 * g + b]!;
    }
    this.heads += sums[at + 4 * g]!;
    this.samples += sums[at + 4 * g + 1]!;
  }

  /** Mean share at grid index b (exact top-K, or q̃'s candidates). */
  meanShare(b: number, verified: boolean): number {
    if (this.heads === 0) return 1;
    return (verified ? this.verifiedShare : this.share)[b]! / this.heads;
  }

  /** Mean token recall at grid index b (1 where no sample had more offloaded tokens than K). */
  meanRecall(b: number): number {
    return this.recallCount[b]! > 0 ? this.recall[b]! / this.recallCount[b]! : 1;
  }
}

/** Scratch of sampleSums. */
let gqs = new Float32Array(0), gss = new Float32Array(0), bqs = new Uint8Array(0), bss = new Uint8Array(0);

/** One sample's sums into out (sampleSumsLength(grid.length) floats, zero on entry). */
function sampleSums(s: CalibrationSample, grid: readonly number[], candidates: number, out: Float64Array): void {
  const n = s.to - s.from, G = grid.length, g = G + 1;
  if (n <= 0) return;
  if (gqs.length < n) {
    gqs = new Float32Array(n);
    gss = new Float32Array(n);
    bqs = new Uint8Array(n);
    bss = new Uint8Array(n);
  }
  const gq = gqs.subarray(0, n), gs = gss.subarray(0, n), bq = bqs, bs = bss;
  groupMax(s.logits, s.from, n, gq);
  groupMax(s.specLogits ?? s.logits, s.from, n, gs);
  bucketRanks(gq, grid, 1, bq);
  bucketRanks(gs, grid, candidates, bs);
  // Token recall: a token in the true top-K_b has bq ≤ b; among q̃'s candidates, bs ≤ b.
  const hits = new Float64Array(g);
  for (let j = 0; j < n; j++) hits[Math.max(bq[j]!, bs[j]!)]++;
  let cum = 0;
  for (let b = 0; b < G; b++) {
    cum += hits[b]!;
    if (grid[b]! >= n) continue; // K selects everything: nothing to miss
    out[2 * g + b] += Math.min(1, cum / grid[b]!);
    out[3 * g + b]++;
  }
  // Per grid index, four interleaved sums (token j into lane j & 3): neighbours mostly share an index, and one sum would chain every add.
  const mq = new Float64Array(4 * g), ms = new Float64Array(4 * g);
  for (const p of s.probs) {
    mq.fill(0);
    ms.fill(0);
    let off = 0;
    for (let j = 0; j < n; j++) {
      const x = p[s.from + j]!, lane = j & 3;
      off += x;
      mq[(bq[j]! << 2) | lane] += x;
      ms[(bs[j]! << 2) | lane] += x;
    }
    let a = 1 - off, v = 1 - off;
    for (let b = 0; b < G; b++) {
      a += mq[4 * b]! + mq[4 * b + 1]! + mq[4 * b + 2]! + mq[4 * b + 3]!;
      v += ms[4 * b]! + ms[4 * b + 1]! + ms[4 * b + 2]! + ms[4 * b + 3]!;
      out[b] += grid[b]! >= n ? 1 : Math.min(1, a);
      out[g + b] += grid[b]! >= n ? 1 : Math.min(1, v);
    }
    out[4 * g]++;
  }
  out[4 * g + 1] = 1;
}

/** out[j] = max over the rows of row[from + j]. */
function groupMax(rows: readonly Float32Array[], from: number, n: number, out: Float32Array): void {
  out.set(rows[0]!.subarray(from, from + n));
  for (let r = 1; r < rows.length; r++) {
    const row = rows[r]!;
    for (let j = 0; j < n; j++) {
      const x = row[from + j]!, y = out[j]!;
      out[j] = x > y ? x : y; // a select, not a branch: random data mispredicts
    }
  }
}

/** Scratch of bucketRanks: a count (then a next rank) per 16-bit key, each token's key, rank → grid index. */
const hist = new Uint32Array(65536);
let keys = new Uint16Array(0);
let entry = new Uint8Array(0);

/**
 * out[j] = the first grid index b whose top-(c·K_b) holds token j (grid.length when none does).
 * Ranks come from a bucket sort on the value's top 16 bits (sign, exponent, 7 bits of mantissa:
 * values within 1% of each other tie, broken by position): two passes, no comparison sort.
 */
function bucketRanks(values: Float32Array, grid: readonly number[], c: number, out: Uint8Array): void {
  const n = values.length, G = grid.length;
  if (keys.length < n) {
    keys = new Uint16Array(n);
    entry = new Uint8Array(n);
  }
  const bits = new Uint32Array(values.buffer, values.byteOffset, n);
  hist.fill(0);
  for (let j = 0; j < n; j++) {
    const u = bits[j]!;
    // Flipped so that unsigned order is float order.
    const key = ((u & 0x80000000) !== 0 ? ~u : u | 0x80000000) >>> 16;
    keys[j] = key;
    hist[key]++;
  }
  // Descending: bucket key's first rank is the count of tokens in higher buckets.
  let acc = 0;
  for (let key = 65535; key >= 0; key--) {
    const k = hist[key]!;
    hist[key] = acc;
    acc += k;
  }
  let r = 0;
  for (let b = 0; b < G && r < n; b++) for (const end = Math.min(n, grid[b]! * c); r < end; r++) entry[r] = b;
  entry.fill(G, r, n);
  for (let j = 0; j < n; j++) out[j] = entry[hist[keys[j]!]!++]!;
}

/** What a prefill calibration found and chose (reported in the stats line, --json and the plan). */
export interface CalibrationResult {
  /** The largest layer's K (the scheduler's K; each layer selects layerK[l] of it). */
  readonly k: number;
  /** Layers whose q̃'s candidates miss the mass target (decideCalibration). */
  readonly exactLayers: readonly number[];
  /** Per layer: the K reaching the target as the layer selects, q̃'s token recall of the true top-K there (c·K candidates), and the mass share held. */
  readonly layerK: readonly number[];
  readonly layerRecall: readonly number[];
  readonly layerShare: readonly number[];
  /** The largest K a layer may take (layerKCap): a layer at it holds less than the mass target. */
  readonly kCap: number;
  readonly massTarget: number;
  readonly candidates: number;
  /** Prompt tokens and offloaded tokens at the sampled rows, the rows sampled per layer (× KV heads). */
  readonly tokens: number;
  readonly offloaded: number;
  readonly samples: number;
  /** Wall time of the calibration (ms), on the thread that drives the model. */
  readonly ms: number;
}

/** The smallest K (interpolated on the grid, log scale) whose mean share reaches `target`; `upTo` when none does. */
function kFor(layer: LayerCalibration, target: number, verified: boolean, upTo: number): number {
  const grid = layer.grid;
  let prev = 0, prevShare = layer.meanShare(0, verified) - 1e-9;
  for (let b = 0; b < grid.length; b++) {
    const s = layer.meanShare(b, verified), k = Math.min(grid[b]!, upTo);
    if (s >= target) {
      if (b === 0 || s <= prevShare) return k;
      const f = (target - prevShare) / (s - prevShare);
      return Math.max(1, Math.min(k, Math.ceil(Math.exp(Math.log(prev) + f * (Math.log(k) - Math.log(prev))))));
    }
    prev = k;
    prevShare = s;
    if (k >= upTo) break;
  }
  return upTo;
}

/** A grid curve read at K (the grid point at or above K). */
function at(layer: LayerCalibration, k: number, read: (b: number) => number): number {
  const b = layer.grid.findIndex((g) => g >= k);
  return read(b < 0 ? layer.grid.length - 1 : b);
}

/** A layer's K is at most this share of the offloaded tokens up to CAP_REFERENCE of them (never below DEFAULT_K): a broad layer spreads its mass over most tokens, and reading most of them would undo the offload. */
export const DEFAULT_MAX_SHARE = 1 / 8;

/** Past this many offloaded tokens the cap grows as the square root of the context: its share falls as √(CAP_REFERENCE/offloaded), 1/8 at 4K, 1/16 at 16K, 1/45 at 128K, so a broad layer's rows grow slower than the context they offload. */
export const CAP_REFERENCE = 4096;

/** The largest K a layer may take: maxShare of the offloaded tokens (of √(CAP_REFERENCE·offloaded) past CAP_REFERENCE), at least DEFAULT_K, at most all of them; maxShare Infinity caps nothing. */
export function layerKCap(offloaded: number, maxShare: number): number {
  const n = Math.max(1, offloaded);
  return Math.min(n, Math.max(DEFAULT_K, Math.ceil(maxShare * Math.sqrt(Math.min(n, CAP_REFERENCE) * n))));
}

/** q̃'s candidates may need this many times the true query's K (and at least SLACK_MIN) before a layer selects with the true query. */
export const SPECULATION_SLACK = 2;
const SLACK_MIN = 32;

/**
 * The decision. Per layer, K_exact: the K whose true top-K (the window kept) captures the mass
 * target. Layer l ≥ 1 is exact when q̃'s candidates miss: at SPECULATION_SLACK·K_exact (at least
 * 32) they still hold less than the target; a speculating layer's K is the one its candidates
 * reach the target with. K is the largest layer's; each layer selects its own share of it.
 * `exact` (layers given, or "all" for exact logits) skips the choice: those layers take K_exact.
 */
export function decideCalibration(
  layers: readonly LayerCalibration[],
  o: { massTarget: number; offloaded: number; tokens: number; ms: number; samples: number; exact?: readonly number[] | "all"; maxShare?: number },
): CalibrationResult {
  const upTo = Math.max(1, o.offloaded), kCap = layerKCap(o.offloaded, o.maxShare ?? DEFAULT_MAX_SHARE);
  const exactLayers: number[] = [];
  const layerK = layers.map((layer, l) => {
    const kExact = kFor(layer, o.massTarget, false, upTo);
    if (l === 0) return kExact; // q̃₀ is q₀
    // Exact layers given (or exact logits): they select with the true query, the others with q̃.
    if (o.exact !== undefined) return o.exact === "all" || o.exact.includes(l) ? kExact : kFor(layer, o.massTarget, true, upTo);
    const slack = Math.min(upTo, Math.max(SLACK_MIN, SPECULATION_SLACK * kExact));
    if (at(layer, slack, (b) => layer.meanShare(b, true)) < o.massTarget) {
      exactLayers.push(l);
      return kExact;
    }
    return kFor(layer, o.massTarget, true, upTo);
  }).map((k) => Math.min(k, kCap)); // capped after the exact choice: a broad layer misses the target at the cap with q or q̃ alike
  const k = Math.max(1, ...layerK);
  const exact = new Set(o.exact === "all" ? layers.map((_, l) => l) : (o.exact ?? exactLayers));
  return {
    k, exactLayers, layerK, kCap,
    layerRecall: layers.map((layer, l) => (l === 0 ? 1 : at(layer, layerK[l]!, (b) => layer.meanRecall(b)))),
    layerShare: layers.map((layer, l) => at(layer, layerK[l]!, (b) => layer.meanShare(b, l > 0 && !exact.has(l)))),
    massTarget: o.massTarget, candidates: layers[0]?.candidates ?? 1,
    tokens: o.tokens, offloaded: o.offloaded, samples: o.samples, ms: o.ms,
  };
}

/** "calibrated from the prefill (32 samples a layer, 3836 offloaded): K per layer 1500/80/6/8 for 95% of the attention mass, exact layers 1, q̃ recall 1.00/0.41/0.95/0.80, 132.5 ms" */
export function calibrationSummary(c: CalibrationResult): string {
  const capped = c.layerK.some((k, l) => k >= c.kCap && c.layerShare[l]! < c.massTarget) ? ` (at most ${c.kCap} a layer)` : "";
  return `calibrated from the prefill (${c.samples} samples a layer, ${c.offloaded} offloaded): K per layer ${c.layerK.join("/")} for ${Math.round(c.massTarget * 1000) / 10}% of the attention mass${capped}, ` +
    `exact layers ${c.exactLayers.length ? c.exactLayers.join(",") : "none"}, q̃ recall per layer ${c.layerRecall.map((r) => r.toFixed(2)).join("/")}, ${c.ms.toFixed(1)} ms`;
}
