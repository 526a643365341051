import { afterAll, describe, expect, it } from "vitest";
import { indexFold, indexPageBounds, pageIndex, pageIndexLayout, referencePrimitives, seededRandom, type Backend, type KvStoreAllocator } from "@hybridgen/core";
import { createCpuBackend, storeKeys, type CpuTensor } from "@hybridgen/kernels-cpu";
import { createSelector } from "@hybridgen/selectors";
import { loadModel } from "@hybridgen/core";
import { createHybridAttention } from "../src/index.js";
import { rankingBackend } from "./ranking-backend.js";
import { checkHostIndex, DeviceIndex, deviceIndexShape, hostIndexBytes, timeIndexRank } from "../src/hybrid/device-index.js";
import { CONTEXT, decodeTiny, PROMPT, STEPS, tinyFiles } from "./tiny-model.js";

describe("the page index ranked on the device (a CPU backend standing in for the device's indexRank)", () => {
  const { backend, calls } = rankingBackend();
  afterAll(() => (backend as Backend & { close(): void }).close());
  const prompt = Int32Array.from({ length: PROMPT }, (_, i) => (i * 37 + 11) % 256);

  /** A placed store (its readAhead wraps the stage, as a TieredStore's does). */
  const placed = (): KvStoreAllocator => ({ alloc: (be, _pool, _layer, shape, dtype) => be.alloc(shape, dtype), pinnable: () => true, release: () => {}, readAhead: () => {} });

  async function decode(placement: "host" | "device", form: "int8" | "int4", logits: "exact" | "verified", storeAllocator?: KvStoreAllocator) {
    using model = loadModel(tinyFiles(9), backend, { maxContext: CONTEXT, gpuKvBudget: 16, sinkTokens: 2 });
    const selector = createSelector("index", { form, pageSize: 4, superPages: 2, placement });
    using ha = await createHybridAttention(model, backend, { selector, scheduler: "fixed", k: 6, timing: "pre", logits, ...(storeAllocator ? { storeAllocator } : {}) });
    expect(ha.deviceIndex !== null).toBe(placement === "device");
    const before = calls.n, r = decodeTiny(model, prompt);
    expect(ha.stats.steps).toBe(STEPS);
    return { ...r, ranked: calls.n - before };
  }

  for (const form of ["int8", "int4"] as const) {
    for (const logits of ["exact", "verified"] as const) {
      it(`${form}, ${logits}: the device's pages give the tokens and logits of the stage's own search, every layer of every step ranked there`, async () => {
        const host = await decode("host", form, logits), device = await decode("device", form, logits);
        expect(host.ranked).toBe(0);
        expect(device.ranked).toBe(STEPS * 3);
        expect(device.tokens).toEqual(host.tokens);
        device.logits.forEach((l, i) => expect(l, `forward ${i}`).toEqual(host.logits[i]));
      });
    }
  }

  it("with a placed store (the stage wrapped to hear each layer's rows) the device still ranks: the same tokens and logits", async () => {
    const plain = await decode("device", "int8", "verified"), wrapped = await decode("device", "int8", "verified", placed());
    expect(wrapped.ranked).toBe(STEPS * 3);
    expect(wrapped.tokens).toEqual(plain.tokens);
    wrapped.logits.forEach((l, i) => expect(l, `forward ${i}`).toEqual(plain.logits[i]));
  });

  it("placement device on a backend that cannot rank is one line; auto falls back to the stage", async () => {
    using cpu = createCpuBackend({ threads: 1 });
    using model = loadModel(tinyFiles(9), cpu, { maxContext: CONTEXT, gpuKvBudget: 16, sinkTokens: 2 });
    await expect(createHybridAttention(model, cpu, { selector: createSelector("index", { placement: "device" }), scheduler: "fixed", k: 6, timing: "pre" }))
      .rejects.toThrow(/^page index: placement "device" needs a backend that ranks pages \(cpu: no\) and a CPU stage that takes them \(native: yes\)$/);
    using ha = await createHybridAttention(model, cpu, { selector: createSelector("index", { placement: "auto" }), scheduler: "fixed", k: 6, timing: "pre" });
    expect(ha.deviceIndex).toBeNull();
    expect(() => createSelector("index", { placement: "gpu" })).toThrow(/placement "gpu" does not exist \(auto, host, device\)/);
  });

  it("the index's host copy is every layer's page level and super-pages; past the host's available memory it is one line before anything is written", () => {
    const kernel = { name: "index", form: "int8", pageSize: 16, superPages: 16 } as const;
    const bytes = hostIndexBytes({ kernel, layers: 32, kvHeads: 8, headDim: 128, capacity: 1_500_000 });
    expect(bytes).toBe(32 * pageIndexLayout(8, 128, 1_500_000, 16, 16, "int8").bytes);
    expect(bytes / (32 * 8 * 260 * (1_500_000 / 16))).toBeCloseTo(1 + 1 / 16, 3); // 260 bytes a page and KV head, a sixteenth more for super-pages
    expect(() => checkHostIndex(bytes, 6e9, "host")).toThrow(/^page index: its host copy \(6\.63 GB, every layer\) does not fit the host's available 6\.00 GB \(placement "host"; form int4, larger pages or a shorter context need less\)$/);
    expect(() => checkHostIndex(bytes, bytes, "device")).not.toThrow();
  });

  it("a ranking's bytes (the query, then want pages a KV head) are whole 16-byte units: a device's signalled copy moves no less", () => {
    const kernel = { name: "index", form: "int8", pageSize: 8, superPages: 2 } as const;
    using x = new DeviceIndex({ backend, kernel, layers: 1, heads: 8, kvHeads: 2, headDim: 64, capacity: 1000 });
    const q = backend.alloc([1, 8 * 64]);
    for (const [budget, want] of [[96, 13], [24, 4], [8, 2]]) {
      const r = x.rank(0, q, 936, budget);
      expect(r.bytes % 16, `budget ${budget}`).toBe(0);
      expect(r.bytes - 8 * 64 * 4, `budget ${budget}`).toBe(Math.ceil((2 * want!) / 4) * 16);
    }
    backend.free(q);
  });

  it("timeIndexRank ranks `layers` times a run (one run to record, then `reps`) on the device's layout of the shape; a shape or backend that cannot rank is one line", () => {
    const shape = deviceIndexShape("int4", 2, 4, 64, 40);
    expect(shape).toEqual({ form: 2, kvHeads: 2, group: 4, headDim: 64, pageCapacity: 40, scalesOffset: 40 * 2 * 64 });
    const before = calls.n, ms = timeIndexRank(backend, shape, 5, 3, 2);
    expect(calls.n - before).toBe(3 * 3);
    expect(Number.isFinite(ms) && ms >= 0).toBe(true);
    expect(() => timeIndexRank(backend, shape, 41, 3)).toThrow(/^page index: the cpu backend does not rank 40 pages a head, want 41 \(form 2, headDim 64, group 4\)$/);
    using cpu = createCpuBackend({ threads: 1 });
    expect(() => timeIndexRank(cpu, shape, 5, 3)).toThrow(/^page index: the cpu backend cannot rank pages on the device$/);
  });

  it("uploads through a staging buffer in runs that fit it (a first fold of many pages, a page a step, a refold after the store shrank): the device's copy ranks as the host's index does", () => {
    const kvHeads = 2, group = 2, headDim = 16, capacity = 200, pageSize = 4, budget = 18, rnd = seededRandom(5);
    const kernel = { name: "index", form: "int8", pageSize, superPages: 2 } as const;
    using x = new DeviceIndex({ backend, kernel, layers: 2, heads: kvHeads * group, kvHeads, headDim, capacity, stageBytes: 3 * kvHeads * (2 * headDim + 4) });
    const K = backend.alloc([kvHeads, capacity, headDim], "bf16") as CpuTensor, q = backend.alloc([1, kvHeads * group * headDim]);
    backend.write(K, Float32Array.from({ length: kvHeads * capacity * headDim }, () => rnd() * 2 - 1));
    const qv = Float32Array.from({ length: kvHeads * group * headDim }, () => rnd() * 2 - 1);
    backend.write(q, qv);
    const keys = storeKeys(K);
    for (const n of [150, 151, 152, 157, 90, 93]) {
      x.sync(n, referencePrimitives, () => keys);
      const want = Math.min(Math.ceil(n / pageSize), Math.ceil(budget / pageSize) + 1), count = Math.ceil(n / pageSize);
      const ref = pageIndex(kvHeads, headDim, capacity, pageSize, 2, "int8");
      indexFold(keys, 0, n, ref);
      const bounds = indexPageBounds(qv, group, ref, n);
      for (const layer of [0, 1]) {
        const r = x.rank(layer, q, n, budget), raw = backend.read(r.tensor), pages = new Int32Array(raw.buffer, raw.byteOffset + kvHeads * group * headDim * 4, kvHeads * want);
        for (let g = 0; g < kvHeads; g++) {
          const order = Array.from({ length: count }, (_, p) => p).sort((a, b) => bounds[g * count + b]! - bounds[g * count + a]! || a - b).slice(0, want);
          expect([...pages.subarray(g * want, (g + 1) * want)], `n ${n}, layer ${layer}, head ${g}`).toEqual(order);
        }
      }
    }
    backend.free(K);
    backend.free(q);
  });
});
