import { DEFAULT_MAX_CONTEXT, HybridgenError, ensureStories15M, generate, loadModel } from "@hybridgen/core";
import { readHybridCalibration, readHybridProfile, writeHybridCalibration } from "@hybridgen/runtime";
import { hybridPlan } from "@hybridgen/runtime";
import { ABORTED, untilAborted } from "../abortable.js";
import { renderChat } from "../chat-prompt.js";
import { formatRate, samplingOf, type GenerateCliOptions } from "../generate-options.js";
import type { CliIo } from "../io.js";
import { openModelSource } from "../model-source.js";
import { readPrompt } from "../read-prompt.js";
import { readPromptsJsonl } from "../read-prompts-jsonl.js";
import { runPromptsBatch } from "./generate-batch.js";
import { openBackend, threadCount } from "../device-backend.js";
import {
  attachHybrid, calibrationPlanLine, FULL_ATTENTION, hybridStatsLines, loadHybridSelector, windowLoadOptions, hybridPlanLine, schedulerJson, type HybridCliOptions,
} from "../hybrid-options.js";
import { KvTierCliOptionsSchema, preflightStore, storeAllocatorFor, type KvTierCliOptions } from "../kv-tier-options.js";
import { deviceIndexBytesPerToken, resolveWindowBudget } from "../auto-budget.js";

/** Exit code of a run stopped by Ctrl-C (128 + SIGINT), as shells report it. */
export const EXIT_INTERRUPTED = 130;

/** --threads, else HYBRIDGEN_THREADS (checked), else undefined (every core). */
export function threadsFrom(opts: { readonly threads?: number }, env: CliIo["env"]): number | undefined {
  if (opts.threads !== undefined) return opts.threads;
  const raw = env.HYBRIDGEN_THREADS;
  if (raw === undefined || raw === "") return undefined;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1 || n > 256) throw new HybridgenError(`invalid HYBRIDGEN_THREADS=${JSON.stringify(raw)}: must be an integer from 1 to 256`);
  return n;
}

/**
 * `hybridgen generate`: load a model on the CPU backend, stream tokens to stdout (the
 * prompt echoed first, as llama2.c does), timings on stderr. Returns the exit code.
 */
