export { createHybridAttention, hybridBuilder, hybridPlan, type HybridModel } from "./create-hybrid-attention.js";
export { attachPerSequence, createBatchHybridAttention, sequenceModel, type PerSequence, type SequenceModel } from "./batch-hybrid-attention.js";
export { resolveHybrid, profileKMin, type HybridPlan, type ResolvedHybrid, type RuntimeTarget } from "./resolve.js";
export { HYBRID_OPTION_FLAGS, HybridRuntimeOptionsSchema, parseHybridFlag, ProfileDefaultsSchema, SchedulerNameSchema, SelectorTextSchema, type HybridOptionFlag, type CpuStageWrap, type HybridRuntimeOptions, type ProfileDefaults, type StoreAllocatorFactory } from "./options.js";
export { ATTENTION_CONFIG_NAMES, attentionConfig, attachAttentionConfig, attachAttentionConfigs, prepareHostStore, type AttachedAttention, type AttentionConfig, type AttentionKind } from "./attention-configs.js";
export { probeDiskGather, type DiskGatherProbe } from "./probe-disk-gather.js";
export { KSpill } from "./k-spill.js";
export { defaultStageThreads } from "./stage-threads.js";
export { fillSyntheticKv, randomizeWindow } from "./synthetic-kv.js";
export { planSelection, type PlanSelection } from "./plan-selection.js";
export * from "./hybrid/index.js";
export {
  backendChoices, BackendChoiceSchema, backendNames, describeBackends, isBackendModule, openBackendChoice, loadBackendModule, lookupBackend, openBackend, probeBackend,
  probeBackendChoice, registerBackend, type BackendAvailability, type BackendDescription, type BackendEntry, type BackendOpenOptions, type DeviceProbe, type OpenedBackend,
  type OpenedBackendChoice, type ProbedBackend, type ProbeOptions,
} from "./backends.js";
