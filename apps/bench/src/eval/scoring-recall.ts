/**
 * Recall of the CPU stage's two-step top-K on real attention: the share of the exact top-K
 * (per KV head, the stage's full-precision selection) that compressed scoring returns when its
 * best rescore·K candidates are rescored from the full rows. Every decode step of every layer is
 * a measurement: the engine runs exact top-K (true query, exact logits) and each form scores the
 * same query against the same store beside it.
 *
 *   ./bun apps/bench/src/eval/scoring-recall.ts [--model recall-4l|stories15m] [--length 4096] [--prompts 8]
 *     [--window 256] [--sinks 4] [--k-frac 0.05] [--forms int8,int4,sign] [--rescore 1,2,4,8]
 *     [--threads 2] [--json FILE]
 *
 * recall-4l: prompts as apps/bench/src/eval/recall-eval.ts builds them (a haystack of `length` tokens, then
 * `? kA` as two decode steps). stories15m: 240 greedy tokens after "Once upon a time", the
 * window `--window` (default 32 there) and K = k-frac of the offloaded tokens (at least 4).
 * "sign" is a 1-bit sketch (the signs of K times the row's mean |k|), scored here in TypeScript
 * to see whether it would select well; int8 and int4 run the native stage. Run `bun run build`
 * first (this imports the built packages).
 */
import { resolve } from "node:path";
import { writeFileSync } from "node:fs";
import {
  ensureStories15M, LlamaModel, openModelDir,
  type CpuStage, type CpuStageJob, type CpuStageShape, type Selection,
} from "@hybridgen/core";
import { createCpuBackend, NativeCpuStage, sketchRowBytes, type CpuBackend } from "@hybridgen/kernels-cpu";
import { createHybridAttention } from "@hybridgen/runtime";

const arg = (name: string, def: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1]! : def;
};
const list = (name: string, def: string) => arg(name, def).split(",").filter((x) => x !== "");
const MODEL = arg("model", "recall-4l");
const LENGTH = Number(arg("length", "4096")), PROMPTS = Number(arg("prompts", "8"));
const WINDOW = Number(arg("window", MODEL === "stories15m" ? "32" : "256")), SINKS = Number(arg("sinks", "4"));
const K_FRAC = Number(arg("k-frac", "0.05")), THREADS = Number(arg("threads", "2"));
const FORMS = list("forms", "int8,int4,sign") as ("int8" | "int4" | "sign")[];
const RESCORE = list("rescore", "1,2,4,8").map(Number);

/** hits / wanted per (form, rescore factor) */
const tally = new Map<string, { hit: number; want: number; worst: number }>();
const key = (form: string, c: number) => `${form} ${c}`;
function count(form: string, c: number, hit: number, want: number): void {
  const t = tally.get(key(form, c)) ?? { hit: 0, want: 0, worst: 1 };
  t.hit += hit;
  t.want += want;
  if (want > 0) t.worst = Math.min(t.worst, hit / want);
  tally.set(key(form, c), t);
}

/** Indices of the k largest of x[0..n) (ties to the lower index), ascending. */
function topK(x: ArrayLike<number>, n: number, k: number): number[] {
  const idx = Array.from({ length: n }, (_, i) => i);
  idx.sort((a, b) => (x[b] > x[a] ? 1 : x[b] < x[a] ? -1 : a - b));
  return idx.slice(0, Math.min(k, n)).sort((a, b) => a - b);
}

/** The engine's stage (full scoring, exact top-K), with every form scoring the same jobs beside it. */
class RecallStage implements CpuStage {
  readonly name = "recall";
  readonly concurrent = false;
  private readonly main: NativeCpuStage;
  private readonly shadows: { form: string; c: number; stage: NativeCpuStage }[] = [];
  private shape: CpuStageShape | null = null;
  private job: CpuStageJob | null = null;

