/**
 * Where a greedy decode step fed on the device spends its time (preset:llama-3.1-8b, dummy bf16
 * weights, bf16 KV, batch 1):
 *   - wall ms/token of the fed loop as bench.ts times it (no events in the stream);
 *   - the same loop with CUDA events around each part, read after the loop (nothing waits in it):
 *     "step" = the blob upload + the step's graph, "pick" = the greedy pick and what it queues on
 *     the compute stream; step + pick against the wall clock says how long the device idles;
 *   - norm + lm_head alone in a graph (4 launches on 4 copies of the head, so L2 holds none).
 * Usage:
 *   bun step-split.js [--contexts 2048,8192] [--steps 64]
 */
import { dummyModelFiles, loadModel, presetConfig } from "@hybridgen/core";
import { createCudaBackend, cudaAvailability, describeCudaAvailability, type CudaTimer } from "@hybridgen/kernels-cuda";
import { createNativeRandomFill } from "@hybridgen/kernels-cpu";
import { llamaBf16Sizes } from "../models.js";
import { inGraphUs } from "./in-graph.js";
import { writeRepeating } from "./fill.js";
import { arg } from "../args.js";

const contexts = arg("contexts", "2048,8192").split(",").map(Number);
const steps = Number(arg("steps", "64"));
const preset = "llama-3.1-8b";

const a = cudaAvailability();
console.log(describeCudaAvailability(a));
if (!a.available) process.exit(1);
const cuda = createCudaBackend({ arenaFraction: 0.92 });
const bw = cuda.copyBandwidth(2 ** 31, 10);
const json = presetConfig(preset);
const { hidden, vocab, weightBytes, kvBytesPerToken } = llamaBf16Sizes(json);
console.log(`D2D copy ${(bw / 1e12).toFixed(2)} TB/s`);

// norm + lm_head in a step graph
const chunk = new Float32Array(1 << 20);
for (let i = 0; i < chunk.length; i++) chunk[i] = Math.sin(i * 12.9898) * 0.05;
{
  const heads = Array.from({ length: 4 }, () => {
    const w = cuda.alloc([vocab, hidden], "bf16");
    writeRepeating(cuda, w, chunk, vocab * hidden);
    return w;
  });
  const x = cuda.alloc([1, hidden]), nw = cuda.alloc([hidden], "bf16"), o = cuda.alloc([1, vocab]);
  cuda.write(x, chunk.subarray(0, hidden));
  cuda.write(nw, chunk.subarray(0, hidden).map((v) => 1 + v));
  const us = inGraphUs(cuda, "split-head", (l) => cuda.matvec(o, x, heads[l], { normWeight: nw, normEps: 1e-5 }), 4, 10);
  const bytes = vocab * hidden * 2;
  console.log(`norm + lm_head in a graph: ${us.toFixed(1)} µs (${(bytes / (us / 1e6) / 1e12).toFixed(2)} TB/s; at the D2D rate ${((bytes / bw) * 1e6).toFixed(1)} µs)`);
  for (const t of [...heads, x, nw, o]) cuda.free(t);
}

const maxContext = Math.max(...contexts) + 2 * steps + 8;
using files = dummyModelFiles(json, "bf16", 1, createNativeRandomFill(), `preset:${preset}`);
using model = loadModel(files, cuda, { maxContext, kvDtype: "bf16" });
const rows = ["| context | run | wall ms/token | floor ms | with events: wall | step (upload + graph) | pick | device idle |", "| --- | --- | --- | --- | --- | --- | --- | --- |"];
const timers = (n: number): CudaTimer[] => Array.from({ length: n }, () => cuda.timer());

for (const ctx of contexts) {
  for (const name of ["first", "second"]) {
    model.reset();
    model.step(Int32Array.from({ length: ctx }, (_, i) => (i * 7919 + 13) % vocab), 0);
    model.argmaxLogits();
    let pos = ctx;
    model.pickToFeed(0);
    model.stepFed(pos++);
    model.pickToFeed(1);
    model.fedToken(0);
    // the fed loop as generate and bench.ts run it
    let t0 = performance.now();
    for (let s = 1; s < steps; s++) {
      model.stepFed(pos++);
      model.pickToFeed((s + 1) & 1);
      model.fedToken(s & 1);
    }
    const wall = (performance.now() - t0) / (steps - 1);
    // the same with events around each part
    const tStep = timers(steps), tPick = timers(steps);
    t0 = performance.now();
    for (let s = 1; s < steps; s++) {
      tStep[s].mark();
      model.stepFed(pos++);
      tStep[s].mark();
      tPick[s].mark();
      model.pickToFeed((s + 1) & 1);
      tPick[s].mark();
      model.fedToken(s & 1);
    }
    model.fedToken((steps) & 1);
    const wallEv = (performance.now() - t0) / (steps - 1);
    let stepMs = 0, pickMs = 0;
    for (let s = 1; s < steps; s++) {
      stepMs += tStep[s].ms();
      pickMs += tPick[s].ms();
    }
    for (const t of [...tStep, ...tPick]) t.close();
    stepMs /= steps - 1;
    pickMs /= steps - 1;
    const floor = ((weightBytes + kvBytesPerToken * (ctx + steps)) / bw) * 1e3;
    const us = (ms: number) => `${(ms * 1e3).toFixed(1)} µs`;
    rows.push(`| ${ctx} | ${name} | ${wall.toFixed(3)} | ${floor.toFixed(2)} | ${wallEv.toFixed(3)} | ${stepMs.toFixed(3)} ms | ${us(pickMs)} | ${us(wallEv - stepMs - pickMs)} |`);
    console.log(rows[rows.length - 1]);
  }
}
console.log(`\n## step split, ${preset} bf16 dummy weights, ${steps - 1} fed steps a row`);
for (const r of rows) console.log(r);
model.close();
cuda.close();
