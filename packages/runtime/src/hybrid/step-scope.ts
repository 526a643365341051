/**
 * What the batched step's per-step batches (IndexBatch, IndexSyncBatch, SendBatch, HandOffBatch)
 * share: one batch per owner (a backend or a host link), and which step it holds — BatchRows reuses
 * one step object and counts its serial, so a step is the object and its serial together.
 */
import type { DecodeBatchStep } from "@hybridgen/core";

/** The step a batch holds. */
export class StepMark {
  private held: DecodeBatchStep | null = null;
  private serial = -1;

  /** The step held (null: none yet). */
  get step(): DecodeBatchStep | null {
    return this.held;
  }

  /** True where `step` is the one held. */
  holds(step: DecodeBatchStep | null): boolean {
    return step !== null && step === this.held && step.serial === this.serial;
  }

  /** Holds `step`; true where it was not held already (the batch starts afresh). */
  moveTo(step: DecodeBatchStep): boolean {
    if (this.holds(step)) return false;
    this.held = step;
    this.serial = step.serial;
    return true;
  }
}

/** One T per owner, made on its first ask. */
export function perOwner<K extends object, T>(make: (owner: K) => T): (owner: K) => T {
  const made = new WeakMap<K, T>();
  return (owner) => {
    let t = made.get(owner);
    if (t === undefined) made.set(owner, (t = make(owner)));
    return t;
  };
}