  constructor(private readonly be: CpuBackend, main: CpuStage) {
    if (!(main instanceof NativeCpuStage)) throw new Error(`recall: the engine's stage must be the native one, got ${main.name}`);
    this.main = main;
    for (const form of FORMS) {
      if (form === "sign") continue;
      for (const c of RESCORE) this.shadows.push({ form, c, stage: new NativeCpuStage(be, { threads: THREADS, scoring: form, rescoreFactor: c }) });
    }
  }
  get primitives() { return this.main.primitives; }
  prepare(shape: CpuStageShape): void {
    this.shape = shape;
    this.main.prepare(shape);
    for (const s of this.shadows) s.stage.prepare(shape);
  }
  query(slot: 0 | 1): Float32Array { return this.main.query(slot); }
  submit(job: CpuStageJob): void { this.job = job; this.main.submit(job); }
  wait(): number {
    const ms = this.main.wait();
    if (this.job?.work.kind === "topk") this.measure(this.job, this.job.work.budget);
    return ms;
  }
  allLogits(): readonly Float32Array[] { return this.main.allLogits(); }
  gather(job: CpuStageJob, selection: Selection): void { this.main.gather(job, selection); }
  output(slot: 0 | 1) { return this.main.output(slot); }
  lastSplit() { return this.main.lastSplit(); }
  offloadedKeys(k: Parameters<NativeCpuStage["offloadedKeys"]>[0]) { return this.main.offloadedKeys(k); }
  close(): void {
    this.main.close();
    for (const s of this.shadows) s.stage.close();
  }
  [Symbol.dispose](): void { this.close(); }

  private measure(job: CpuStageJob, budget: number): void {
    const { heads, kvHeads, headDim: d, storeCapacity: cap } = this.shape!, group = heads / kvHeads, n = job.offloaded;
    const want = this.main.output(job.slot), kmax = job.kmax;
    const exactOf = (g: number) => new Set(Array.from(want.ids.subarray(g * kmax, g * kmax + want.counts[g]!)));
    const q = this.main.query(job.slot);
    for (const s of this.shadows) {
      s.stage.query(job.slot).set(q);
      s.stage.submit(job);
      s.stage.wait();
      const got = s.stage.output(job.slot);
      let hit = 0, total = 0;
      for (let g = 0; g < kvHeads; g++) {
        const ex = exactOf(g);
        total += ex.size;
        for (let i = 0; i < got.counts[g]!; i++) if (ex.has(got.ids[g * kmax + i]!)) hit++;
      }
      count(s.form, s.c, hit, total);
    }
    if (!FORMS.includes("sign")) return;
    // 1-bit sketch in TypeScript: mean|k| · Σ q_i sgn(k_i), group max; candidates rescored with the exact logits
    const K = this.be.read(job.k), logits = this.main.allLogits();
    for (let g = 0; g < kvHeads; g++) {
      const approx = new Float32Array(n), exact = new Float32Array(n);
      for (let j = 0; j < n; j++) {
        const row = (g * cap + j) * d;
        let mean = 0;
        for (let i = 0; i < d; i++) mean += Math.abs(K[row + i]!);
        mean /= d;
        let best = -Infinity, ex = -Infinity;
        for (let h = g * group; h < (g + 1) * group; h++) {
          let dot = 0;
          for (let i = 0; i < d; i++) dot += K[row + i]! >= 0 ? q[h * d + i]! : -q[h * d + i]!;
          best = Math.max(best, dot * mean);
          ex = Math.max(ex, logits[h]![j]!);
        }
        approx[j] = best;
        exact[j] = ex;
      }
      const ex = exactOf(g);
      for (const c of RESCORE) {
        const cand = topK(approx, n, Math.min(n, c * budget));
        const candExact = cand.map((j) => exact[j]!);
        const chosen = topK(candExact, cand.length, budget).map((i) => cand[i]!);
        count("sign", c, chosen.filter((j) => ex.has(j)).length, ex.size);
      }
    }
  }
}

