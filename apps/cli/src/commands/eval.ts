/** `hybridgen eval`: see EVAL_HELP. */
import { basename } from "node:path";
import { ensureStories15M, HybridgenError, loadModel } from "@hybridgen/core";
import { openBackend, threadCount } from "../device-backend.js";
import type { CliIo } from "../io.js";
import { openModelSource } from "../model-source.js";
import { readTextFile } from "../read-prompt.js";
import { EVAL_HELP, parseEvalArgs } from "./eval-args.js";
import { evalTasks, evalText, type TaskResult, type TextResult } from "./eval-measure.js";
import { evalTables, writeEvalOutputs, type EvalReport } from "./eval-report.js";
import { readTasksJsonl } from "./eval-tasks-file.js";

export { EVAL_HELP };

export async function runEval(argv: readonly string[], io: CliIo): Promise<number> {
  const o = parseEvalArgs(argv);
  if (o.help) {
    io.stdout(EVAL_HELP);
    return 0;
  }
  const progress = (line: string) => io.stderr(`${line}\n`);
  // Every input is read and checked before the model loads.
  const text = o.text === undefined ? undefined : readTextFile(o.text, "--text");
  const tasks = o.tasks.map((f) => ({ name: basename(f).replace(/\.jsonl$/, ""), items: readTasksJsonl(f).slice(0, o.limit) }));
  const dir = o.model ?? (await ensureStories15M({ cacheDir: io.env.HYBRIDGEN_CACHE, onProgress: progress }));
  using files = await openModelSource(dir);
  const maxContext = files.shape.maxPositions;
  const ids = text === undefined ? undefined : Int32Array.from(files.tokenizer.encode(text, { addBos: true }).slice(0, o.tokens ?? maxContext));
  if (ids && ids.length <= o.prefix + 1) throw new HybridgenError(`--text ${o.text} is ${ids.length} tokens: it needs more than --prefix ${o.prefix} + 1`, "EUSAGE");
  if (ids && o.tokens !== undefined && ids.length < o.tokens) progress(`--text has ${ids.length} tokens (fewer than --tokens ${o.tokens}): using them all`);
  // The cache holds the text, or the longest item with what is decoded after it.
  const enc = (t: string, bos: boolean) => files.tokenizer.encode(t, { addBos: bos }).length;
  const needs = tasks.flatMap((t) => t.items.map((it) => enc(it.context, true) + (it.kind === "choice" ? Math.max(...it.choices.map((c) => enc(c, false))) : enc(it.answer, false))));
  const context = Math.min(maxContext, Math.max(ids?.length ?? 0, ...needs));
  if (o.gpuKvBudget >= context) throw new HybridgenError(`--gpu-kv-budget ${o.gpuKvBudget} holds the whole context (${context}): nothing would be offloaded`, "EUSAGE");
  const opened = await openBackend("cpu", o.threads);
  using backend = opened.backend;
  using full = loadModel(files, backend, { maxContext: context });
  using windowed = loadModel(files, backend, { maxContext: context, gpuKvBudget: o.gpuKvBudget, sinkTokens: o.sinkTokens });
  progress(`eval of ${dir} on ${opened.device} with ${threadCount(opened.threads)}: window ${o.gpuKvBudget} with ${o.sinkTokens} sinks, K ${o.ks.join(", ")}`);
  const models = { full, windowed, backend, progress };
  const t0 = performance.now();
  const textResults: TextResult[] = ids ? await evalText(models, ids, o) : [];
  const taskResults: TaskResult[] = [];
  for (const t of tasks) taskResults.push(...(await evalTasks(models, files.tokenizer, t.items, t.name, o)));
  const report: EvalReport = {
    setup: {
      date: new Date().toISOString(), model: dir, device: opened.device, threads: opened.threads, configs: o.configs, ks: o.ks, k: o.k,
      gpuKvBudget: o.gpuKvBudget, sinkTokens: o.sinkTokens, text: o.text ?? null, textTokens: ids?.length ?? 0, prefix: o.prefix,
      tasks: o.tasks, tail: o.tail, limit: o.limit ?? null, seconds: Math.round((performance.now() - t0) / 1000),
    },
    text: textResults,
    tasks: taskResults,
  };
  if (o.json) io.stdout(`${JSON.stringify(report)}\n`);
  else io.stdout(evalTables(report, o.k));
  if (o.out) for (const f of await writeEvalOutputs(report, o.k, o.out)) progress(`wrote ${f}`);
  return 0;
}
