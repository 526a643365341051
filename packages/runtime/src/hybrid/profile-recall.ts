/**
 * SpeculationRecallProbe: how well the speculative query q̃ₗ = projectQuery(l, x_{l−1}) —
 * projected from the previous layer's input, as speculative hybrid attention does — picks the
 * tokens the true query qₗ would pick. At every decode step with offloaded tokens, for each
 * layer l ≥ 1 and KV head, both queries score the layer's offloaded K (max over the head's
 * group of query heads); recall = |top-K(q̃) ∩ top-K(q)| / K, averaged over steps and KV
 * heads, for every K asked (steps whose offloaded count is ≤ K select everything and are not
 * counted). With `candidates` c > 1, q̃ chooses its top c·K (as verified logits do, the true
 * query then scoring them) and recall is the share of the true top-K among them. Mass recall
 * weighs the tokens by attention: per query head, the share of the offloaded attention mass
 * (softmax of the true logits over the offloaded tokens) on q̃'s choice, relative to the mass
 * on the true top-K (at most 1): a miss among near-equal weights costs little. Attention
 * itself stays full attention, so the model's outputs are unchanged.
 */
import { type Tensor, fail } from "@hybridgen/spec";
import type { Attention, DecodeAttention, QueryProjector } from "@hybridgen/core";

export class SpeculationRecallProbe implements DecodeAttention, Disposable {
  readonly ks: readonly number[];
  private readonly layers: number;
  private readonly heads: number;
  private readonly kvHeads: number;
  private readonly group: number;
  private readonly specQ: Tensor;
  private readonly scores: Tensor;
  /** [layer][k index]: summed recall, summed mass recall (per query head) and the (step, KV head) samples. */
  private readonly sums: Float64Array[];
  private readonly massSums: Float64Array[];
  private readonly counts: Float64Array[];
  /** Under q̃ of the layer, per KV head (kvHeads × offloaded): tokens best first, and each token's rank. */
  private readonly specOrder: (Int32Array | null)[];
  private readonly specRank: (Int32Array | null)[];
  /** The true query's softmax over the offloaded tokens, per query head (heads × offloaded). */
  private probs = new Float32Array(0);
  private pos = 0;
  private offloaded = 0;
  private closed = false;

  constructor(
    private readonly attention: Attention,
    private readonly projector: QueryProjector,
    ks: readonly number[],
    /** q̃ chooses candidates·K tokens. */
    readonly candidates = 1,
  ) {
    if (ks.length === 0 || ks.some((k) => !Number.isInteger(k) || k < 1)) fail(`recall probe: K values must be positive integers (got ${ks.join(", ")})`);
    if (!Number.isInteger(candidates) || candidates < 1) fail(`recall probe: candidates must be a positive integer (got ${candidates})`);
    const cache = attention.cache;
    if (cache.storeCapacity === 0) fail("recall probe: the KV window holds the whole context (nothing is offloaded)");
    this.ks = [...ks];
    this.layers = cache.layers;
    ({ heads: this.heads, kvHeads: this.kvHeads } = attention.layout);
    this.group = this.heads / this.kvHeads;
    const be = attention.backend;
    this.specQ = be.alloc([1, this.heads * attention.layout.headDim]);
    this.scores = be.alloc([this.heads, cache.storeCapacity]);
    this.sums = Array.from({ length: this.layers }, () => new Float64Array(ks.length));
    this.massSums = Array.from({ length: this.layers }, () => new Float64Array(ks.length));
    this.counts = Array.from({ length: this.layers }, () => new Float64Array(ks.length));
    this.specOrder = new Array(this.layers).fill(null);
    this.specRank = new Array(this.layers).fill(null);
  }

  /** Routes `attention`'s decode steps through a new probe. */
  static attach(attention: Attention, projector: QueryProjector, ks: readonly number[], candidates = 1): SpeculationRecallProbe {
    const p = new SpeculationRecallProbe(attention, projector, ks, candidates);
    attention.setDecodeAttention(p);
    return p;
  }

  newSequence(): void {
    this.specOrder.fill(null);
    this.specRank.fill(null);
  }

  beginStep(pos: number): void {
    this.pos = pos;
    this.offloaded = this.attention.cache.storeCount;
    this.newSequence();
  }