using be = createCpuBackend({ threads: THREADS });
let shape = "";
if (MODEL === "stories15m") {
  using files = openModelDir(await ensureStories15M({ onProgress: (m) => console.error(m) }));
  const maxContext = 256;
  using model = LlamaModel.load(files, be, { maxContext, gpuKvBudget: WINDOW, sinkTokens: SINKS, kvEvictBlock: Math.min(16, WINDOW - SINKS) });
  const k = Math.max(4, Math.round(K_FRAC * (maxContext - WINDOW)));
  using ha = await createHybridAttention(model, be, {
    selector: "topk", scheduler: "fixed", k, timing: "post", logits: "exact", cpuStageThreads: THREADS, cpuStage: (main) => new RecallStage(be, main),
  });
  const prompt = files.tokenizer.encode("Once upon a time", { addBos: true });
  let logits = model.forward(Int32Array.from(prompt), 0);
  for (let t = prompt.length; t < 240; t++) {
    let b = 0;
    for (let i = 1; i < logits.length; i++) if (logits[i]! > logits[b]!) b = i;
    logits = model.forward(Int32Array.of(b), t);
  }
  shape = `stories15M (6 heads × 48, MHA), 240 tokens greedy, window ${WINDOW} with ${SINKS} sinks, K = ${k}, ${ha.stats.layerSteps} layer steps`;
} else {
  const dir = resolve(new URL("../../../../../shared/models/recall-4l", import.meta.url).pathname);
  using files = openModelDir(dir);
  const vocab = (w: string) => files.tokenizer.encode(w, { addBos: false })[0]!;
  const FILLERS = Array.from({ length: 1000 }, (_, i) => vocab(`f${i}`)), KEYS = Array.from({ length: 256 }, (_, i) => vocab(`k${i}`));
  const VALUES = Array.from({ length: 256 }, (_, i) => vocab(`v${i}`)), DOT = vocab("."), ASK = vocab("?");
  const BOS = files.tokenizer.encode("", { addBos: true })[0]!;
  let seed = 12345;
  const rand = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 4294967296);
  using model = LlamaModel.load(files, be, { maxContext: LENGTH, gpuKvBudget: WINDOW, sinkTokens: SINKS, kvEvictBlock: 16 });
  const k = Math.max(1, Math.round(K_FRAC * LENGTH));
  for (let p = 0; p < PROMPTS; p++) {
    const body = LENGTH - 3, records = 128, share = Math.floor(body / records);
    const context = Array.from({ length: body }, () => FILLERS[Math.floor(rand() * FILLERS.length)]!);
    const keys = [...new Set(Array.from({ length: 400 }, () => Math.floor(rand() * KEYS.length)))].slice(0, records);
    keys.forEach((kk, i) => context.splice(i * share + Math.floor(rand() * (share - 3)), 3, KEYS[kk]!, VALUES[Math.floor(rand() * 256)]!, DOT));
    model.reset();
    model.forward(Int32Array.from([BOS, ...context]), 0);
    using ha = await createHybridAttention(model, be, {
      selector: "topk", scheduler: "fixed", k, timing: "post", logits: "exact", cpuStageThreads: THREADS, cpuStage: (main) => new RecallStage(be, main),
    });
    model.forward(Int32Array.of(ASK), body + 1);
    model.forward(Int32Array.of(KEYS[keys[Math.floor(rand() * keys.length)]!]!), body + 2);
    process.stderr.write(`\rprompt ${p + 1}/${PROMPTS}`);
  }
  process.stderr.write("\n");
  shape = `recall-4l (8 heads / 2 KV × 32), ${PROMPTS} prompts of ${LENGTH} tokens, the two decode steps × 4 layers each, window ${WINDOW} with ${SINKS} sinks, K = ${k}`;
}

const d = MODEL === "stories15m" ? 48 : 32;
console.log(`Recall of the exact top-K, ${shape}:`);
console.log("| form | bytes/row (bf16 = " + 2 * d + ") | rescore c | recall | worst job |");
console.log("| --- | ---: | ---: | ---: | ---: |");
const out: Record<string, unknown>[] = [];
for (const form of FORMS)
  for (const c of RESCORE) {
    const t = tally.get(key(form, c));
    if (!t) continue;
    const rb = form === "sign" ? Math.ceil(d / 8) + 4 : sketchRowBytes(form, d);
    console.log(`| ${form} | ${rb} | ${c} | ${(t.hit / t.want).toFixed(4)} | ${t.worst.toFixed(3)} |`);
    out.push({ form, rowBytes: rb, rescore: c, recall: t.hit / t.want, worst: t.worst });
  }
const json = arg("json", "");
if (json) writeFileSync(json, `${JSON.stringify({ shape, results: out }, null, 2)}\n`);
