/**
 * layoutStore: a placement made concrete for the store the engine allocates — every layer's K
 * region and V region cut into page-aligned segments, each on one tier (bound to its NUMA
 * node, interleaved, left local, or a file of the disk tier). @hybridgen/kernels-cpu's
 * TieredStore applies the result. Bytes go where planCapacity puts them (K first, each pool in
 * its rule's order); a host budget caps what all memory tiers together may hold, the slowest
 * giving up room first, so the rest lands on the file tiers: V's last layers first (V fills
 * after K). K goes to files only once all of V is there, and not by layer: its regions stay
 * memory and `kSpill` says how many bytes of K a K spill (@hybridgen/runtime's KSpill) keeps in
 * which files, its coldest pages first. A pool crosses tiers at a page boundary, so one region
 * may be split.
 */
import { z } from "zod";
import { HybridgenError, MemoryTierSchema, PlacementSchema, checkPlacement, tierRuleIds, type MemoryTier, type StoreLayout, type StoreSegment, type TierRule, isFileTier } from "@hybridgen/spec";
import { fastestFirst } from "./speed.js";

export const StoreLayoutInputSchema = z.object({
  tiers: z.array(MemoryTierSchema).min(1),
  placement: PlacementSchema,
  layers: z.number().int().positive(),
  /** Bytes of one layer's K (or V) store tensor; rounded up to whole pages. */
  regionBytes: z.number().int().positive(),
  pageBytes: z.number().int().positive().default(4096),
  /** Share of each memory tier kept free (OS, weights, staging). File tiers are used whole. */
  headroom: z.number().min(0).max(0.95).default(0.1),
  useFreeBytes: z.boolean().default(false),
  /** The most bytes all memory tiers together may hold of the store; the rest goes to file tiers. */
  hostBudgetBytes: z.number().int().nonnegative().optional(),
  /** Bytes of each tier already taken before the store (weights or the window on the CPU backend). */
  reservedBytes: z.record(z.string(), z.number().int().nonnegative()).default({}),
  /** Memory mappings a process may have (vm.max_map_count, the kernel's default): K's spill units are sized from it. */
  mapLimit: z.number().int().positive().default(65530),
});
export type StoreLayoutInput = z.input<typeof StoreLayoutInputSchema>;

export interface TierUse {
  readonly id: string;
  readonly kind: MemoryTier["kind"];
  readonly kBytes: number;
  readonly vBytes: number;
  /** What the layout may use on the tier (capacity less headroom, reservations and the host budget's cut). */
  readonly availableBytes: number;
}

export interface StoreLayoutResult {
  readonly layout: StoreLayout;
  readonly tiers: readonly TierUse[];
  /** Store bytes on file tiers. */
  readonly diskBytes: number;
  readonly fits: boolean;
  /** Bytes no tier had room for (they are left unbound in `layout`, which must not be applied then). */
  readonly shortfallBytes: number;
}

interface Piece {
  tier: string;
  bytes: number;
  /** Interleave pieces: every tier of the rule. */
  over?: string[];
}

/**
 * The unit a K spill moves to disk: whole pages, as few as keep K's units within a quarter of
 * `mapLimit` — each spilled run costs the process a mapping or two, and a run is one unit at worst.
 */
export function kSpillUnitBytes(kPoolBytes: number, pageBytes: number, mapLimit = 65530): number {
  const units = Math.max(1, Math.floor(mapLimit / 4));
  return pageBytes * Math.max(1, Math.ceil(Math.ceil(kPoolBytes / pageBytes) / units));
}

function fail(message: string): never {
  throw new HybridgenError(`store layout: ${message}`);
}

