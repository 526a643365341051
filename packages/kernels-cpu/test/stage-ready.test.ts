import { describe, expect, it } from "vitest";
import { ptr } from "bun:ffi";
import type { CpuStageJob } from "@hybridgen/spec";
import { createCpuBackend, NativeCpuStage } from "../src/index.js";
import { randn, rng, SEED } from "./helpers.js";

const heads = 8, kvHeads = 2, headDim = 32, cap = 300, n = 280, kmax = 16;

/** A stage with a store, and the top-K job a device's hybrid step would submit for slot 0. */
function setUp(readyTimeoutMs?: number) {
  const cpu = createCpuBackend({ threads: 2 });
  const stage = new NativeCpuStage(cpu, { threads: 2, ...(readyTimeoutMs ? { readyTimeoutMs } : {}) });
  stage.prepare({ heads, kvHeads, headDim, storeCapacity: cap, dtype: "bf16" });
  const r = rng(SEED);
  const K = cpu.alloc([kvHeads, cap, headDim], "bf16"), V = cpu.alloc([kvHeads, cap, headDim], "bf16");
  cpu.write(K, randn(r, kvHeads * cap * headDim));
  cpu.write(V, randn(r, kvHeads * cap * headDim));
  const job: CpuStageJob = { slot: 0, k: K, v: V, offloaded: n, kmax, scale: 0.17, work: { kind: "topk", budget: kmax, shared: false } };
  const done = () => {
    stage.close();
    cpu.free(K);
    cpu.free(V);
    cpu.close();
  };
  return { stage, job, q: randn(r, heads * headDim), done };
}

describe(`NativeCpuStage: a job with a ready signal reads its query only once the word reaches the value (seed ${SEED})`, () => {
  it("waits for the word, modulo 2^32, and then gives the result of the query written meanwhile", () => {
    const { stage, job, q, done } = setUp();
    try {
      stage.query(0).set(q);
      stage.submit(job);
      stage.wait();
      const want = Array.from(stage.output(0).ids.subarray(0, kvHeads * kmax));
      for (const [before, value] of [[0, 1], [0xfffffffe, 0xffffffff], [0xffffffff, 0]] as const) {
        const word = new Uint32Array(16);
        word[0] = before;
        stage.query(0).fill(0); // what the stage would read if it did not wait
        stage.submit({ ...job, ready: { address: ptr(word), value } });
        Bun.sleepSync(20);
        stage.query(0).set(q); // the device's copy lands…
        word[0] = value; // …then its signal
        stage.wait();
        expect(Array.from(stage.output(0).ids.subarray(0, kvHeads * kmax)), `word ${before} → ${value}`).toEqual(want);
        expect(stage.lastSplit().handoffMs, "the wait for the device is not a hand-off").toBeLessThan(15);
      }
    } finally {
      done();
    }
  });

  it("fails with one line when the signal never comes, and runs the next job", () => {
    const { stage, job, q, done } = setUp(30);
    try {
      const word = new Uint32Array(16);
      stage.query(0).set(q);
      stage.submit({ ...job, ready: { address: ptr(word), value: 5 } });
      expect(() => stage.wait()).toThrow(/never signalled the query's copy \(waited 0\.0 s for value 5, the word holds 0\)/);
      stage.submit(job);
      expect(() => stage.wait()).not.toThrow();
    } finally {
      done();
    }
  });

  it("rejects a ready signal that is not an aligned address and a 32-bit value", () => {
    const { stage, job, done } = setUp();
    try {
      expect(() => stage.submit({ ...job, ready: { address: 6, value: 1 } })).toThrow(/ready must be a 4-byte-aligned host address/);
      expect(() => stage.submit({ ...job, ready: { address: 64, value: 2 ** 32 } })).toThrow(/ready must be/);
    } finally {
      done();
    }
  });
});
