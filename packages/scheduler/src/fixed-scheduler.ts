import type { Scheduler, SchedulerDecision, StepTimings } from "@hybridgen/spec";
import { FixedSchedulerOptionsSchema, type FixedSchedulerOptions } from "./options.js";
import { parseOptions } from "./parse-options.js";
import { SPEC_VERSION } from "@hybridgen/spec";

/** The same K and timing every step: the baseline, and `--k N --selection post|pre` without feedback. */
export class FixedScheduler implements Scheduler {
  readonly spec = SPEC_VERSION;
  readonly name = "fixed";
  private readonly decision: SchedulerDecision;

  constructor(options: FixedSchedulerOptions = {}) {
    const o = parseOptions(FixedSchedulerOptionsSchema, options, "fixed scheduler");
    this.decision = Object.freeze({ k: o.k, timing: o.timing });
  }

  initial(): SchedulerDecision {
    return { ...this.decision };
  }

  next(_t: StepTimings): SchedulerDecision {
    return { ...this.decision };
  }

  reset(): void {}
}
