/**
 * The backend registry: cpu and cuda built in, a user's backend registered by object or loaded from
 * a module, opened by name or by "auto" (the highest-ranked one that is available and opens), and
 * one-line errors for an unknown name, a taken one and a plugin that returns no backend. Probed for a
 * plan (cpu: host memory alone; "auto": the highest-ranked usable one with a probe) and described
 * for `hybridgen info` (cuda in kernels-cuda's words).
 */
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { HybridgenError, loadModel } from "@hybridgen/core";
import { ReferenceBackend } from "@hybridgen/spec/kit";
import { cudaAvailability, describeCudaAvailability } from "@hybridgen/kernels-cuda";
import { backendNames, createHybridAttention, describeBackends, loadBackendModule, lookupBackend, openBackend, probeBackend, probeBackendChoice, registerBackend } from "../src/index.js";
import { CONTEXT, decodeTiny, PROMPT, tinyFiles } from "./tiny-model.js";

const PLUGIN = fileURLToPath(new URL("./fixtures/backend-plugin.ts", import.meta.url));
const prompt = Int32Array.from({ length: PROMPT }, (_, i) => (i * 29 + 7) % 256);

/** The one-line HybridgenError message `fn` rejects with. */
async function failure(fn: () => Promise<unknown>): Promise<string> {
  const e = await fn().then(() => null, (x: unknown) => x);
  expect(e).toBeInstanceOf(HybridgenError);
  expect((e as Error).message).not.toContain("\n");
  return (e as Error).message;
}

