/**
 * Token sampling: repetition penalty → temperature → top-k → top-p (the Hugging Face order),
 * with a seeded PRNG so the same seed gives the same text.
 *
 * Efficiency: top-k keeps a k-entry min-heap over the logits (O(V log k), no full sort);
 * top-p without top-k only sorts the tokens that could be in the nucleus (a token with
 * probability below (1 − p)/(V − 1) never is); plain sampling is one pass. Buffers are
 * preallocated per vocabulary.
 */
import { z } from "zod";
import { check, fail } from "@hybridgen/spec";

export const SamplingOptionsSchema = z.object({
  /** 0 = greedy (argmax). */
  temperature: z.number().min(0).default(1),
  /** Keep the k most likely tokens; 0 = off. */
  topK: z.number().int().min(0).default(0),
  /** Keep the smallest set of most likely tokens whose probability reaches p. */
  topP: z.number().gt(0).max(1).default(0.9),
  /** > 1 discourages ids already in the prompt or output (CTRL / HF semantics). */
  repetitionPenalty: z.number().min(1).default(1),
  /** PRNG seed; default: drawn at random (the Sampler reports the one used). */
  seed: z.number().int().optional(),
});
export type SamplingOptionsInput = z.input<typeof SamplingOptionsSchema>;
export type SamplingOptions = z.output<typeof SamplingOptionsSchema> & { seed: number };

export function parseSamplingOptions(input: SamplingOptionsInput = {}): SamplingOptions {
  const r = SamplingOptionsSchema.safeParse(input);
  if (!r.success) {
    const issue = r.error.issues[0];
    fail(`invalid sampling option ${issue.path.join(".")}: ${issue.message}`);
  }
  return { ...r.data, seed: r.data.seed ?? Math.floor(Math.random() * 2 ** 31) };
}

/** xoshiro128**, seeded through splitmix32: fast, 32-bit, reproducible across platforms. */
export class Xoshiro128 {
  private s0 = 0;
  private s1 = 0;
  private s2 = 0;
  private s3 = 0;

  constructor(seed: number) {
    let x = seed >>> 0;
    const next = () => {
      x = (x + 0x9e3779b9) >>> 0;
      let z = x;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
      return (z ^ (z >>> 16)) >>> 0;
    };
    this.s0 = next();
    this.s1 = next();
    this.s2 = next();
    this.s3 = next();
  }

  /** Uniform 32-bit unsigned integer. */
  nextU32(): number {
    const result = Math.imul(rotl(Math.imul(this.s1, 5), 7), 9) >>> 0;
    const t = this.s1 << 9;
    this.s2 ^= this.s0;
    this.s3 ^= this.s1;
    this.s1 ^= this.s2;
    this.s0 ^= this.s3;
    this.s2 ^= t;
    this.s3 = rotl(this.s3, 11);
    return result;
  }

  /** Uniform in [0, 1). */
  next(): number {
    return this.nextU32() / 4294967296;
  }
}

function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k));
}

export class Sampler {
  readonly options: SamplingOptions;
  readonly vocabSize: number;
  private rng: Xoshiro128;
  private readonly seen: Uint8Array;
  private readonly seenIds: Int32Array;
  private seenCount = 0;
  private readonly cand: Int32Array; // candidate ids
  private readonly prob: Float64Array; // their weights (parallel to cand)
  private readonly heap: Int32Array;
  private allMass = 0; // Σ weights of all tokens, set by nucleusCandidates

  /** Plain argmax of the logits (temperature 0, no repetition penalty): a backend may pick on the device. */
  get greedy(): boolean {
    return this.options.temperature === 0 && this.options.repetitionPenalty === 1;
  }

  constructor(vocabSize: number, options: SamplingOptionsInput = {}) {
    check(Number.isInteger(vocabSize) && vocabSize > 0, `sampler: bad vocabulary size ${vocabSize}`);
    this.vocabSize = vocabSize;
    this.options = parseSamplingOptions(options);
    this.rng = new Xoshiro128(this.options.seed);
    this.seen = new Uint8Array(vocabSize);
    this.seenIds = new Int32Array(vocabSize);
    this.cand = new Int32Array(vocabSize);
    this.prob = new Float64Array(vocabSize);
    this.heap = new Int32Array(Math.min(this.options.topK || 1, vocabSize));
  }

  /** Record ids (prompt or generated) for the repetition penalty. */
  observe(id: number): void {
    if (id >= 0 && id < this.vocabSize && !this.seen[id]) {
      this.seen[id] = 1;
      this.seenIds[this.seenCount++] = id;
    }
  }

  observeAll(ids: Iterable<number>): void {
    for (const id of ids) this.observe(id);
  }

  /** Forget observed ids and restart the PRNG from the seed. */
  reset(): void {
    for (let i = 0; i < this.seenCount; i++) this.seen[this.seenIds[i]] = 0;
    this.seenCount = 0;
    this.rng = new Xoshiro128(this.options.seed);
  }

