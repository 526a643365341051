/**
 * A built-in scheduler whose K a prefill calibration moves: `retune(k)` makes a new one from the
 * same options at the new K (the fixed K, or the feedback floor), so the next sequence's steps
 * start from what the prompt measured rather than from a constant.
 */
import type { Scheduler, SchedulerDecision, StepTimings } from "@hybridgen/core";

export class CalibratedScheduler implements Scheduler {
  private inner: Scheduler;

  constructor(private readonly make: (k: number) => Scheduler, k: number) {
    this.inner = make(k);
  }

  get name(): string {
    return this.inner.name;
  }

  retune(k: number): void {
    this.inner = this.make(k);
  }

  initial(): SchedulerDecision {
    return this.inner.initial();
  }

  next(t: StepTimings): SchedulerDecision {
    return this.inner.next(t);
  }

  reset(): void {
    this.inner.reset();
  }
}
