/**
 * `hybridgen profile-kmin`: K_min per selector and the layers that may speculate, measured
 * offline on the CPU backend (profile-kmin-measure.ts), printed, and stored as the model's
 * hybrid profile (the runtime's writeHybridProfile) for `generate` to take its defaults from.
 */
import { realpathSync } from "node:fs";
import { DEFAULT_MAX_CONTEXT, HybridgenError, ensureStories15M, loadModel } from "@hybridgen/core";
import { DEFAULT_PROFILE_TEXT, forcedSteps, openBackend, writeHybridProfile, type HybridProfile } from "@hybridgen/runtime";
import { loadSelectorSpec } from "@hybridgen/selectors";
import type { CliIo } from "../io.js";
import { isPreset, openModelSource } from "../model-source.js";
import { readTextFile } from "../read-prompt.js";
import { readPromptsJsonl } from "../read-prompts-jsonl.js";
import { PROFILE_KMIN_HELP, parseProfileKminArgs, type ProfileKminOptions } from "./profile-kmin-args.js";
import { measureProfile, type ProfileMeasurements, type ProfileSequence } from "./profile-kmin-measure.js";
import { formatProfileReport } from "./profile-kmin-report.js";

export { PROFILE_KMIN_HELP };

/** The selector whose K_min generate uses: topk (its default post-QKᵀ selector) when profiled. */
const defaultSelectorOf = (selectors: readonly string[]) => (selectors.includes("topk") ? "topk" : selectors[0]!);

export async function runProfileKmin(argv: readonly string[], io: CliIo): Promise<number> {
  const parsed = parseProfileKminArgs(argv);
  if (parsed.help) {
    io.stdout(PROFILE_KMIN_HELP);
    return 0;
  }
  // Plugin modules among --selectors are imported and registered; the profile keys them by name.
  const selectors: string[] = [];
  for (const s of parsed.selectors) selectors.push(await loadSelectorSpec(s, { cwd: process.cwd() }));
  const o: ProfileKminOptions = { ...parsed, selectors: [...new Set(selectors)] };
  const progress = (line: string) => io.stderr(`${line}\n`);
  const texts = o.prompts !== undefined
    ? readPromptsJsonl(o.prompts).map((p) => ({ name: `${o.prompts} line ${p.line}`, text: p.prompt }))
    : [{ name: o.text ?? "the built-in text", text: o.text === undefined ? DEFAULT_PROFILE_TEXT : readTextFile(o.text, "text file") }];
  const model = o.model ?? (await ensureStories15M({ cacheDir: io.env.HYBRIDGEN_CACHE, onProgress: progress }));
  using files = await openModelSource(model, { dummyWeights: isPreset(model), threads: o.threads });
  const shape = files.shape;
  if (o.tokens !== undefined && o.tokens > shape.maxPositions) {
    throw new HybridgenError(`--tokens ${o.tokens} exceeds the model's max_position_embeddings (${shape.maxPositions})`, "EUSAGE");
  }
  const limit = o.tokens ?? Math.min(shape.maxPositions, DEFAULT_MAX_CONTEXT);
  const seqs: ProfileSequence[] = texts.map(({ name, text }) => {
    const ids = files.tokenizer.encode(text).slice(0, limit);
    if (forcedSteps(ids.length, o.gpuKvBudget) < 1) {
      throw new HybridgenError(
        `${name} is ${ids.length} tokens: too short for --gpu-kv-budget ${o.gpuKvBudget} (it needs at least ${o.gpuKvBudget + 2} tokens, so that some are offloaded)`,
        "EUSAGE",
      );
    }
    return { name, ids };
  });
  const recallKs = [...new Set([...o.ks, ...(o.recallK === undefined ? [] : [o.recallK])])].sort((a, b) => a - b);

  using backend = (await openBackend("cpu", { threads: o.threads })).backend;
  const maxContext = Math.max(...seqs.map((s) => s.ids.length));
  using lm = loadModel(files, backend, { maxContext, gpuKvBudget: o.gpuKvBudget, sinkTokens: o.sinkTokens });
  progress(
    `profiling ${model} (${shape.layers} layers, ${shape.heads} heads / ${shape.kvHeads} KV heads): ${seqs.length} text${seqs.length === 1 ? "" : "s"}, ` +
      `${seqs.reduce((n, s) => n + s.ids.length, 0)} tokens, window ${o.gpuKvBudget} (${o.sinkTokens} sinks), on ${backend.name}`,
  );
  const m = await measureProfile(lm, backend, seqs, { selectors: o.selectors, ks: o.ks, recallKs, candidates: o.candidates, gpuKvBudget: o.gpuKvBudget, skipFailing: !o.selectorsGiven, progress });

  const profile = buildProfile(model, o, m, progress);
  const path = o.write ? writeHybridProfile(model, profile, io.env.HYBRIDGEN_CACHE) : null;
  if (o.json) {
    io.stdout(`${JSON.stringify({ path, profile, recall: { ks: m.recallKs, tokens: m.recall, mass: m.massRecall } })}\n`);
  } else {
    io.stdout(formatProfileReport(profile, m, { texts: seqs.map((s) => `${s.name} (${s.ids.length} tokens)`) }));
    io.stdout(path === null ? "profile not written (--no-write)\n" : `profile: ${path}\n`);
  }
  return 0;
}

function buildProfile(model: string, o: ProfileKminOptions, m: ProfileMeasurements, progress: (line: string) => void): HybridProfile {
  const perSelector: HybridProfile["perSelector"] = {};
  for (const [name, { rows }] of Object.entries(m.perSelector)) {
    perSelector[name] = { kMin: rows.find(([, top1]) => top1 >= o.tolerance)?.[0] ?? null, agreement: rows };
  }
  const measured = Object.keys(perSelector);
  if (measured.length === 0) throw new HybridgenError("no selector could be profiled (see the warnings above)");
  const selector = defaultSelectorOf(measured);
  let kMin = perSelector[selector]!.kMin;
  if (kMin === null) {
    kMin = o.ks[o.ks.length - 1]!;
    progress(`warning: no K of ${selector} reached top-1 agreement ${o.tolerance}; kMin is the largest K measured (${kMin}): sweep larger --ks`);
  }
  const recallK = o.recallK ?? kMin;
  const ki = m.recallKs.indexOf(recallK);
  const layerRecall = m.recall.map((r) => r[ki]!), layerMassRecall = m.massRecall.map((r) => r[ki]!);
  const decisive = o.recallMetric === "mass" ? layerMassRecall : layerRecall;
  return {
    version: 1,
    model: isPreset(model) ? model : realpathSync(model),
    tolerance: o.tolerance,
    selector,
    kMin,
    perSelector,
    exactLayers: decisive.flatMap((r, l) => (l > 0 && r < o.recallThreshold ? [l] : [])),
    layerRecall,
    layerMassRecall,
    recallMetric: o.recallMetric,
    candidates: o.candidates,
    recallK,
    recallThreshold: o.recallThreshold,
    gpuKvBudget: o.gpuKvBudget,
    sinkTokens: o.sinkTokens,
    steps: m.steps,
    createdAt: new Date().toISOString(),
  };
}
