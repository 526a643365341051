import { existsSync } from "node:fs";
import { join } from "node:path";
import { defaultCacheDir, STORIES15M_NAME } from "@hybridgen/core";
import { threadCount } from "../device-backend.js";
import type { CliIo } from "../io.js";

/**
 * `hybridgen info`: what this machine offers the engine — the CPU kernel set, what each registered
 * backend that describes itself finds (CUDA: the runtime's registry asks kernels-cuda), the memory
 * tiers (DRAM / CXL nodes) the offloaded KV can use, and the model cache.
 */
export async function runInfo(io: CliIo, json: boolean): Promise<number> {
  // Imported here: the other commands should not pay for (or fail on) these libraries.
  const { cpuFeatures } = await import("@hybridgen/kernels-cpu");
  const { describeBackends } = await import("@hybridgen/runtime");
  const { discoverTiers, formatBytes } = await import("@hybridgen/memtier");
  const { placementNote } = await import("../kv-tier-options.js");

  const cpu = cpuFeatures();
  const backends = await describeBackends();
  const tiers = discoverTiers();
  const cacheDir = io.env.HYBRIDGEN_CACHE || defaultCacheDir();
  const defaultModel = join(cacheDir, "models", STORIES15M_NAME);
  const cached = existsSync(join(defaultModel, "model.safetensors"));

  if (json) {
    const byName = Object.fromEntries(backends.map(({ name, ...d }) => [name, d]));
    io.stdout(`${JSON.stringify({ cpu, backends: byName, tiers, placement: placementNote(tiers), cache: { dir: cacheDir, defaultModel, cached } })}\n`);
    return 0;
  }
  const flags = [cpu.avx2 && "avx2", cpu.avx512 && "avx512", cpu.avx512bf16 && "avx512bf16"].filter(Boolean).join(" ") || "none";
  const lines = [
    `cpu:    ${threadCount(cpu.cpus)}, features: ${flags}; kernels: ${cpu.chosen} (best ${cpu.best})`,
    ...backends.map((b) => `${`${b.name}:`.padEnd(7)} ${b.summary}`),
    "memory tiers:",
    ...tiers.map(
      (t) =>
        `  ${t.id.padEnd(10)} ${t.kind.padEnd(5)} ${formatBytes(t.capacityBytes).padStart(10)}` +
        `${t.numaNode === undefined ? "" : `  NUMA node ${t.numaNode}`}${t.path ? `  ${t.path}` : ""}`,
    ),
    `placement: ${placementNote(tiers)}; default policy semantic (K on the fastest DRAM, V on the slowest memory; hybridgen plan shows the bytes)`,
    `model cache: ${cacheDir} (${STORIES15M_NAME} ${cached ? "present" : "not fetched yet"})`,
  ];
  io.stdout(`${lines.join("\n")}\n`);
  return 0;
}
