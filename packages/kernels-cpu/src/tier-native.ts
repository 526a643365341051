/** The kv_tier.c entry points of libhgcpu (NUMA binding, file-backed regions, tier probes), opened on first use. */
import { FFIType, type dlopen } from "bun:ffi";
import { openNativeSymbols } from "./native.js";

const { ptr, i32, i64_fast, u64, f64 } = FFIType;

const symbols = {
  hg_tier_map_anon: { args: [u64], returns: ptr },
  hg_tier_unmap: { args: [ptr, u64], returns: i32 },
  hg_tier_mbind: { args: [ptr, u64, i32, ptr, i32, i32], returns: i32 },
  hg_tier_policy: { args: [ptr, ptr, i32], returns: i32 },
  hg_tier_page_nodes: { args: [ptr, u64, i32, ptr], returns: i32 },
  hg_tier_touch: { args: [ptr, u64], returns: FFIType.void },
  hg_tier_map_file: { args: [ptr, u64, ptr, i32, ptr, ptr], returns: ptr },
  hg_tier_close_fd: { args: [i32], returns: i32 },
  hg_tier_prefetch: { args: [ptr, u64], returns: i32 },
  hg_tier_prefetch_runs: { args: [ptr, i32], returns: i32 },
  hg_tier_prefetch_wait: { args: [], returns: FFIType.void },
  hg_tier_file_read_bw: { args: [ptr, u64, u64], returns: f64 },
  hg_tier_register_file: { args: [ptr, u64, ptr, u64], returns: i32 },
  hg_tier_unregister_file: { args: [ptr], returns: i32 },
  hg_tier_registered_files: { args: [], returns: i32 },
  hg_tier_drop_cache: { args: [ptr, u64, i32, u64], returns: i32 },
  hg_tier_resident: { args: [ptr, u64], returns: i64_fast },
  hg_tier_file_read_latency: { args: [ptr, u64, i32, ptr, ptr, i32, ptr], returns: i32 },
} as const;

export type TierNative = ReturnType<typeof dlopen<typeof symbols>>["symbols"];

let lib: TierNative | null = null;

export function tierNative(): TierNative {
  if (!lib) lib = openNativeSymbols(symbols); // one error for a missing or stale library
  return lib;
}

/** A NUL-terminated UTF-8 copy of `s` for a `const char *` argument. */
export function cPath(s: string): Uint8Array {
  return new TextEncoder().encode(`${s}\0`);
}

/** Linux mempolicy modes (numaif.h) and mbind flags. */
export const MPOL = { default: 0, preferred: 1, bind: 2, interleave: 3, local: 4 } as const;
export const MPOL_MF_MOVE = 2;
/** 64-bit words of the node masks passed to the kernel (1024 nodes). */
export const MASK_WORDS = 16;

export function nodeMask(nodes: readonly number[]): BigUint64Array {
  const m = new BigUint64Array(MASK_WORDS);
  for (const n of nodes) m[n >> 6] |= 1n << BigInt(n & 63);
  return m;
}

export function maskNodes(m: BigUint64Array): number[] {
  const out: number[] = [];
  for (let w = 0; w < m.length; w++) for (let b = 0; b < 64; b++) if ((m[w] >> BigInt(b)) & 1n) out.push(w * 64 + b);
  return out;
}
