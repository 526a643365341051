export { createHybridAttention, hybridPlan, type HybridModel } from "./create-hybrid-attention.js";
export { resolveHybrid, profileKMin, type HybridPlan, type ResolvedHybrid, type RuntimeTarget } from "./resolve.js";
export { HybridRuntimeOptionsSchema, ProfileDefaultsSchema, type HybridRuntimeOptions, type ProfileDefaults } from "./options.js";
