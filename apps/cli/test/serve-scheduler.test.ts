// The serve scheduler in process on stories15M: a long prompt joining a running request is
// prefilled one chunk a turn, a decode step of the running one between every two chunks. With
// hybrid attention the planner's ledger admits only the requests whose stores (each sized to its
// own context) fit the tiers left (here room for two), the rest wait and join as stores come
// back; every request gets the tokens of `hybridgen generate` alone with the same flags; slots
// are renewed (the released attentions pruned) and the ledger ends empty; a store that cannot be
// made fails only its own request. A cancel ends its request before the next decode step. The
// ledger alone: a context within the window needs no store, a shorter context a smaller store;
// refusals are one line. Device memory: the same budget admits more short requests than long
// ones, and a finished or cancelled request's bytes come back.
import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { BatchDecoder, HybridgenError, loadModel, openModelDir, type KvStoreAllocator, type MemoryTier } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { bufferedIo, runCli } from "../src/index.js";
import { attachHybrid, HybridCliOptionsSchema } from "../src/hybrid-options.js";
import { DeviceLedger, deviceMemory } from "../src/serve/device-ledger.js";
import { ServeMetrics } from "../src/serve/metrics.js";
import { ServeScheduler } from "../src/serve/scheduler.js";
import { StoreLedger } from "../src/serve/store-ledger.js";
import { stories15M } from "./model-fixture.js";

const FLAGS = ["--attention", "hybrid", "--gpu-kv-budget", "32", "--sink-tokens", "4", "--k", "16"];
const hybridFlags = HybridCliOptionsSchema.parse({ attention: "hybrid", gpuKvBudget: 32, sinkTokens: 4, k: 16 });
const PROMPTS = ["Once upon a time", "The little dog ran to the park", "Lily and Tom", "A big red ball", "The sun was hot"];
/** Every prompt + max_tokens is 48 positions, past the 32-token window: each needs a store, all of one size. */
const CONTEXT = 48;
const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});
const memory = (bytes: number): MemoryTier[] => [{ id: "node0", kind: "dram", numaNode: 0, capacityBytes: bytes }];

/** `hybridgen generate --json` in process (by default with the same hybrid flags): one prompt alone. */
async function alone(prompt: string, n: number, flags: readonly string[] = FLAGS): Promise<string> {
  const io = bufferedIo({ env: process.env });
  expect(await runCli(["generate", "--device", "cpu", "--threads", "1", "-t", "0", "-n", String(n), "-p", prompt, "--json", ...flags], io), io.err).toBe(0);
  return JSON.parse(io.out).text;
}

describe("the serve scheduler: chunked prefill between decode steps", () => {
  it("a long prompt joining a running request is prefilled a chunk a turn, a decode step between every two chunks; both texts are generate's alone", async () => {
    const long = "Tom had a red kite. It flew high over the park and the trees. ".repeat(6).trim();
    const [wantA, wantB] = [await alone(PROMPTS[0]!, 60, []), await alone(long, 20, [])];
    using files = openModelDir(await stories15M());
    using backend = createCpuBackend({ threads: 1 });
    using model = loadModel(files, backend, { maxContext: 256 });
    using dec = new BatchDecoder(model, 2);
    const calls: string[] = [];
    const prefill = dec.prefill.bind(dec), step = dec.step.bind(dec);
    dec.prefill = (slot, ids, start) => (calls.push(`prefill ${slot}`), prefill(slot, ids, start));
    dec.step = (slots, ids) => (calls.push(`step ${slots.length}`), step(slots, ids));
    const scheduler = new ServeScheduler(dec, files.tokenizer, files.shape.vocabSize, new ServeMetrics(), {
      slots: [0, 1], queueLimit: 4, chunk: 8, maxContext: 256, eos: files.shape.eosTokenIds, bytesPerToken: 1, ledger: null,
    });
    const run = (prompt: string, maxTokens: number, onText: () => void = () => {}) => new Promise<string>((resolve) => {
      scheduler.submit({
        ids: files.tokenizer.encode(prompt), maxTokens, sampling: { temperature: 0 }, stop: [], arrivedMs: performance.now(), onText,
        onFinish: (r) => resolve(r.text),
      });
    });
    let joined: Promise<string> | null = null, seen = 0;
    const a = run(PROMPTS[0]!, 60, () => {
      if (++seen === 3) joined = run(long, 20);
    });
    expect(await a).toBe(wantA);
    expect(await joined!).toBe(wantB);
    const chunks = Math.ceil(files.tokenizer.encode(long).length / 8);
    expect(chunks).toBeGreaterThan(8);
    const first = calls.indexOf("prefill 1"), last = calls.lastIndexOf("prefill 1");
    const during = calls.slice(first, last + 1);
    expect(during.filter((c) => c === "prefill 1")).toHaveLength(chunks);
    // Never two chunks in a row while slot 0 decodes: each is followed by one step of the running request.
    during.forEach((c, i) => i % 2 === 0 ? expect(c).toBe("prefill 1") : expect(c).toBe("step 1"));
  });
});

