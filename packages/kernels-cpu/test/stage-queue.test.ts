import { describe, expect, it } from "vitest";
import { ptr, toArrayBuffer } from "bun:ffi";
import type { CpuStageJob, CpuStageWork, Tensor } from "@hybridgen/spec";
import { createCpuBackend, NativeCpuStage, type CpuBackend, type NativeCpuStageOptions } from "../src/index.js";
import { randn, rng, SEED } from "./helpers.js";

const heads = 8, kvHeads = 2, headDim = 32, cap = 300, n = 280, kmax = 16, layers = 6;
const shape = { heads, kvHeads, headDim, storeCapacity: cap, dtype: "bf16" as const };

/** Per layer: its store, query and work (slot l & 1, as a decode step's jobs). */
function setUp(cpu: CpuBackend) {
  const r = rng(91);
  const works: CpuStageWork[] = [
    { kind: "topk", budget: kmax, shared: false }, { kind: "quest", budget: kmax, pageSize: 16 }, { kind: "topk", budget: kmax - 3, shared: true },
    { kind: "streaming", budget: kmax - 2, sinks: 3 },
  ];
  const stores: Tensor[] = [];
  const jobs = Array.from({ length: layers }, (_, l): { job: CpuStageJob; q: Float32Array } => {
    const K = cpu.alloc([kvHeads, cap, headDim], "bf16"), V = cpu.alloc([kvHeads, cap, headDim], "bf16");
    cpu.write(K, randn(r, kvHeads * cap * headDim));
    cpu.write(V, randn(r, kvHeads * cap * headDim));
    stores.push(K, V);
    const job: CpuStageJob = {
      slot: (l & 1) as 0 | 1, k: K, v: V, offloaded: n - l, kmax, scale: 0.17, work: works[l % works.length], deviceGather: l % 4 === 3, storeEpoch: 0,
    };
    return { job, q: randn(r, heads * headDim) };
  });
  return { jobs, free: () => stores.forEach((t) => cpu.free(t)) };
}

/** What a job left in its slot. */
function outputs(cpu: CpuBackend, stage: NativeCpuStage, job: CpuStageJob) {
  const o = stage.output(job.slot);
  return {
    ids: Array.from(o.ids.subarray(0, kvHeads * kmax)), counts: Array.from(o.counts),
    logits: Array.from(o.logits.subarray(0, heads * kmax)),
    values: job.deviceGather ? null : Array.from(cpu.read(o.values, 0, kvHeads * kmax * headDim)),
  };
}

/** Signal words in memory that never moves (a small plain typed array's data may, once JS touches it). */
function words(count: number) {
  const w = new Uint32Array(new SharedArrayBuffer(count * 4));
  return { w, at: (i: number) => ptr(w) + 4 * i };
}

/** Spins until the stage's thread stored `value` into w[i] (a broken stage times the test out). */
function awaitWord(w: Uint32Array, i: number, value: number): void {
  while (Atomics.load(w, i) !== value) { /* the device's poll */ }
}

function stageOf(cpu: CpuBackend, options: NativeCpuStageOptions = {}) {
  const stage = new NativeCpuStage(cpu, { threads: 2, ...options });
  stage.prepare(shape);
  return stage;
}

