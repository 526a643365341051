/**
 * cudaAvailability(): can this process use a GPU, and which? Never throws and never crashes:
 * a missing library, a library that will not load, no driver, a driver too old, or no device
 * each come back as `{available: false, reason: "CUDA unavailable: …"}` for the CLI to print
 * (and for `--device auto` to fall back to the CPU).
 */
import { existsSync } from "node:fs";
import { CudaLibrary, EXPECTED_ABI_VERSION } from "./cuda-library.js";
import { formatCudaVersion, parseDeviceRecord, type CudaDevice } from "./device-record.js";
import { cudaLibraryPath } from "./library-path.js";
import { notBuiltReason } from "./not-built.js";

export type CudaAvailability =
  | {
      readonly available: true;
      readonly devices: readonly CudaDevice[];
      /** e.g. 13000 for CUDA 13.0 (the runtime linked into the library). */
      readonly runtimeVersion: number;
      /** The newest CUDA version the driver supports. */
      readonly driverVersion: number;
      readonly libraryPath: string;
    }
  | { readonly available: false; readonly reason: string; readonly libraryPath: string };

// cudaError_t values the probe reports as −rc.
const INSUFFICIENT_DRIVER = 35;
const NO_DEVICE = 100;

// The library stays loaded for the process once opened: the backend uses the same handle,
// and unloading static cudart after driver initialisation gains nothing.
const opened = new Map<string, CudaLibrary>();
const cache = new Map<string, CudaAvailability>();

function unavailable(reason: string, libraryPath: string): CudaAvailability {
  return { available: false, reason: `CUDA unavailable: ${reason}`, libraryPath };
}

/** The opened library at `path` (shared), or the reason it cannot be used. */
export function openCudaLibrary(path: string): CudaLibrary | string {
  const have = opened.get(path);
  if (have) return have;
  if (!existsSync(path)) return notBuiltReason(path);
  let lib: CudaLibrary;
  try {
    lib = new CudaLibrary(path);
  } catch (e) {
    return `cannot load ${path}: ${(e instanceof Error ? e.message : String(e)).split("\n")[0]}`;
  }
  const abi = lib.abiVersion();
  if (abi !== EXPECTED_ABI_VERSION) {
    lib.close();
    return `${path} has ABI version ${abi}, this package expects ${EXPECTED_ABI_VERSION} (rebuild the package)`;
  }
  opened.set(path, lib);
  return lib;
}

function probe(libraryPath: string): CudaAvailability {
  const lib = openCudaLibrary(libraryPath);
  if (typeof lib === "string") return unavailable(lib, libraryPath);
  const runtime = lib.runtimeVersion();
  const driver = lib.driverVersion();
  const { rc, text } = lib.probe();
  if (rc < 0) {
    if (-rc === INSUFFICIENT_DRIVER && driver <= 0) return unavailable(`no NVIDIA driver found (${text})`, libraryPath);
    if (-rc === INSUFFICIENT_DRIVER) {
      return unavailable(`the NVIDIA driver supports CUDA ${formatCudaVersion(driver)}, older than this build's runtime ${formatCudaVersion(runtime)} (${text})`, libraryPath);
    }
    if (-rc === NO_DEVICE) return unavailable(`no CUDA device (${text})`, libraryPath);
    return unavailable(text || `CUDA error ${-rc}`, libraryPath);
  }
  if (rc === 0) return unavailable("no CUDA device", libraryPath);
  const devices: CudaDevice[] = [];
  for (let i = 0; i < rc; i++) {
    const info = i === 0 ? { rc: 0, text } : lib.deviceInfo(i);
    if (info.rc < 0) return unavailable(`device ${i}: ${info.text}`, libraryPath);
    devices.push(parseDeviceRecord(i, info.text));
  }
  return { available: true, devices, runtimeVersion: runtime, driverVersion: driver, libraryPath };
}

export interface CudaAvailabilityOptions {
  /** Library to probe (default: $HYBRIDGEN_KERNELS_CUDA_LIB, else the package's lib/libhgcuda.so). */
  libraryPath?: string;
  /** Probe again instead of answering from the per-process cache. */
  refresh?: boolean;
}

export function cudaAvailability(options: CudaAvailabilityOptions = {}): CudaAvailability {
  const path = cudaLibraryPath(options.libraryPath);
  const cached = cache.get(path);
  if (cached && !options.refresh) return cached;
  let result: CudaAvailability;
  try {
    result = probe(path);
  } catch (e) {
    // Should not happen (the probe reports errors as values), but availability must never throw.
    result = unavailable(e instanceof Error ? e.message : String(e), path);
  }
  cache.set(path, result);
  return result;
}

/** One line for logs and the CLI's stats: "CUDA 13.0: NVIDIA H200 (sm_90, 140.4 GB, 132 SMs)" or the reason. */
export function describeCudaAvailability(a: CudaAvailability): string {
  if (!a.available) return a.reason;
  const devices = a.devices.map((d) => `${d.name} (sm_${d.major}${d.minor}, ${(d.totalMemoryBytes / 1e9).toFixed(1)} GB, ${d.multiprocessors} SMs)`);
  return `CUDA ${formatCudaVersion(a.runtimeVersion)} (driver ${formatCudaVersion(a.driverVersion)}): ${devices.join(", ")}`;
}
