/**
 * A stand-in for the CUDA library (no GPU needed): every symbol of backendSymbols, answering
 * what creating a context asks (a heap at 2^40, its size, 132 SMs), the matmul path the real
 * library takes (GEMV up to 8 rows), a fake error string, and 0 for everything else.
 * A test overrides single answers with `answer` (undefined falls through to the defaults).
 * STAND_IN_HEAP is where the backend's first tensor lands.
 */
import { backendSymbols, type CudaDevice, type CudaNative } from "../src/index.js";

export interface NativeCall {
  readonly name: string;
  /** The call's arguments; Int32Arrays copied, since the backend reuses its tables. */
  readonly args: unknown[];
}

export interface StandInOptions {
  /** Every call, in order. */
  calls?: NativeCall[];
  /** Bytes of the backend's own heap the native library reports (default 1 MiB). */
  heapBytes?: number;
  answer?: (name: string, args: unknown[]) => unknown;
}

export const STAND_IN_HEAP = 2 ** 40;

export const STAND_IN_DEVICE: CudaDevice = {
  index: 0, name: "Stand-in GPU", major: 9, minor: 0, computeCapability: "9.0", totalMemoryBytes: 2 ** 34, multiprocessors: 132, pciBusId: "",
};

export function standInNative(options: StandInOptions = {}): CudaNative {
  const { calls, heapBytes = 1 << 20, answer } = options;
  const lib: Record<string, (...args: unknown[]) => unknown> = {};
  for (const name of Object.keys(backendSymbols)) {
    lib[name] = (...args: unknown[]) => {
      calls?.push({ name, args: args.map((a) => (a instanceof Int32Array ? a.slice() : a)) });
      const own = answer?.(name, args);
      if (own !== undefined) return own;
      switch (name) {
        case "hg_cu_create": case "hg_link_create": return 4096;
        case "hg_fetch_create": return 8192;
        case "hg_cu_heap_base": return STAND_IN_HEAP;
        case "hg_cu_heap_bytes": return heapBytes;
        case "hg_cu_arena_bytes": return heapBytes + 4096;
        case "hg_cu_num_sms": return 132;
        case "hg_cu_matmul_path": return (args[1] as number) <= 8 ? 0 : 1;
        case "hg_cu_error_string": {
          (args[1] as Uint8Array).set(new TextEncoder().encode(`cudaErrorFake${args[0]}: fake failure\0`));
          return undefined;
        }
        default: return 0;
      }
    };
  }
  return lib as unknown as CudaNative;
}
