/** `hybridgen bench`: see BENCH_HELP. */
import { availableParallelism, cpus } from "node:os";
import { basename } from "node:path";
import { ensureStories15M } from "@hybridgen/core";
import { openBackend, threadCount } from "../device-backend.js";
import type { CliIo } from "../io.js";
import { openModelSource } from "../model-source.js";
import { BENCH_HELP, parseBenchArgs } from "./bench-args.js";
import { runWorkloadBench } from "./bench-workload.js";
import { measureModel, type BenchPoint } from "./bench-measure.js";
import { benchTables, writeBenchOutputs, type BenchReport } from "./bench-report.js";

export { BENCH_HELP };

/** A model as tables and charts name it: the preset, or the directory's last component. */
export const displayName = (model: string): string => (model.startsWith("preset:") ? model.slice("preset:".length) : basename(model.replace(/\/+$/, "")) || model);

export async function runBench(argv: readonly string[], io: CliIo): Promise<number> {
  const o = parseBenchArgs(argv);
  if (o.help) {
    io.stdout(BENCH_HELP);
    return 0;
  }
  if (o.workload) return runWorkloadBench({ ...o, workload: o.workload }, io, displayName);
  const progress = (line: string) => io.stderr(`${line}\n`);
  const models = o.models.length > 0 ? o.models : [await ensureStories15M({ cacheDir: io.env.HYBRIDGEN_CACHE, onProgress: progress })];
  const threads = o.threads ?? availableParallelism();
  const opened = await openBackend(o.device, threads, o.gpuMem);
  using backend = opened.backend;
  progress(`bench on ${opened.device}${opened.device.startsWith("cpu") ? ` with ${threadCount(opened.threads)}` : ""}${opened.fallback ? ` (${opened.fallback})` : ""}`);
  const points: BenchPoint[] = [];
  for (const name of models) {
    using files = await openModelSource(name, { dummyWeights: o.dummyWeights, dtype: o.dtype, threads });
    points.push(...(await measureModel(files, displayName(name), { ...o, threads }, { backend, progress, signal: io.signal })));
    if (io.signal?.aborted) break;
  }
  const report: BenchReport = {
    setup: {
      date: new Date().toISOString(), device: opened.device, cpu: cpus()[0]?.model ?? "unknown", cores: availableParallelism(), threads: opened.threads,
      models, configs: o.configs, contexts: o.contexts, batches: o.batches, steps: o.steps, warmup: o.warmup, gpuKvBudget: o.gpuKvBudget,
      sinkTokens: o.sinkTokens, k: o.k, kvDtype: o.kvDtype, dtype: o.dtype ?? (o.dummyWeights ? "bf16" : "stored"), dummyWeights: o.dummyWeights,
      fill: `synthetic: seeded random tokens (seed ${o.seed})`, ...(o.cpuStageThreads === undefined ? {} : { cpuStageThreads: o.cpuStageThreads }),
    },
    points,
  };
  if (o.json) io.stdout(`${JSON.stringify(report)}\n`);
  else io.stdout(benchTables(report));
  if (o.out) for (const f of await writeBenchOutputs(report, o.out)) progress(`wrote ${f}`);
  if (io.signal?.aborted) {
    io.stderr("interrupted\n");
    return 130;
  }
  return 0;
}
