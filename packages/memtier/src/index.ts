export { discoverTiers, parseNodeMeminfo, withUnclaimedMemory, cpulistHasCpus, DiscoverOptionsSchema, FileTierOptionsSchema, type DiscoverOptions } from "./discover.js";
export { compareTierSpeed, fastestFirst } from "./speed.js";
export { placeKv, placeSemantic, placeInterleave, placeLocal, placeDramOnly } from "./placement.js";
export { planCapacity, CapacityPlanInputSchema, type CapacityPlanInput, type CapacityPlan, type TierPlan } from "./plan.js";
export { layoutStore, kSpillUnitBytes, tierShares, StoreLayoutInputSchema, type StoreLayoutInput, type StoreLayoutResult, type TierUse } from "./layout.js";
export { planRun, gpuWindowTokens, diskRowsMs, kDiskMs, RunPlanInputSchema, GpuPlanInputSchema, type RunPlanInput, type RunPlan } from "./run-plan.js";
export { formatBytes } from "./format.js";
