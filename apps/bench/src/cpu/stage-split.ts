/**
 * Where the hybrid CPU stage's time goes on one layer of Llama-3.1-8B's offloaded store
 * (8 KV heads × 128 dims, 32 query heads, bf16), with the stage's per-phase split:
 *   ./bun apps/bench/src/cpu/stage-split.ts [--tokens 28704] [--layers 8] [--threads N] [--ks 256,1024] [--rounds 5] [--spinners 0]
 *     [--scoring full,int8,int4] [--rescore-factor 4] [--jobs score,topk] [--quest 16]
 * --scoring adds top-K rows per form of two-step scoring (compressed copies scored first,
 * rescore-factor·K candidates rescored from the full rows); "K MB read" counts the bytes those read.
 * Both are the runtime's options, parsed and bounded by its schema (args.ts).
 * Jobs rotate over `layers` distinct stores (8 × 58.8 MB at 28.7K tokens: more than an L3), as a
 * decode step's 32 layers do, and are compared with a streaming sum over the same K bytes and
 * with the logits alone ("score"). Reported: medians over rounds of the per-layer mean.
 * --spinners N runs N busy processes meanwhile: a thread that never sleeps (the host thread
 * driving a GPU, Bun's main thread launching kernels) competing with the stage for the cores.
 * --jobs picks the top-K table's rows (score, topk); --quest P adds Quest pages of P tokens at each
 * K: the selection in JS on the driving thread (core's questSelection on the stage's primitives, as
 * quest's select() runs it, then a "selected" job) against the stage's quest kernel (one job).
 */
import { questPages, questSelection, validateSelection, type CpuStageJob, type CpuStageSplit, type QuestPageState, type Tensor } from "@hybridgen/spec";
import { cpus } from "node:os";
import { createCpuBackend, NativeCpuStage, sketchRowBytes, type Scoring } from "@hybridgen/kernels-cpu";
import { arg, hybridArg, hybridList } from "../args.js";
import { filledTensor } from "./measure.js";

const n = Number(arg("tokens", "28704"));
const layers = Number(arg("layers", "8"));
const threads = Number(arg("threads", String(cpus().length)));
const ks = arg("ks", "256,1024").split(",").map(Number);
const rounds = Number(arg("rounds", "5"));
const scorings = hybridList("scoring", "full") as Scoring[];
const rescore = hybridArg("rescore-factor", 4);
const jobs = arg("jobs", "score,topk").split(",");
const questPage = Number(arg("quest", "0"));
const spinners = Array.from({ length: Number(arg("spinners", "0")) }, () => Bun.spawn(["bun", "-e", "for (;;) {}"], { stdout: "ignore", stderr: "ignore" }));
process.on("exit", () => { for (const p of spinners) p.kill(); });
const KV = 8, HEADS = 32, D = 128;
const kBytes = KV * n * D * 2;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];

using be = createCpuBackend({ threads });
const stages = new Map<Scoring, NativeCpuStage>();
for (const scoring of new Set<Scoring>(["full", ...scorings])) {
  const s = new NativeCpuStage(be, { threads, scoring, rescoreFactor: rescore });
  s.prepare({ heads: HEADS, kvHeads: KV, headDim: D, storeCapacity: n, dtype: "bf16" });
  stages.set(scoring, s);
}
let stage = stages.get("full")!;
const K: Tensor[] = [], V: Tensor[] = [];
for (let l = 0; l < layers; l++) {
  K.push(filledTensor(be, [KV, n, D], "bf16", 0.37 + l * 0.01));
  V.push(filledTensor(be, [KV, n, D], "bf16", 0.41 + l * 0.01));
}
const q = Float32Array.from({ length: HEADS * D }, (_, i) => Math.cos(i * 1.3) * 0.3);
for (const s of stages.values()) s.query(0).set(q);

interface Row { what: string; ms: number; split: CpuStageSplit; readMB: number }
const rows: Row[] = [];

function measure(what: string, work: CpuStageJob["work"], kmax: number): void {
  const per: number[] = [], parts: CpuStageSplit[] = [];
  for (let r = 0; r < rounds + 1; r++) {
    let busy = 0;
    const sum = { scoreMs: 0, selectMs: 0, gatherMs: 0, handoffMs: 0 };
    for (let l = 0; l < layers; l++) {
      stage.submit({ slot: 0, k: K[l], v: V[l], offloaded: n, kmax, scale: 1 / Math.sqrt(D), work });
      busy += stage.wait();
      const s = stage.lastSplit();
      sum.scoreMs += s.scoreMs; sum.selectMs += s.selectMs; sum.gatherMs += s.gatherMs; sum.handoffMs += s.handoffMs;
    }
    if (r === 0) continue; // warm-up round
    per.push(busy / layers);
    parts.push({ scoreMs: sum.scoreMs / layers, selectMs: sum.selectMs / layers, gatherMs: sum.gatherMs / layers, handoffMs: sum.handoffMs / layers });
  }
  const ms = median(per);
  const pick = (f: (s: CpuStageSplit) => number) => median(parts.map(f));
  const kb = stage.scoring === "full" ? kBytes : KV * n * sketchRowBytes(stage.scoring, D) + KV * Math.min(n, rescore * kmax) * D * 2;
  rows.push({ what, ms, readMB: kb / 1e6, split: { scoreMs: pick((s) => s.scoreMs), selectMs: pick((s) => s.selectMs), gatherMs: pick((s) => s.gatherMs), handoffMs: pick((s) => s.handoffMs) } });
}

