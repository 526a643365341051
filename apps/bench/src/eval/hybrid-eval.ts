/**
 * Hybrid attention accuracy on stories15M (./bun apps/bench/src/eval/hybrid-eval.ts [--budget 32] [--tokens 256]):
 *
 * - "all" + exact logits with a 32-token device window must reproduce full attention's greedy
 *   text exactly over 256 tokens;
 * - teacher-forced over a TinyStories-style text written for this project, top-1 next-token
 *   agreement and mean KL(full ‖ hybrid) for K ∈ {8, 16, 32, 64}, post-QKᵀ exact top-K, in every
 *   logits mode (plus StreamingLLM pre-QKᵀ and "all" as reference rows);
 * Run `bun run build` first (this imports the built packages).
 * - the stage timings of each run: mean CPU stage and device stage per layer, and how much of
 *   the CPU stage the device stage hid.
 */
import { argmax, ensureStories15M, LlamaModel, logSoftmax64, openModelDir, type SelectionTiming } from "@hybridgen/core";
import { DEFAULT_PROFILE_TEXT, type HybridAttention } from "@hybridgen/runtime";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { createHybridAttention, type HybridRuntimeOptions } from "@hybridgen/runtime";

type HybridOptions = Pick<HybridRuntimeOptions, "logits" | "candidates" | "exactLayers">;

const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const BUDGET = arg("budget", 32), TOKENS = arg("tokens", 256), PROMPT = 16;

const dir = await ensureStories15M({ onProgress: (m) => console.error(m) });
using files = openModelDir(dir);
using be = createCpuBackend({ threads: 1 }); // one "device" thread; the CPU stage has its own
const ids = files.tokenizer.encode(DEFAULT_PROFILE_TEXT).slice(0, TOKENS);
if (ids.length < TOKENS) throw new Error(`the text is only ${ids.length} tokens`);
const maxContext = TOKENS; // stories15M holds 256 positions

using full = LlamaModel.load(files, be, { maxContext });
using hyb = LlamaModel.load(files, be, { maxContext, gpuKvBudget: BUDGET, kvEvictBlock: Math.min(16, BUDGET) });

/** Teacher-forced logits after each token from PROMPT − 1 on. */
function forced(model: LlamaModel): Float32Array[] {
  model.reset();
  const out = [model.forward(Int32Array.from(ids.slice(0, PROMPT)), 0)];
  for (let t = PROMPT; t < ids.length - 1; t++) out.push(model.forward(Int32Array.of(ids[t]), t));
  return out;
}

function greedy(model: LlamaModel): number[] {
  model.reset();
  const out: number[] = [];
  model.step(Int32Array.from(ids.slice(0, PROMPT)), 0);
  for (let t = PROMPT; t < TOKENS; t++) {
    const next = model.argmaxLogits();
    out.push(next);
    model.step(Int32Array.of(next), t);
  }
  return out;
}

function attach(selector: string, k: number, timing: SelectionTiming, options: HybridOptions): Promise<HybridAttention> {
  return createHybridAttention(hyb, be, { selector, scheduler: "fixed", k, timing, cpuStageThreads: 1, ...options });
}

// 1. Greedy reproduction with "all" + exact and "all" + verified.
const wantGreedy = greedy(full);
for (const logits of ["exact", "verified"] as const) {
  using h = await attach("all", 1, "post", { logits });
  const got = greedy(hyb);
  const same = got.every((t, i) => t === wantGreedy[i]);
  console.log(`greedy, ${TOKENS} tokens, device window ${BUDGET}: "all" + ${logits} ${same ? "reproduces" : "DIFFERS FROM"} full attention ` +
    `(${h.stats.summary()})`);
  if (!same) process.exitCode = 1;
}

// 2. Teacher-forced agreement and KL.
const ref = forced(full).map((l) => ({ top: argmax(l), logp: logSoftmax64(l) }));
const rows: string[][] = [];
const EXTRA = (process.argv.find((a) => a.startsWith("--selectors="))?.slice(12) ?? "").split(",").filter(Boolean);
const configs: [string, string, number, SelectionTiming, HybridOptions][] = [["all", "all", 1, "post", { logits: "exact" }]];
const modes: [string, HybridOptions][] = [
  ["exact", { logits: "exact" }], ["speculative", { logits: "speculative" }], ["verified", { logits: "verified" }],
  ["verified ×2", { logits: "verified", candidates: 2 }],
  ["verified ×4", { logits: "verified", candidates: 4 }],
  ["verified ×2, layer 1 exact", { logits: "verified", candidates: 2, exactLayers: [1] }],
];
for (const [label, options] of modes) {
  for (const k of [8, 16, 32, 64]) configs.push([`top-K ${label}`, "topk", k, "post", options]);
  if (label === "exact" || label === "speculative") configs.push([`streaming ${label}`, "streaming", 32, "pre", options]);
  if (label === "speculative") configs.push(["all speculative", "all", 1, "post", options]);
}
for (const name of EXTRA) for (const k of [8, 16, 32]) configs.push([`${name} verified`, name, k, "pre", { logits: "verified" }]);
for (const [label, selector, k, timing, options] of configs) {
  using h = await attach(selector, k, timing, options);
  const got = forced(hyb);
  let agree = 0, kl = 0;
  got.forEach((l, i) => {
    const lp = logSoftmax64(l), r = ref[i];
    if (argmax(l) === r.top) agree++;
    let d = 0;
    for (let j = 0; j < lp.length; j++) d += Math.exp(r.logp[j]) * (r.logp[j] - lp[j]);
    kl += d;
  });
  const s = h.stats, per = (ms: number) => (s.layerSteps ? (ms / s.layerSteps) * 1000 : 0).toFixed(1);
  rows.push([label, selector === "all" ? "all" : String(k), timing, options.logits ?? "speculative", `${((agree / got.length) * 100).toFixed(1)}%`, (kl / got.length).toExponential(2),
    s.meanRows.toFixed(1), per(s.cpuStageMs + s.cpuJsMs), per(s.deviceMs), `${Math.round(s.hiddenFraction * 100)}%`]);
}
const head = ["selector", "K", "timing", "logits", "top-1 agree", "mean KL", "mean K", "CPU µs/layer", "device µs/layer", "CPU hidden"];
const w = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
console.log(`\nstories15M, ${ids.length} tokens (prompt ${PROMPT}, then teacher-forced), device window ${BUDGET}, vs full attention:`);
console.log(head.map((h, i) => h.padStart(w[i])).join("  "));
for (const r of rows) console.log(r.map((c, i) => c.padStart(w[i])).join("  "));