  /** Pick the next id from `logits` (length vocabSize). The penalty is applied in place. */
  sample(logits: Float32Array): number {
    if (logits.length !== this.vocabSize) fail(`sampler: ${logits.length} logits for a vocabulary of ${this.vocabSize}`);
    const { temperature, topK, topP, repetitionPenalty } = this.options;
    if (repetitionPenalty !== 1) {
      for (let i = 0; i < this.seenCount; i++) {
        const id = this.seenIds[i], l = logits[id];
        logits[id] = l > 0 ? l / repetitionPenalty : l * repetitionPenalty;
      }
    }
    if (temperature === 0) return argmax(logits);
    const useTopK = topK > 0 && topK < this.vocabSize;
    if (!useTopK && topP === 1) return this.drawFull(logits, temperature);
    const n = useTopK ? this.topKCandidates(logits, topK) : this.nucleusCandidates(logits, temperature, topP);
    // cand[0..n) sorted by logit, descending. Weights relative to the best, then the top-p cut.
    const maxL = logits[this.cand[0]];
    let total = 0;
    for (let i = 0; i < n; i++) total += this.prob[i] = Math.exp((logits[this.cand[i]] - maxL) / temperature);
    let keep = n;
    if (topP < 1) {
      // Top-p after top-k renormalizes over the k; alone, it measures against every token.
      const mass = useTopK ? total : this.allMass;
      let cum = 0;
      for (let i = 0; i < n; i++) {
        cum += this.prob[i];
        if (cum >= topP * mass) {
          keep = i + 1;
          total = cum;
          break;
        }
      }
    }
    let r = this.rng.next() * total;
    for (let i = 0; i < keep; i++) {
      r -= this.prob[i];
      if (r < 0) return this.cand[i];
    }
    return this.cand[keep - 1]; // rounding left r ≥ 0
  }

  /** The k largest logits into cand[0..k), sorted descending (ties: lower id first). */
  private topKCandidates(logits: Float32Array, k: number): number {
    const heap = this.heap;
    // Min-heap ordered by "worse": smaller logit, or equal logit and larger id.
    const worse = (a: number, b: number) => logits[a] < logits[b] || (logits[a] === logits[b] && a > b);
    let size = 0;
    for (let id = 0; id < logits.length; id++) {
      if (size < k) {
        let i = size++;
        heap[i] = id;
        while (i > 0) {
          const p = (i - 1) >> 1;
          if (!worse(heap[i], heap[p])) break;
          const t = heap[i]; heap[i] = heap[p]; heap[p] = t;
          i = p;
        }
      } else if (logits[id] > logits[heap[0]]) {
        heap[0] = id;
        let i = 0;
        for (;;) {
          const l = 2 * i + 1, r = l + 1;
          let m = i;
          if (l < size && worse(heap[l], heap[m])) m = l;
          if (r < size && worse(heap[r], heap[m])) m = r;
          if (m === i) break;
          const t = heap[i]; heap[i] = heap[m]; heap[m] = t;
          i = m;
        }
      }
    }
    for (let i = 0; i < size; i++) this.cand[i] = heap[i];
    sortDescending(this.cand, size, logits);
    return size;
  }

  /** Tokens that can be in the top-p nucleus, sorted descending. */
  private nucleusCandidates(logits: Float32Array, temperature: number, topP: number): number {
    const maxL = logits[argmax(logits)];
    let total = 0;
    for (let i = 0; i < logits.length; i++) total += Math.exp((logits[i] - maxL) / temperature);
    // p_i < (1 − topP)/(V − 1) ⇒ all such tokens together stay below 1 − topP: never needed.
    this.allMass = total;
    const cutoff = ((1 - topP) / Math.max(1, logits.length - 1)) * total;
    let n = 0;
    for (let i = 0; i < logits.length; i++) {
      if (Math.exp((logits[i] - maxL) / temperature) >= cutoff) this.cand[n++] = i;
    }
    sortDescending(this.cand, n, logits);
    return n;
  }

  private drawFull(logits: Float32Array, temperature: number): number {
    const maxL = logits[argmax(logits)];
    let total = 0;
    for (let i = 0; i < logits.length; i++) total += this.prob[i] = Math.exp((logits[i] - maxL) / temperature);
    let r = this.rng.next() * total;
    for (let i = 0; i < logits.length; i++) {
      r -= this.prob[i];
      if (r < 0) return i;
    }
    return argmax(logits);
  }
}

/** First index of the largest value. */
export function argmax(x: Float32Array): number {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i;
  return best;
}

function sortDescending(ids: Int32Array, n: number, logits: Float32Array): void {
  const cmp = (a: number, b: number) => logits[b] - logits[a] || a - b;
  if (n <= 32) {
    for (let i = 1; i < n; i++) {
      const v = ids[i];
      let j = i - 1;
      while (j >= 0 && cmp(ids[j], v) > 0) {
        ids[j + 1] = ids[j];
        j--;
      }
      ids[j + 1] = v;
    }
  } else {
    ids.subarray(0, n).sort(cmp);
  }
}
