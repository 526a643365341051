/**
 * The backend registry: cpu and cuda built in, a user's backend registered by object or loaded from
 * a module, opened by name or by "auto" (the highest-ranked one that is available and opens), and
 * one-line errors for an unknown name, a taken one and a plugin that returns no backend.
 */
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { HybridgenError, loadModel } from "@hybridgen/core";
import { ReferenceBackend } from "@hybridgen/spec/kit";
import { backendNames, createHybridAttention, loadBackendModule, lookupBackend, openBackend, registerBackend } from "../src/index.js";
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
});