describe("the serve scheduler: a consumer that throws", () => {
  it("fails only itself (logged): the loop and the other requests go on", async () => {
    using files = openModelDir(await stories15M());
    using backend = createCpuBackend({ threads: 1 });
    using model = loadModel(files, backend, { maxContext: 256 });
    using dec = new BatchDecoder(model, 2);
    const errors: string[] = [];
    const scheduler = new ServeScheduler(dec, files.tokenizer, files.shape.vocabSize, new ServeMetrics(), {
      slots: [0, 1], queueLimit: 4, chunk: 64, maxContext: 256, eos: files.shape.eosTokenIds, bytesPerToken: 1, ledger: null, onError: (m) => errors.push(m),
    });
    const job = (onText: () => void) => new Promise<string>((resolve) => {
      scheduler.submit({ ids: files.tokenizer.encode(PROMPTS[0]!), maxTokens: 12, sampling: { temperature: 0 }, stop: [], arrivedMs: 0, onText, onFinish: (r) => resolve(r.text) });
    });
    const [bad, good] = await Promise.all([job(() => {
      throw new Error("the socket is gone");
    }), job(() => {})]);
    expect(good).toBe(await alone(PROMPTS[0]!, 12, []));
    expect(bad).toBe(good);
    expect(errors.length).toBeGreaterThan(0);
    expect(new Set(errors)).toEqual(new Set(["a response failed: the socket is gone"]));
  });
});

describe("the serve scheduler: a cancel", () => {
  it("ends its request before the next decode step (no token after it), frees the slot for the queued one; the other goes on as alone", async () => {
    const [wantB, wantC] = [await alone(PROMPTS[1]!, 20, []), await alone(PROMPTS[2]!, 8, [])];
    using files = openModelDir(await stories15M());
    using backend = createCpuBackend({ threads: 1 });
    using model = loadModel(files, backend, { maxContext: 256 });
    using dec = new BatchDecoder(model, 2);
    const metrics = new ServeMetrics();
    const scheduler = new ServeScheduler(dec, files.tokenizer, files.shape.vocabSize, metrics, {
      slots: [0, 1], queueLimit: 4, chunk: 64, maxContext: 256, eos: files.shape.eosTokenIds, bytesPerToken: 1, ledger: null,
    });
    const run = (prompt: string, maxTokens: number, onText: (handle: { cancel(): void }) => void = () => {}) =>
      new Promise<{ finish: string; text: string; tokens: number }>((resolve) => {
        const handle = scheduler.submit({
          ids: files.tokenizer.encode(prompt), maxTokens, sampling: { temperature: 0 }, stop: [], arrivedMs: performance.now(), onText: () => onText(handle),
          onFinish: (r) => resolve({ finish: r.finish, text: r.text, tokens: r.completionTokens }),
        });
      });
    // A: cancelled inside its 3rd token's callback (during a step); B: cancels between turns after its 5th, as a disconnect does; C waits for a slot.
    let a = 0, b = 0;
    const [ra, rb, rc] = await Promise.all([
      run(PROMPTS[0]!, 60, (h) => ++a === 3 && h.cancel()),
      run(PROMPTS[1]!, 20),
      run(PROMPTS[3]!, 60, (h) => {
        if (++b === 5) setImmediate(() => h.cancel());
      }),
    ]);
    expect(ra).toMatchObject({ finish: "abort", tokens: 3 });
    expect(rb).toMatchObject({ finish: "length", text: wantB });
    expect(rc.finish).toBe("abort");
    expect(rc.tokens).toBe(5);
    expect(metrics.finished.get({ reason: "cancelled" })).toBe(2);
    expect(scheduler.running).toBe(0);
    // The slots are free again: the next request is served, its text as alone.
    expect((await run(PROMPTS[2]!, 8)).text).toBe(wantC);
  });
});

