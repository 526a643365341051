/**
 * Admission by the planner for `hybridgen serve --attention hybrid`: a request whose context
 * (prompt + max_tokens) outgrows the device window needs an offloaded store of its own, sized to
 * that context (core's kvStoreCapacity: context − window + one eviction block), and memtier's
 * layoutStore places it on the tiers the running requests' stores left (their bytes reserved per
 * tier, the host budget less what they hold in memory). No room: the request waits; no room on
 * the empty tiers: it is refused. A request that fits the window gets an idle store (an untouched
 * anonymous mapping, never pinned), which costs nothing.
 */
import { DTYPE_BYTES, HybridgenError, kvStoreCapacity, type KvCache, type KvStoreAllocator, type MemoryTier, type StoreLayout, tierKind } from "@hybridgen/core";
import type { KvTierCliOptions } from "../kv-tier-options.js";

/** One store on the tiers: its allocator and the bytes it reserves per tier id. */
export interface PlacedSlotStore {
  readonly allocator: KvStoreAllocator;
  readonly bytesByTier: ReadonlyMap<string, number>;
}

/** The per-tier bytes of a layout (K and V pools, spill files included). */
function layoutBytes(tiers: readonly { id: string; kBytes: number; vBytes: number }[]): Map<string, number> {
  const m = new Map<string, number>();
  for (const t of tiers) if (t.kBytes + t.vBytes > 0) m.set(t.id, t.kBytes + t.vBytes);
  return m;
}

export class StoreLedger {
  private readonly reserved = new Map<string, number>();
  private readonly kinds: ReadonlyMap<string, MemoryTier["kind"]>;
  /** Positions the window holds: a context up to it never touches a store. */
  readonly window: number;
  /** Bytes of the store of a request at the model's whole context (K and V of every layer). */
  readonly storeBytes: number;

  private constructor(
    private readonly tiers: readonly MemoryTier[],
    private readonly tier: KvTierCliOptions,
    private readonly cache: Pick<KvCache, "layers" | "kvHeads" | "headDim" | "maxContext" | "dtype" | "gpuKvBudget" | "evictBlock">,
    private readonly memtier: typeof import("@hybridgen/memtier"),
    private readonly kernels: typeof import("@hybridgen/kernels-cpu"),
    private readonly runtime: typeof import("@hybridgen/runtime"),
  ) {
    this.kinds = new Map(tiers.map((t) => [t.id, t.kind]));
    this.window = cache.gpuKvBudget;
    this.storeBytes = this.storeBytesFor(cache.maxContext);
  }

  /** The ledger over the tiers the flags describe (discovered NUMA nodes, --kv-disk's free space). */
  static async open(cache: StoreLedger["cache"], tier: KvTierCliOptions): Promise<StoreLedger> {
    const { storeTiers } = await import("../kv-tier-options.js");
    return StoreLedger.on(await storeTiers(tier), cache, tier);
  }

  /** The ledger over `tiers`; refuses (one line) when even the smallest store (one position past the window) fits the empty tiers nowhere. */
  static async on(tiers: readonly MemoryTier[], cache: StoreLedger["cache"], tier: KvTierCliOptions): Promise<StoreLedger> {
    const ledger = new StoreLedger(tiers, tier, cache, await import("@hybridgen/memtier"), await import("@hybridgen/kernels-cpu"), await import("@hybridgen/runtime"));
    const smallest = ledger.refusal(ledger.window + 1);
    if (smallest) throw new HybridgenError(`the smallest request past the window: ${smallest}`);
    return ledger;
  }

  /** Positions the store of a sequence of `context` positions holds (core's KvCache arithmetic). */
  private storeCapacity(context: number): number {
    return kvStoreCapacity({ maxContext: Math.min(context, this.cache.maxContext), gpuKvBudget: this.cache.gpuKvBudget, evictBlock: this.cache.evictBlock });
  }

  private regionBytes(context: number): number {
    return this.cache.kvHeads * this.storeCapacity(context) * this.cache.headDim * DTYPE_BYTES[this.cache.dtype];
  }

