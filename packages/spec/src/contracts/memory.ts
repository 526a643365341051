/**
 * Memory tiers and KV placement (paper §4.4, semantic-aware mapping).
 *
 * The offloaded store keeps K and V in separate pools, so each pool can live in a different
 * tier: the CPU stage reads K on every step (it wants the fastest DRAM), while V is only ever
 * copied to the GPU by DMA (a CXL expander or, beyond RAM, a file is good enough).
 */
import { z } from "zod";
import { DTYPE_BYTES, type Backend, type DType, type Tensor } from "../backend.js";
import { HybridgenError } from "../errors.js";
import { isFileTier, tierKindNames } from "./tier-kinds.js";
import type { SpecVersion } from "../version.js";

/** A registered tier kind's name (registerTierKind: "dram", "cxl", "file", …). */
export const MemoryTierKindSchema = z.string().superRefine((k, ctx) => {
  const names = tierKindNames();
  if (!names.includes(k)) ctx.addIssue({ code: "invalid_value", values: names, input: k, message: `must be a registered tier kind (${names.join(", ")})` });
});
export type MemoryTierKind = string;

export const MemoryTierSchema = z
  .object({
    /** Stable name, e.g. "node0", "node2", "file:/mnt/nvme/kv". */
    id: z.string().min(1),
    kind: MemoryTierKindSchema,
    /** NUMA node backing the tier (dram/cxl); allocation binds here (mbind). */
    numaNode: z.number().int().nonnegative().optional(),
    capacityBytes: z.number().int().nonnegative(),
    /** Free at discovery time, when known. */
    freeBytes: z.number().int().nonnegative().optional(),
    /** Sequential read bandwidth from the CPU, when known (HMAT, or measured). */
    readBandwidthGBs: z.number().positive().optional(),
    /** File tiers: one random 4 KiB read's latency in µs with `readDepth` reads in flight, as the CPU stage's gather of
     * disk-tier rows issues them (@hybridgen/runtime's probeDiskGather). */
    readLatencyUs: z.number().positive().optional(),
    /** Reads in flight when readLatencyUs was measured: the CPU stage's threads × reads in flight each. */
    readDepth: z.number().int().positive().optional(),
    /** File tiers: one page fault's latency in µs on a file mapping of the tier (its read-around included) with
     * `faultDepth` in flight, one a CPU-stage thread: how the stage's scoring reads K pages spilled to the tier. */
    faultLatencyUs: z.number().positive().optional(),
    faultDepth: z.number().int().positive().optional(),
    /** Directory holding the backing files of a file-backed tier ("file"). */
    path: z.string().min(1).optional(),
  })
  .refine((t) => !isFileTier(t) || t.path !== undefined, { message: "a file tier needs a path", path: ["path"] });
export type MemoryTier = z.infer<typeof MemoryTierSchema>;

export const PlacementPolicySchema = z.enum(["semantic", "interleave", "local", "dram-only"]);
export type PlacementPolicy = z.infer<typeof PlacementPolicySchema>;

/**
 * Where one pool (K or V) goes. "fill": the first tier until it is full, then the next (spill
 * order). "interleave": pages spread round-robin, an equal share on every listed tier.
 */
export const TierRuleSchema = z.discriminatedUnion("mode", [
  z.object({ mode: z.literal("fill"), order: z.array(z.string().min(1)).min(1) }),
  z.object({ mode: z.literal("interleave"), tiers: z.array(z.string().min(1)).min(1) }),
]);
export type TierRule = z.infer<typeof TierRuleSchema>;

/** Which tiers the K pool and the V pool of the offloaded store go to. */
export const PlacementSchema = z.object({
  policy: PlacementPolicySchema,
  k: TierRuleSchema,
  v: TierRuleSchema,
});
export type Placement = z.infer<typeof PlacementSchema>;

export function tierRuleIds(rule: TierRule): readonly string[] {
  return rule.mode === "fill" ? rule.order : rule.tiers;
}

/** Throws a one-line HybridgenError when a placement names a tier that is not in `tiers`. */
export function checkPlacement(placement: Placement, tiers: readonly MemoryTier[]): void {
  const known = new Set(tiers.map((t) => t.id));
  for (const pool of ["k", "v"] as const) {
    for (const id of tierRuleIds(placement[pool])) {
      if (!known.has(id)) {
        throw new HybridgenError(`placement: ${pool.toUpperCase()} pool names tier "${id}", which is not one of [${[...known].join(", ")}]`);
      }
    }
  }
}

/** The dimensions that size a KV cache. ModelShape satisfies it. */
export interface KvShape {
  readonly layers: number;
  readonly kvHeads: number;
  readonly headDim: number;
}

export interface KvBytesPerToken {
  /** K bytes of one token over all layers. */
  readonly k: number;
  /** V bytes of one token over all layers. */
  readonly v: number;
  readonly total: number;
}

