/**
 * Two-step scoring of the CPU stage: compressed copies of the offloaded K rows (native/kq.c),
 * written when rows are first read after their eviction, scored first; the best
 * rescoreFactor·K candidates are rescored from the full rows. The copies live in a region of
 * their own per store K tensor (TensorRegions, apart from the host store's own memory).
 */
import { FFIType, type Pointer } from "bun:ffi";
import { fail, type DType } from "@hybridgen/spec";
import { z } from "zod";
import { openNativeSymbols } from "./native.js";
import type { CpuTensor } from "./tensor.js";
import { TensorRegions, type NativeRegion } from "./tensor-regions.js";

const { ptr, i32, i64, i64_fast, void: none } = FFIType;
const symbols = {
  hg_kq_row_bytes: { args: [i32, i64], returns: i64_fast },
  hg_kq_encode: { args: [i32, ptr, i32, i64, i64, i64, i64, i64, ptr], returns: none },
  hg_kq_scores: { args: [i32, ptr, i64, i64, i64, ptr, i64, i64, ptr, i32], returns: i64_fast },
} as const;
let lib: ReturnType<typeof openNativeSymbols<typeof symbols>> | undefined;
const kq = () => (lib ??= openNativeSymbols(symbols));

/** full: score the bf16/f16/f32 rows (one step); int8: per row; int4: per 32 channels. */
export const ScoringSchema = z.enum(["full", "int8", "int4"]);
export type Scoring = z.infer<typeof ScoringSchema>;
export const SCORING_CODE: Readonly<Record<Scoring, number>> = { full: 0, int8: 1, int4: 2 };
const DTYPE_CODE: Readonly<Record<DType, number>> = { f32: 0, f16: 1, bf16: 2 };
/** Longest head the encoder takes (its row buffer). */
export const MAX_SKETCH_HEAD_DIM = 1024;

/** Bytes of one row's compressed record. */
export function sketchRowBytes(scoring: Exclude<Scoring, "full">, headDim: number): number {
  return Number(kq().hg_kq_row_bytes(SCORING_CODE[scoring], headDim));
}

interface Region extends NativeRegion { encoded: number; epoch: number | undefined }

/** The compressed copies of the store K tensors a stage has scored, one region each. */
export class KeySketches {
  private readonly regions: TensorRegions<Region>;
  readonly rowBytes: number;

  constructor(readonly scoring: Exclude<Scoring, "full">, private readonly kvHeads: number, private readonly capacity: number, headDim: number) {
    if (headDim > MAX_SKETCH_HEAD_DIM) fail(`cpu stage: ${scoring} scoring takes head dims up to ${MAX_SKETCH_HEAD_DIM}, got ${headDim}`);
    this.rowBytes = sketchRowBytes(scoring, headDim);
    this.regions = new TensorRegions(`${scoring} key copies`);
  }

  /**
   * The region of `k` and the first row it lacks (rows [from, offloaded) are encoded by the job).
   * A new epoch (the cache was reset or restored: rows may have been rewritten) or fewer rows
   * than encoded start it over.
   */
  region(k: CpuTensor, offloaded: number, epoch: number | undefined): { address: Pointer; from: number } {
    const bytes = this.kvHeads * this.capacity * this.rowBytes;
    const r = this.regions.get(k) ?? this.regions.alloc(k, bytes, (p) => ({ p, bytes, encoded: 0, epoch }));
    if (r.epoch !== epoch || offloaded < r.encoded) r.encoded = 0;
    r.epoch = epoch;
    const from = r.encoded;
    r.encoded = Math.max(r.encoded, offloaded);
    return { address: r.p, from };
  }

  /** The next region() of `k` starts over (a job that was to encode its rows failed). */
  forget(k: CpuTensor): void {
    const r = this.regions.get(k);
    if (r) r.encoded = 0;
  }

  /** Bytes held by the compressed copies. */
  get bytes(): number {
    return this.regions.bytes;
  }

  close(): void {
    this.regions.close();
  }
}

/**
 * The native encoder and approximate scorer on plain arrays (tests, recall measurements): the
 * records of rows [0, n) of K ([kvHeads, n, headDim] in `dtype`, as raw bytes), and the scores
 * [kvHeads, n] of q ([heads, headDim]). isa: 0 portable, 1 AVX2, -1 the best.
 */
export function sketchKeys(scoring: Exclude<Scoring, "full">, k: Uint8Array, dtype: DType, kvHeads: number, n: number, headDim: number): Uint8Array {
  const el = dtype === "f32" ? 4 : 2;
  if (k.byteLength !== kvHeads * n * headDim * el) fail(`sketchKeys: K has ${k.byteLength} bytes, expected ${kvHeads * n * headDim * el}`);
  if (headDim > MAX_SKETCH_HEAD_DIM) fail(`sketchKeys: head dims up to ${MAX_SKETCH_HEAD_DIM}, got ${headDim}`);
  const out = new Uint8Array(Math.max(1, kvHeads * n * sketchRowBytes(scoring, headDim)));
  if (n > 0) kq().hg_kq_encode(SCORING_CODE[scoring], k, DTYPE_CODE[dtype], kvHeads, n, headDim, 0, n, out);
  return out;
}

export function sketchScores(scoring: Exclude<Scoring, "full">, q: Float32Array, heads: number, kvHeads: number, headDim: number, records: Uint8Array, n: number, isa = -1): Float32Array {
  if (q.length !== heads * headDim) fail(`sketchScores: q has ${q.length} values, expected ${heads * headDim}`);
  if (heads % kvHeads !== 0) fail(`sketchScores: ${heads} heads do not split into ${kvHeads} KV heads`);
  if (records.byteLength < kvHeads * n * sketchRowBytes(scoring, headDim)) fail("sketchScores: too few records for n rows");
  const out = new Float32Array(Math.max(1, kvHeads * n));
  if (n > 0 && Number(kq().hg_kq_scores(SCORING_CODE[scoring], q, heads, kvHeads, headDim, records, n, n, out, isa)) !== 0) fail("sketchScores: out of memory");
  return out.subarray(0, kvHeads * n);
}
