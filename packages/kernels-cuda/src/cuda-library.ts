/**
 * The native library through bun:ffi. Every pointer handed to C is a buffer allocated here
 * with its length passed alongside, so C never writes past it.
 */
import { dlopen, FFIType } from "bun:ffi";

/** The ABI this TypeScript expects (hg_cuda_abi_version in native/probe.cu). */
export const EXPECTED_ABI_VERSION = 16;

const symbols = {
  hg_cuda_abi_version: { args: [], returns: FFIType.i32 },
  hg_cuda_runtime_version: { args: [], returns: FFIType.i32 },
  hg_cuda_driver_version: { args: [], returns: FFIType.i32 },
  hg_cuda_probe: { args: [FFIType.ptr, FFIType.i32], returns: FFIType.i32 },
  hg_cuda_device_info: { args: [FFIType.i32, FFIType.ptr, FFIType.i32], returns: FFIType.i32 },
} as const;

const TEXT_BYTES = 1024;

export interface NativeAnswer {
  /** ≥ 0 on success (device count for probe), −cudaError on failure. */
  readonly rc: number;
  /** The record or the "errName: errString" the library wrote. */
  readonly text: string;
}

function cString(buf: Uint8Array): string {
  const end = buf.indexOf(0);
  return new TextDecoder().decode(end < 0 ? buf : buf.subarray(0, end));
}

/** An opened libhgcuda. Owns the dlopen handle: close() (or `using`) releases it. */
export class CudaLibrary implements Disposable {
  private lib: ReturnType<typeof dlopen<typeof symbols>> | undefined;

  /** Throws the loader's error when `path` is not a loadable library with these symbols. */
  constructor(readonly path: string) {
    this.lib = dlopen(path, symbols);
  }

  private get fns() {
    if (!this.lib) throw new Error(`${this.path} is closed`);
    return this.lib.symbols;
  }

  abiVersion(): number {
    return this.fns.hg_cuda_abi_version();
  }

  runtimeVersion(): number {
    return this.fns.hg_cuda_runtime_version();
  }

  driverVersion(): number {
    return this.fns.hg_cuda_driver_version();
  }

  /** Device count and device 0's record, or the CUDA error. `bufferBytes` exists for tests of truncation. */
  probe(bufferBytes = TEXT_BYTES): NativeAnswer {
    const buf = new Uint8Array(Math.max(1, bufferBytes));
    const rc = this.fns.hg_cuda_probe(buf, buf.length);
    return { rc, text: cString(buf) };
  }

  deviceInfo(index: number): NativeAnswer {
    if (!Number.isInteger(index) || index < 0 || index > 0x7fffffff) return { rc: -101, text: `invalid device index ${index}` };
    const buf = new Uint8Array(TEXT_BYTES);
    const rc = this.fns.hg_cuda_device_info(index, buf, buf.length);
    return { rc, text: cString(buf) };
  }

  close(): void {
    this.lib?.close();
    this.lib = undefined;
  }

  [Symbol.dispose](): void {
    this.close();
  }
}
