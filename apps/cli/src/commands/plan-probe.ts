/**
 * What `hybridgen plan` measures: the GPU's free memory (cudaMemGetInfo, before any arena is
 * taken), its copy bandwidth device → device and host → device on a small arena, and each host
 * tier's read bandwidth (a node-bound buffer read on every core; the disk tier: large aligned
 * reads of a scratch file, O_DIRECT where allowed, random 4 KiB reads one at a time, and the CPU stage's
 * gather of random rows at its depth). Tiers keep a bandwidth HMAT already gave.
 */
import { HybridgenError, linkBandwidth, type MemoryTier, isFileTier } from "@hybridgen/core";

export interface GpuProbe {
  readonly name: string;
  readonly freeBytes: number;
  readonly readBandwidthGBs?: number;
  readonly linkBandwidthGBs?: number;
}

const MiB = 2 ** 20;

/** The first CUDA device's free memory and (with `bandwidth`) its copy bandwidths; null without CUDA unless `required`. */
export async function probeGpu(required: boolean, bandwidth: boolean): Promise<GpuProbe | null> {
  const { cudaAvailability, openCudaNative, createCudaBackend } = await import("@hybridgen/kernels-cuda");
  const a = cudaAvailability();
  if (!a.available) {
    if (required) throw new HybridgenError(a.reason);
    return null;
  }
  const out = new Float64Array(2);
  const rc = openCudaNative(a.libraryPath).hg_cu_mem_info(0, out);
  if (rc !== 0) throw new HybridgenError(`CUDA device 0: cannot read its free memory (error ${rc})`);
  const probe: GpuProbe = { name: a.devices[0]?.name ?? "CUDA device 0", freeBytes: out[0]! };
  if (!bandwidth) return probe;
  using be = createCudaBackend({ arenaBytes: 1024 * MiB });
  const copy = be.copyBandwidth(256 * MiB, 10); // device → device, read + write bytes a second
  const link = linkBandwidth(be.hostTransfers(), 256 * MiB, 5);
  return { ...probe, readBandwidthGBs: copy / 1e9, ...(link ? { linkBandwidthGBs: link.h2d / 1e9 } : {}) };
}

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
