/**
 * What AoG and AoC share: the step bookkeeping (position, offloaded count, wall time into
 * BaselineStats), full attention while nothing is offloaded, attach and close. A subclass
 * attends over the offloaded rows and says what a step with some needs first.
 */
import { type Tensor, fail } from "@hybridgen/spec";
import type { Attention, DecodeAttention } from "../attention.js";
import { BaselineStats } from "./baseline-stats.js";

export abstract class BaselineAttention implements DecodeAttention, Disposable {
  abstract readonly name: string;
  readonly stats = new BaselineStats();
  protected pos = 0;
  /** Offloaded tokens of the current step (0: the step is plain full attention). */
  protected offloaded = 0;
  private stepStart = 0;
  private closed = false;

  /** `label` names the method in errors ("AoG"). */
  constructor(protected readonly attention: Attention, private readonly label: string) {
    if (attention.cache.storeCapacity === 0) fail(`${label} attention needs a KV window smaller than the context (nothing would be offloaded)`);
  }

  /** Routes `attention`'s decode steps through a new one of this class. */
  static attach<T extends BaselineAttention>(this: new (attention: Attention) => T, attention: Attention): T {
    const a = new this(attention);
    attention.setDecodeAttention(a);
    return a;
  }

  newSequence(): void {}

  beginStep(pos: number): void {
    if (this.closed) fail(`${this.label} attention used after close()`);
    this.pos = pos;
    this.offloaded = this.attention.cache.storeCount;
    this.stepStart = performance.now();
    if (this.offloaded > 0) this.prepareStep();
  }

  layerInput(): void {}

  attend(layer: number, q: Tensor, out: Tensor): void {
    if (this.offloaded === 0) {
      this.attention.attendFull(layer, q, 0, this.pos, out);
      return;
    }
    this.attendOffloaded(layer, q, out);
  }

  endStep(): void {
    if (this.offloaded === 0) return;
    this.stats.steps++;
    this.stats.offloaded = this.offloaded;
    this.stats.stepMs += performance.now() - this.stepStart;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.attention.decodeAttention === this) this.attention.setDecodeAttention(null);
    this.release();
  }

  [Symbol.dispose](): void {
    this.close();
  }

  /** A step with offloaded tokens begins (after the step's bookkeeping). */
  protected abstract prepareStep(): void;
  /** Layer `layer`'s attention with `this.offloaded` tokens offloaded. */
  protected abstract attendOffloaded(layer: number, q: Tensor, out: Tensor): void;
  /** Frees what the subclass allocated (once, at close). */
  protected abstract release(): void;
}
