import { describe, expect, it } from "vitest";
import { ptr } from "bun:ffi";
import type { CpuStageJob, CpuStageWork, Tensor } from "@hybridgen/spec";
import { createCpuBackend, NativeCpuStage, NativeStageGroup, type CpuBackend } from "../src/index.js";
import { randn, rng, SEED } from "./helpers.js";

const heads = 8, kvHeads = 2, headDim = 32, cap = 600, kmax = 24, sequences = 5;
const shape = { heads, kvHeads, headDim, storeCapacity: cap, dtype: "bf16" as const };
const works: CpuStageWork[] = [
  { kind: "topk", budget: kmax, shared: false }, { kind: "quest", budget: kmax - 4, pageSize: 16 },
  { kind: "index", budget: kmax, form: "int8", pageSize: 8, superPages: 4 }, { kind: "streaming", budget: kmax - 2, sinks: 3 },
  { kind: "topk", budget: kmax - 5, shared: true },
];

/** Per sequence: its store and, per layer, a query (layer l on slot l & 1); every sequence a different work and length. */
function setUp(cpu: CpuBackend, layers: number) {
  const r = rng(4401);
  const stores: Tensor[] = [];
  const seqs = Array.from({ length: sequences }, (_, s) => {
    const K = cpu.alloc([kvHeads, cap, headDim], "bf16"), V = cpu.alloc([kvHeads, cap, headDim], "bf16");
    cpu.write(K, randn(r, kvHeads * cap * headDim));
    cpu.write(V, randn(r, kvHeads * cap * headDim));
    stores.push(K, V);
    return Array.from({ length: layers }, (_, l): { job: CpuStageJob; q: Float32Array } => ({
      job: { slot: (l & 1) as 0 | 1, k: K, v: V, offloaded: 500 + 17 * s - l, kmax, scale: 0.17, work: works[(s + l) % works.length]!, storeEpoch: 0 },
      q: randn(r, heads * headDim),
    }));
  });
  return { seqs, free: () => stores.forEach((t) => cpu.free(t)) };
}

function outputs(cpu: CpuBackend, stage: NativeCpuStage, job: CpuStageJob) {
  const o = stage.output(job.slot);
  return {
    ids: Array.from(o.ids.subarray(0, kvHeads * kmax)), counts: Array.from(o.counts),
    logits: Array.from(o.logits.subarray(0, heads * kmax)), values: Array.from(cpu.read(o.values, 0, kvHeads * kmax * headDim)),
  };
}

function words(count: number) {
  const w = new Uint32Array(new SharedArrayBuffer(count * 4));
  return { w, at: (i: number) => ptr(w) + 4 * i };
}

