/**
 * Retrieval accuracy of hybrid attention's modes beside full attention, as a new user meets them:
 * no profile anywhere and no K given, so K and the exact layers come from each prompt's prefill
 * calibration (the runtime's PrefillCalibrator). CPU backend, or the device with --backend cuda (bf16 KV).
 *
 *   ./bun apps/bench/src/eval/calibrated-eval.ts --models ../shared/models/recall-4l:needle,DIR:vartrack,…
 *     [--lengths 4096,8192,16384] [--prompts 40] [--window 256] [--sinks 4] [--records 64] [--backend cpu|cuda]
 *     [--modes full,default,…] [--mass-target 0.95] [--threads 2] [--seed 1] [--arena 0.25] [--json FILE] [--table FILE]
 *   ./bun apps/bench/src/eval/calibrated-eval.ts --from A.json,B.json [--json FILE] [--table FILE]
 *
 * --from runs nothing: it adds up the cells of earlier runs' --json files (runs side by side on one
 * device, one a length or seed each) into one table; a cell's prompts are the sum of its runs'.
 *
 * Per prompt the context is prefilled once (exact full attention in every mode) with the
 * calibrators of the modes attached (one per candidate multiplier), and checkpointed; each mode
 * then attaches its hybrid attention with that prompt's calibration (what it would have measured
 * itself, attached before the prefill), feeds the question as decode steps and checks every
 * answer token's greedy choice; the cache goes back to the checkpoint.
 */
import { resolve } from "node:path";
import { readFileSync, writeFileSync } from "node:fs";
import { argmax, type Backend, LlamaModel, openModelDir, seededRandom, type PrefillObserver } from "@hybridgen/core";
import { DEFAULT_MASS_TARGET, PrefillCalibrator, type CalibrationResult } from "@hybridgen/runtime";
import { createCpuBackend, createNativeCalibrationSums } from "@hybridgen/kernels-cpu";
import { createHybridAttention, type HybridRuntimeOptions } from "@hybridgen/runtime";
import { arg, hybridArg, list } from "../args.js";
import { openBackend } from "../open-backend.js";
import { retrievalPrompt, retrievalVocabulary, TASKS, type Task } from "./retrieval-tasks.js";

const MODELS = list("models", `${new URL("../../../../../shared/models/recall-4l", import.meta.url).pathname}:needle`).map((m) => {
  const i = m.lastIndexOf(":");
  const task = (i > 0 ? m.slice(i + 1) : "needle") as Task;
  if (!TASKS.includes(task)) throw new Error(`unknown task ${task} (tasks: ${TASKS.join(", ")})`);
  return { dir: resolve(i > 0 ? m.slice(0, i) : m), task };
});
const LENGTHS = list("lengths", "4096,8192,16384").map(Number);
/** The tables' columns ascending, whatever order the lengths run in (a cut run keeps the lengths it ran first). */
const COLUMNS_RUN = [...LENGTHS].sort((a, b) => a - b);
const PROMPTS_RUN = Number(arg("prompts", "40"));
const WINDOW = Number(arg("window", "256")), SINKS = Number(arg("sinks", "4"));
const RECORDS = Number(arg("records", "64"));
const THREADS = Number(arg("threads", "2"));
const SEED = Number(arg("seed", "1"));
const MASS = hybridArg("mass-target", DEFAULT_MASS_TARGET);
const BACKEND = arg("backend", "cpu");
if (BACKEND !== "cpu" && BACKEND !== "cuda") throw new Error(`--backend must be cpu or cuda (got ${BACKEND})`);
const DEVICE = BACKEND === "cuda";
// Tiny models: a share of the device's memory leaves room for other processes (a training run, other evals) beside the eval.
/** Bad input: one line, exit 2. */
const fail = (line: string): never => {
  process.stderr.write(`error: ${line}\n`);
  process.exit(2);
};
const ARENA = Number(arg("arena", "0.25"));
if (!(ARENA > 0 && ARENA <= 1)) fail(`--arena must be above 0 and at most 1 (got ${arg("arena", "")})`);
const FROM = list("from", "");
const sums = createNativeCalibrationSums();

