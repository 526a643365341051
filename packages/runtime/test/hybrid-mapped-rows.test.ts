/**
 * Selected rows read by the device where they live (HostTransfers.gatherRows over the pinned,
 * mapped host store) against rows staged by the CPU stage and copied up: the path decision, the
 * gathered-row buffers' size, and the same logits either way — on ReferenceBackends and a
 * loopback link whose gatherRows reads the host store by the stage's ids.
 */
import { describe, expect, it } from "vitest";
import { BackendCpuStage, LlamaModel, ReferenceBackend, type CpuStageJob, type HostRegion, type HostTransferCapabilities, type ModelFiles, type RowGather, type Scheduler, type Selection, type Tensor, type TokenSelector } from "@hybridgen/core";
import { chooseRowPath, grownRows, HybridAttention, selectionRows, type RowPathRequest } from "../src/index.js";
import { maxAbsDiff, randomIds, testSeed, tinyModel } from "@hybridgen/core/testing";
import { fixedScheduler, topKSelector, type HybridRunOptions } from "./hybrid-helpers.js";
import { AddressBook, HostReference, LoopbackLink, StagedBackendCpuStage } from "@hybridgen/core/testing";

const CONTEXT = 40;

/** The loopback link with a device that reads pinned host tensors in place (all but `unmapped` addresses). */
class MappedLoopback extends LoopbackLink {
  readonly gathered: string[] = [];
  constructor(private readonly dev: ReferenceBackend, private readonly hostMem: ReferenceBackend, private readonly addresses: AddressBook,
    readonly unmapped = new Set<number>()) {
    super(dev, hostMem, addresses);
  }

  override get capabilities(): HostTransferCapabilities {
    return { ...super.capabilities, gathersRows: true };
  }

  mapped(r: HostRegion): boolean {
    return this.pinned.has(r.address) && !this.unmapped.has(r.address);
  }

  gatherRows(dst: Tensor, src: HostRegion, g: RowGather, ids: Int32Array, counts: Int32Array): void {
    if (!this.mapped(src)) throw new Error("gatherRows from memory the device does not map");
    const t = this.addresses.get(src);
    if (t.kind !== "tensor") throw new Error("gatherRows from a plain array");
    const w = g.rowBytes / 4;
    for (let h = 0; h < g.groups; h++) {
      for (let i = 0; i < g.kmax; i++) {
        const id = i < counts[h] ? ids[h * g.kmax + i] : -1;
        const row = id >= 0 && id < g.cap ? this.hostMem.read(t.t(), (h * g.cap + id) * w, w) : new Float32Array(w);
        this.dev.write(dst, row, (h * g.kmax + i) * w);
      }
    }
    this.gathered.push(`${g.groups}x${g.kmax}`);
  }
}

/** The staged stage, recording every job it is handed. */
class RecordingStage extends StagedBackendCpuStage {
  readonly jobs: CpuStageJob[] = [];
  submit(job: CpuStageJob): void {
    this.jobs.push(job);
    super.submit(job);
  }
  gather(job: CpuStageJob, selection: Selection): void {
    this.jobs.push(job);
    super.gather(job, selection);
  }
}

/** Pre-QKᵀ lists of different lengths per KV head (head g drops its g last picks): padded rows on the device. */
const shortListsSelector: TokenSelector = {
  name: "short-lists", timings: ["pre"], needsScores: false, usesBudget: true,
  initState: () => undefined,
  select: (i) => ({
    kind: "perKvHead",
    ids: Array.from({ length: i.layout.kvHeads }, (_, g) => {
      const n = Math.max(1, Math.min(i.k, i.offloaded) - g);
      return Int32Array.from({ length: n }, (_, j) => Math.floor((j * i.offloaded) / n));
    }),
  }),
};

interface MappedRun extends HybridRunOptions {
  rowPath: RowPathRequest;
  trackScores?: boolean;
  /** Layers whose store V the device does not map. */
  unmappedV?: number[];
}

