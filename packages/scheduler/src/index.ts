export { FixedScheduler } from "./fixed-scheduler.js";
export { FeedbackScheduler, type FeedbackSchedulerState } from "./feedback-scheduler.js";
export { createScheduler } from "./create-scheduler.js";
export {
  FixedSchedulerOptionsSchema,
  FeedbackSchedulerOptionsSchema,
  SchedulerSpecSchema,
  type FixedSchedulerOptions,
  type FeedbackSchedulerOptions,
  type ResolvedFeedbackOptions,
  type SchedulerSpec,
} from "./options.js";
