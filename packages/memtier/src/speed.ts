import { tierKind, type MemoryTier } from "@hybridgen/spec";

/**
 * Fastest first by kind (registered rank: DRAM, then CXL, then files); within a kind the higher known read bandwidth
 * first, then the lower NUMA node (node 0 is usually local to the process).
 */
export function compareTierSpeed(a: MemoryTier, b: MemoryTier): number {
  return (
    tierKind(a.kind).rank - tierKind(b.kind).rank ||
    (b.readBandwidthGBs ?? 0) - (a.readBandwidthGBs ?? 0) ||
    (a.numaNode ?? 0) - (b.numaNode ?? 0) ||
    a.id.localeCompare(b.id)
  );
}

export function fastestFirst(tiers: readonly MemoryTier[]): MemoryTier[] {
  return [...tiers].sort(compareTierSpeed);
}