const streams: number[] = [];
{
  const plain = Array.from({ length: layers }, (_, l) => filledTensor(be, [kBytes / 4], "f32", 0.29 + l * 0.01)); // as many bytes, f32
  for (let r = 0; r < rounds + 1; r++) {
    const t0 = Bun.nanoseconds();
    for (let l = 0; l < layers; l++) be.streamSum(plain[l]);
    if (r > 0) streams.push((kBytes * layers) / ((Bun.nanoseconds() - t0) / 1e9) / 1e9);
  }
  for (const t of plain) be.free(t);
}
if (jobs.includes("score")) measure("score only", { kind: "score" }, 0);
if (jobs.includes("topk")) {
  for (const k of ks) measure(`top-${k} per KV head`, { kind: "topk", budget: k, shared: false }, k);
  measure(`top-${ks[0]} shared`, { kind: "topk", budget: ks[0], shared: true }, ks[0]);
  measure("all (shared, K = n)", { kind: "topk", budget: n, shared: true }, n);
}

interface QuestRow { k: number; jsMs: number; jsJobMs: number; kernelMs: number; pagesMs: number; firstJsMs: number; firstKernelMs: number }
const questRows: QuestRow[] = [];

/** Quest at K: per layer, the JS selection and its "selected" job, then the quest kernel's job (same ids, checked). */
function measureQuest(k: number): void {
  const P = stage.primitives!, group = HEADS / KV, job = (work: CpuStageJob["work"], l: number): CpuStageJob =>
    ({ slot: 0, k: K[l], v: V[l], offloaded: n, kmax: k, scale: 1 / Math.sqrt(D), work, storeEpoch: k }); // a new epoch: the kernel summarizes afresh, as JS does
  const states: QuestPageState[] = K.map(() => ({ pages: null, summarized: 0 }));
  const bounds = new Float32Array(KV * Math.ceil(n / questPage));
  const js: number[] = [], jsJob: number[] = [], kern: number[] = [], pages: number[] = [];
  let firstJs = 0, firstKernel = 0;
  for (let r = 0; r < rounds + 1; r++) {
    let a = 0, b = 0, c = 0, p = 0;
    for (let l = 0; l < layers; l++) {
      const t0 = Bun.nanoseconds(), keys = stage.offloadedKeys!(K[l]);
      const chosen = questSelection(P, q, group, keys, questPages(P, states[l], keys, n, questPage), n, k, bounds);
      const selection = validateSelection(chosen, { offloaded: n, kvHeads: KV, k });
      a += (Bun.nanoseconds() - t0) / 1e6;
      stage.submit(job({ kind: "selected", selection }, l));
      b += stage.wait();
      const want = stage.output(0).ids.slice(0, KV * k);
      stage.submit(job({ kind: "quest", budget: k, pageSize: questPage }, l));
      c += stage.wait();
      p += stage.lastSplit().selectMs;
      if (r === 0 && !stage.output(0).ids.subarray(0, KV * k).every((x, i) => x === want[i])) throw new Error(`quest kernel and JS chose differently (layer ${l}, K ${k})`);
    }
    if (r === 0) { firstJs = a / layers; firstKernel = c / layers; continue; } // the first round summarizes every row
    js.push(a / layers); jsJob.push(b / layers); kern.push(c / layers); pages.push(p / layers);
  }
  questRows.push({ k, jsMs: median(js), jsJobMs: median(jsJob), kernelMs: median(kern), pagesMs: median(pages), firstJsMs: firstJs, firstKernelMs: firstKernel });
}
if (questPage > 0) for (const k of ks) measureQuest(k);
for (const scoring of scorings.filter((x) => x !== "full")) {
  stage = stages.get(scoring)!;
  for (const k of ks) measure(`${scoring}, ${rescore}·K rescored: top-${k} per KV head`, { kind: "topk", budget: k, shared: false }, k);
}

console.log(`CPU stage split: ${n} tokens × ${KV} KV heads × ${D} bf16 (K ${(kBytes / 1e6).toFixed(1)} MB a layer), ${layers} layers rotating, ${threads} stage threads, ${spinners.length} busy processes, ${cpus().length} cores`);
console.log(`streaming sum over the same K bytes: ${median(streams).toFixed(1)} GB/s`);
console.log("| job | ms/layer | K GB/s (whole job) | score ms | top-K ms | gather ms | hand-offs ms | score GB/s | K MB read |");
console.log("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
for (const r of rows) {
  const s = r.split;
  console.log(`| ${r.what} | ${r.ms.toFixed(3)} | ${(kBytes / r.ms / 1e6).toFixed(1)} | ${s.scoreMs.toFixed(3)} | ${s.selectMs.toFixed(3)} | ${s.gatherMs.toFixed(3)} | ${s.handoffMs.toFixed(3)} | ${(r.readMB / s.scoreMs).toFixed(1)} | ${r.readMB.toFixed(1)} |`);
}
if (questRows.length) {
  console.log(`\nQuest, pages of ${questPage} (${Math.ceil(n / questPage)} a KV head): JS selection on the driving thread + its "selected" job, against the stage's quest kernel (ms a layer)`);
  console.log("| K | JS select (driving thread) | selected job | JS path total | quest kernel job | its pages phase | first job, JS / kernel (all rows summarized) |");
  console.log("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
  for (const r of questRows) {
    console.log(`| ${r.k} | ${r.jsMs.toFixed(3)} | ${r.jsJobMs.toFixed(3)} | ${(r.jsMs + r.jsJobMs).toFixed(3)} | ${r.kernelMs.toFixed(3)} | ${r.pagesMs.toFixed(3)} | ${r.firstJsMs.toFixed(1)} / ${r.firstKernelMs.toFixed(1)} |`);
  }
}
for (const s of stages.values()) s.close();
for (const t of [...K, ...V]) be.free(t);
for (const p of spinners) p.kill();