describe(`NativeStageGroup: a batch's stages as lanes of one native stage (seed ${SEED})`, () => {
  it("each layer's jobs of every sequence as one group (one a pool thread) equal each sequence's jobs on a stage of its own; every done rises", () => {
    using cpu = createCpuBackend({ threads: 1 });
    const layers = 4, { seqs, free } = setUp(cpu, layers);
    try {
      const want = seqs.map((jobs) => {
        using own = new NativeCpuStage(cpu, { threads: 2 });
        own.prepare(shape);
        return jobs.map(({ job, q }) => {
          own.query(job.slot).set(q);
          own.submit(job);
          own.wait();
          return outputs(cpu, own, job);
        });
      });
      const group = new NativeStageGroup(cpu, { threads: 3 }, 8);
      const stages = seqs.map(() => new NativeCpuStage(cpu, {}, group));
      try {
        for (const s of stages) s.prepare(shape);
        expect(stages[0]!.threads).toBe(3);
        const done = words(sequences * layers);
        for (let l = 0; l < layers; l++) {
          // Layer l of every sequence deferred, then sent as one group; each waits for its own lane.
          seqs.forEach((jobs, s) => {
            const { job, q } = jobs[l]!;
            stages[s]!.query(job.slot).set(q);
            stages[s]!.submit({ ...job, done: { address: done.at(s * layers + l), value: 100 + l } });
          });
          group.flush();
          seqs.forEach((jobs, s) => {
            stages[s]!.wait();
            expect(group.groupCounts(), `layer ${l}: every group of the light jobs so far ran at once`).toEqual({ atOnce: l + 1, inTurn: 0 });
            expect(Atomics.load(done.w, s * layers + l), `sequence ${s} layer ${l}: done`).toBe(100 + l);
            expect(outputs(cpu, stages[s]!, jobs[l]!.job), `sequence ${s} layer ${l} (${jobs[l]!.job.work.kind})`).toEqual(want[s]![l]);
          });
        }
      } finally {
        for (const s of stages) s.close();
      }
      expect(group.handle, "the last lane closed the native stage").toBeNull();
    } finally {
      free();
    }
  });

  it("a lane's jobs run in order over several groups; a lane that fails (its ready never comes) fails alone, and its wait says so", () => {
    using cpu = createCpuBackend({ threads: 1 });
    const layers = 2, { seqs, free } = setUp(cpu, layers);
    try {
      const group = new NativeStageGroup(cpu, { threads: 2, readyTimeoutMs: 50 }, 4);
      const stages = seqs.slice(0, 3).map(() => new NativeCpuStage(cpu, {}, group));
      const solo = new NativeCpuStage(cpu, { threads: 1 });
      try {
        for (const s of [...stages, solo]) s.prepare(shape);
        const ready = words(1);
        // Lane 0 submits both layers before the group goes: its second job sends the first group, so the lane runs in order.
        for (const l of [0, 1]) {
          stages[0]!.query(seqs[0]![l]!.job.slot).set(seqs[0]![l]!.q);
          stages[0]!.submit(seqs[0]![l]!.job);
        }
        stages[1]!.query(seqs[1]![0]!.job.slot).set(seqs[1]![0]!.q);
        stages[1]!.submit({ ...seqs[1]![0]!.job, ready: { address: ready.at(0), value: 1 } });
        stages[2]!.query(seqs[2]![0]!.job.slot).set(seqs[2]![0]!.q);
        stages[2]!.submit(seqs[2]![0]!.job);
        group.flush();
        expect(() => stages[1]!.wait()).toThrow(/never signalled the query's copy/);
        stages[0]!.wait();
        stages[2]!.wait();
        for (const [s, l] of [[0, 1], [2, 0]] as const) {
          solo.query(seqs[s]![l]!.job.slot).set(seqs[s]![l]!.q);
          solo.submit(seqs[s]![l]!.job);
          solo.wait();
          expect(outputs(cpu, stages[s]!, seqs[s]![l]!.job), `sequence ${s} layer ${l}`).toEqual(outputs(cpu, solo, seqs[s]![l]!.job));
        }
        // The failed lane goes on with its next job.
        stages[1]!.query(seqs[1]![1]!.job.slot).set(seqs[1]![1]!.q);
        stages[1]!.submit(seqs[1]![1]!.job);
        stages[1]!.wait();
        solo.query(seqs[1]![1]!.job.slot).set(seqs[1]![1]!.q);
        solo.submit(seqs[1]![1]!.job);
        solo.wait();
        expect(outputs(cpu, stages[1]!, seqs[1]![1]!.job)).toEqual(outputs(cpu, solo, seqs[1]![1]!.job));
      } finally {
        for (const s of [...stages, solo]) s.close();
      }
    } finally {
      free();
    }
  });

  it("a step's lanes complete a group: lanes attached but idle in the step (a server's free slots) hold no job back, with no flush or wait", () => {
    using cpu = createCpuBackend({ threads: 1 });
    const { seqs, free } = setUp(cpu, 2);
    try {
      const group = new NativeStageGroup(cpu, { threads: 2 }, 8);
      const stages = seqs.slice(0, 4).map(() => new NativeCpuStage(cpu, {}, group));
      try {
        for (const s of stages) s.prepare(shape);
        const done = words(4);
        // Polls the done word as a device would, the host making no call to the group meanwhile.
        const rises = (i: number, value: number) => {
          for (let spins = 0; spins < 20_000 && Atomics.load(done.w, i) !== value; spins++) Bun.sleepSync(1);
          return Atomics.load(done.w, i) === value;
        };
        const submit = (s: number, l: number, i: number, value: number) => {
          const { job, q } = seqs[s]![l]!;
          stages[s]!.query(job.slot).set(q);
          stages[s]!.submit({ ...job, done: { address: done.at(i), value } });
        };
        // A step of one lane of the four attached.
        group.join(null);
        submit(2, 0, 0, 7);
        expect(group.waiting, "a one-lane step's job went at its submit").toBe(0);
        expect(rises(0, 7)).toBe(true);
        stages[2]!.wait();
        // A batched step of lanes 0 and 3: the group goes once both have a job, not before.
        const step = { serial: 41 };
        group.join(step);
        group.join(step);
        submit(0, 0, 1, 8);
        expect(group.waiting).toBe(1);
        submit(3, 0, 2, 9);
        expect(group.waiting, "the step's second lane sent the group").toBe(0);
        expect(rises(1, 8) && rises(2, 9)).toBe(true);
        // The same object's next serial is a new step: the count starts over.
        step.serial++;
        group.join(step);
        submit(1, 1, 3, 10);
        expect(group.waiting).toBe(0);
        expect(rises(3, 10)).toBe(true);
        for (const s of [0, 3, 1]) stages[s]!.wait();
      } finally {
        for (const s of stages) s.close();
      }
    } finally {
      free();
    }
  });

  it("lanes are handed out and taken back; a group with every lane taken, options a group owns on a stage of it, and bad lane counts are one-line errors", () => {
    using cpu = createCpuBackend({ threads: 1 });
    const group = new NativeStageGroup(cpu, { threads: 2 }, 2);
    const a = new NativeCpuStage(cpu, {}, group), b = new NativeCpuStage(cpu, {}, group);
    expect(() => new NativeCpuStage(cpu, {}, group)).toThrow(/all 2 lanes are taken/);
    expect(() => new NativeCpuStage(cpu, { threads: 4 }, group)).toThrow(/threads belongs to the stage group/);
    a.close();
    const c = new NativeCpuStage(cpu, {}, group);
    b.close();
    c.close();
    expect(group.handle).toBeNull();
    expect(() => new NativeStageGroup(cpu, {}, 0)).toThrow(/0 lanes, a group has 1\.\.64/);
    expect(() => new NativeStageGroup(cpu, {}, 65)).toThrow(/65 lanes/);
  });
});