/** A mode: its runtime options (no K: calibrated), its calibration's candidate multiplier ("exact": exact logits, every layer exact; 0: none) and cap on a layer's K (layerKCap's share; Infinity: none; absent: the runtime's). */
interface Mode { label: string; options: HybridRuntimeOptions; candidates: number | "exact"; maxShare?: number }
const MODES: Record<string, Mode> = {
  full: { label: "full attention", options: { selector: "all", logits: "exact", scheduler: "fixed", k: 1 }, candidates: 0 },
  default: { label: "defaults", options: {}, candidates: 4 },
  "default-fixed": { label: "fixed top-K, verified ×4", options: { scheduler: "fixed" }, candidates: 4 },
  "default-uncapped": { label: "defaults, K per layer uncapped", options: {}, candidates: 4, maxShare: Infinity },
  // Share 0: layerKCap's floor (DEFAULT_K) caps every layer, so a broad layer reads 64 rows while the calibrated exact layers and small K stay.
  "default-cap64": { label: "defaults, K per layer at most 64", options: {}, candidates: 4, maxShare: 0 },
  "default-device": { label: "device defaults (feedback, topk+quest, verified ×4)", options: { scheduler: "feedback" }, candidates: 4 },
  exact: { label: "top-K, exact logits", options: { logits: "exact" }, candidates: "exact" },
  speculative: { label: "top-K, speculative logits", options: { logits: "speculative" }, candidates: 1 },
  "verified-c1": { label: "top-K, verified ×1", options: { candidates: 1 }, candidates: 1 },
  quest: { label: "Quest (pre), verified ×4", options: { selector: "quest", timing: "pre" }, candidates: 4 },
  infinigen: { label: "InfiniGen (pre), verified ×4", options: { selector: "infinigen", timing: "pre" }, candidates: 4 },
  streaming: { label: "StreamingLLM (pre)", options: { selector: "streaming", timing: "pre", logits: "exact" }, candidates: "exact" },
  uncalibrated: { label: "uncalibrated defaults (K 64, no exact layer)", options: { calibrate: false }, candidates: 0 },
};
const MODE_NAMES = list("modes", "full,default,default-device,exact,speculative,verified-c1,quest,infinigen,streaming,uncalibrated");
for (const m of MODE_NAMES) if (!MODES[m]) throw new Error(`unknown mode ${m} (modes: ${Object.keys(MODES).join(", ")})`);

/** Shows one prompt's last block to several calibrators. */
const fanOut = (list: PrefillObserver[]): PrefillObserver => ({
  blockInput: (l, x, n, p) => list.forEach((o) => o.blockInput(l, x, n, p)),
  blockQueries: (l, q, n, p) => list.forEach((o) => o.blockQueries(l, q, n, p)),
  blockEnd: (p, n) => list.forEach((o) => o.blockEnd(p, n)),
});