/** Bytes one token adds to the KV cache: Llama-3.1-8B in bf16 → 64 KiB K + 64 KiB V. */
export function kvBytesPerToken(shape: KvShape, dtype: DType = "bf16"): KvBytesPerToken {
  for (const key of ["layers", "kvHeads", "headDim"] as const) {
    const n = shape[key];
    if (!Number.isInteger(n) || n <= 0) throw new HybridgenError(`kv bytes: ${key} must be a positive integer, got ${n}`);
  }
  const bytes = DTYPE_BYTES[dtype];
  if (bytes === undefined) throw new HybridgenError(`kv bytes: unknown dtype "${dtype}"`);
  const k = shape.layers * shape.kvHeads * shape.headDim * bytes;
  return { k, v: k, total: 2 * k };
}

/** Bytes of K + V for `tokens` tokens of each of `batch` sequences. */
export function kvCacheBytes(shape: KvShape, dtype: DType, tokens: number, batch = 1): number {
  if (!Number.isInteger(tokens) || tokens < 0) throw new HybridgenError(`kv bytes: tokens must be a non-negative integer, got ${tokens}`);
  if (!Number.isInteger(batch) || batch <= 0) throw new HybridgenError(`kv bytes: batch must be a positive integer, got ${batch}`);
  return kvBytesPerToken(shape, dtype).total * tokens * batch;
}

/**
 * One page-aligned byte range of a store region and where it lives: bound to NUMA nodes
 * ("bind": those nodes only; "preferred": the first, falling back when full; "interleave":
 * pages round-robin), left to the kernel ("local": no policy), or a file of the disk tier in
 * `dir` ("file").
 */
export const StoreSegmentSchema = z.object({
  offset: z.number().int().nonnegative(),
  bytes: z.number().int().positive(),
  tier: z.string().min(1),
  mode: z.enum(["bind", "preferred", "interleave", "local", "file"]),
  nodes: z.array(z.number().int().nonnegative()),
  dir: z.string().min(1).optional(),
});
export type StoreSegment = z.infer<typeof StoreSegmentSchema>;

/**
 * K bytes that live on file tiers page-wise: the K regions' segments are memory, and a K spill
 * (@hybridgen/runtime's KSpill) keeps the coldest `unitBytes` units of K in these files, `bytes`
 * of each in turn, once the store's K outgrows what is left to memory.
 */
export const KSpillLayoutSchema = z.object({
  unitBytes: z.number().int().positive(),
  files: z.array(z.object({ tier: z.string().min(1), dir: z.string().min(1), bytes: z.number().int().positive() })).min(1),
});
export type KSpillLayout = z.infer<typeof KSpillLayoutSchema>;

/** Where every byte of the offloaded store goes: per layer, the segments of its K and its V region. */
export const StoreLayoutSchema = z.object({
  regionBytes: z.number().int().positive(),
  pageBytes: z.number().int().positive(),
  k: z.array(z.array(StoreSegmentSchema)),
  v: z.array(z.array(StoreSegmentSchema)),
  kSpill: KSpillLayoutSchema.optional(),
});
export type StoreLayout = z.infer<typeof StoreLayoutSchema>;

/**
 * Where the offloaded store's tensors come from when their memory must be placed: bound to a
 * NUMA node, interleaved, or mapped from a file of the disk tier (@hybridgen/kernels-cpu's
 * tiered store). Without one the backend's alloc() serves.
 */
export interface KvStoreAllocator {
  /** The spec version it was written for (SPEC_VERSION); absent: written before the field. */
  readonly spec?: SpecVersion;
  /** The [kvHeads, capacity, headDim] tensor of `pool` for `layer`, a tensor of `backend`. */
  alloc(backend: Backend, pool: "k" | "v", layer: number, shape: readonly number[], dtype: DType): Tensor;
  /** Whether a device may page-lock it (a file-backed region stays pageable, or it would be held in RAM). */
  pinnable(t: Tensor): boolean;
  /** The cache has freed every tensor alloc() gave it: the memory may go. */
  release(): void;
  /**
   * Optional: a CPU stage has just gathered slots `ids` of the V region `v` (per KV head g,
   * `counts[g]` ids from g·kmax). With `ahead`, consecutive layers are taken to select much alike,
   * so a file-backed allocator may start reading the same slots of the next layer's V; without
   * it (the page index: each layer's own pages reach the stage a layer early with q̃, and only
   * they may leave the disk) it only learns which slots were used (the runtime calls it).
   */
  readAhead?(v: Tensor, ids: Int32Array, counts: Int32Array, kmax: number, ahead: boolean): void;
  /**
   * Optional: the store now holds slots [0, rows) of every region (after an eviction, a reset or
   * a restore); `sync` waits for rows still on their way to host memory. A K spill moves its
   * coldest pages to disk here.
   */
  stored?(rows: number, sync: () => void): void;
}
