/**
 * Memory-tier discovery from Linux sysfs. Every NUMA node with memory is a tier; a node with
 * no CPUs is taken to be a CXL memory expander (that is how CXL Type-3 memory appears: a
 * CPU-less NUMA node). Capacity comes from the node's meminfo, read bandwidth from HMAT
 * (`access0/initiators/read_bandwidth`, MB/s) where the firmware publishes it. Where sysfs is
 * missing or unreadable (containers, macOS), the whole machine is one DRAM tier.
 */
import { readdirSync, readFileSync, statSync, statfsSync } from "node:fs";
import { freemem, totalmem } from "node:os";
import { join } from "node:path";
import { z } from "zod";
import { HybridgenError, MemoryTierSchema, type MemoryTier, tierKind } from "@hybridgen/spec";

export const FileTierOptionsSchema = z.object({
  /** Directory that will hold the backing files (must exist). */
  path: z.string().min(1),
  /** Bytes the tier may use (default: the free space of its file system). */
  capacityBytes: z.number().int().nonnegative().optional(),
  readBandwidthGBs: z.number().positive().optional(),
});

export const DiscoverOptionsSchema = z.object({
  /** Root of sysfs; tests point it at a fake tree. */
  sysRoot: z.string().default("/sys"),
  fileTiers: z.array(FileTierOptionsSchema).default([]),
});
export type DiscoverOptions = z.input<typeof DiscoverOptionsSchema>;

function readText(path: string): string | undefined {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return undefined;
  }
}

/** "Node 0 MemTotal:  32594412 kB" lines → bytes by key. */
export function parseNodeMeminfo(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split("\n")) {
    const m = /^Node\s+\d+\s+(\w+):\s+(\d+)(?:\s+kB)?\s*$/.exec(line.trim());
    if (m) out.set(m[1]!, Number(m[2]) * (line.includes("kB") ? 1024 : 1));
  }
  return out;
}

/** A cpulist such as "0-7,16-23" holds at least one CPU. */
export function cpulistHasCpus(text: string): boolean {
  return /\d/.test(text);
}

function discoverNode(nodeDir: string, node: number): MemoryTier | undefined {
  const meminfo = readText(join(nodeDir, "meminfo"));
  if (meminfo === undefined) return undefined;
  const mem = parseNodeMeminfo(meminfo);
  const total = mem.get("MemTotal");
  if (!total) return undefined; // a memory-less node cannot hold KV
  const cpus = readText(join(nodeDir, "cpulist"));
  const bwText = readText(join(nodeDir, "access0", "initiators", "read_bandwidth"));
  const bwMBs = bwText === undefined ? NaN : Number(bwText.trim());
  return MemoryTierSchema.parse({
    id: `node${node}`,
    // No cpulist file at all is unusual; treat it as an ordinary DRAM node rather than guess CXL.
    kind: cpus === undefined || cpulistHasCpus(cpus) ? "dram" : "cxl",
    numaNode: node,
    capacityBytes: total,
    freeBytes: mem.get("MemFree"),
    readBandwidthGBs: Number.isFinite(bwMBs) && bwMBs > 0 ? bwMBs / 1000 : undefined,
  });
}

function discoverNumaTiers(sysRoot: string): MemoryTier[] {
  const base = join(sysRoot, "devices", "system", "node");
  let entries: string[];
  try {
    entries = readdirSync(base);
  } catch {
    return [];
  }
  const nodes = entries
    .map((e) => /^node(\d+)$/.exec(e))
    .filter((m): m is RegExpExecArray => m !== null)
    .map((m) => Number(m[1]))
    .sort((a, b) => a - b);
  return nodes.map((n) => discoverNode(join(base, `node${n}`), n)).filter((t): t is MemoryTier => t !== undefined);
}

function fileTier(o: z.output<typeof FileTierOptionsSchema>): MemoryTier {
  let isDir = false;
  try {
    isDir = statSync(o.path).isDirectory();
  } catch {
    /* reported below */
  }
  if (!isDir) throw new HybridgenError(`file tier: "${o.path}" is not an existing directory`);
  let capacity = o.capacityBytes;
  if (capacity === undefined) {
    const fs = statfsSync(o.path);
    capacity = Number(fs.bavail) * Number(fs.bsize);
  }
  return MemoryTierSchema.parse({
    id: `file:${o.path}`,
    kind: "file",
    capacityBytes: capacity,
    freeBytes: capacity,
    readBandwidthGBs: o.readBandwidthGBs,
    path: o.path,
  });
}

/**
 * A single DRAM node whose meminfo counts less than the OS does (a VM whose memory was added after
 * boot) holds the OS's figures: the memory no node claims is still this machine's RAM. With
 * several nodes the split is unknown: unchanged.
 */
export function withUnclaimedMemory(tiers: MemoryTier[], osTotal: number, osFree: number): MemoryTier[] {
  const only = tiers.length === 1 ? tiers[0]! : undefined;
  if (!only || !tierKind(only.kind).local || (only.capacityBytes ?? 0) >= 0.9 * osTotal) return tiers;
  return [{ ...only, capacityBytes: osTotal, freeBytes: Math.max(only.freeBytes ?? 0, osFree) }];
}

/** The machine's memory tiers: NUMA nodes (DRAM / CXL) in node order, then any file tiers. */
export function discoverTiers(options: DiscoverOptions = {}): MemoryTier[] {
  const r = DiscoverOptionsSchema.safeParse(options);
  if (!r.success) {
    const i = r.error.issues[0];
    throw new HybridgenError(`tier discovery options: ${i?.path.join(".") || "value"}: ${i?.message ?? "invalid"}`);
  }
  const o = r.data;
  let tiers = discoverNumaTiers(o.sysRoot);
  if (o.sysRoot === "/sys") tiers = withUnclaimedMemory(tiers, totalmem(), freemem());
  if (tiers.length === 0) {
    tiers = [MemoryTierSchema.parse({ id: "ram", kind: "dram", capacityBytes: totalmem(), freeBytes: freemem() })];
  }
  return [...tiers, ...o.fileTiers.map(fileTier)];
}
