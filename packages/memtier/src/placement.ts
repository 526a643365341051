/**
 * Placement policies as pure functions of the tier list (paper §4.4):
 *
 * - semantic   — K (read by the CPU every step) fills DRAM, fastest first; V (only ever DMA'd to
 *                the GPU) fills the slowest memory first: CXL, then the slower DRAM nodes, and
 *                files last. K spills down the same speed order if DRAM runs out.
 * - interleave — the usual OS-style baseline: K and V pages round-robin over every memory tier
 *                (DRAM and CXL), equal shares.
 * - local      — K and V on the node the process runs on (the kernel's default first-touch
 *                policy, no binding), spilling down the speed order when it is full.
 * - dram-only  — K and V fill DRAM nodes, fastest first; CXL and files are not used.
 *
 * File tiers are a last resort in every fill order: a V row read from disk stalls the copy.
 */
import { HybridgenError, PlacementPolicySchema, type MemoryTier, type Placement, type PlacementPolicy, isFileTier, tierKind } from "@hybridgen/spec";
import { fastestFirst } from "./speed.js";

function ids(tiers: readonly MemoryTier[]): string[] {
  return tiers.map((t) => t.id);
}

function requireDram(tiers: readonly MemoryTier[], policy: string): MemoryTier[] {
  const dram = fastestFirst(tiers).filter((t) => tierKind(t.kind).local);
  if (dram.length === 0) throw new HybridgenError(`placement "${policy}": no DRAM tier among [${ids(tiers).join(", ")}]`);
  return dram;
}

export function placeSemantic(tiers: readonly MemoryTier[]): Placement {
  const sorted = fastestFirst(tiers);
  requireDram(tiers, "semantic");
  const files = sorted.filter((t) => isFileTier(t));
  const memorySlowestFirst = sorted.filter((t) => !isFileTier(t)).reverse();
  return {
    policy: "semantic",
    k: { mode: "fill", order: ids(sorted) },
    v: { mode: "fill", order: ids([...memorySlowestFirst, ...files]) },
  };
}

export function placeInterleave(tiers: readonly MemoryTier[]): Placement {
  requireDram(tiers, "interleave");
  const memory = ids(fastestFirst(tiers).filter((t) => !isFileTier(t)));
  return { policy: "interleave", k: { mode: "interleave", tiers: memory }, v: { mode: "interleave", tiers: memory } };
}

export function placeDramOnly(tiers: readonly MemoryTier[]): Placement {
  const dram = ids(requireDram(tiers, "dram-only"));
  return { policy: "dram-only", k: { mode: "fill", order: dram }, v: { mode: "fill", order: dram } };
}

/** `localNode`: the NUMA node of the CPU the process runs on (default: the lowest DRAM node). */
export function placeLocal(tiers: readonly MemoryTier[], localNode?: number): Placement {
  const dram = requireDram(tiers, "local");
  const local = dram.find((t) => t.numaNode === localNode) ?? [...dram].sort((a, b) => (a.numaNode ?? 0) - (b.numaNode ?? 0))[0]!;
  const order = [local, ...fastestFirst(tiers).filter((t) => t !== local)];
  return { policy: "local", k: { mode: "fill", order: ids(order) }, v: { mode: "fill", order: ids(order) } };
}

/** The placement a policy name gives on these tiers. */
export function placeKv(policy: PlacementPolicy, tiers: readonly MemoryTier[], localNode?: number): Placement {
  if (tiers.length === 0) throw new HybridgenError("placement: no memory tiers");
  const p = PlacementPolicySchema.safeParse(policy);
  if (!p.success) throw new HybridgenError(`placement: unknown policy "${String(policy)}" (semantic, interleave, local, dram-only)`);
  if (p.data === "semantic") return placeSemantic(tiers);
  if (p.data === "interleave") return placeInterleave(tiers);
  if (p.data === "local") return placeLocal(tiers, localNode);
  return placeDramOnly(tiers);
}
