/**
 * Teacher-forced agreement with full attention, as the K_min profile measures it: a sequence
 * is prefilled up to the KV window, then fed one token a step; the next-token logits of every
 * step that has offloaded tokens are compared with full attention's — top-1 agreement and
 * KL(full ‖ other).
 */
import type { KvCache } from "@hybridgen/core";
import { logSoftmax } from "@hybridgen/core";
import { argmax } from "@hybridgen/core";

/** What teacherForce needs of a model (every CausalLM). */
export interface ForcedModel {
  readonly cache: KvCache;
  reset(): void;
  forward(ids: Int32Array, startPos: number): Float32Array;
}

/** Full attention's answer at one step: its argmax and log-probabilities. */
export interface ReferenceStep {
  readonly top: number;
  readonly logp: Float32Array;
}

/**
 * Runs `ids` teacher-forced: positions [0, prefill) as prefill blocks, then one decode step per
 * token; `visit` gets the logits after each decode step that had offloaded tokens.
 */
export function teacherForce(model: ForcedModel, ids: ArrayLike<number>, prefill: number, visit: (logits: Float32Array) => void): void {
  model.reset();
  model.forward(Int32Array.from(Array.prototype.slice.call(ids, 0, prefill) as number[]), 0);
  for (let t = prefill; t < ids.length; t++) {
    const offloaded = model.cache.storeCount; // evictions happen at the end of a step
    const logits = model.forward(Int32Array.of(ids[t]), t);
    if (offloaded > 0) visit(logits);
  }
}

/** Decode steps teacherForce compares for `length` tokens prefilled up to a `window`-token KV window. */
export function forcedSteps(length: number, window: number): number {
  // The first step past the window evicts a block; offloaded steps start after it.
  return Math.max(0, length - window - 1);
}

export function referenceStep(logits: Float32Array): ReferenceStep {
  return { top: argmax(logits), logp: logSoftmax(logits) };
}

/** Running top-1 agreement and mean KL(full ‖ other) over compared steps. */
export class AgreementMeter {
  private agree = 0;
  private kl = 0;
  private n = 0;

  add(ref: ReferenceStep, logits: Float32Array): void {
    const lp = logSoftmax(logits), r = ref.logp;
    if (argmax(logits) === ref.top) this.agree++;
    let d = 0;
    for (let j = 0; j < lp.length; j++) d += Math.exp(r[j]) * (r[j] - lp[j]);
    this.kl += Math.max(0, d); // ≥ 0 up to rounding
    this.n++;
  }

  get steps(): number {
    return this.n;
  }

  get top1(): number {
    return this.n === 0 ? 1 : this.agree / this.n;
  }

  get meanKl(): number {
    return this.n === 0 ? 0 : this.kl / this.n;
  }
}
