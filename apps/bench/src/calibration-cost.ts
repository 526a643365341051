/**
 * What prefill calibration costs: the same prompt prefilled with hybrid attention attached
 * without calibration and with it (the runtime's defaults), alternating, on dummy bf16 weights
 * of a preset shape (Llama-3.1-8B by default), then a few decode steps of the calibrated run
 * (its stats line shows what the calibration chose).
 *
 *   bun apps/bench/src/calibration-cost.ts [--contexts 32768,131072] [--repeats 2,1] [--preset llama-3.1-8b]
 *     [--backend cuda|cpu] [--window 4096] [--sinks 4] [--steps 8] [--table FILE]
 *
 * One model (sized for the longest context) serves every context: its host store is pinned when it
 * loads, so one warm-up prefill of the shortest context readies kernels, arena and store for all.
 * --repeats: pairs per context (one value for all, or one per context). Prefill blocks of 32 768
 * tokens (a longer prompt is prefilled block by block; the last block is the one calibrated).
 * Prints one table: prefill seconds without and with (medians), the calibration's own milliseconds
 * on the driving thread, and the ratio; --table FILE writes it as a README result file.
 */
import { writeFileSync } from "node:fs";
import { dummyModelFiles, loadModel, presetConfig } from "@hybridgen/core";
import { createNativeRandomFill } from "@hybridgen/kernels-cpu";
import { createHybridAttention, hybridPlan } from "@hybridgen/runtime";
import { arg, list } from "./args.js";
import { openBackend } from "./open-backend.js";

const contexts = list("contexts", "32768,131072").map(Number);
const preset = arg("preset", "llama-3.1-8b");
const window = Number(arg("window", "4096")), sinks = Number(arg("sinks", "4"));
const repeatList = list("repeats", "2").map(Number), steps = Number(arg("steps", "8"));
const fail = (line: string): never => {
  process.stderr.write(`error: ${line}\n`);
  process.exit(2);
};
if (contexts.length === 0 || !contexts.every((c) => Number.isInteger(c) && c > window + sinks)) fail(`--contexts must be integers above the window and sinks (${window + sinks}), got ${arg("contexts", "")}`);
if (!(repeatList.length === 1 || repeatList.length === contexts.length) || !repeatList.every((r) => Number.isInteger(r) && r >= 1)) {
  fail(`--repeats must be one positive integer, or one per context (${contexts.length}), got ${arg("repeats", "")}`);
}
const PREFILL_BLOCK = 32768;
/** "tiny": a 4-layer Llama for a dry run on the CPU backend. */
const TINY = {
  architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 256, intermediate_size: 768, num_hidden_layers: 4,
  num_attention_heads: 8, num_key_value_heads: 2, vocab_size: 1024, max_position_embeddings: 1 << 20, rms_norm_eps: 1e-5, rope_theta: 1e6,
};

using backend = await openBackend(arg("backend", "cuda"), { arenaFraction: 0.95 });
const maxContext = Math.max(...contexts) + steps + 8;
const json = { ...(preset === "tiny" ? TINY : presetConfig(preset)), max_position_embeddings: maxContext };
const tl = performance.now();
using files = dummyModelFiles(json, "bf16", 1, createNativeRandomFill(), `preset:${preset}`);
using model = loadModel(files, backend, { maxContext, prefillBlock: PREFILL_BLOCK, kvDtype: "bf16", gpuKvBudget: window, sinkTokens: sinks });
console.log(`${preset}: loaded for ${maxContext} tokens in ${((performance.now() - tl) / 1e3).toFixed(1)} s`);
const promptOf = (context: number) => Int32Array.from({ length: context }, (_, i) => (i * 7919 + 13) % files.shape.vocabSize);
const prefill = async (prompt: Int32Array, calibrate: boolean) => {
  const h = await createHybridAttention(model, backend, { calibrate });
  model.reset();
  const t0 = performance.now();
  model.forward(prompt, 0);
  return { h, s: (performance.now() - t0) / 1e3 };
};
(await prefill(promptOf(Math.min(...contexts)), false)).h.close(); // warm-up: kernels, arena, host store
const cells: string[][] = [];
for (const [ci, context] of contexts.entries()) {
  const prompt = promptOf(context), repeats = repeatList[Math.min(ci, repeatList.length - 1)]!;
  const plain: number[] = [], calibrated: number[] = [], own: number[] = [];
  let last = "";
  for (let r = 0; r < repeats; r++) {
    const a = await prefill(prompt, false);
    plain.push(a.s);
    a.h.close();
    const b = await prefill(prompt, true);
    calibrated.push(b.s);
    const c = hybridPlan(b.h)?.calibrated;
    own.push(c?.ms ?? NaN);
    // As it goes: a run cut short keeps the pairs it measured.
    console.log(`${context}, pair ${r + 1}: prefill ${a.s.toFixed(3)} s without calibration, ${b.s.toFixed(3)} s calibrated (${((b.s / a.s - 1) * 100).toFixed(1)}%), calibration ${(c?.ms ?? NaN).toFixed(1)} ms`);
    if (r === repeats - 1) {
      for (let t = 0; t < steps; t++) model.forward(Int32Array.of(1 + t), context + t);
      last = b.h.stats.summary();
    }
    b.h.close();
  }
  const med = (v: number[]) => [...v].sort((x, y) => x - y)[v.length >> 1]!;
  const p = med(plain), c = med(calibrated), o = med(own);
  console.log(`${preset} ${context}: ${last}`);
  cells.push([context.toLocaleString("en-US").replace(/,/g, " "), `${repeats}`, p.toFixed(3), c.toFixed(3), `${c >= p ? "+" : ""}${((c / p - 1) * 100).toFixed(1)}%`, o.toFixed(1), `${((o / 1e3 / p) * 100).toFixed(1)}%`]);
}
const columns = ["context", "pairs", "prefill s, no calibration", "prefill s, calibrated", "difference", "calibration ms (driving thread)", "of the prefill"];
console.log(`\n## Prefill calibration cost, ${preset} shape, dummy bf16 weights, window ${window} + ${sinks} sinks, medians of the pairs (${backend.name})\n`);
console.log(`| ${columns.join(" | ")} |`);
console.log(`| ${columns.map(() => "---").join(" | ")} |`);
for (const r of cells) console.log(`| ${r.join(" | ")} |`);
const tableFile = arg("table", "");
if (tableFile) {
  const card = (backend as { device?: { name?: string } }).device?.name ?? backend.name;
  const measured = `apps/bench/src/calibration-cost.ts --contexts ${contexts.join(",")} --repeats ${repeatList.join(",")} --preset ${preset} --window ${window} --sinks ${sinks}: ` +
    `dummy bf16 weights, prefill blocks of ${PREFILL_BLOCK}, both arms alternating in one process (medians of the pairs), ${card}, ${new Date().toISOString().slice(0, 10)}`;
  writeFileSync(tableFile, `${JSON.stringify({ measured, table: { columns, align: ["right", "right", "right", "right", "right", "right", "right"], rows: cells } }, null, 1)}\n`);
}
