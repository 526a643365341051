// The hybrid step (plan, merge, accounting, transports), its stats, profiles and calibration.
export * from "./hybrid-attention.js";
export * from "./step-plan.js";
export { StepMerge } from "./step-merge.js";
export * from "./transport/choose-transport.js";
export type { StepDriver, StepTimes, StepTransport, TransportName } from "./transport/step-transport.js";
export * from "./hybrid-stats.js";
export * from "./options.js";
export * from "./row-path.js";
export * from "./profile.js";
export * from "./profile-recall.js";
export * from "./profile-agreement.js";
export * from "./profile-text.js";
export * from "./calibration.js";
export * from "./calibrator.js";
export * from "./calibration-cache.js";
export { IndexBatch, type IndexBatchMember } from "./index-batch.js";
export { HandOffBatch } from "./transport/hand-off-batch.js";
export { deviceIndexShape, indexRankCharge, timeIndexRank } from "./device-index.js";