describe("the serve scheduler with hybrid attention and the planner's ledger", () => {
  it("admits only what the tiers left hold; the others wait and join; each request's text is generate's alone", async () => {
    using files = openModelDir(await stories15M());
    const MAX_TOKENS = PROMPTS.map((p) => CONTEXT - files.tokenizer.encode(p).length);
    const want = await Promise.all(PROMPTS.map((p, i) => alone(p, MAX_TOKENS[i]!)));
    using backend = createCpuBackend({ threads: 1 });
    using model = loadModel(files, backend, { maxContext: 256, gpuKvBudget: 32, sinkTokens: 4 });
    const probe = await StoreLedger.on(memory(2 ** 30), model.cache, { kvPlacement: "semantic" });
    // Room for two stores of 48 positions (memory tiers keep 10% headroom), not three; at the model's 256, not one.
    expect(probe.storeBytesFor(CONTEXT)).toBeLessThan(probe.storeBytes / 4);
    const ledger = await StoreLedger.on(memory(Math.ceil((2.5 * probe.storeBytesFor(CONTEXT)) / 0.9)), model.cache, { kvPlacement: "semantic" });
    expect(ledger.refusal(256)).toMatch(/^its KV store needs [\d.]+ [KM]iB, [\d.]+ [KM]iB more than host memory holds \(add --kv-disk DIR\)$/);
    let next: KvStoreAllocator | null = null;
    const allocator = () => {
      const a = next ?? ledger.idle();
      next = null;
      return a;
    };
    using hybrids = await attachHybrid(model, backend, hybridFlags, { storeAllocator: allocator, batch: 4, ownIdle: true });
    using dec = new BatchDecoder(model, 5);
    const metrics = new ServeMetrics();
    const scheduler = new ServeScheduler(dec, files.tokenizer, files.shape.vocabSize, metrics, {
      slots: [1, 2, 3, 4], queueLimit: 8, chunk: 64, maxContext: 256, eos: files.shape.eosTokenIds, bytesPerToken: 1,
      ledger, nextStore: (a) => (next = a), prune: (hybrids as unknown as { prune(): void }).prune,
    });
    let most = 0, waited = 0;
    const texts = await Promise.all(PROMPTS.map((prompt, i) => new Promise<string>((resolve, reject) => {
      const ids = files.tokenizer.encode(prompt);
      scheduler.submit({
        ids, maxTokens: MAX_TOKENS[i]!, sampling: { temperature: 0 }, stop: [], arrivedMs: performance.now(),
        onText() {
          most = Math.max(most, scheduler.running);
          waited = Math.max(waited, scheduler.waiting);
        },
        onFinish: (r) => (r.finish === "length" ? resolve(r.text) : reject(new Error(`finished ${r.finish} ${r.error ?? ""}`))),
      });
    })));
    expect(texts).toEqual(want);
    expect(most).toBe(2);
    expect(waited).toBeGreaterThan(0);
    expect([...ledger.reservedByTier().values()]).toEqual([0]);
    expect(hybrids!.all).toHaveLength(5); // the own sequence's and one live attention a slot: released ones pruned
    expect(metrics.finished.get({ reason: "length" })).toBe(5);
    // All of one size: the three that waited each took the sequence (and store) a finished one left; renewed only as the first two came and the last two left.
    expect(metrics.reused.get()).toBe(3);
    expect(metrics.renewSeconds.observations).toBe(4);
    await scheduler.idle();
  });

  for (const selector of ["topk", "index"] as const) {
    it(`(${selector}) the queue's head takes a left sequence it fits as it is, else the slot is renewed; each text is generate's alone`, async () => {
      using files = openModelDir(await stories15M());
      const flags = [...FLAGS, "--selector", selector];
      // Contexts: A 48, B 48 (takes A's), C 80 (B's is too short: renewed), D 72 (takes C's: at most a quarter shorter), E 40 (C's 80 is twice its context: renewed).
      const jobs = [[PROMPTS[0]!, 48], [PROMPTS[1]!, 48], [PROMPTS[2]!, 80], [PROMPTS[3]!, 72], [PROMPTS[4]!, 40]] as const;
      const maxTokens = jobs.map(([p, c]) => c - files.tokenizer.encode(p).length);
      const want = [];
      for (const [i, [p]] of jobs.entries()) want.push(await alone(p, maxTokens[i]!, flags));
      using backend = createCpuBackend({ threads: 1 });
      using model = loadModel(files, backend, { maxContext: 256, gpuKvBudget: 32, sinkTokens: 4 });
      const ledger = await StoreLedger.on(memory(2 ** 30), model.cache, { kvPlacement: "semantic" });
      let next: KvStoreAllocator | null = null;
      const storeAllocator = () => {
        const a = next ?? ledger.idle();
        next = null;
        return a;
      };
      using hybrids = await attachHybrid(model, backend, HybridCliOptionsSchema.parse({ ...hybridFlags, selector }), { storeAllocator, batch: 1, ownIdle: true });
      using dec = new BatchDecoder(model, 2, { sequenceContext: 33 });
      const metrics = new ServeMetrics();
      const stats: string[] = [];
      const scheduler = new ServeScheduler(dec, files.tokenizer, files.shape.vocabSize, metrics, {
        slots: [1], queueLimit: 8, chunk: 64, maxContext: 256, eos: files.shape.eosTokenIds, bytesPerToken: 1, idleContext: 33,
        ledger, nextStore: (a) => (next = a), prune: (hybrids as unknown as { prune(): void }).prune, onHybridStats: (_, line) => stats.push(line),
      });
      const contexts: number[] = [];
      const texts = await Promise.all(jobs.map(([p], i) => new Promise<string>((resolve, reject) => {
        scheduler.submit({
          ids: files.tokenizer.encode(p), maxTokens: maxTokens[i]!, sampling: { temperature: 0 }, stop: [], arrivedMs: 0,
          onText: () => contexts[i] ??= dec.sequence(1).cache.maxContext,
          onFinish: (r) => (r.finish === "length" ? resolve(r.text) : reject(new Error(`finished ${r.finish} ${r.error ?? ""}`))),
        });
      })));
      expect(texts).toEqual(want);
      expect(contexts).toEqual([48, 48, 80, 80, 40]);
      expect(metrics.reused.get()).toBe(2);
      // A came; B left (C does not fit its sequence); C came; D left (E does not fit); E came and left.
      expect(metrics.renewSeconds.observations).toBe(6);
      // Each request's own stats line: the second request on a sequence does not count the first's steps.
      expect(stats).toHaveLength(5);
      expect(stats.map((l) => Number(/median of (\d+) hybrid steps/.exec(l)?.[1])), "the steps with positions offloaded: its context less 34").toEqual(jobs.map(([, c]) => c - 34));
      expect([...ledger.reservedByTier().values()]).toEqual([0]);
      expect(dec.sequence(1).cache.maxContext).toBe(33);
      await scheduler.idle();
    });
  }

  it("preallocated: every slot holds a sequence of the model's context from the start and keeps it; requests of any size take them with no renewal; each text is generate's alone", async () => {
    using files = openModelDir(await stories15M());
    const jobs = [[PROMPTS[0]!, 48], [PROMPTS[1]!, 80], [PROMPTS[2]!, 40], [PROMPTS[3]!, 100], [PROMPTS[4]!, 33]] as const;
    const maxTokens = jobs.map(([p, c]) => c - files.tokenizer.encode(p).length);
    const want = [];
    for (const [i, [p]] of jobs.entries()) want.push(await alone(p, maxTokens[i]!));
    using backend = createCpuBackend({ threads: 1 });
    using model = loadModel(files, backend, { maxContext: 256, gpuKvBudget: 32, sinkTokens: 4 });
    const probe = await StoreLedger.on(memory(2 ** 30), model.cache, { kvPlacement: "semantic" });
    let next: KvStoreAllocator | null = null;
    const storeAllocator = () => {
      const a = next ?? probe.idle();
      next = null;
      return a;
    };
    using hybrids = await attachHybrid(model, backend, hybridFlags, { storeAllocator, batch: 2, ownIdle: true });
    using dec = new BatchDecoder(model, 3, { sequenceContext: 33 });
    const make = (ledger: StoreLedger, metrics = new ServeMetrics()) => new ServeScheduler(dec, files.tokenizer, files.shape.vocabSize, metrics, {
      slots: [1, 2], queueLimit: 8, chunk: 64, maxContext: 256, eos: files.shape.eosTokenIds, bytesPerToken: 1, idleContext: 33,
      ledger, nextStore: (a) => (next = a), prune: (hybrids as unknown as { prune(): void }).prune,
    });
    // Tiers for one store of the model's context, not two: a one-line refusal, nothing left reserved.
    const small = await StoreLedger.on(memory(Math.ceil((1.5 * probe.storeBytes) / 0.9)), model.cache, { kvPlacement: "semantic" });
    expect(() => make(small).preallocate()).toThrow(/^--preallocate: the KV tiers hold the stores of 1 of 2 sequences of the model's context \([\d.]+ MiB each\): lower --max-batch or --context, or add --kv-disk DIR$/);
    const metrics = new ServeMetrics();
    const scheduler = make(probe, metrics);
    scheduler.preallocate();
    expect(metrics.renewSeconds.observations).toBe(2);
    const held = [...probe.reservedByTier().values()][0]!;
    expect(held).toBeGreaterThanOrEqual(2 * probe.storeBytes);
    expect(() => scheduler.preallocate()).toThrow("preallocate: only once, before any request");
    const texts = await Promise.all(jobs.map(([p], i) => new Promise<string>((resolve, reject) => {
      scheduler.submit({
        ids: files.tokenizer.encode(p), maxTokens: maxTokens[i]!, sampling: { temperature: 0 }, stop: [], arrivedMs: 0, onText() {},
        onFinish: (r) => (r.finish === "length" ? resolve(r.text) : reject(new Error(`finished ${r.finish} ${r.error ?? ""}`))),
      });
    })));
    await scheduler.idle();
    expect(texts).toEqual(want);
    expect(metrics.reused.get()).toBe(5);
    expect(metrics.renewSeconds.observations).toBe(2);
    // Idle, the sequences and their stores are still there.
    expect([dec.sequence(1).cache.maxContext, dec.sequence(2).cache.maxContext]).toEqual([256, 256]);
    expect([...probe.reservedByTier().values()]).toEqual([held]);
  });

  it("a store that cannot be built (its disk directory gone) fails that request with a one-line error; the next ones are served", async () => {
    using files = openModelDir(await stories15M());
    using backend = createCpuBackend({ threads: 1 });
    using model = loadModel(files, backend, { maxContext: 256, gpuKvBudget: 32, sinkTokens: 4 });
    const dir = mkdtempSync(join(tmpdir(), "hg-ledger-gone-"));
    const ledger = await StoreLedger.on([...memory(2 ** 30), { id: `file:${dir}`, kind: "file", path: dir, capacityBytes: 2 ** 30 }], model.cache, { kvPlacement: "semantic", kvDisk: dir, hostKvBudget: 0 });
    rmSync(dir, { recursive: true });
    let next: KvStoreAllocator | null = null;
    const storeAllocator = () => {
      const a = next ?? ledger.idle();
      next = null;
      return a;
    };
    using hybrids = await attachHybrid(model, backend, hybridFlags, { storeAllocator, ownIdle: true });
    using dec = new BatchDecoder(model, 2);
    const errors: string[] = [];
    const scheduler = new ServeScheduler(dec, files.tokenizer, files.shape.vocabSize, new ServeMetrics(), {
      slots: [1], queueLimit: 4, chunk: 64, maxContext: 256, eos: files.shape.eosTokenIds, bytesPerToken: 1,
      ledger, nextStore: (a) => (next = a), prune: (hybrids as unknown as { prune(): void }).prune, onError: (m) => errors.push(m),
    });
    const run = (maxTokens: number) => new Promise<{ finish: string; text: string; error?: string }>((resolve) => {
      scheduler.submit({ ids: files.tokenizer.encode(PROMPTS[0]!), maxTokens, sampling: { temperature: 0 }, stop: [], arrivedMs: 0, onText() {}, onFinish: resolve });
    });
    const [failed, fits] = await Promise.all([run(40), run(20)]);
    expect(failed).toMatchObject({ finish: "abort", text: "" });
    expect(failed.error).toBe(`K spill: cannot create a file in ${dir}: ENOENT`); // all of K past memory spills: its file is made first
    expect(errors).toEqual([failed.error]);
    expect(fits.finish).toBe("length"); // within the window: no store, served on the same slot
    expect(fits.text).toBe(await alone(PROMPTS[0]!, 20));
    expect([...ledger.reservedByTier().values()]).toEqual([0, 0]);
  });

  it("the ledger: a context within the window needs no store; stores come back on release; the disk tier's files go with them", async () => {
    using files = openModelDir(await stories15M());
    using backend = createCpuBackend({ threads: 1 });
    using model = loadModel(files, backend, { maxContext: 256, gpuKvBudget: 32, sinkTokens: 4 });
    const probe = await StoreLedger.on(memory(2 ** 30), model.cache, { kvPlacement: "semantic" });
    const dir = mkdtempSync(join(tmpdir(), "hg-ledger-"));
    dirs.push(dir);
    // Memory for one store; a disk with room for one more: the second lands on disk, the third waits.
    const tiers: MemoryTier[] = [...memory(Math.ceil((1.2 * probe.storeBytes) / 0.9)), { id: `file:${dir}`, kind: "file", path: dir, capacityBytes: Math.ceil(1.2 * probe.storeBytes) }];
    const ledger = await StoreLedger.on(tiers, model.cache, { kvPlacement: "semantic", kvDisk: dir });
    expect(ledger.needsStore(32)).toBe(false);
    expect(ledger.needsStore(33)).toBe(true);
    const a = ledger.place(256)!, b = ledger.place(256)!;
    expect(ledger.place(256)).toBeNull();
    expect(ledger.reservedByTier()).toEqual(new Map([["node0", expect.any(Number)], ["disk", expect.any(Number)]]));
    expect([...ledger.reservedByTier().values()].reduce((x, y) => x + y)).toBeGreaterThanOrEqual(2 * probe.storeBytes);
    // The disk store's files exist once its regions are allocated, and go when it is released.
    const shape = [model.cache.kvHeads, model.cache.storeCapacity, model.cache.headDim];
    const tensors = [0, 1].flatMap((l) => (["k", "v"] as const).map((pool) => b.allocator.alloc(backend, pool, l, shape, "f32")));
    expect(readdirSync(dir).length).toBeGreaterThan(0);
    for (const t of tensors) backend.free(t);
    b.allocator.release();
    ledger.release(b);
    expect(readdirSync(dir)).toEqual([]);
    const c = ledger.place(256);
    expect(c).not.toBeNull();
    ledger.release(a);
    ledger.release(c!);
    expect([...ledger.reservedByTier().values()]).toEqual([0, 0]);
    await expect(StoreLedger.on(memory(1000), model.cache, { kvPlacement: "semantic" })).rejects.toThrow(/^the smallest request past the window: its KV store needs [\d.]+ [KM]iB, [\d.]+ [KM]iB more than host memory holds \(add --kv-disk DIR\)$/);
  });
});

describe("the serve scheduler: admission by each request's device bytes", () => {
  it("the same device memory admits more short requests than long ones; a finished or cancelled request's bytes come back", async () => {
    using files = openModelDir(await stories15M());
    using backend = createCpuBackend({ threads: 1, memoryCapBytes: 2 ** 30 });
    using model = loadModel(files, backend, { maxContext: 128 });
    using dec = new BatchDecoder(model, 6, { sequenceContext: 1 });
    const bytes = (c: number) => model.sequenceBytes(c).window + model.sequenceBytes(c).scores;
    // Room for two sequences of 100 positions beside the idle slots: ten of 25.
    const device = new DeviceLedger(deviceMemory(backend)!, Math.floor(2.5 * (bytes(100) - bytes(1))), bytes, 1);
    expect(device.need(100)).toBe(bytes(100) - bytes(1));
    expect(4 * device.need(25)).toBeLessThan(device.need(100) + 4 * bytes(1));
    const metrics = new ServeMetrics();
    const scheduler = new ServeScheduler(dec, files.tokenizer, files.shape.vocabSize, metrics, {
      slots: [1, 2, 3, 4, 5], queueLimit: 16, chunk: 64, maxContext: 128, eos: [], bytesPerToken: 1, ledger: null, device, idleContext: 1,
    });
    const wave = async (context: number, cancelFirst = false) => {
      let most = 0, held = 0;
      const outcomes = await Promise.all(PROMPTS.map((prompt, i) => new Promise<{ finish: string; text: string; tokens: number }>((resolve) => {
        const ids = files.tokenizer.encode(prompt);
        let seen = 0;
        const handle = scheduler.submit({
          ids, maxTokens: context - ids.length, sampling: { temperature: 0 }, stop: [], arrivedMs: performance.now(),
          onText() {
            most = Math.max(most, scheduler.running);
            held = Math.max(held, metrics.deviceReserved.get());
            if (cancelFirst && i === 0 && ++seen === 3) handle.cancel();
          },
          onFinish: (r) => resolve({ finish: r.finish, text: r.text, tokens: r.completionTokens }),
        });
      })));
      return { most, held, outcomes };
    };
    const long = await wave(100, true);
    expect(long.most).toBe(2);
    expect(long.held).toBeGreaterThanOrEqual(2 * device.need(100));
    expect(long.outcomes.map((o) => o.finish)).toEqual(["abort", "length", "length", "length", "length"]);
    expect(device.reserved).toBe(0);
    expect(metrics.deviceReserved.get()).toBe(0);
    // No EOS was given: every request ran its whole budget.
    expect(long.outcomes[1]!.tokens).toBe(100 - files.tokenizer.encode(PROMPTS[1]!).length);
    const short = await wave(25);
    expect(short.most).toBe(5);
    expect(short.outcomes.every((o) => o.finish === "length")).toBe(true);
    expect(metrics.deviceReserved.get()).toBe(0);
    await scheduler.idle();
    // A request larger than the whole budget is refused up front, never queued for good.
    expect(scheduler.refusal(128)).toBeNull(); // 2.5 × 100 positions' bytes hold 128
    const tight = new ServeScheduler(dec, files.tokenizer, files.shape.vocabSize, new ServeMetrics(), {
      slots: [1], queueLimit: 1, chunk: 64, maxContext: 128, eos: [], bytesPerToken: 1, ledger: null, idleContext: 1,
      device: new DeviceLedger(deviceMemory(backend)!, device.need(50), bytes, 1),
    });
    expect(tight.refusal(50)).toBeNull();
    expect(tight.refusal(51)).toMatch(/^its sequence needs [\d.]+ MiB of device memory, and [\d.]+ MiB is left for requests beside the model$/);
    const refused = await new Promise<{ finish: string; error?: string }>((resolve) => {
      tight.submit({ ids: files.tokenizer.encode(PROMPTS[0]!), maxTokens: 60, sampling: { temperature: 0 }, stop: [], arrivedMs: 0, onText() {}, onFinish: resolve });
    });
    expect(refused.finish).toBe("abort");
    expect(refused.error).toMatch(/^this request cannot be served: its sequence needs/);
    // Preallocated sequences of the whole context (128) must all fit the budget: 2.5 × 100 positions' bytes hold one, not five.
    const all = new ServeScheduler(dec, files.tokenizer, files.shape.vocabSize, new ServeMetrics(), {
      slots: [1, 2, 3, 4, 5], queueLimit: 1, chunk: 64, maxContext: 128, eos: [], bytesPerToken: 1, ledger: null, idleContext: 1,
      device: new DeviceLedger(deviceMemory(backend)!, Math.floor(2.5 * (bytes(100) - bytes(1))), bytes, 1),
    });
    expect(() => all.preallocate()).toThrow(/^--preallocate: 5 sequences of the model's context need [\d.]+ MiB of device memory, [\d.]+ MiB is left beside the model \(1 fit\): lower --max-batch or --context$/);
  });
});

describe("the serve scheduler: a prefill refused device memory", () => {
  it("goes back to the queue's head while others run, and is served when one leaves; alone it fails with one line", async () => {
    using files = openModelDir(await stories15M());
    using backend = createCpuBackend({ threads: 1 });
    using model = loadModel(files, backend, { maxContext: 256 });
    using dec = new BatchDecoder(model, 3);
    const prefill = dec.prefill.bind(dec);
    let refuse = 0, on = 1; // refused prefills left, and on which slot (-1: any)
    dec.prefill = (slot, ids, start) => {
      if (refuse > 0 && (on < 0 || slot === on)) {
        refuse--;
        throw new HybridgenError("out of device memory: a prefill buffer", "ENOMEM");
      }
      return prefill(slot, ids, start);
    };
    const errors: string[] = [];
    const scheduler = new ServeScheduler(dec, files.tokenizer, files.shape.vocabSize, new ServeMetrics(), {
      slots: [0, 1], queueLimit: 4, chunk: 64, maxContext: 256, eos: files.shape.eosTokenIds, bytesPerToken: 1, ledger: null, onError: (m) => errors.push(m),
    });
    const run = (prompt: string, n: number) => new Promise<{ finish: string; text: string; error?: string }>((resolve) => {
      scheduler.submit({ ids: files.tokenizer.encode(prompt), maxTokens: n, sampling: { temperature: 0 }, stop: [], arrivedMs: 0, onText() {}, onFinish: resolve });
    });
    refuse = 1;
    let waited = 0;
    const first = run(PROMPTS[0]!, 30);
    const second = run(PROMPTS[1]!, 12);
    while (scheduler.running + scheduler.waiting > 0) {
      if (scheduler.running === 1) waited = Math.max(waited, scheduler.waiting); // the second back in the queue beside the first
      await new Promise((r) => setTimeout(r, 1));
    }
    const [a, b] = await Promise.all([first, second]);
    expect(a).toMatchObject({ finish: "length", text: await alone(PROMPTS[0]!, 30, []) });
    expect(b).toMatchObject({ finish: "length", text: await alone(PROMPTS[1]!, 12, []) }); // re-prefilled from the start once the first left
    expect(waited).toBe(1);
    expect(errors).toEqual([]);
    [refuse, on] = [1, -1];
    const lone = await run(PROMPTS[1]!, 12);
    expect(lone.finish).toBe("abort");
    expect(lone.error).toBe("this request cannot be served: its prefill ran out of device memory with nothing else running (out of device memory: a prefill buffer)");
  });
});