/** Per length and mode: answers right, rows a KV head, exact layers chosen, calibration and prefill ms, steps run pre-QKᵀ and all steps, Σ of the calibrated K per layer, decode ms (the question's steps). */
interface Cell { correct: number; total: number; meanK: number; exactLayers: Record<string, number>; calibMs: number; prefillMs: number; preSteps: number; steps: number; layerK: number[]; decodeMs: number }
type Results = Record<string, Record<string, Record<number, Cell>>>;
/** What a --json file holds (and --from reads back). */
interface RunFile { backend: string; models: { dir: string; task: string }[]; lengths?: number[]; seed?: number; prompts: number; records: number; window: number; sinks: number; massTarget: number; modes?: string[]; results: Results }
let results: Results = {};
const failed = new Set<string>();
/** Set by --from: the merged runs (their backend, seeds and lengths), the table's columns, modes and largest prompt count. */
const merged = FROM.length ? mergeRuns(FROM) : null;
if (merged) {
  results = merged.results;
  report(true);
} else {
using be: Backend = DEVICE ? await openBackend("cuda", { arenaFraction: ARENA }) : createCpuBackend({ threads: THREADS });
for (const { dir, task } of MODELS) {
  using files = openModelDir(dir);
  const V = retrievalVocabulary(files.tokenizer, dir);
  const name = `${dir.split("/").pop()} (${task})`;
  const res = (results[name] = {} as Record<string, Record<number, Cell>>);
  for (const m of MODE_NAMES) res[m] = {};
  for (const length of LENGTHS) {
    using model = LlamaModel.load(files, be, { maxContext: length, gpuKvBudget: WINDOW, sinkTokens: SINKS, kvEvictBlock: 16, ...(DEVICE ? { kvDtype: "bf16" as const } : {}) });
    // On the device the offloaded rows live in host memory from the first token on: every mode's hybrid attention reads them there.
    if (DEVICE) model.cache.attachHostStore(createCpuBackend({ threads: 1 }), be.hostTransfers!(), true);
    const r = seededRandom(SEED * 1000 + length);
    for (const m of MODE_NAMES) res[m]![length] = { correct: 0, total: 0, meanK: 0, exactLayers: {}, calibMs: 0, prefillMs: 0, preSteps: 0, steps: 0, layerK: [], decodeMs: 0 };
    const multipliers = [...new Set(MODE_NAMES.map((m) => MODES[m]!.candidates).filter((c) => c !== 0))];
    const t0 = performance.now();
    for (let p = 0; p < PROMPTS_RUN; p++) {
      const prompt = retrievalPrompt(V, task, r, length, RECORDS);
      const calibrated = new Map<number | "exact", CalibrationResult>();
      const calibrators = new Map(multipliers.map((c) => [c, new PrefillCalibrator(model.attention, model, {
        sums, massTarget: MASS, candidates: c === "exact" ? 1 : c, ...(c === "exact" ? { exact: "all" as const } : {}), onResult: (x) => calibrated.set(c, x),
      })] as const));
      model.reset();
      model.attention.setPrefillObserver(fanOut([...calibrators.values()]));
      const tp = performance.now();
      model.forward(Int32Array.from(prompt.context), 0);
      const prefillMs = performance.now() - tp;
      model.attention.setPrefillObserver(null);
      // A mode with its own cap on a layer's K decides from the same prefill's sums.
      const decision = (m: Mode) => (m.candidates === 0 ? undefined : m.maxShare === undefined ? calibrated.get(m.candidates) : calibrators.get(m.candidates)!.decide(m.maxShare));
      const decided = new Map(MODE_NAMES.map((m) => [m, decision(MODES[m]!)] as const));
      for (const c of calibrators.values()) c.close();
      using cp = model.cache.checkpoint();
      for (const mname of MODE_NAMES) {
        const mode = MODES[mname]!;
        const cal = decided.get(mname);
        let h: Awaited<ReturnType<typeof createHybridAttention>>;
        try {
          h = await createHybridAttention(model, be, { ...mode.options, ...(DEVICE ? {} : { cpuStageThreads: 1 }), ...(cal ? { calibration: { ...cal, exactLayers: [...cal.exactLayers], layerK: [...cal.layerK] } } : {}) });
        } catch (e) {
          // A mode this backend cannot run is reported once and left out ("–" in the table); the others go on.
          if (!failed.has(mname)) process.stderr.write(`\n${MODES[mname]!.label}: ${(e as Error).message.split("\n")[0]}\n`);
          failed.add(mname);
          continue;
        }
        try {
          let ok = true, pos = prompt.context.length;
          const lead = prompt.question.length - (prompt.answer.length - 1);
          const td = performance.now();
          prompt.question.forEach((tok, i) => {
            const logits = model.forward(Int32Array.of(tok), pos++);
            if (i >= lead - 1 && argmax(logits) !== prompt.answer[i - (lead - 1)]) ok = false;
          });
          const cell = res[mname]![length]!;
          cell.decodeMs += performance.now() - td;
          cell.total++;
          if (ok) cell.correct++;
          cell.meanK += h.stats.meanRows;
          const ex = h.exactLayers.join(",") || "none";
          cell.exactLayers[ex] = (cell.exactLayers[ex] ?? 0) + 1;
          cell.calibMs += cal?.ms ?? 0;
          cal?.layerK.forEach((k, l) => (cell.layerK[l] = (cell.layerK[l] ?? 0) + k));
          cell.prefillMs += prefillMs;
          cell.preSteps += h.stats.trace.filter((t) => t.timing === "pre").length;
          cell.steps += h.stats.trace.length;
        } finally {
          h.close();
          model.cache.restore(cp);
        }
      }
      process.stderr.write(`\r${name} ${length}: prompt ${p + 1}/${PROMPTS_RUN} (${((performance.now() - t0) / 1000).toFixed(0)} s)`);
      report(false); // after each prompt: a run cut short keeps what it measured (each cell counts its prompts)
    }
    process.stderr.write("\n");
  }
}
report(true, be.name);
}

