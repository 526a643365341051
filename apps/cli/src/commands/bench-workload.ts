/** `hybridgen bench --workload NxC [--gpu-mem SIZE]`: see workload-measure.ts. */
import { availableParallelism, cpus } from "node:os";
import { ensureStories15M, type MemoryTier } from "@hybridgen/core";
import { defaultStageThreads, probeBackendChoice } from "@hybridgen/runtime";
import { openBackend, threadCount } from "../device-backend.js";
import type { CliIo } from "../io.js";
import { storeTiers } from "../kv-tier-options.js";
import { openModelSource } from "../model-source.js";
import type { BenchOptions } from "./bench-args.js";
import { probeTiers } from "./plan-probe.js";
import type { Workload } from "./workload-args.js";
import { measureWorkload } from "./workload-measure.js";
import { workloadTable, writeWorkloadOutputs, type WorkloadReport } from "./workload-report.js";

export async function runWorkloadBench(o: BenchOptions & { readonly workload: Workload }, io: CliIo, displayName: (m: string) => string): Promise<number> {
  const progress = (line: string) => io.stderr(`${line}\n`);
  const model = o.models[0] ?? (await ensureStories15M({ cacheDir: io.env.HYBRIDGEN_CACHE, onProgress: progress }));
  const threads = o.threads ?? availableParallelism();
  // Bandwidths first, before the capped backend takes its memory: the device's (or, on the CPU backend, host memory's).
  const chosen = await probeBackendChoice(o.device, { bandwidth: true });
  const gpu = chosen.device;
  const probed = await probeTiers(await storeTiers({ kvPlacement: "semantic" }), defaultStageThreads(gpu !== null));
  const tiers: MemoryTier[] = probed.tiers.filter((t) => t.kind !== "file");
  const opened = await openBackend(chosen.name, threads, o.gpuMem);
  using backend = opened.backend;
  progress(`workload bench on ${opened.device}${opened.device.startsWith("cpu") ? ` with ${threadCount(opened.threads)}` : ""}${opened.fallback ? ` (${opened.fallback})` : ""}`);
  const hostGBs = tiers[0]?.readBandwidthGBs;
  using files = await openModelSource(model, { dummyWeights: o.dummyWeights, dtype: o.dtype, threads });
  const result = await measureWorkload(files, displayName(model), { ...o, threads }, {
    backend, tiers, progress, signal: io.signal,
    ...(gpu ? { gpuReadGBs: gpu.readBandwidthGBs, linkGBs: gpu.linkBandwidthGBs } : { gpuReadGBs: hostGBs, linkGBs: hostGBs }),
  });
  const report: WorkloadReport = {
    setup: {
      date: new Date().toISOString(), device: opened.device, cpu: cpus()[0]?.model ?? "unknown", cores: availableParallelism(), threads: opened.threads,
      model, configs: o.configs, steps: o.steps, warmup: o.warmup, sinkTokens: o.sinkTokens, k: o.k, kvDtype: o.kvDtype,
      dtype: o.dtype ?? (o.dummyWeights ? "bf16" : "stored"), dummyWeights: o.dummyWeights, fill: o.syntheticKv ? `synthetic KV: seeded random rows (seed ${o.seed} + slot), no prefill` : `synthetic: seeded random tokens (seed ${o.seed})`,
      tiers: tiers.map((t) => ({ id: t.id, kind: t.kind, readBandwidthGBs: t.readBandwidthGBs })),
    },
    result,
  };
  io.stdout(o.json ? `${JSON.stringify(report)}\n` : workloadTable(report));
  if (o.out) for (const f of await writeWorkloadOutputs(report, o.out)) progress(`wrote ${f}`);
  if (io.signal?.aborted) {
    io.stderr("interrupted\n");
    return 130;
  }
  return 0;
}
