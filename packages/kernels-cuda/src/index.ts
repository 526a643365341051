export { cudaAvailability, describeCudaAvailability, openCudaLibrary, type CudaAvailability, type CudaAvailabilityOptions } from "./availability.js";
export { CudaLibrary, EXPECTED_ABI_VERSION, type NativeAnswer } from "./cuda-library.js";
export { parseDeviceRecord, formatCudaVersion, type CudaDevice } from "./device-record.js";
export { cudaLibraryPath, CUDA_LIBRARY_ENV } from "./library-path.js";
export {
  CudaBackendOptionsSchema,
  parseCudaBackendOptions,
  selectCudaDevice,
  type CudaBackendOptions,
  type ResolvedCudaBackendOptions,
} from "./options.js";
export { CudaBackend, createCudaBackend, type CudaMemoryStats, type MatmulPath, type MatvecFusionChoice, type SkinnyOptions } from "./cuda-backend.js";
export { CudaTimer } from "./cuda-timer.js";
export { CudaTensor } from "./cuda-tensor.js";
export { DeviceArena, ARENA_ALIGN, type ArenaStats } from "./arena.js";
export { backendSymbols, openCudaNative, cudaErrorString, type CudaNative } from "./native-backend.js";
export { CudaHostLink, DEFAULT_WAIT_TIMEOUT_MS, type HostLinkOwner } from "./host-link.js";
