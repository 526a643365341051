import { describe, expect, it } from "vitest";
import { type Backend, type CpuStage, type CpuStageJob, type CpuStageWork, type Selection, type Tensor } from "@hybridgen/spec";
import { BackendCpuStage, ReferenceBackend } from "@hybridgen/spec/kit";
import { createCpuBackend, NativeCpuStage } from "../src/index.js";
import { randn, rng, SEED } from "./helpers.js";

const heads = 8, kvHeads = 2, headDim = 32, cap = 300, n = 280, kmax = 24;
const SENTINEL = 7.25; // what the staging rows hold before a deviceGather job: it must leave them so

function run(stage: CpuStage, job: CpuStageJob, js?: Selection): void {
  stage.submit(job);
  stage.wait();
  if (job.work.kind === "score" && js) stage.gather(job, js);
}

function selection(r: () => number): Selection {
  const ids = Array.from({ length: kvHeads }, (_, g) => {
    const set = new Set<number>();
    while (set.size < (g === 0 ? kmax : kmax - 5)) set.add(Math.floor(r() * n));
    return Int32Array.from([...set].sort((a, b) => a - b));
  });
  return { kind: "perKvHead", ids };
}

/** Every work kind a stage runs, each with its width. */
function works(r: () => number): [string, CpuStageWork, number, Selection?][] {
  return [
    ["topk", { kind: "topk", budget: kmax, shared: false }, kmax],
    ["topk shared", { kind: "topk", budget: kmax, shared: true }, kmax],
    ["all", { kind: "topk", budget: n, shared: true }, n],
    ["quest kernel", { kind: "quest", budget: kmax, pageSize: 16 }, kmax],
    ["selected", { kind: "selected", selection: selection(r) }, kmax],
    ["score + JS gather", { kind: "score" }, kmax, selection(r)],
  ];
}

function checkStage(name: string, be: Backend, stage: CpuStage): void {
  const r = rng(71);
  stage.prepare({ heads, kvHeads, headDim, storeCapacity: cap, dtype: "bf16", stageKeys: true });
  const K = be.alloc([kvHeads, cap, headDim], "bf16"), V = be.alloc([kvHeads, cap, headDim], "bf16");
  be.write(K, randn(r, kvHeads * cap * headDim));
  be.write(V, randn(r, kvHeads * cap * headDim));
  const q = randn(r, heads * headDim);
  for (const [what, work, width, js] of works(r)) {
    const job: CpuStageJob = { slot: 1, k: K, v: V, offloaded: n, kmax: width, scale: 0.17, work, keys: true, storeEpoch: 0 };
    stage.query(1).set(q);
    run(stage, job, js);
    const want = stage.output(1);
    const ids = Array.from(want.ids.subarray(0, kvHeads * width)), counts = Array.from(want.counts), logits = Float32Array.from(want.logits.subarray(0, heads * width));
    // Fill the row buffers with a sentinel: a deviceGather job must not write a byte of them.
    const fill = new Float32Array(kvHeads * width * headDim).fill(SENTINEL);
    be.write(want.values, fill);
    be.write(want.keys!, fill);
    run(stage, { ...job, deviceGather: true }, js);
    const got = stage.output(1), label = `${name} ${what}`;
    expect(Array.from(got.ids.subarray(0, kvHeads * width)), label).toEqual(ids);
    expect(Array.from(got.counts), label).toEqual(counts);
    expect(Buffer.compare(Buffer.from(got.logits.buffer, got.logits.byteOffset, heads * width * 4), Buffer.from(logits.buffer)), label).toBe(0);
    expect(be.read(got.values, 0, fill.length).every((x) => x === SENTINEL), `${label}: V rows untouched`).toBe(true);
    if (got.keys) expect(be.read(got.keys, 0, fill.length).every((x) => x === SENTINEL), `${label}: K rows untouched`).toBe(true);
    const split = stage.lastSplit?.();
    if (split) {
      // Nothing is copied: a selected job's remaining phase is its selected logits (scoring); top-K's is the logits copy.
      if (work.kind === "selected" || work.kind === "quest") expect(split.gatherMs, label).toBe(0);
      else expect(split.gatherMs, label).toBeLessThan(5);
    }
  }
  stage.close();
  be.free(K);
  be.free(V);
}

describe(`deviceGather: the stage writes ids, counts and logits, and leaves the row buffers alone (seed ${SEED})`, () => {
  it("NativeCpuStage (full and int8 scoring), every work kind", () => {
    using cpu = createCpuBackend({ threads: 2 });
    checkStage("native", cpu, new NativeCpuStage(cpu, { threads: 2 }));
    checkStage("native int8", cpu, new NativeCpuStage(cpu, { threads: 2, scoring: "int8", rescoreFactor: 2 }));
  });

  it("BackendCpuStage, every work kind", () => {
    const ref = new ReferenceBackend();
    checkStage("backend", ref, new BackendCpuStage(ref));
  });

  it("without deviceGather the rows are copied (the sentinel is overwritten)", () => {
    using cpu = createCpuBackend({ threads: 1 });
    using stage = new NativeCpuStage(cpu, { threads: 1 });
    stage.prepare({ heads, kvHeads, headDim, storeCapacity: cap, dtype: "f32" });
    const r = rng(5), K = cpu.alloc([kvHeads, cap, headDim]), V = cpu.alloc([kvHeads, cap, headDim]);
    cpu.write(V, randn(r, kvHeads * cap * headDim));
    const job: CpuStageJob = { slot: 0, k: K, v: V, offloaded: n, kmax, scale: 1, work: { kind: "topk", budget: kmax, shared: false } };
    run(stage, job);
    const values: Tensor = stage.output(0).values;
    cpu.write(values, new Float32Array(kvHeads * kmax * headDim).fill(SENTINEL));
    run(stage, job);
    expect(cpu.read(values, 0, kvHeads * kmax * headDim).some((x) => x === SENTINEL)).toBe(false);
    cpu.free(K);
    cpu.free(V);
  });
});