export async function runGenerate(opts: GenerateCliOptions, io: CliIo, flags: HybridCliOptions = FULL_ATTENTION, tier: KvTierCliOptions = KvTierCliOptionsSchema.parse({})): Promise<number> {
  // --selector ./plugin.ts (or a package): imported and registered before anything else runs.
  const hybrid = await loadHybridSelector(flags, process.cwd());
  // --prompts: many prompts from a JSONL file, decoded --batch at a time (generate-batch.ts).
  const jsonl = opts.prompts === undefined ? null : readPromptsJsonl(opts.prompts);
  // Sequences decoded together (generateBatch takes no more slots than prompts).
  const batch = jsonl ? Math.max(1, Math.min(opts.batch ?? 1, jsonl.length)) : 1;
  const prompt = jsonl ? "" : await untilAborted(readPrompt(opts, io), io.signal); // stdin may be a terminal
  const progress = (msg: string) => io.stderr(`${msg}\n`);
  const interrupted = () => {
    io.stderr("\ninterrupted\n");
    return EXIT_INTERRUPTED;
  };

  if (prompt === ABORTED) return interrupted();
  const dir = opts.model ?? (await untilAborted(ensureStories15M({ cacheDir: io.env.HYBRIDGEN_CACHE, onProgress: progress }), io.signal));
  if (dir === ABORTED) return interrupted();

  const t0 = performance.now();
  // Loading runs synchronously for seconds on a big model: Ctrl-C must end it at once.
  io.uninterruptible?.(true);
  // A directory, or preset:<name> (--dummy-weights): random weights, generated natively.
  using files = await openModelSource(dir, { dummyWeights: opts.dummyWeights, dtype: opts.dtype, threads: threadsFrom(opts, io.env) });
  const shape = files.shape;
  // The KV cache's size, as LlamaModel.load picks it; checked here so a too-long prompt
  // fails before any weight is loaded.
  const maxContext = opts.context ?? Math.min(shape.maxPositions, DEFAULT_MAX_CONTEXT);
  if (maxContext > shape.maxPositions) {
    throw new HybridgenError(`--context ${maxContext} exceeds the model's max_position_embeddings (${shape.maxPositions})`, "ECONTEXT");
  }
  const encode = (text: string, what: string): { text: string; ids: number[] } => {
    const promptText = opts.chat ? renderChat(files, text, opts.system) : text;
    // A rendered chat template carries its own special tokens (BOS included), as
    // transformers' apply_chat_template does.
    const ids = files.tokenizer.encode(promptText, { addBos: !opts.chat });
    if (ids.length > maxContext) {
      throw new HybridgenError(
        `${what} is ${ids.length} tokens but the context holds ${maxContext}` +
          (maxContext < shape.maxPositions ? ` (raise it with --context, up to ${shape.maxPositions})` : ""),
        "ECONTEXT",
      );
    }
    return { text: promptText, ids };
  };
  // Every prompt is checked before any weight is loaded.
  const batchPrompts = jsonl?.map((p) => ({ ...p, ...encode(p.prompt, `${opts.prompts} line ${p.line}: the prompt`) }));
  const { text: promptText, ids: promptIds } = jsonl ? { text: "", ids: [] } : encode(prompt, "the prompt");
  const threads = threadsFrom(opts, io.env);
  // Opened here, not at the top: --help, --version and flag errors need no native library.
  const opened = await openBackend(opts.device, threads);
  using backend = opened.backend;
  // The family (Llama, Qwen2, OPT) comes from config.json.
  // --gpu-kv-budget (auto: what the device's memory holds); a store that fits in no tier is refused before the weights load.
  const indexBytesPerToken = hybrid.attention === "hybrid" ? deviceIndexBytesPerToken(typeof hybrid.selector === "string" ? hybrid.selector : undefined, hybrid.selectorOptions, shape) : 0;
  const window = await resolveWindowBudget(hybrid.gpuKvBudget, backend, files, { maxContext, batch, hybrid: hybrid.attention === "hybrid", indexBytesPerToken });
  if (hybrid.attention === "hybrid" && window !== undefined) await preflightStore(shape, { maxContext, window, sinks: hybrid.sinkTokens }, tier, batch);
  using model = loadModel(files, backend, {
    maxContext,
    ...(opts.dtype === undefined ? {} : { weightDtype: opts.dtype }),
    ...windowLoadOptions({ ...hybrid, gpuKvBudget: window }), // and --sink-tokens
  });
  // `hybridgen profile-kmin`'s result for this model gives the defaults of --k-min and --exact-layers.
  const profile = hybrid.attention === "hybrid" ? readHybridProfile(dir, io.env.HYBRIDGEN_CACHE) : null;
  // Without one, the model's last calibration is where this run starts (its prompt calibrates afresh).
  const calibration = hybrid.attention === "hybrid" && !profile ? readHybridCalibration(dir, io.env.HYBRIDGEN_CACHE) : null;
  // Each sequence's offloaded store placed on its share of the memory tiers (and the disk) as the sequence is made.
  const placed = hybrid.attention === "hybrid" && model.cache.storeCapacity > 0 ? await storeAllocatorFor(model.cache, tier, batch) : null;
  // One hybrid attention per sequence of the batch (slot 0's is the model's own).
  using hybrids = await attachHybrid(model, backend, hybrid, { profile, ...(placed ? { storeAllocator: placed.allocator } : {}), batch, readDepth: tier.readDepth, calibration });
  const hybridAttention = hybrids?.own ?? null;
  progress(
    `loaded ${dir} (${shape.architecture}, ${shape.layers} layers, dim ${shape.hiddenSize}, ${opts.dummyWeights ? `dummy ${opts.dtype ?? "bf16"}` : (opts.dtype ?? "stored")} weights` +
      `${model.cache.storeCapacity === 0 ? "" : `, KV window ${model.cache.gpuKvBudget}${model.cache.sinkTokens ? ` with ${model.cache.sinkTokens} sinks` : ""}`}) ` +
      `on ${opened.device}${opened.device.startsWith("cpu") ? ` with ${threadCount(opened.threads)}` : ""}` +
      `${opened.fallback ? ` (${opened.fallback}${opts.verbose ? `: ${opened.fallbackDetail}` : ""})` : ""} in ${(performance.now() - t0).toFixed(0)} ms`,
  );
  io.uninterruptible?.(false);
  if (hybridAttention) progress(hybridPlanLine(hybridAttention));
  const calibrates = hybridAttention ? calibrationPlanLine(hybridAttention) : "";
  if (calibrates) progress(calibrates);
  // The feedback scheduler's K follows the measured stage times, so a seed repeats the sampling but not the tokens hybrid attention selects.
  if (hybridAttention && opts.seed !== undefined && opts.temperature > 0 && hybridPlan(hybridAttention)?.scheduler === "feedback") {
    progress("note: --seed repeats the sampling, not the feedback scheduler's K (it follows the measured stage times), so the text may differ run to run; --scheduler fixed repeats it");
  }
  if (placed) progress(placed.line);
  if (io.signal?.aborted) return interrupted();
  // After the run: each sequence's stage stats, and what the K spill moved over all of them.
  const summary = () => {
    if (hybrids) io.stderr(hybridStatsLines(hybrids));
    const calibrated = hybridAttention ? hybridPlan(hybridAttention)?.calibrated : undefined;
    if (calibrated) writeHybridCalibration(dir, calibrated, io.env.HYBRIDGEN_CACHE);
    const spilled = placed?.spillLine();
    if (spilled) io.stderr(`${spilled}\n`);
  };
  if (batchPrompts) {
    const aborted = await runPromptsBatch(model, files.tokenizer, batchPrompts, opts, io, opened.device);
    const code = aborted ? interrupted() : 0;
    summary();
    return code;
  }

  const stream = generate(model, files.tokenizer, promptIds, {
    maxTokens: opts.maxTokens,
    stop: opts.stop,
    sampling: samplingOf(opts),
    signal: io.signal,
  });

  if (!opts.json && !opts.chat) io.stdout(prompt); // echo, as llama2.c does; a chat shows only the reply
  for await (const token of stream) {
    if (!opts.json) io.stdout(token.text);
  }
  const result = await stream.result();
  const t = result.timings;
  if (opts.json) {
    io.stdout(
      `${JSON.stringify({
        model: dir,
        prompt: promptText,
        text: result.text,
        finishReason: result.finishReason,
        promptTokens: result.promptTokens,
        generatedTokens: result.tokens.length,
        tokens: result.tokens,
        seed: result.seed,
        threads: opened.threads,
        device: opened.device,
        dtype: opts.dtype ?? null,
        timings: t,
        ...(hybridAttention ? { scheduler: schedulerJson(hybridAttention) } : {}),
      })}\n`,
    );
  } else if (result.finishReason !== "abort") {
    io.stdout("\n");
  }
  const code = result.finishReason === "abort" ? interrupted() : 0;
  io.stderr(
    `prompt: ${result.promptTokens} tokens, ${formatRate(t.promptTokensPerSec)} tok/s | ` +
      `generated: ${result.tokens.length} tokens, ${formatRate(t.tokensPerSec)} tok/s | finish: ${result.finishReason} | device: ${opened.device}\n`,
  );
  summary();
  return code;
}
