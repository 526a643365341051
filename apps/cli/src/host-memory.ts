/**
 * The host memory this machine offers the engine, from one source: the memory tiers (DRAM and
 * CXL nodes) that `hybridgen info` lists, so info and inspect never disagree.
 */
import { discoverTiers } from "@hybridgen/memtier";
import { isFileTier } from "@hybridgen/core";

export function hostMemoryBytes(): number {
  return discoverTiers()
    .filter((t) => !isFileTier(t))
    .reduce((sum, t) => sum + (t.capacityBytes ?? 0), 0);
}