describe("the backend registry", () => {
  it("has cpu and cuda built in; cpu opens with the threads and memory cap asked for", async () => {
    expect(backendNames().slice(0, 2)).toEqual(["cpu", "cuda"]);
    const o = await openBackend("cpu", { threads: 1, memoryBytes: 64 << 20 });
    using backend = o.backend as typeof o.backend & Disposable;
    expect(o.name).toBe("cpu");
    expect(o.device).toMatch(/^cpu\/(avx512|avx2|scalar)$/);
    expect(o.threads).toBe(1);
    expect((o.backend as unknown as { memoryCapBytes: number }).memoryCapBytes).toBe(64 << 20);
    expect(backend.alloc).toBeTypeOf("function");
  });

  it("an unknown backend is one line naming the registered ones", async () => {
    expect(await failure(() => openBackend("tpu"))).toBe(`unknown backend "tpu" (registered: ${backendNames().join(", ")}; or auto)`);
  });

  it("refuses a taken name, a bad one and \"auto\"", () => {
    expect(() => registerBackend({ name: "cpu", open: () => { throw new Error("unused"); } })).toThrow(/registerBackend: "cpu" is registered already/);
    expect(() => registerBackend({ name: "My GPU", open: () => { throw new Error("unused"); } })).toThrow(/must be lower-case kebab-case/);
    expect(() => registerBackend({ name: "auto", open: () => { throw new Error("unused"); } })).toThrow(/cannot be one/);
  });

  it("a plugin backend from a module runs hybrid attention: the logits of full attention on it ('all' + exact)", async () => {
    expect(await loadBackendModule(PLUGIN)).toBe("one-thread");
    expect(await loadBackendModule(PLUGIN)).toBe("one-thread"); // the same entry again: no error
    const o = await openBackend("one-thread");
    using backend = o.backend as typeof o.backend & Disposable;
    expect([o.name, o.device.split("/")[0], o.threads]).toEqual(["one-thread", "one-thread", 1]);
    using full = loadModel(tinyFiles(5), backend, { maxContext: CONTEXT });
    const want = decodeTiny(full, prompt);
    using model = loadModel(tinyFiles(5), backend, { maxContext: CONTEXT, gpuKvBudget: 16, sinkTokens: 2 });
    using ha = await createHybridAttention(model, backend, { selector: "all", scheduler: "fixed", logits: "exact" });
    const got = decodeTiny(model, prompt, want.tokens);
    expect(ha.stats.steps).toBeGreaterThan(0);
    got.logits.forEach((l, i) => l.forEach((v, j) => expect(Math.abs(v - want.logits[i]![j]!)).toBeLessThan(1e-4)));
  });

  it("a module whose export is not an entry, or that does not load, is one line naming it", async () => {
    expect(await failure(() => loadBackendModule(`${PLUGIN}:notABackend`))).toBe(`backend "${PLUGIN}:notABackend": export "notABackend" is not a backend entry ({ name, open(options) })`);
    expect(await failure(() => loadBackendModule("./no-such-backend.ts", "/tmp"))).toMatch(/^backend "\.\/no-such-backend\.ts": loading \/tmp\/no-such-backend\.ts failed: /);
  });

  it("auto takes the highest-ranked backend that is available and opens, saying why it passed over the others", async () => {
    registerBackend({ name: "absent", autoRank: 9, availability: () => ({ available: false, reason: "no such card" }), open: () => { throw new Error("unused"); } });
    registerBackend({ name: "broken", autoRank: 8, open: () => { throw new Error("driver crashed"); } });
    registerBackend({ name: "empty", autoRank: 7, open: () => ({}) as never });
    registerBackend({ name: "ranked", autoRank: 6, open: () => ({ backend: new ReferenceBackend(), device: "ranked", threads: 1 }) });
    const o = await openBackend("auto");
    expect(o.name).toBe("ranked");
    expect(o.skipped).toEqual([
      { name: "absent", reason: "no such card" },
      { name: "broken", reason: "driver crashed" },
      { name: "empty", reason: `backend "empty": open() must return { backend, device, threads } with a Backend` },
    ]);
    expect(lookupBackend("ranked").autoRank).toBe(6);
  });

  it("probes for a plan: cpu is host memory alone, auto the highest-ranked usable backend with a probe; each refusal one line", async () => {
    const cuda = cudaAvailability();
    expect(await probeBackend("cpu", { bandwidth: false })).toEqual({ name: "cpu", device: null, skipped: [] });
    if (!cuda.available) {
      // (Backends the tests above registered are passed over too: none has a probe.)
      const auto = await probeBackend("auto", { bandwidth: false });
      expect([auto.name, auto.device]).toEqual(["cpu", null]);
      expect(auto.skipped).toContainEqual({ name: "cuda", reason: describeCudaAvailability(cuda) });
      expect(await failure(() => probeBackend("cuda", { bandwidth: false }))).toBe(cuda.reason);
    }
    registerBackend({ name: "gone", autoRank: 22, availability: () => ({ available: false, reason: "unplugged" }), open: () => { throw new Error("unused"); } });
    registerBackend({ name: "unprobed", autoRank: 21, open: () => { throw new Error("unused"); } });
    let asked: boolean | null = null;
    registerBackend({
      name: "probed", autoRank: 20, open: () => { throw new Error("unused"); },
      probe: async ({ bandwidth }) => ((asked = bandwidth), { name: "card", freeBytes: 5e9, readBandwidthGBs: 100 }),
    });
    const unprobed = `backend "unprobed" cannot be probed for a plan (its entry has no probe): give the device's free memory`;
    expect(await probeBackend("auto", { bandwidth: true })).toEqual({
      name: "probed", device: { name: "card", freeBytes: 5e9, readBandwidthGBs: 100 }, skipped: [{ name: "gone", reason: "unplugged" }, { name: "unprobed", reason: unprobed }],
    });
    expect(asked).toBe(true);
    expect(await failure(() => probeBackend("unprobed", { bandwidth: false }))).toBe(unprobed);
    expect(await failure(() => probeBackend("gone", { bandwidth: false }))).toBe("unplugged");
    expect(await failure(() => probeBackendChoice("tpu", { bandwidth: false }))).toMatch(/^unknown backend "tpu"/);
    // The plugin module's entry has no probe: a plan for it is refused by name.
    expect(await failure(() => probeBackendChoice(PLUGIN, { bandwidth: false }))).toBe(`backend "one-thread" cannot be probed for a plan (its entry has no probe): give the device's free memory`);
  });

  it("describes the backends that describe themselves: cuda in kernels-cuda's words", async () => {
    const cuda = cudaAvailability();
    const described = await describeBackends();
    expect(described.find((b) => b.name === "cuda")).toEqual({ name: "cuda", available: cuda.available, summary: describeCudaAvailability(cuda), detail: cuda });
    expect(described.map((b) => b.name)).not.toContain("cpu");
  });
});