  layerInput(layer: number, x: Tensor): void {
    if (this.offloaded === 0 || layer + 1 >= this.layers) return;
    this.projector.projectQuery(layer + 1, x, this.pos, this.specQ);
    const order = this.rankOrder(layer + 1, this.specQ, false);
    const n = this.offloaded, rank = new Int32Array(order.length);
    for (let g = 0; g < this.kvHeads; g++) {
      for (let r = 0; r < n; r++) rank[g * n + order[g * n + r]] = r;
    }
    this.specOrder[layer + 1] = order;
    this.specRank[layer + 1] = rank;
  }

  attend(layer: number, q: Tensor, out: Tensor): void {
    const rank = this.specRank[layer], spec = this.specOrder[layer];
    if (rank && spec) {
      const n = this.offloaded, order = this.rankOrder(layer, q, true), p = this.probs;
      this.ks.forEach((k, i) => {
        if (n <= k) return;
        const chosen = Math.min(n, k * this.candidates);
        for (let g = 0; g < this.kvHeads; g++) {
          let hits = 0;
          for (let r = 0; r < k; r++) if (rank[g * n + order[g * n + r]] < chosen) hits++;
          this.sums[layer][i] += hits / k;
          let mass = 0;
          for (let h = g * this.group; h < (g + 1) * this.group; h++) {
            let exact = 0, got = 0;
            for (let r = 0; r < k; r++) exact += p[h * n + order[g * n + r]];
            for (let r = 0; r < chosen; r++) got += p[h * n + spec[g * n + r]];
            mass += exact > 0 ? Math.min(1, got / exact) : 1;
          }
          this.massSums[layer][i] += mass / this.group;
          this.counts[layer][i]++;
        }
      });
    }
    this.attention.attendFull(layer, q, 0, this.pos, out);
  }

  endStep(): void {}

  /**
   * Mean recall per layer (rows) and K (columns, in `ks` order). Layer 0's q̃ is its true query
   * (it comes from the embedding), so its recall is 1; so is a K no step had more tokens than.
   */
  recall(): number[][] {
    return this.mean(this.sums);
  }

  /** Mean mass recall, laid out as recall(). */
  massRecall(): number[][] {
    return this.mean(this.massSums);
  }

  private mean(sums: Float64Array[]): number[][] {
    return sums.map((s, l) => Array.from(s, (sum, i) => (l === 0 || this.counts[l][i] === 0 ? 1 : sum / this.counts[l][i])));
  }

  /** Samples behind recall()[layer][i] (steps × KV heads). */
  samples(layer: number, i: number): number {
    return this.counts[layer][i];
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.attention.decodeAttention === this) this.attention.setDecodeAttention(null);
    this.attention.backend.free(this.specQ);
    this.attention.backend.free(this.scores);
  }

  [Symbol.dispose](): void {
    this.close();
  }

  /**
   * Offloaded token indices per KV head (kvHeads × offloaded), best first under query `q`;
   * with `keepProbs`, each query head's softmax over them goes to `probs`.
   */
  private rankOrder(layer: number, q: Tensor, keepProbs: boolean): Int32Array {
    const a = this.attention, be = a.backend, n = this.offloaded, width = a.cache.storeCapacity;
    be.attnLogits(this.scores, 0, q, 0, a.cache.stageStoreK(layer), 0, n, a.scale);
    const order = new Int32Array(this.kvHeads * n);
    const best = new Float32Array(n);
    if (keepProbs && this.probs.length < this.heads * n) this.probs = new Float32Array(this.heads * a.cache.storeCapacity);
    for (let g = 0; g < this.kvHeads; g++) {
      best.fill(-Infinity);
      for (let h = g * this.group; h < (g + 1) * this.group; h++) {
        const row = be.read(this.scores, h * width, n);
        for (let j = 0; j < n; j++) if (row[j] > best[j]) best[j] = row[j];
        if (keepProbs) softmaxInto(row, this.probs.subarray(h * n, (h + 1) * n));
      }
      const idx = order.subarray(g * n, (g + 1) * n);
      for (let j = 0; j < n; j++) idx[j] = j;
      idx.sort((x, y) => best[y] - best[x] || x - y);
    }
    return order;
  }
}

function softmaxInto(x: Float32Array, out: Float32Array): void {
  let m = -Infinity;
  for (const v of x) if (v > m) m = v;
  let z = 0;
  for (let i = 0; i < x.length; i++) z += out[i] = Math.exp(x[i] - m);
  for (let i = 0; i < x.length; i++) out[i] /= z;
}