function run(files: ModelFiles, tokens: number[], o: MappedRun) {
  const be = new ReferenceBackend(), book = new AddressBook(), host = new HostReference(book);
  const link = new MappedLoopback(be, host, book);
  const model = LlamaModel.load(files, be, { prefillBlock: 5, maxContext: CONTEXT, gpuKvBudget: o.budget, sinkTokens: o.sinks ?? 0, kvEvictBlock: o.block });
  model.cache.attachHostStore(host, link);
  for (const l of o.unmappedV ?? []) link.unmapped.add(host.hostRegion(model.cache.stageStoreV(l)).address);
  const stage = new RecordingStage(host, book);
  const shapes: number[][] = [], scoreShapes: number[][] = [];
  const alloc = be.alloc.bind(be);
  be.alloc = (shape, dtype) => {
    const stack = new Error().stack ?? "";
    if (stack.includes("device-staging")) (stack.includes("allocScores") ? scoreShapes : shapes).push([...shape]); // DeviceStaging's buffers only
    return alloc(shape, dtype);
  };
  let hybrid: HybridAttention;
  try {
    hybrid = HybridAttention.attach(
      { attention: model.attention, projector: model, stage, selector: o.selector!, scheduler: o.scheduler ?? fixedScheduler(4, "post") },
      { logits: o.logits ?? "exact", rowPath: o.rowPath, candidates: o.candidates, trackScores: o.trackScores },
    );
  } catch (e) {
    stage.close();
    model.close();
    throw e;
  }
  const out = [model.forward(Int32Array.from(tokens.slice(0, o.prompt)), 0)];
  for (let t = o.prompt; t < tokens.length; t++) out.push(model.forward(Int32Array.of(tokens[t]), t));
  const summary = hybrid.stats.summary(), paths = [...hybrid.rowPaths];
  hybrid.close();
  model.close();
  expect(be.liveTensors()).toBe(0);
  expect(link.pinned.size).toBe(0);
  const { kvHeads, headDim } = model.cache;
  return { out, summary, paths, jobs: stage.jobs, gathered: link.gathered, rowShapes: shapes.filter((s) => s.length === 2 && s[1] === headDim), scoreShapes, kvHeads, headDim };
}

/** The CPU-backend path (no host store, no DeviceStaging): the reference for the device paths. */
function plainRun(files: ModelFiles, tokens: number[], o: HybridRunOptions & { trackScores?: boolean }): Float32Array[] {
  const be = new ReferenceBackend();
  using model = LlamaModel.load(files, be, { prefillBlock: 5, maxContext: CONTEXT, gpuKvBudget: o.budget, sinkTokens: o.sinks ?? 0, kvEvictBlock: o.block });
  using _hybrid = HybridAttention.attach(
    { attention: model.attention, projector: model, stage: new BackendCpuStage(be), selector: o.selector!, scheduler: o.scheduler! },
    { logits: o.logits ?? "exact", candidates: o.candidates, trackScores: o.trackScores },
  );
  const out = [model.forward(Int32Array.from(tokens.slice(0, o.prompt)), 0)];
  for (let t = o.prompt; t < tokens.length; t++) out.push(model.forward(Int32Array.of(tokens[t]), t));
  return out;
}