/** The runs' cells added up per model, mode and length (exact-layer counts merged, K per layer summed); the runs must share the prompts' shape. */
function mergeRuns(files: string[]) {
  const runs = files.map((f) => {
    try {
      return JSON.parse(readFileSync(f, "utf8")) as RunFile;
    } catch (e) {
      return fail(`--from: ${f}: ${(e as Error).message.split("\n")[0]}`);
    }
  });
  const first = runs[0]!;
  for (const [i, r] of runs.entries()) {
    for (const key of ["backend", "records", "window", "sinks", "massTarget"] as const) {
      if (r[key] !== first[key]) fail(`--from: ${files[i]} has ${key} ${r[key]}, ${files[0]} ${first[key]}`);
    }
  }
  const out: Results = {};
  const lengths = new Set<number>(), modes: string[] = [];
  let prompts = 0;
  for (const r of runs) {
    for (const [name, res] of Object.entries(r.results)) {
      const into = (out[name] ??= {});
      for (const [m, byLength] of Object.entries(res)) {
        if (!modes.includes(m)) modes.push(m);
        const cells = (into[m] ??= {});
        for (const [l, c] of Object.entries(byLength)) {
          if (!c.total) continue;
          lengths.add(Number(l));
          const d = (cells[Number(l)] ??= { correct: 0, total: 0, meanK: 0, exactLayers: {}, calibMs: 0, prefillMs: 0, preSteps: 0, steps: 0, layerK: [], decodeMs: 0 });
          for (const k of ["correct", "total", "meanK", "calibMs", "prefillMs", "preSteps", "steps", "decodeMs"] as const) d[k] += c[k];
          for (const [e, n] of Object.entries(c.exactLayers)) d.exactLayers[e] = (d.exactLayers[e] ?? 0) + n;
          c.layerK.forEach((k, i) => (d.layerK[i] = (d.layerK[i] ?? 0) + k));
          prompts = Math.max(prompts, d.total);
        }
      }
    }
  }
  for (const m of modes) if (!MODES[m]) fail(`--from: unknown mode ${m}`);
  const seeds = [...new Set(runs.map((r) => r.seed ?? 1))];
  // Every run's models, once each (runs of several models side by side).
  const models = runs.flatMap((r) => r.models).filter((m, i, all) => all.findIndex((x) => x.dir.split("/").pop() === m.dir.split("/").pop() && x.task === m.task) === i);
  return { results: out, backend: first.backend, run: { ...first, models }, columns: [...lengths].sort((a, b) => a - b), modes, prompts, seeds };
}

