import type { Scheduler } from "@hybridgen/spec";
import { FeedbackScheduler } from "./feedback-scheduler.js";
import { FixedScheduler } from "./fixed-scheduler.js";
import { SchedulerSpecSchema, type SchedulerSpec } from "./options.js";
import { parseOptions } from "./parse-options.js";

/** Builds a scheduler from a spec such as `{kind: "feedback", options: {kMin: 128}}` (CLI, config files). */
export function createScheduler(spec: SchedulerSpec): Scheduler {
  const s = parseOptions(SchedulerSpecSchema, spec, "scheduler");
  if (s.kind === "fixed") return new FixedScheduler({ k: s.k, timing: s.timing });
  return new FeedbackScheduler(s.options ?? {});
}
