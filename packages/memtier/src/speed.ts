import type { MemoryTier, MemoryTierKind } from "@hybridgen/spec";

const KIND_RANK: Record<MemoryTierKind, number> = { dram: 0, cxl: 1, file: 2 };

/**
 * Fastest first: DRAM, then CXL, then files; within a kind the higher known read bandwidth
 * first, then the lower NUMA node (node 0 is usually local to the process).
 */
export function compareTierSpeed(a: MemoryTier, b: MemoryTier): number {
  return (
    KIND_RANK[a.kind] - KIND_RANK[b.kind] ||
    (b.readBandwidthGBs ?? 0) - (a.readBandwidthGBs ?? 0) ||
    (a.numaNode ?? 0) - (b.numaNode ?? 0) ||
    a.id.localeCompare(b.id)
  );
}

export function fastestFirst(tiers: readonly MemoryTier[]): MemoryTier[] {
  return [...tiers].sort(compareTierSpeed);
}