describe(`NativeCpuStage queue: a step's jobs submitted up front (seed ${SEED})`, () => {
  it("queued jobs over both slots, fed by ready words in order, equal the same jobs one at a time; done words rise in order, after the outputs", () => {
    using cpu = createCpuBackend({ threads: 2 });
    const { jobs, free } = setUp(cpu);
    try {
      using one = stageOf(cpu);
      const want = jobs.map(({ job, q }) => {
        one.query(job.slot).set(q);
        one.submit(job);
        one.wait();
        return outputs(cpu, one, job);
      });

      using stage = stageOf(cpu);
      expect(stage.queueDepth).toBeGreaterThanOrEqual(layers);
      const ready = words(layers), done = words(layers);
      jobs.forEach(({ job }, l) => stage.submit({ ...job, ready: { address: ready.at(l), value: 1 }, done: { address: done.at(l), value: 7 + l } }));
      for (let l = 0; l < layers; l++) {
        const { job, q } = jobs[l];
        // Job l − 2 ended (its done rose), so the slot's query is free; job l has not run without its ready.
        expect(Array.from(done.w.subarray(l)).every((x) => x === 0), `no done from layer ${l} on before its ready`).toBe(true);
        stage.query(job.slot).set(q); // the device's copy of the query lands…
        Atomics.store(ready.w, l, 1); // …then its signal
        awaitWord(done.w, l, 7 + l);
        // Job l + 2 (same slot) waits for its ready, so the slot holds job l's outputs.
        expect(outputs(cpu, stage, job), `layer ${l}`).toEqual(want[l]);
      }
      const busy = stage.wait();
      expect(busy).toBeGreaterThan(0);
      expect(Array.from(done.w)).toEqual(jobs.map((_, l) => 7 + l));
      // The split covers every job's busy time, not the last one's.
      const s = stage.lastSplit();
      const phases = s.scoreMs + s.selectMs + s.gatherMs;
      expect(phases).toBeLessThanOrEqual(busy + 1e-6);
      expect(phases).toBeGreaterThan(busy * 0.5); // the last job alone is about a sixth
      expect(() => stage.wait()).toThrow(/wait\(\) without a submitted job/);
    } finally {
      free();
    }
  });

  it("a failed job raises its done and the later jobs' (skipped: the slot keeps its last outputs); wait() throws the first error after all ended, and the next batch runs", () => {
    using cpu = createCpuBackend({ threads: 2 });
    const { jobs, free } = setUp(cpu);
    try {
      let alone;
      {
        using one = stageOf(cpu);
        one.query(0).set(jobs[0].q);
        one.submit(jobs[0].job);
        one.wait();
        alone = outputs(cpu, one, jobs[0].job);
      }
      using stage = stageOf(cpu, { readyTimeoutMs: 1 });
      const never = words(1), done = words(4);
      stage.query(0).set(jobs[0].q);
      stage.query(1).set(jobs[1].q);
      stage.submit({ ...jobs[0].job, done: { address: done.at(0), value: 1 } });
      stage.submit({ ...jobs[1].job, ready: { address: never.at(0), value: 3 }, done: { address: done.at(1), value: 2 } });
      stage.submit({ ...jobs[2].job, done: { address: done.at(2), value: 3 } });
      stage.submit({ ...jobs[3].job, done: { address: done.at(3), value: 4 } });
      expect(() => stage.wait()).toThrow(/^cpu stage: the device never signalled the query's copy \(waited 0\.0 s for value 3, the word holds 0\)$/);
      expect(Array.from(done.w)).toEqual([1, 2, 3, 4]);
      expect(outputs(cpu, stage, jobs[0].job), "layer 2 was skipped: slot 0 holds layer 0's outputs").toEqual(alone);
      stage.submit(jobs[2].job);
      expect(() => stage.wait()).not.toThrow();
    } finally {
      free();
    }
  });

  it("cancel() with jobs waiting for their ready: wait() throws 'cancelled' at once, every done is raised, and the stage goes on", { timeout: 20_000 }, () => {
    using cpu = createCpuBackend({ threads: 2 });
    const { jobs, free } = setUp(cpu);
    try {
      using stage = stageOf(cpu, { readyTimeoutMs: 600_000 }); // without cancel() the test times out
      const never = words(layers), done = words(layers);
      jobs.forEach(({ job }, l) => stage.submit({ ...job, ready: { address: never.at(l), value: 1 }, done: { address: done.at(l), value: 1 } }));
      stage.cancel();
      expect(() => stage.wait()).toThrow(/^cpu stage: cancelled$/);
      expect(Array.from(done.w)).toEqual(jobs.map(() => 1));
      stage.cancel(); // nothing pending: a no-op
      stage.query(0).set(jobs[0].q);
      stage.submit(jobs[0].job);
      expect(() => stage.wait()).not.toThrow();
    } finally {
      free();
    }
  });

  it("submit() past queueDepth fails with one line; a selected job cannot queue behind another; allLogits() and gather() need an idle stage", () => {
    using cpu = createCpuBackend({ threads: 2 });
    const { jobs, free } = setUp(cpu);
    try {
      using stage = stageOf(cpu, { readyTimeoutMs: 600_000 });
      const never = words(1), job = { ...jobs[0].job, ready: { address: never.at(0), value: 1 } };
      for (let i = 0; i < stage.queueDepth; i++) stage.submit(job);
      let message = "";
      try {
        stage.submit(job);
      } catch (e) {
        message = (e as Error).message;
      }
      expect(message).toBe(`cpu stage: submit() past the queue depth of ${stage.queueDepth} jobs (wait() first)`);
      const selected: CpuStageJob = { ...jobs[0].job, work: { kind: "selected", selection: { kind: "shared", ids: Int32Array.of(1, 5) } } };
      stage.cancel();
      expect(() => stage.wait()).toThrow(/cancelled/);
      stage.submit(jobs[0].job);
      expect(() => stage.submit(selected)).toThrow(/^cpu stage: a selected job cannot be queued behind another \(wait\(\) first\)$/);
      expect(() => stage.allLogits()).toThrow(/while jobs are pending/);
      expect(() => stage.gather(jobs[0].job, { kind: "shared", ids: Int32Array.of(1) })).toThrow(/while a job is running/);
      stage.wait();
      stage.submit(selected); // first in the queue: fine
      stage.submit(jobs[1].job);
      expect(() => stage.wait()).not.toThrow();
      expect(() => stage.submit({ ...jobs[0].job, done: { address: 6, value: 1 } })).toThrow(/done must be a 4-byte-aligned host address/);
    } finally {
      free();
    }
  });

  it("a score job's done rises with gather() (its selection comes from JS), or when the score job fails", () => {
    using cpu = createCpuBackend({ threads: 2 });
    const { jobs, free } = setUp(cpu);
    try {
      using stage = stageOf(cpu, { readyTimeoutMs: 1 });
      const done = words(2), never = words(1);
      const job: CpuStageJob = { ...jobs[0].job, work: { kind: "score" }, done: { address: done.at(0), value: 9 } };
      stage.query(0).set(jobs[0].q);
      stage.submit(job);
      stage.wait();
      expect(done.w[0]).toBe(0);
      stage.gather(job, { kind: "shared", ids: Int32Array.of(2, 3, 40) });
      expect(done.w[0]).toBe(9);
      stage.submit({ ...job, ready: { address: never.at(0), value: 1 }, done: { address: done.at(1), value: 4 } });
      expect(() => stage.wait()).toThrow(/never signalled/);
      expect(done.w[1]).toBe(4);
    } finally {
      free();
    }
  });

  it("a slot's table is one pinnable block: int32 counts at 0, ids after them (stride kmax), and the logits block is pinnable too", () => {
    using cpu = createCpuBackend({ threads: 2 });
    const { jobs, free } = setUp(cpu);
    try {
      using stage = stageOf(cpu);
      for (const slot of [0, 1] as const) {
        const { job, q } = jobs[slot];
        stage.query(slot).set(q);
        stage.submit(job);
        stage.wait();
        const st = stage.hostStaging(slot), table = st.table!, out = stage.output(slot);
        expect(table.address % 4096, "a block of its own").toBe(0);
        expect(table.byteLength).toBeGreaterThanOrEqual(Math.max(2 << 20, kvHeads * (1 + cap) * 4));
        expect(ptr(out.counts)).toBe(table.address);
        expect(ptr(out.ids)).toBe(table.address + kvHeads * 4);
        const raw = new Int32Array(toArrayBuffer(table.address, 0, kvHeads * (1 + kmax) * 4));
        expect(Array.from(raw.subarray(0, kvHeads))).toEqual(Array.from(out.counts));
        expect(Array.from(raw.subarray(kvHeads))).toEqual(Array.from(out.ids.subarray(0, kvHeads * kmax)));
        for (const r of [st.query, st.logits]) {
          expect(r.address % 4096).toBe(0);
          expect(r.byteLength).toBeGreaterThanOrEqual(2 << 20);
        }
      }
    } finally {
      free();
    }
  });
});