/** Prints the table (at the end) and writes --json / --table with the lengths measured so far. */
function report(print: boolean, backend = merged?.backend ?? BACKEND): void {
const COLUMNS = merged?.columns ?? COLUMNS_RUN, modeNames = merged?.modes ?? MODE_NAMES, PROMPTS = merged?.prompts ?? PROMPTS_RUN;
// The defaults differ by backend: the label says which ran.
const label = (m: string) => (m === "default" ? `defaults (${backend === "cuda" ? "device: feedback, topk+quest" : "CPU: fixed top-K"}, verified ×4)` : MODES[m]!.label);
const run = merged?.run ?? { prompts: PROMPTS_RUN, window: WINDOW, sinks: SINKS, records: RECORDS, massTarget: MASS, models: MODELS };
const head = ["model (task)", "mode", ...COLUMNS.map((l) => `${l}`), ...COLUMNS.map((l) => `mean K ${l}`)];
const rows: string[][] = [];
for (const [name, res] of Object.entries(results)) {
  for (const m of modeNames) {
    const cells = COLUMNS.map((l) => res[m]?.[l] ?? { correct: 0, total: 0, meanK: 0 });
    rows.push([name, label(m), ...cells.map((x) => (x.total ? (x.correct / x.total).toFixed(3) : "–")), ...cells.map((x) => (x.total ? (x.meanK / x.total).toFixed(0) : "–"))]);
  }
}
if (print) {
const w = head.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i]!.length)));
console.log(`\nretrieval accuracy, ${merged ? `up to ${PROMPTS} prompts a length (${FROM.length} runs, seeds ${merged.seeds.join(",")})` : `${PROMPTS} prompts per length`}, window ${run.window} with ${run.sinks} sinks, no profile and no K given (calibrated from each prefill, mass target ${run.massTarget}), ${backend} backend:`);
console.log(`| ${head.map((h, i) => h.padEnd(w[i]!)).join(" | ")} |`);
console.log(`| ${w.map((n) => "-".repeat(n)).join(" | ")} |`);
for (const row of rows) console.log(`| ${row.map((c, i) => c.padEnd(w[i]!)).join(" | ")} |`);
for (const [name, res] of Object.entries(results)) {
  for (const l of COLUMNS) {
    const d = res.default?.[l];
    if (d?.total) {
      console.log(`${name} ${l}: defaults' exact layers ${JSON.stringify(d.exactLayers)}, calibration ${(d.calibMs / d.total).toFixed(1)} ms of a ${(d.prefillMs / d.total).toFixed(0)} ms prefill, ` +
        `mean K per layer ${d.layerK.map((k) => (k / d.total).toFixed(0)).join("/")}`);
    }
    for (const m of modeNames) {
      const c = res[m]?.[l];
      if (c?.steps && c.preSteps) console.log(`${name} ${l}: ${label(m)} ran ${c.preSteps} of ${c.steps} steps pre-QKᵀ`);
      if (c?.steps) console.log(`${name} ${l}: ${label(m)} ${(c.decodeMs / c.steps).toFixed(2)} ms a decode step, K per layer ${c.layerK.map((k) => (k / c.total).toFixed(0)).join("/") || "–"}`);
    }
  }
}
}
// --table FILE: the README's result file (apps/bench/src/readme/tables.ts renders it under its marker).
const tableFile = arg("table", "");
if (tableFile) {
  const fmt = (l: number) => l.toLocaleString("en-US").replace(/,/g, " ");
  const table = {
    columns: ["model (task)", "mode", ...COLUMNS.map(fmt), `mean rows a KV head (${COLUMNS.map(fmt).join(" / ")})`],
    align: ["left", "left", ...COLUMNS.map(() => "right"), "right"],
    rows: Object.entries(results).flatMap(([name, res]) => modeNames.map((m) => {
      const cells = COLUMNS.map((l) => res[m]?.[l] ?? { correct: 0, total: 0, meanK: 0 });
      // A length cut short says over how many prompts.
      const acc = (x: { correct: number; total: number }) => (x.total ? `${(x.correct / x.total).toFixed(3)}${x.total < PROMPTS ? ` (${x.total} prompts)` : ""}` : "–");
      return [name, label(m), ...cells.map(acc), cells.map((x) => (x.total ? (x.meanK / x.total).toFixed(0) : "–")).join(" / ")];
    })),
  };
  const cuda = backend === "cuda";
  const measured = merged
    ? `apps/bench/src/eval/calibrated-eval.ts --from ${FROM.map((f) => f.split("/").pop()).join(",")}: ${FROM.length} runs of --models ${run.models.map((m) => `${m.dir.split("/").pop()}:${m.task}`).join(",")} --records ${run.records} --window ${run.window} --sinks ${run.sinks} --mass-target ${run.massTarget}, seeds ${merged.seeds.join(",")}, ${cuda ? "CUDA backend (bf16 KV)" : "CPU backend"}, ${new Date().toISOString().slice(0, 10)}`
    : `apps/bench/src/eval/calibrated-eval.ts --models ${MODELS.map((m) => `${m.dir.split("/").pop()}:${m.task}`).join(",")} --lengths ${LENGTHS.join(",")} --prompts ${PROMPTS} --records ${RECORDS} --window ${WINDOW} --sinks ${SINKS} --mass-target ${MASS} --seed ${SEED}${cuda ? " --backend cuda" : ""}, ${cuda ? "CUDA backend (bf16 KV)" : "CPU backend"}, ${new Date().toISOString().slice(0, 10)}`;
  writeFileSync(tableFile, `${JSON.stringify({ measured, table }, null, 1)}\n`);
}
const json = arg("json", "");
if (json) {
  const file: RunFile = { backend, models: run.models, lengths: COLUMNS, seed: merged ? undefined : SEED, prompts: PROMPTS, records: run.records, window: run.window, sinks: run.sinks, massTarget: run.massTarget, modes: modeNames, results };
  writeFileSync(json, `${JSON.stringify(file, null, 2)}\n`);
}
}
