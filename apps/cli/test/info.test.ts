import { cpuFeatures } from "@hybridgen/kernels-cpu";
import { cudaAvailability, describeCudaAvailability } from "@hybridgen/kernels-cuda";
import { discoverTiers } from "@hybridgen/memtier";
import { beforeAll, expect, it } from "vitest";
import { requireBuiltBin, runBin } from "./helpers.js";

beforeAll(requireBuiltBin);

it("hybridgen info --json reports what the packages report in this process", () => {
  const r = runBin(["info", "--json"]);
  expect(r.code, r.stderr).toBe(0);
  const info = JSON.parse(r.stdout);
  expect(info.cpu).toEqual(cpuFeatures());
  // CUDA as the runtime's backend registry describes it: kernels-cuda's own answer.
  expect(info.backends.cuda).toMatchObject({ available: cudaAvailability().available, summary: describeCudaAvailability(cudaAvailability()) });
  const strip = (t: { id: string; kind: string; capacityBytes: number }) => ({ id: t.id, kind: t.kind, capacityBytes: t.capacityBytes });
  expect(info.tiers.map(strip)).toEqual(discoverTiers().map(strip));
  expect(typeof info.cache.dir).toBe("string");
});

it("hybridgen info prints the CPU kernels, CUDA and memory tiers as text", () => {
  const r = runBin(["info"]);
  expect(r.code, r.stderr).toBe(0);
  expect(r.stdout).toMatch(new RegExp(`^cpu: .*kernels: ${cpuFeatures().chosen}`, "m"));
  expect(r.stdout).toMatch(/^cuda: /m);
  expect(r.stdout).toMatch(/^memory tiers:\n {2}\S+/m);
  expect(runBin(["info", "--bogus"]).stderr).toMatch(/^error: unknown option --bogus/);
});
