/**
 * Where the offloaded KV store lives (issue 22): `--kv-placement`, `--kv-disk DIR`,
 * `--host-kv-budget SIZE`, `--kv-disk-read-depth N`, taken out of argv like the hybrid flags. storeAllocatorFor() turns
 * them and the loaded cache into @hybridgen/kernels-cpu's TieredStore over a
 * @hybridgen/memtier layout (wrapped in @hybridgen/runtime's KSpill when K too must go to disk),
 * one a sequence, each of a batch of B on a B-th of every tier and of the host budget,
 * refusing (one line, before any token) a disk directory that is missing, read-only or too small,
 * and a store that fits nowhere.
 */
import { closeSync, openSync, statSync, statfsSync, unlinkSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";
import { HybridgenError, PlacementPolicySchema, DTYPE_BYTES, type KvCache, type KvStoreAllocator, type MemoryTier, isFileTier, tierKind } from "@hybridgen/core";

export const KvTierCliOptionsSchema = z.object({
  /** semantic (K fast tier, V capacity tier), interleave, local, dram-only. */
  kvPlacement: PlacementPolicySchema.default("semantic"),
  /** Directory of the disk tier's files. */
  kvDisk: z.string().min(1).optional(),
  /** Most bytes of host memory the store may take; the rest goes to --kv-disk. */
  hostKvBudget: z.number().int().nonnegative().optional(),
  /** Disk-tier reads in flight per CPU-stage thread (the runtime's and NativeCpuStage's readDepth); 0: page faults. */
  readDepth: z.number().int("must be an integer").min(0, "must be at least 0").max(64, "must be ≤ 64").optional(),
}).refine((o) => o.readDepth === undefined || o.kvDisk !== undefined, { message: "--kv-disk-read-depth needs --kv-disk DIR (it reads the disk tier's rows)", path: ["readDepth"] });
export type KvTierCliOptions = z.infer<typeof KvTierCliOptionsSchema>;

const FLAGS = { "kv-placement": "kvPlacement", "kv-disk": "kvDisk", "host-kv-budget": "hostKvBudget", "kv-disk-read-depth": "readDepth" } as const;

export const KV_TIER_HELP = `KV memory tiers (hybrid attention's offloaded store):
      --kv-placement P         semantic (default: K on the fastest DRAM, V on the capacity tier, e.g. CXL),
                               interleave (pages over every memory node), local, dram-only
      --kv-disk DIR            a disk tier: what host memory (or --host-kv-budget) cannot hold, V first,
                               then K's least recently selected pages, lives in files in DIR, removed on
                               exit and Ctrl-C
      --host-kv-budget SIZE    most host memory the store may take (bytes, or with K/M/G/T: 8G)
      --kv-disk-read-depth N   disk-tier row reads in flight per CPU-stage thread, 0…64 (default 8; 0: page faults)
  With --batch N each sequence's store takes 1/N of every tier, of the disk and of the budget.
`;

/** "8G" → 8 GiB; plain digits are bytes. */
export function parseSize(text: string, flag: string): number {
  const m = /^(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?$/i.exec(text.trim());
  if (!m) throw new HybridgenError(`invalid value for ${flag}: ${JSON.stringify(text)} is not a size (bytes, or a number with K, M, G or T)`);
  const scale = { "": 1, k: 2 ** 10, m: 2 ** 20, g: 2 ** 30, t: 2 ** 40 }[m[2]!.toLowerCase() as "" | "k" | "m" | "g" | "t"];
  return Math.floor(Number(m[1]) * scale);
}

/** --kv-disk-read-depth's text as a number for the schema (which checks the range); not digits: a one-line error. */
export function readDepthValue(text: string): number {
  if (!/^\d+$/.test(text.trim())) throw new HybridgenError(`invalid value for --kv-disk-read-depth: ${JSON.stringify(text)} is not a non-negative integer`);
  return Number(text);
}

/** A disk-tier directory that exists, is a directory and is writable; else a one-line error. */
export function checkDiskDir(dir: string): void {
  let isDir = false;
  try {
    isDir = statSync(dir).isDirectory();
  } catch {
    throw new HybridgenError(`--kv-disk ${dir}: no such directory`);
  }
  if (!isDir) throw new HybridgenError(`--kv-disk ${dir}: not a directory`);
  // A file actually created and removed: access(W_OK) says yes to root on a read-only mount's directory.
  const probe = join(dir, `.hybridgen-kv-check-${process.pid}`);
  try {
    closeSync(openSync(probe, "wx"));
    unlinkSync(probe);
  } catch (e) {
    throw new HybridgenError(`--kv-disk ${dir}: not writable (${(e as NodeJS.ErrnoException).code ?? "error"}: read-only file system or permissions)`);
  }
}

/** Free bytes of the file system holding `dir` (statfs, as an unprivileged writer sees it). */
export function diskFreeBytes(dir: string): number {
  const s = statfsSync(dir);
  return Number(s.bavail) * Number(s.bsize);
}

/** Takes the tier flags out of argv; returns the remaining args and the validated options. */
export function splitKvTierArgs(argv: readonly string[]): { rest: string[]; tier: KvTierCliOptions; given: boolean } {
  const rest: string[] = [];
  const raw: Record<string, unknown> = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const m = /^--([a-z-]+)(?:=(.*))?$/.exec(arg);
    const key = m ? FLAGS[m[1] as keyof typeof FLAGS] : undefined;
    if (!m || !key) {
      rest.push(arg);
      continue;
    }
    let value = m[2];
    if (value === undefined) {
      if (i + 1 >= argv.length) throw new HybridgenError(`${arg} needs a value`);
      value = argv[++i]!;
    }
    raw[key] = key === "hostKvBudget" ? parseSize(value, `--${m[1]}`) : key === "readDepth" ? readDepthValue(value) : value;
  }
  const r = KvTierCliOptionsSchema.safeParse(raw);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    const flag = Object.entries(FLAGS).find(([, k]) => k === issue.path[0])?.[0];
    throw new HybridgenError(issue.code === "custom" ? issue.message : `invalid value for --${flag}: ${issue.message}`); // a refine names its flags
  }
  if (r.data.kvDisk !== undefined) checkDiskDir(r.data.kvDisk);
  return { rest, tier: r.data, given: Object.keys(raw).length > 0 };
}