/** The pieces (tier, bytes) of one pool in order, drawing on `room` (page multiples). */
function piecesFor(rule: TierRule, bytes: number, room: Map<string, number>, files: readonly string[], page: number): { pieces: Piece[]; left: number } {
  const pieces: Piece[] = [];
  let left = bytes;
  if (rule.mode === "interleave") {
    // Page interleaving ignores capacity, but a disk tier takes what the memory tiers' room cannot.
    const memRoom = rule.tiers.reduce((n, id) => n + room.get(id)!, 0);
    const inMemory = files.length === 0 ? left : Math.min(left, Math.floor(memRoom / page) * page);
    if (inMemory > 0) {
      pieces.push({ tier: rule.tiers[0]!, bytes: inMemory, over: [...rule.tiers] });
      for (const id of rule.tiers) room.set(id, Math.max(0, room.get(id)! - Math.ceil(inMemory / rule.tiers.length)));
      left -= inMemory;
    }
    for (const id of files) {
      const take = Math.min(left, room.get(id)!);
      if (take > 0) pieces.push({ tier: id, bytes: take });
      room.set(id, room.get(id)! - take);
      left -= take;
    }
    return { pieces, left };
  }
  for (const id of rule.order) {
    const take = Math.min(left, room.get(id)!);
    if (take <= 0) continue;
    pieces.push({ tier: id, bytes: take });
    room.set(id, room.get(id)! - take);
    left -= take;
  }
  return { pieces, left };
}

/** One sequence's share of every tier when `batch` sequences each lay their store out on the same tiers. */
export function tierShares(tiers: readonly MemoryTier[], batch: number): MemoryTier[] {
  if (!(Number.isInteger(batch) && batch >= 1)) fail(`batch must be a positive integer, got ${batch}`);
  return tiers.map((t) => ({ ...t, capacityBytes: Math.floor(t.capacityBytes / batch), ...(t.freeBytes === undefined ? {} : { freeBytes: Math.floor(t.freeBytes / batch) }) }));
}

