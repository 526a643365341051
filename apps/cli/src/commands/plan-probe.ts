/**
 * What `hybridgen plan` measures beside the device (the backend's own probe, through the runtime's
 * registry): each host tier's read bandwidth (a node-bound buffer read on every core; the disk
 * tier: large aligned reads of a scratch file, O_DIRECT where allowed, random 4 KiB reads one at a
 * time, and the CPU stage's gather of random rows at its depth). Tiers keep a bandwidth HMAT already gave.
 */
import { type MemoryTier, isFileTier } from "@hybridgen/core";

const MiB = 2 ** 20;

/**
 * The tiers with a measured read bandwidth where none is known; file tiers also get the latency of a
 * disk-tier row read by the CPU stage's own gather at its depth (`stageThreads` × `readDepth` reads in
 * flight each; readDepth 0: page faults), of a page fault of that gather (one a stage thread), and
 * (`serialUs`, by tier id) of one random 4 KiB read at a time.
 */
export async function probeTiers(
  tiers: readonly MemoryTier[], stageThreads: number, readDepth?: number,
): Promise<{ tiers: MemoryTier[]; serialUs: Map<string, number> }> {
  const { probeMemoryReadBandwidth, probeFileReadBandwidth, probeFileReadLatency, DEFAULT_READ_DEPTH } = await import("@hybridgen/kernels-cpu");
  const { probeDiskGather } = await import("@hybridgen/runtime");
  const serialUs = new Map<string, number>();
  const depth = readDepth ?? DEFAULT_READ_DEPTH;
  const out: MemoryTier[] = [];
  for (const t of tiers) {
    let r = t;
    if (r.readBandwidthGBs === undefined) {
      const bytesPerS = isFileTier(r) ? probeFileReadBandwidth(r.path!, 128 * MiB, 4 * MiB) : probeMemoryReadBandwidth(256 * MiB, r.numaNode);
      r = { ...r, readBandwidthGBs: bytesPerS / 1e9 };
    }
    if (isFileTier(r) && r.readLatencyUs === undefined) {
      serialUs.set(r.id, probeFileReadLatency(r.path!, [{ threads: 1, depth: 1 }])[0]!);
      // The stage's reads of V rows at its depth, and its page faults, which read K a K spill moved to the disk back.
      const [gather, faults] = await probeDiskGather(r.path!, { threads: stageThreads, readDepths: [depth, 0] });
      r = { ...r, readLatencyUs: gather!.latencyUs, readDepth: gather!.readDepth, faultLatencyUs: faults!.latencyUs, faultDepth: faults!.readDepth };
    }
    out.push(r);
  }
  return { tiers: out, serialUs };
}
