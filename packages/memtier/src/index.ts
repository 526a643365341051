export { discoverTiers, parseNodeMeminfo, cpulistHasCpus, DiscoverOptionsSchema, FileTierOptionsSchema, type DiscoverOptions } from "./discover.js";
export { compareTierSpeed, fastestFirst } from "./speed.js";
export { placeKv, placeSemantic, placeInterleave, placeDramOnly } from "./placement.js";
export { planCapacity, CapacityPlanInputSchema, type CapacityPlanInput, type CapacityPlan, type TierPlan } from "./plan.js";
export { formatBytes } from "./format.js";