export const KV_TIER_FLAG_NAMES = Object.keys(FLAGS);

export interface PlacedStore {
  /** Each sequence's store (createHybridAttention's storeAllocator function): its own regions and files on its share of the tiers. */
  readonly allocator: (sequence: number) => KvStoreAllocator;
  /** "placement semantic: K node0 12.0 MiB, V node0 8.0 MiB + disk 4.0 MiB; one NUMA node: binding changes nothing", summed over a batch's sequences */
  readonly line: string;
  /** After the run: what a K spill moved to disk over every sequence ("K spill: 40 units of 4.0 KiB …"), or null. */
  spillLine(): string | null;
}

/** The machine's tiers for the store: NUMA nodes, and the disk directory as a file tier. */
export async function storeTiers(o: KvTierCliOptions): Promise<MemoryTier[]> {
  const { discoverTiers } = await import("@hybridgen/memtier");
  return discoverTiers({ fileTiers: o.kvDisk === undefined ? [] : [{ path: o.kvDisk, capacityBytes: diskFreeBytes(o.kvDisk) }] });
}

/** One line on what a placement does on these tiers (the no-op on a one-node machine says so). */
export function placementNote(tiers: readonly MemoryTier[]): string {
  const memory = tiers.filter((t) => !isFileTier(t));
  if (memory.length <= 1) return `one NUMA node (${memory[0]?.id ?? "none"}): binding K and V there changes nothing`;
  const cxl = memory.filter((t) => !tierKind(t.kind).local).map((t) => t.id);
  return `${memory.length} NUMA nodes${cxl.length ? `, CPU-less (CXL): ${cxl.join(", ")}` : ""}`;
}

/** Refuses a store that fits in no tier, from the model's shape, before any weight loads (the
 * cache's store: every position past the window, plus one eviction block, in the f32 KV), for
 * each of `batch` sequences on its share of the tiers. */