  /** Bytes of the store of a request of `context` positions (K and V of every layer; 0 within the window). */
  storeBytesFor(context: number): number {
    return 2 * this.cache.layers * this.regionBytes(context);
  }

  /** Why a store for `context` positions fits even the empty tiers nowhere (one line), or null. */
  refusal(context: number): string | null {
    if (!this.needsStore(context)) return null;
    const empty = this.layout(new Map(), context);
    if (empty.fits) return null;
    const f = this.memtier.formatBytes;
    return `its KV store needs ${f(this.storeBytesFor(context))}, ${f(empty.shortfallBytes)} more than ${this.tier.kvDisk ? `host memory and ${this.tier.kvDisk} hold` : "host memory holds (add --kv-disk DIR)"}`;
  }

  private layout(reserved: ReadonlyMap<string, number>, context: number) {
    const { layoutStore, placeKv } = this.memtier;
    let inMemory = 0;
    for (const [id, b] of reserved) if (this.kinds.get(id) !== "file") inMemory += b;
    const budget = this.tier.hostKvBudget === undefined ? undefined : Math.max(0, this.tier.hostKvBudget - inMemory);
    return layoutStore({
      tiers: [...this.tiers], placement: placeKv(this.tier.kvPlacement, this.tiers), layers: this.cache.layers, regionBytes: this.regionBytes(context),
      hostBudgetBytes: budget, reservedBytes: Object.fromEntries(reserved),
    });
  }

  /** Whether a context of `tokens` positions needs a store at all. */
  needsStore(tokens: number): boolean {
    return tokens > this.window;
  }

  /** A store for `context` positions on the tiers left, reserved until release(); null when it does not fit now; throws (nothing reserved) when it cannot be made. */
  place(context: number): PlacedSlotStore | null {
    const r = this.layout(this.reserved, context);
    if (!r.fits) return null;
    const store = new this.kernels.TieredStore(r.layout);
    let allocator: KvStoreAllocator = store;
    try {
      if (r.layout.kSpill) allocator = new this.runtime.KSpill(store); // its spill file is made here: it may fail
    } catch (e) {
      store.release();
      throw e;
    }
    const bytesByTier = layoutBytes(r.tiers);
    for (const [id, b] of bytesByTier) this.reserved.set(id, (this.reserved.get(id) ?? 0) + b);
    return { allocator, bytesByTier };
  }

  /** Gives a store's tier bytes back (its request left). */
  release(store: PlacedSlotStore): void {
    for (const [id, b] of store.bytesByTier) {
      const left = (this.reserved.get(id) ?? 0) - b;
      if (left > 0) this.reserved.set(id, left);
      else this.reserved.delete(id);
    }
  }

  /** Bytes reserved now, per tier: "disk" for file tiers, else the tier's id. */
  reservedByTier(): Map<string, number> {
    const out = new Map<string, number>();
    for (const t of this.tiers) out.set(tierKind(t.kind).label(t.id), 0);
    for (const [id, b] of this.reserved) {
      const name = this.kinds.get(id) === "file" ? "disk" : id;
      out.set(name, (out.get(name) ?? 0) + b);
    }
    return out;
  }

  /** A store nobody writes (a context within the window, or an idle slot): an anonymous mapping left untouched and never pinned. */
  idle(): KvStoreAllocator {
    const R = Math.ceil(this.regionBytes(this.cache.maxContext) / 4096) * 4096; // virtual only: any sequence's store fits it
    const region = () => Array.from({ length: this.cache.layers }, () => [{ offset: 0, bytes: R, tier: "idle", mode: "local" as const, nodes: [] }]);
    const layout: StoreLayout = { regionBytes: R, pageBytes: 4096, k: region(), v: region() };
    const store = new this.kernels.TieredStore(layout);
    return { alloc: (b, pool, layer, shape, dtype) => store.alloc(b, pool, layer, shape, dtype), pinnable: () => false, release: () => store.release() };
  }
}
