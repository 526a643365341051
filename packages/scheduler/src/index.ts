export { FixedScheduler } from "./fixed-scheduler.js";
export { FeedbackScheduler, type FeedbackSchedulerState } from "./feedback-scheduler.js";
export { createScheduler } from "./create-scheduler.js";
export { registerScheduler, schedulerNames, lookupScheduler, type SchedulerContext, type SchedulerEntry } from "./registry.js";
export {
  FixedSchedulerOptionsSchema,
  FeedbackSchedulerOptionsSchema,
  SchedulerSpecSchema,
  type FixedSchedulerOptions,
  type FeedbackSchedulerOptions,
  type ResolvedFeedbackOptions,
  type SchedulerSpec,
} from "./options.js";
export {
  TIMING_TRACE_FORMAT,
  TimingTraceSchema,
  TimingTraceRunSchema,
  TraceStepSchema,
  parseTimingTrace,
  timingTraceFromRuns,
  type TimingTrace,
  type TimingTraceRun,
  type TraceStep,
  type RecordedRun,
} from "./timing-trace.js";
export { fitCostModel, simulateStep, type CostModel, type TimingCost, type LinearCost, type StepResidual, type SimulatedStep } from "./cost-model.js";
export { replay, bestFixed, type ReplayOptions, type ReplayResult, type FixedChoice } from "./replay.js";
