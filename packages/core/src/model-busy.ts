/** One generation at a time per model (generate and generateBatch both claim the model). */
import { fail } from "@hybridgen/spec";

const busy = new WeakSet<object>();

export function checkIdle(model: object): void {
  if (busy.has(model)) fail("the model is already generating (one generation at a time per model)");
}

export function claimModel(model: object): void {
  checkIdle(model);
  busy.add(model);
}

export function releaseModel(model: object): void {
  busy.delete(model);
}