export async function preflightStore(
  shape: { layers: number; kvHeads: number; headDim: number }, o: { maxContext: number; window: number; sinks: number }, tier: KvTierCliOptions, batch = 1,
): Promise<void> {
  if (o.window >= o.maxContext) return;
  const evictBlock = Math.min(16, o.window - o.sinks);
  const storeCapacity = Math.min(o.maxContext, o.maxContext - o.window + evictBlock);
  await layoutFor({ layers: shape.layers, regionBytes: shape.kvHeads * storeCapacity * shape.headDim * DTYPE_BYTES.f32 }, tier, batch);
}

/** One sequence's layout on a `batch`-th of every tier and of --host-kv-budget (memtier's planRun lays the batch's stores out on the whole tiers alike). */
async function layoutFor(store: { layers: number; regionBytes: number }, o: KvTierCliOptions, batch: number) {
  const { layoutStore, placeKv, formatBytes, tierShares } = await import("@hybridgen/memtier");
  const tiers = await storeTiers(o);
  if (o.hostKvBudget !== undefined && o.kvDisk === undefined) throw new HybridgenError("--host-kv-budget needs --kv-disk DIR (where the rest of the store goes)");
  const shares = tierShares(tiers, batch);
  const hostBudgetBytes = o.hostKvBudget === undefined ? undefined : Math.floor(o.hostKvBudget / batch);
  const r = layoutStore({ tiers: shares, placement: placeKv(o.kvPlacement, shares), layers: store.layers, regionBytes: store.regionBytes, hostBudgetBytes });
  if (!r.fits) {
    const disk = tiers.find((t) => isFileTier(t));
    throw new HybridgenError(
      `the KV store${batch > 1 ? ` of ${batch} sequences` : ""} needs ${formatBytes(batch * 2 * store.layers * r.layout.regionBytes)}, ${formatBytes(batch * r.shortfallBytes)} more than ` +
        (disk ? `host memory and ${o.kvDisk} (${formatBytes(disk.capacityBytes)} free) hold` : "host memory holds (add --kv-disk DIR)"),
    );
  }
  return { r, tiers, formatBytes };
}

/**
 * The allocator that places the store of each of `batch` sequences of `cache`'s shape as the flags
 * say, and the line describing them. Refuses, before anything is allocated, a store that fits
 * nowhere and a disk that is too small for the batch.
 */
export async function storeAllocatorFor(cache: KvCache, o: KvTierCliOptions, batch = 1): Promise<PlacedStore> {
  const { TieredStore } = await import("@hybridgen/kernels-cpu");
  const { KSpill } = await import("@hybridgen/runtime");
  const regionBytes = cache.kvHeads * cache.storeCapacity * cache.headDim * DTYPE_BYTES[cache.dtype];
  const { r, tiers, formatBytes } = await layoutFor({ layers: cache.layers, regionBytes }, o, batch);
  const spills: InstanceType<typeof KSpill>[] = [];
  const allocator = (): KvStoreAllocator => {
    const store = new TieredStore(r.layout);
    if (!r.layout.kSpill) return store;
    const spill = new KSpill(store); // K beyond memory: its coldest pages on disk
    spills.push(spill);
    return spill;
  };
  const per = (pool: "kBytes" | "vBytes") =>
    r.tiers.filter((t) => t[pool] > 0).map((t) => `${tierKind(t.kind).label(t.id)} ${formatBytes(batch * t[pool])}${isFileTier(t) && pool === "kBytes" ? " (its coldest pages)" : ""}`).join(" + ") || "none";
  const sequences = batch > 1 ? ` for ${batch} sequences, each on 1/${batch} of every tier` : "";
  const line = `placement ${o.kvPlacement}${sequences}: K ${per("kBytes")}, V ${per("vBytes")}; ${placementNote(tiers)}`;
  const spillLine = () => {
    if (!r.layout.kSpill) return null;
    const sum = (key: "units" | "bytes" | "passes") => spills.reduce((n, s) => n + s.stats[key], 0);
    return `K spill: ${sum("units")} units of ${formatBytes(r.layout.kSpill.unitBytes)} (${formatBytes(sum("bytes"))}) moved to disk in ${sum("passes")} passes` +
      `${spills.length > 1 ? ` over ${spills.length} sequences` : ""}, the least recently selected first`;
  };
  return { allocator, line, spillLine };
}
