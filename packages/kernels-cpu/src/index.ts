export { CpuBackend, createCpuBackend } from "./cpu-backend.js";
export { CpuBackendOptionsSchema, type CpuBackendOptions } from "./options.js";
export { cpuFeatures, ISAS, type Isa, type CpuFeatures } from "./features.js";
export { CpuTensor } from "./tensor.js";
export { nativeLibraryPath } from "./native.js";
export { NativeCpuStage, NativeCpuStageOptionsSchema, type NativeCpuStageOptions } from "./cpu-stage.js";
export { createNativeRandomFill } from "./random-fill.js";
export { nativeSelectorPrimitives, type SelectorIsa } from "./selector-primitives.js";
export { storeKeys } from "./store-keys.js";
