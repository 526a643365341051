/**
 * @hybridgen/spec: the contracts every HybridGen package meets on — the Backend and its host
 * transfers, the token selector and its primitives, the scheduler, memory tiers, the CPU-stage
 * job, the hybrid parameters and the errors. Types and small checks only; what backend authors
 * reuse lives under `@hybridgen/spec/kit`.
 */
export * from "./errors.js";
export * from "./version.js";
export * from "./backend.js";
export * from "./host-capabilities.js";
export * from "./native-tensor.js";
export * from "./half-float.js";
export * from "./seeded-random.js";
export * from "./contracts/selector.js";
export * from "./contracts/scheduler.js";
export * from "./contracts/memory.js";
export * from "./contracts/tier-kinds.js";
export * from "./hybrid/cpu-stage.js";
export * from "./hybrid/check-stage-job.js";
export * from "./hybrid/params.js";
export * from "./hybrid/calibration-batch.js";
export * from "./hybrid/kept-columns.js";
