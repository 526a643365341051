/**
 * stories15M with the calibrated defaults against today's best fixed configuration (top-K,
 * verified ×4, no exact layer) at several K: the text's first --prompt tokens are prefilled (the
 * calibration's prompt), the rest teacher-forced; top-1 agreement and mean KL(full ‖ hybrid) of
 * every forced step, and the mean rows a KV head attends (what "the same mean K" compares).
 *
 *   ./bun apps/bench/src/eval/calibrated-stories.ts [--budget 32] [--prompt 96] [--mass-targets 0.95,0.9,0.8] [--table FILE]
 *
 * --table FILE writes the README's result file (apps/bench/src/readme/tables.ts renders it under its marker).
 */
import { ensureStories15M, LlamaModel, openModelDir } from "@hybridgen/core";
import { AgreementMeter, DEFAULT_PROFILE_TEXT, referenceStep } from "@hybridgen/runtime";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { createHybridAttention, hybridPlan, type HybridRuntimeOptions } from "@hybridgen/runtime";
import { writeFileSync } from "node:fs";
import { arg, list } from "../args.js";

const BUDGET = Number(arg("budget", "32")), PROMPT = Number(arg("prompt", "96")), TOKENS = 256;
const TARGETS = list("mass-targets", "0.95,0.9,0.8").map(Number);

const dir = await ensureStories15M({ onProgress: (m) => console.error(m) });
using files = openModelDir(dir);
using be = createCpuBackend({ threads: 1 });
const ids = files.tokenizer.encode(DEFAULT_PROFILE_TEXT).slice(0, TOKENS);
using full = LlamaModel.load(files, be, { maxContext: TOKENS });
using hyb = LlamaModel.load(files, be, { maxContext: TOKENS, gpuKvBudget: BUDGET, kvEvictBlock: Math.min(16, BUDGET) });

/** Logits after the prompt and after each forced token. */
function forced(model: LlamaModel): Float32Array[] {
  model.reset();
  const out = [model.forward(Int32Array.from(ids.slice(0, PROMPT)), 0)];
  for (let t = PROMPT; t < ids.length - 1; t++) out.push(model.forward(Int32Array.of(ids[t]!), t));
  return out;
}

const ref = forced(full).map(referenceStep);
const rows: string[][] = [];
async function measure(label: string, options: HybridRuntimeOptions): Promise<void> {
  using h = await createHybridAttention(hyb, be, { cpuStageThreads: 1, ...options });
  const meter = new AgreementMeter();
  forced(hyb).forEach((l, i) => meter.add(ref[i]!, l));
  const c = hybridPlan(h)?.calibrated;
  rows.push([label, `${(meter.top1 * 100).toFixed(1)}%`, meter.meanKl.toExponential(2), h.stats.meanRows.toFixed(1),
    c ? `K ${c.layerK.join("/")}, exact ${c.exactLayers.join(",") || "none"}` : ""]);
}

for (const k of [4, 8, 16, 32, 64]) await measure(`top-K ${k}, verified ×4, no exact layer`, { k, exactLayers: [] });
for (const massTarget of TARGETS) await measure(`calibrated defaults, mass target ${massTarget}`, { massTarget });
console.log(`\nstories15M, ${ids.length} tokens (prompt ${PROMPT} prefilled and calibrated from, then teacher-forced), window ${BUDGET}, CPU backend, vs full attention:`);
console.log("| configuration | top-1 agreement | mean KL | mean rows a KV head | calibrated |");
console.log("| --- | --- | --- | --- | --- |");
for (const r of rows) console.log(`| ${r.join(" | ")} |`);
const tableFile = arg("table", "");
if (tableFile) {
  const measured = `apps/bench/src/eval/calibrated-stories.ts --budget ${BUDGET} --prompt ${PROMPT} --mass-targets ${TARGETS.join(",")}, CPU backend, ${new Date().toISOString().slice(0, 10)}`;
  const table = { columns: ["configuration", "top-1 agreement", "mean KL", "mean rows a KV head", "calibrated"], align: ["left", "right", "right", "right", "left"], rows };
  writeFileSync(tableFile, `${JSON.stringify({ measured, table }, null, 1)}\n`);
}
