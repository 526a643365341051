// Batched hybrid attention with each sequence's store on the tiers (a storeAllocator function): a
// batch of 3 with V on the disk tier and all of K that may spill spilled (KSpill over TieredStore)
// gives logits bit for bit those of the same batch in host memory, each sequence alone likewise,
// and tokens of each alone; each sequence has its own files, gone when its sequence is released,
// when a BatchDecoder or generateBatch closes its slots, and on an error, which is one line.
import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { BatchDecoder, dummyModelFiles, generateBatch, loadModel, relError, type KvCache, type LlamaModel, type StoreLayout } from "@hybridgen/core";
import { createCpuBackend, TieredStore } from "@hybridgen/kernels-cpu";
import { createBatchHybridAttention, createHybridAttention, KSpill, type HybridRuntimeOptions, type StoreAllocatorFactory } from "../src/index.js";
import { decodeBatched, openIn } from "./batch-helpers.js";
import { TINY_CONFIG } from "./tiny-model.js";

const PAGE = 4096;
/** Batched rows run B-row matmuls where a single step runs fused matvecs: f32 summation order only. */
const REL_TOL = 1e-4;
const OPTIONS = { scheduler: "fixed", selector: "topk", k: 8, logits: "exact" } as const;
const backend = createCpuBackend({ threads: 1 });
const dirs: string[] = [];
const tmp = () => {
  const d = mkdtempSync(join(tmpdir(), "hg-batch-tier-"));
  dirs.push(d);
  return d;
};
afterAll(() => {
  backend.close();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** A context long enough that a sequence's store fills whole pages of K (64 rows of a KV head), which the spill moves. */
const CONTEXT = 256;
const modelFiles = () => dummyModelFiles({ ...TINY_CONFIG, max_position_embeddings: CONTEXT }, "f32", 5, undefined, "tiny-256");
const load = () => loadModel(modelFiles(), backend, { maxContext: CONTEXT, gpuKvBudget: 16, sinkTokens: 2 }) as LlamaModel;
const prompt = (n: number, seed: number) => Int32Array.from({ length: n }, (_, i) => 3 + ((i * 37 + seed * 101) % 250));
/** Prompts 0–2 fill slots 0–2; prompt 3 takes slot 0 when prompt 0 is done. */
const PROMPTS = [prompt(60, 1), prompt(130, 2), prompt(200, 3), prompt(90, 4)];
const STEPS = [4, 10, 7, 10];
const argmax = (x: Float32Array) => x.reduce((b, v, i) => (v > x[b]! ? i : b), 0);


/** One sequence's layout: K in memory with a spill file as large as K (every complete unit may go), V in a file of `dir`. */
function layout(cache: KvCache, dir: string): StoreLayout {
  const R = Math.ceil((cache.kvHeads * cache.storeCapacity * cache.headDim * 4) / PAGE) * PAGE;
  return {
    regionBytes: R, pageBytes: PAGE,
    k: Array.from({ length: cache.layers }, () => [{ offset: 0, bytes: R, tier: "node0", mode: "local", nodes: [] }]),
    v: Array.from({ length: cache.layers }, () => [{ offset: 0, bytes: R, tier: `file:${dir}`, mode: "file", nodes: [], dir }]),
    kSpill: { unitBytes: PAGE, files: [{ tier: `file:${dir}`, dir, bytes: cache.layers * R }] },
  };
}

/** A factory placing each sequence's store in `dir`, and the stores it made by sequence. */
function tiered(cache: KvCache, dir: string): { factory: (sequence: number) => KSpill; made: Map<number, KSpill> } {
  const made = new Map<number, KSpill>();
  const factory = (sequence: number): KSpill => {
    const s = new KSpill(new TieredStore(layout(cache, dir)));
    made.set(sequence, s);
    return s;
  };
  return { factory, made };
}

/** Each prompt alone (the model's own sequence, reset between prompts): the logits before each token. */
async function alone(dir?: string): Promise<Float32Array[][]> {
  using model = load();
  const extra: HybridRuntimeOptions = dir ? { storeAllocator: tiered(model.cache, dir).factory } : {};
  using _ha = await createHybridAttention(model, backend, { ...OPTIONS, ...extra });
  return PROMPTS.map((p, i) => {
    model.reset();
    const out = [Float32Array.from(model.forward(p, 0))];
    for (let s = 1; s < STEPS[i]!; s++) out.push(Float32Array.from(model.forward(Int32Array.of(argmax(out[s - 1]!)), p.length + s - 1)));
    return out;
  });
}


const files = (dir: string) => readdirSync(dir).sort();

describe("batched hybrid attention, each sequence's store on the tiers (V on disk, K spilled)", () => {
  it("a batch of 3 equals the batch in host memory bit for bit, and each sequence alone; files go with their sequences", async () => {
    const host = await (async () => {
      using model = load();
      using _b = await createBatchHybridAttention(model, backend, OPTIONS, 3);
      using dec = new BatchDecoder(model, 3);
      return decodeBatched(dec, PROMPTS, STEPS);
    })();
    const dir = tmp();
    let spilled = 0;
    const disk = await (async () => {
      using model = load();
      const { factory, made } = tiered(model.cache, dir);
      using hybrid = await createBatchHybridAttention(model, backend, { ...OPTIONS, storeAllocator: factory }, 3);
      const own = files(dir);
      expect(own).toHaveLength(3); // V of 3 layers
      const held = openIn(dir).length; // descriptors of one sequence's V files and its K spill file
      const out = (() => {
        using dec = new BatchDecoder(model, 3);
        const all = files(dir);
        expect(all).toHaveLength(9);
        expect(openIn(dir)).toHaveLength(3 * held);
        // Prompt 3 reuses slot 0's store: no file comes or goes.
        const res = decodeBatched(dec, PROMPTS, STEPS, () => expect(files(dir)).toEqual(all));
        spilled = [...made.values()].reduce((n, s) => n + s.stats.units, 0);
        return res;
      })();
      // The decoder released slots 1 and 2: their files and spill files are gone, the own sequence's stay.
      expect([...made.keys()]).toEqual([0, 1, 2]);
      expect(files(dir)).toEqual(own);
      expect(openIn(dir)).toHaveLength(held);
      expect(hybrid.all).toHaveLength(3);
      return out;
    })();
    expect(files(dir)).toEqual([]);
    expect(openIn(dir)).toEqual([]);
    expect(spilled).toBeGreaterThanOrEqual(12); // every sequence's K spilled some pages
    expect(disk).toEqual(host);

    const hostAlone = await alone();
    const diskDir = tmp();
    expect(await alone(diskDir)).toEqual(hostAlone);
    expect(files(diskDir)).toEqual([]);
    disk.forEach((rows, i) => {
      expect(rows.length, `sequence ${i}`).toBe(STEPS[i]);
      rows.forEach((g, s) => {
        expect(argmax(g), `sequence ${i} token ${s}`).toBe(argmax(hostAlone[i]![s]!));
        expect(relError(g, hostAlone[i]![s]!), `sequence ${i} token ${s}`).toBeLessThanOrEqual(REL_TOL);
      });
    });
  });

  it("a sequence released takes its files; generateBatch's slots (continuous batching) leave none when it ends; tokens equal host memory's", async () => {
    const requests = [...PROMPTS, prompt(150, 5)].map((p, i) => ({ prompt: Array.from(p), maxTokens: [3, 9, 7, 8, 6][i]! }));
    const run = async (dir?: string) => {
      using model = load();
      const extra: HybridRuntimeOptions = dir ? { storeAllocator: tiered(model.cache, dir).factory } : {};
      using _b = await createBatchHybridAttention(model, backend, { ...OPTIONS, ...extra }, 3);
      if (dir) {
        const own = files(dir);
        const held = openIn(dir).length;
        const a = model.createSequence(), b = model.createSequence();
        const both = files(dir);
        expect(both).toHaveLength(9);
        model.releaseSequence(a);
        const left = files(dir);
        expect(left).toHaveLength(6);
        expect(both.filter((f) => !left.includes(f))).toHaveLength(3);
        expect(openIn(dir)).toHaveLength(2 * held);
        model.releaseSequence(b);
        expect(files(dir)).toEqual(own);
      }
      const res = await generateBatch(model, modelFiles().tokenizer, requests, { batch: 3, sampling: { temperature: 0 } }).result();
      if (dir) expect(files(dir)).toHaveLength(3);
      return res.results.map((r) => r.tokens);
    };
    const want = await run();
    const dir = tmp();
    expect(await run(dir)).toEqual(want);
    expect(files(dir)).toEqual([]);
    expect(openIn(dir)).toEqual([]);
  });

  it("BatchDecoder.renew: a slot's store and files go, a fresh one comes, the released attention leaves `all` at prune(); the tokens are the first run's", async () => {
    const dir = tmp();
    using model = load();
    const { factory, made } = tiered(model.cache, dir);
    using hybrid = await createBatchHybridAttention(model, backend, { ...OPTIONS, storeAllocator: factory }, 2);
    using dec = new BatchDecoder(model, 2);
    const run = () => {
      dec.prefill(1, PROMPTS[1]!, 0);
      const out = [dec.argmax(1)];
      for (let s = 1; s < 6; s++) {
        dec.step([1], Int32Array.of(out[s - 1]!));
        out.push(dec.argmax(1));
      }
      return out;
    };
    const first = run();
    const before = files(dir), held = openIn(dir).length, old = hybrid.all[1];
    expect(before).toHaveLength(6);
    dec.renew(1);
    const after = files(dir);
    expect(after).toHaveLength(6);
    expect(after.filter((f) => before.includes(f))).toHaveLength(3); // the own sequence's stay; slot 1's are new
    expect(openIn(dir)).toHaveLength(held);
    expect(hybrid.all).toHaveLength(3); // the released one stays, closed, until prune()
    hybrid.prune();
    expect(hybrid.all).toHaveLength(2);
    expect(hybrid.all[1]).not.toBe(old);
    expect([...made.keys()]).toEqual([0, 1, 2]);
    expect(run()).toEqual(first);
  });

  it("errors are one line and leave nothing behind: a factory that throws, returns garbage or repeats itself, a missing directory, an allocator object, a store refused", async () => {
    const dir = tmp();
    using model = load();
    const { factory } = tiered(model.cache, dir);
    const failing = (bad: number, what: (s: number) => unknown): StoreAllocatorFactory => (s) => (s === bad ? what(s) : factory(s)) as ReturnType<StoreAllocatorFactory>;

    await expect(createBatchHybridAttention(model, backend, { ...OPTIONS, storeAllocator: failing(0, () => { throw new Error("no room"); }) }, 3))
      .rejects.toThrow(/^storeAllocator\(0\) failed: no room$/);
    expect(files(dir)).toEqual([]);
    expect(model.attention.decodeAttention).toBeNull();
    await expect(createBatchHybridAttention(model, backend, { ...OPTIONS, storeAllocator: failing(0, () => ({ alloc: 1 })) }, 3))
      .rejects.toThrow(/^storeAllocator\(0\) must return a KvStoreAllocator \(alloc, pinnable, release\)$/);
    await expect(createBatchHybridAttention(model, backend, { ...OPTIONS, storeAllocator: "disk" as never }, 3))
      .rejects.toThrow(/^hybrid runtime option storeAllocator: must be a KvStoreAllocator or a function \(sequence\) => KvStoreAllocator$/);
    const one = { alloc: () => { throw new Error("unused"); }, pinnable: () => true, release: () => {} };
    await expect(createBatchHybridAttention(model, backend, { ...OPTIONS, storeAllocator: one }, 3))
      .rejects.toThrow(/^a storeAllocator object places one sequence's store; give batched hybrid attention a function/);
    expect(files(dir)).toEqual([]);
    expect(openIn(dir)).toEqual([]);
    expect(model.attention.decodeAttention).toBeNull();

    // A later sequence's failure: the decoder is not made, the sequences it made are released with their files.
    const { factory: withMissing } = tiered(model.cache, join(dir, "missing"));
    using hybrid = await createBatchHybridAttention(model, backend, { ...OPTIONS, storeAllocator: (s) => (s === 2 ? withMissing(s) : factory(s)) }, 3);
    const own = files(dir), held = openIn(dir);
    expect(own).toHaveLength(3);
    expect(() => new BatchDecoder(model, 3)).toThrow(new RegExp(`^storeAllocator\\(2\\) failed: K spill: cannot create a file in ${dir}/missing: ENOENT$`));
    expect(files(dir)).toEqual(own);
    expect(openIn(dir)).toEqual(held);
    hybrid.close();
    // A store the cache refuses (its own is placed already) is released: its spill file closes.
    await expect(createBatchHybridAttention(model, backend, { ...OPTIONS, storeAllocator: factory }, 3)).rejects.toThrow(/^KV cache: the store was placed already$/);
    expect(files(dir)).toEqual(own);
    expect(openIn(dir)).toEqual(held);

    using other = load();
    const { factory: otherFactory } = tiered(other.cache, dir);
    let first: KSpill | null = null;
    using _h = await createBatchHybridAttention(other, backend, { ...OPTIONS, storeAllocator: (s) => (first ??= otherFactory(s)) }, 2);
    expect(() => new BatchDecoder(other, 2)).toThrow(/^storeAllocator\(1\) returned sequence 0's allocator: each sequence needs a store of its own$/);
    expect(files(dir)).toHaveLength(6); // the two models' own sequences
  });
});
