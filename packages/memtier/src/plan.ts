/**
 * Capacity planning: how many bytes of the offloaded KV store land on each tier under a
 * placement, and whether it fits. Per sequence, the GPU window keeps `windowTokens` tokens and
 * the other `contextTokens − windowTokens` are offloaded; K and V pools are planned separately
 * (K first, since the CPU stage reads it every step and should get the first pick).
 */
import { z } from "zod";
import { HybridgenError, MemoryTierSchema, PlacementSchema, checkPlacement, type MemoryTier, type Placement, type TierRule, isFileTier } from "@hybridgen/spec";

export const CapacityPlanInputSchema = z.object({
  tiers: z.array(MemoryTierSchema).min(1),
  placement: PlacementSchema,
  /** KV bytes one token adds over all layers (see kvBytesPerToken in @hybridgen/spec). */
  bytesPerToken: z.object({ k: z.number().int().nonnegative(), v: z.number().int().nonnegative() }),
  contextTokens: z.number().int().nonnegative(),
  batch: z.number().int().positive().default(1),
  /** Tokens per sequence resident in the GPU window (sink tokens included). */
  windowTokens: z.number().int().nonnegative(),
  /** Share of each memory tier kept free for the OS, weights and staging buffers. File tiers are used whole. */
  headroom: z.number().min(0).max(0.95).default(0.1),
  /** Plan against free memory at discovery time instead of total capacity. */
  useFreeBytes: z.boolean().default(false),
});
export type CapacityPlanInput = z.input<typeof CapacityPlanInputSchema>;

export interface TierPlan {
  readonly id: string;
  readonly kind: MemoryTier["kind"];
  readonly kBytes: number;
  readonly vBytes: number;
  /** kBytes + vBytes. */
  readonly usedBytes: number;
  /** What the plan may use on this tier (capacity or free bytes, less headroom). */
  readonly availableBytes: number;
  readonly fits: boolean;
}

export interface CapacityPlan {
  readonly offloadedTokensPerSequence: number;
  /** KV bytes held in the GPU windows of all sequences. */
  readonly windowBytes: number;
  readonly kBytes: number;
  readonly vBytes: number;
  readonly tiers: readonly TierPlan[];
  readonly fits: boolean;
  /** Bytes that found no room (0 when it fits). */
  readonly shortfallBytes: number;
}

/** Places `bytes` on tiers by a rule, drawing on `room`; returns bytes per tier and what did not fit. */
function allocate(rule: TierRule, bytes: number, room: Map<string, number>, used: Map<string, number>): number {
  if (rule.mode === "fill") {
    let left = bytes;
    for (const id of rule.order) {
      const take = Math.min(left, Math.max(0, room.get(id)!));
      room.set(id, room.get(id)! - take);
      used.set(id, (used.get(id) ?? 0) + take);
      left -= take;
    }
    return left;
  }
  // Interleave: equal shares (the remainder to the first tiers); a share beyond a tier's room
  // is over-subscription, not a spill, since page interleaving does not look at capacity.
  const n = rule.tiers.length;
  const share = Math.floor(bytes / n);
  let over = 0;
  rule.tiers.forEach((id, i) => {
    const mine = share + (i < bytes - share * n ? 1 : 0);
    room.set(id, room.get(id)! - mine);
    used.set(id, (used.get(id) ?? 0) + mine);
  });
  for (const id of rule.tiers) over += Math.max(0, -room.get(id)!);
  for (const id of rule.tiers) room.set(id, Math.max(0, room.get(id)!));
  return over;
}

export function planCapacity(input: CapacityPlanInput): CapacityPlan {
  const r = CapacityPlanInputSchema.safeParse(input);
  if (!r.success) {
    const i = r.error.issues[0];
    throw new HybridgenError(`capacity plan: ${i?.path.join(".") || "value"}: ${i?.message ?? "invalid"}`);
  }
  const o = r.data;
  const placement: Placement = o.placement;
  checkPlacement(placement, o.tiers);
  const ids = new Set<string>();
  for (const t of o.tiers) {
    if (ids.has(t.id)) throw new HybridgenError(`capacity plan: tier "${t.id}" listed twice`);
    ids.add(t.id);
  }

  const offloaded = Math.max(0, o.contextTokens - o.windowTokens);
  const resident = o.contextTokens - offloaded;
  const kBytes = offloaded * o.batch * o.bytesPerToken.k;
  const vBytes = offloaded * o.batch * o.bytesPerToken.v;

  const available = new Map<string, number>();
  for (const t of o.tiers) {
    const base = o.useFreeBytes && t.freeBytes !== undefined ? t.freeBytes : t.capacityBytes;
    available.set(t.id, isFileTier(t) ? base : Math.floor(base * (1 - o.headroom)));
  }
  const room = new Map(available);
  const kUsed = new Map<string, number>();
  const vUsed = new Map<string, number>();
  const shortfall = allocate(placement.k, kBytes, room, kUsed) + allocate(placement.v, vBytes, room, vUsed);

  const tiers = o.tiers.map((t): TierPlan => {
    const k = kUsed.get(t.id) ?? 0;
    const v = vUsed.get(t.id) ?? 0;
    const avail = available.get(t.id)!;
    return { id: t.id, kind: t.kind, kBytes: k, vBytes: v, usedBytes: k + v, availableBytes: avail, fits: k + v <= avail };
  });
  return {
    offloadedTokensPerSequence: offloaded,
    windowBytes: resident * o.batch * (o.bytesPerToken.k + o.bytesPerToken.v),
    kBytes,
    vBytes,
    tiers,
    fits: shortfall === 0,
    shortfallBytes: shortfall,
  };
}