describe("chooseRowPath: where a device backend gets the selected rows", () => {
  const ok = { request: "auto" as const, deviceGathers: true, mapped: true, rowBytes: 256 };
  it("mapped wherever the device gathers from a pinned, mapped store; staged otherwise, with the reason", () => {
    expect(chooseRowPath(ok)).toEqual({ path: "mapped", reason: "the store is pinned and mapped" });
    expect(chooseRowPath({ ...ok, request: "mapped" }).path).toBe("mapped");
    expect(chooseRowPath({ ...ok, request: "staged" })).toEqual({ path: "staged", reason: "staged rows asked for" });
    expect(chooseRowPath({ ...ok, deviceGathers: false })).toEqual({ path: "staged", reason: "the device backend cannot gather rows from host memory" });
    expect(chooseRowPath({ ...ok, mapped: false }).reason).toMatch(/not in pinned host memory the device maps \(a file-backed tier/);
    expect(chooseRowPath({ ...ok, rowBytes: 40 })).toEqual({ path: "staged", reason: "a row of 40 bytes is not a whole number of 16-byte pieces" });
    // The first blocker is named: a device without the gather says so even over an unmapped store.
    expect(chooseRowPath({ ...ok, request: "mapped", deviceGathers: false, mapped: false }).reason).toMatch(/cannot gather/);
  });

  it("selectionRows: K (candidates·K when verifying) capped at the store, the whole store for a selector without a budget; grownRows at least doubles", () => {
    expect(selectionRows({ storeCapacity: 32_768, usesBudget: true, k: 256, candidates: 4 })).toBe(1024);
    expect(selectionRows({ storeCapacity: 32_768, usesBudget: true, k: 256, candidates: 1 })).toBe(256);
    expect(selectionRows({ storeCapacity: 600, usesBudget: true, k: 256, candidates: 4 })).toBe(600);
    expect(selectionRows({ storeCapacity: 600, usesBudget: false, k: 8, candidates: 4 })).toBe(600);
    expect(grownRows(1024, 1000, 32_768)).toBe(1024);
    expect(grownRows(1024, 1100, 32_768)).toBe(2048);
    expect(grownRows(1024, 5000, 32_768)).toBe(5000);
    expect(grownRows(1024, 5000, 3000)).toBe(3000);
  });
});

describe("hybrid attention with rows gathered by the device from the mapped host store", () => {
  const { files } = tinyModel({ seed: testSeed(360), maxPositions: 64, heads: 4, kvHeads: 2, layers: 3 });
  const tokens = randomIds(testSeed(460), CONTEXT);
  const base = { budget: 6, sinks: 1, block: 2, prompt: 12 };

  it("exact, speculative and verified top-K (stage kernel and JS): the same logits as staged rows, bit for bit; the stage is told not to copy rows", () => {
    for (const logits of ["exact", "speculative", "verified"] as const) {
      for (const kernel of [false, true]) {
        const o = { ...base, logits, selector: topKSelector(kernel), scheduler: fixedScheduler(3, "post") };
        const staged = run(files, tokens, { ...o, rowPath: "staged" });
        const mapped = run(files, tokens, { ...o, rowPath: "auto" });
        expect(mapped.paths).toEqual(["mapped", "mapped", "mapped"]);
        expect(staged.paths).toEqual(["staged", "staged", "staged"]);
        mapped.out.forEach((l, i) => expect(maxAbsDiff(l, staged.out[i]), `${logits} ${kernel} forward ${i}`).toBe(0));
        expect(mapped.gathered.length).toBeGreaterThan(0);
        expect(staged.gathered.length).toBe(0);
        expect(mapped.jobs.length).toBeGreaterThan(0);
        expect(mapped.jobs.every((j) => j.deviceGather === true)).toBe(true);
        expect(staged.jobs.every((j) => j.deviceGather === false)).toBe(true);
        expect(mapped.summary).toMatch(/V rows read by the device from pinned host memory \(3 of 3 layers\)/);
        expect(staged.summary).toMatch(/V rows staged by the CPU stage on 3 of 3 layers \(staged rows asked for\)/);
      }
    }
  });

  it("per-head lists of different lengths (pre-QKᵀ): padded rows are zeros both ways, same logits", () => {
    for (const logits of ["exact", "verified"] as const) {
      const o = { ...base, logits, selector: shortListsSelector, scheduler: fixedScheduler(4, "pre") };
      const staged = run(files, tokens, { ...o, rowPath: "staged" });
      const mapped = run(files, tokens, { ...o, rowPath: "mapped" });
      expect(mapped.paths).toEqual(["mapped", "mapped", "mapped"]);
      mapped.out.forEach((l, i) => expect(maxAbsDiff(l, staged.out[i]), `${logits} forward ${i}`).toBe(0));
    }
  });

  it("a layer whose store V the device does not map stays staged; a forced mapped path there fails with the reason", () => {
    const o = { ...base, logits: "verified" as const, selector: topKSelector(true), scheduler: fixedScheduler(3, "post") };
    const staged = run(files, tokens, { ...o, rowPath: "staged" });
    const mixed = run(files, tokens, { ...o, rowPath: "auto", unmappedV: [1] });
    expect(mixed.paths).toEqual(["mapped", "staged", "mapped"]);
    expect(mixed.jobs.some((j) => !j.deviceGather)).toBe(true);
    mixed.out.forEach((l, i) => expect(maxAbsDiff(l, staged.out[i]), `forward ${i}`).toBe(0));
    expect(mixed.summary).toMatch(/V rows staged by the CPU stage on 1 of 3 layers \(the store's rows are not in pinned host memory/);
    expect(() => run(files, tokens, { ...o, rowPath: "mapped", unmappedV: [2] })).toThrow(/rowPath "mapped" cannot run on layer 2: the store's rows are not in pinned/);
  });

  const rising: Scheduler = { name: "rising", initial: () => ({ k: 2, timing: "post" }), next: (t) => ({ k: t.step < 3 ? 2 : 7, timing: "post" }), reset() {} };

  it("the gathered-row buffers hold the widest selection (candidates·K), not the store, and grow when K rises", () => {
    const o = { ...base, logits: "verified" as const, selector: topKSelector(true), candidates: 2 };
    const fixed = run(files, tokens, { ...o, scheduler: fixedScheduler(3, "post"), rowPath: "auto" });
    // Two slots of V and two of K rows: kvHeads × 2·3 rows each (the store holds 36 a head).
    expect(fixed.rowShapes).toEqual(Array.from({ length: 4 }, () => [fixed.kvHeads * 6, fixed.headDim]));
    const plain = plainRun(files, tokens, { ...o, scheduler: rising });
    for (const rowPath of ["staged", "auto"] as const) {
      const grown = run(files, tokens, { ...o, scheduler: rising, rowPath });
      // 2·2 rows a head first, then 2·7 = 14 once K is 7: four buffers each time.
      expect(grown.rowShapes.map((s) => s[0] / grown.kvHeads)).toEqual([4, 4, 4, 4, 14, 14, 14, 14]);
      grown.out.forEach((l, i) => expect(maxAbsDiff(l, plain[i]), `${rowPath} forward ${i}`).toBeLessThan(1e-6));
    }
  });

  it("the score rows: the selected columns alone with the window as a partial (grown with the row buffers), whole rows with tracked scores", () => {
    const o = { ...base, logits: "verified" as const, selector: topKSelector(true), candidates: 2, scheduler: rising };
    const heads = 4;
    for (const rowPath of ["staged", "auto"] as const) {
      const partial = run(files, tokens, { ...o, rowPath });
      // Two slots of [heads, 2·2] first, then [heads, 2·7] once K is 7: never the context's 40 columns.
      expect(partial.scoreShapes).toEqual([[heads, 4], [heads, 4], [heads, 14], [heads, 14]]);
      const tracked = run(files, tokens, { ...o, rowPath, trackScores: true });
      expect(tracked.scoreShapes).toEqual([[heads, CONTEXT], [heads, CONTEXT]]); // the window's materialised logits beside the selected
      expect(tracked.rowShapes.map((s) => s[0] / tracked.kvHeads)).toEqual([4, 4, 4, 4, 14, 14, 14, 14]);
      const plain = plainRun(files, tokens, { ...o, trackScores: true });
      tracked.out.forEach((l, i) => expect(maxAbsDiff(l, plain[i]), `${rowPath} tracked forward ${i}`).toBeLessThan(1e-6));
    }
  });
});