export function layoutStore(input: StoreLayoutInput): StoreLayoutResult {
  const r = StoreLayoutInputSchema.safeParse(input);
  if (!r.success) {
    const i = r.error.issues[0];
    fail(`${i?.path.join(".") || "value"}: ${i?.message ?? "invalid"}`);
  }
  const o = r.data;
  checkPlacement(o.placement, o.tiers);
  const byId = new Map<string, MemoryTier>();
  for (const t of o.tiers) {
    if (byId.has(t.id)) fail(`tier "${t.id}" listed twice`);
    byId.set(t.id, t);
  }
  const page = o.pageBytes;
  const R = Math.ceil(o.regionBytes / page) * page;
  const poolBytes = R * o.layers;

  const available = new Map<string, number>();
  for (const t of o.tiers) {
    const base = o.useFreeBytes && t.freeBytes !== undefined ? t.freeBytes : t.capacityBytes;
    const usable = (isFileTier(t) ? base : Math.floor(base * (1 - o.headroom))) - (o.reservedBytes[t.id] ?? 0);
    available.set(t.id, Math.max(0, Math.floor(usable / page) * page));
  }
  if (o.hostBudgetBytes !== undefined) {
    let over = o.tiers.filter((t) => !isFileTier(t)).reduce((n, t) => n + available.get(t.id)!, 0) - o.hostBudgetBytes;
    for (const t of fastestFirst(o.tiers).filter((x) => !isFileTier(x)).reverse()) {
      if (over <= 0) break;
      const cut = Math.min(over, available.get(t.id)!);
      const rounded = Math.min(available.get(t.id)!, Math.ceil(cut / page) * page);
      available.set(t.id, available.get(t.id)! - rounded);
      over -= rounded;
    }
  }
  const room = new Map(available);
  const files = fastestFirst(o.tiers).filter((t) => isFileTier(t)).map((t) => t.id);
  const k = piecesFor(o.placement.k, poolBytes, room, files, page);
  const v = piecesFor(o.placement.v, poolBytes, room, files, page);
  const shortfall = k.left + v.left;
  // K that memory cannot hold is spilled page-wise at run time, coldest first, so its regions stay memory throughout.
  const kFile = k.pieces.filter((p) => isFileTier(byId.get(p.tier)!));
  const kSpillBytes = kFile.reduce((n, p) => n + p.bytes, 0);
  const kMemory = k.pieces.filter((p) => !isFileTier(byId.get(p.tier)!)).map((p) => ({ ...p }));
  if (kSpillBytes > 0) {
    const last = kMemory[kMemory.length - 1];
    if (last) last.bytes += kSpillBytes;
    else kMemory.push({ tier: tierRuleIds(o.placement.k).find((id) => !isFileTier(byId.get(id)!)) ?? o.tiers.find((t) => !isFileTier(t))!.id, bytes: kSpillBytes });
  }
  const kSpill = kSpillBytes === 0 ? undefined : {
    unitBytes: kSpillUnitBytes(poolBytes, page, o.mapLimit),
    files: kFile.map((p) => ({ tier: p.tier, dir: byId.get(p.tier)!.path!, bytes: p.bytes })),
  };

  const segmentOf = (p: Piece, offset: number, bytes: number): StoreSegment => {
    const t = byId.get(p.tier)!;
    if (isFileTier(t)) return { offset, bytes, tier: t.id, mode: "file", nodes: [], dir: t.path! };
    if (p.over) {
      const nodes = p.over.map((id) => byId.get(id)!.numaNode);
      if (nodes.some((n) => n === undefined)) return { offset, bytes, tier: p.over.join("+"), mode: "local", nodes: [] };
      return { offset, bytes, tier: p.over.join("+"), mode: "interleave", nodes: nodes as number[] };
    }
    if (o.placement.policy === "local" || t.numaNode === undefined) return { offset, bytes, tier: t.id, mode: "local", nodes: [] };
    return { offset, bytes, tier: t.id, mode: "bind", nodes: [t.numaNode] };
  };
  const cut = (pieces: Piece[], left: number): StoreSegment[][] => {
    const all = left > 0 ? [...pieces, { tier: "(no room)", bytes: left }] : pieces;
    const regions: StoreSegment[][] = Array.from({ length: o.layers }, () => []);
    let at = 0;
    for (const p of all) {
      let rest = p.bytes;
      while (rest > 0) {
        const layer = Math.floor(at / R), off = at % R, n = Math.min(rest, R - off);
        const seg: StoreSegment = p.tier === "(no room)" ? { offset: off, bytes: n, tier: p.tier, mode: "local", nodes: [] } : segmentOf(p, off, n);
        const list = regions[layer]!;
        const prev = list[list.length - 1];
        if (prev && prev.tier === seg.tier && prev.mode === seg.mode) list[list.length - 1] = { ...prev, bytes: prev.bytes + n };
        else list.push(seg);
        at += n;
        rest -= n;
      }
    }
    return regions;
  };
  const kUse = new Map<string, number>(), vUse = new Map<string, number>();
  const tally = (pieces: Piece[], use: Map<string, number>) => {
    for (const p of pieces) {
      const over = p.over ?? [p.tier];
      over.forEach((id, i) => use.set(id, (use.get(id) ?? 0) + Math.floor(p.bytes / over.length) + (i < p.bytes % over.length ? 1 : 0)));
    }
  };
  tally(k.pieces, kUse);
  tally(v.pieces, vUse);
  const tiers = o.tiers.map((t) => ({ id: t.id, kind: t.kind, kBytes: kUse.get(t.id) ?? 0, vBytes: vUse.get(t.id) ?? 0, availableBytes: available.get(t.id)! }));
  return {
    layout: { regionBytes: R, pageBytes: page, k: cut(kMemory, k.left), v: cut(v.pieces, v.left), ...(kSpill ? { kSpill } : {}) },
    tiers,
    diskBytes: tiers.filter((t) => isFileTier(t)).reduce((n, t) => n + t.kBytes + t.vBytes, 0),
    fits: shortfall === 0,
    shortfallBytes: shortfall,
  };
}
