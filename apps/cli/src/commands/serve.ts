/**
 * `hybridgen serve`: listens first (/health says 503 while the model loads), loads the model as
 * `generate` does (same model, device, window and hybrid flags), then serves OpenAI's endpoints
 * from one continuous-batching scheduler (serve/scheduler.ts). SIGINT/SIGTERM: stop accepting,
 * give running requests --shutdown-grace seconds, cancel the rest, free every store (their disk
 * files go with them) and return 0.
 */
import { basename } from "node:path";
import { BatchDecoder, DEFAULT_MAX_CONTEXT, DTYPE_BYTES, HybridgenError, PRESET_PREFIX, ensureStories15M, loadModel, modelInfo, type KvStoreAllocator } from "@hybridgen/core";
import { hybridPlan, readHybridProfile } from "@hybridgen/runtime";
import { resolveWindowBudget } from "../auto-budget.js";
import { openBackend, threadCount } from "../device-backend.js";
import { attachHybrid, hybridPlanLine, loadHybridSelector, windowLoadOptions } from "../hybrid-options.js";
import type { CliIo } from "../io.js";
import { openModelSource } from "../model-source.js";
import { DeviceLedger, deviceMemory } from "../serve/device-ledger.js";
import { ServeMetrics } from "../serve/metrics.js";
import { templateName } from "../serve/prompt-text.js";
import { createRoutes, type ServeState } from "../serve/routes.js";
import { ServeScheduler } from "../serve/scheduler.js";
import { parseServeArgs, SERVE_HELP } from "../serve/serve-args.js";
import { StepCost } from "../serve/step-cost.js";
import { StoreLedger } from "../serve/store-ledger.js";
import { threadsFrom } from "./generate.js";

/** Resolves when SIGINT (the CLI's signal) or SIGTERM arrives. */
function shutdownSignal(signal: AbortSignal | undefined): { wait: Promise<string>; dispose(): void } {
  let done!: (why: string) => void;
  const wait = new Promise<string>((resolve) => (done = resolve));
  const onInt = () => done("SIGINT");
  const onTerm = () => done("SIGTERM");
  if (signal?.aborted) onInt();
  signal?.addEventListener("abort", onInt, { once: true });
  process.on("SIGTERM", onTerm);
  return { wait, dispose: () => (signal?.removeEventListener("abort", onInt), process.off("SIGTERM", onTerm)) };
}

export async function runServe(argv: readonly string[], io: CliIo): Promise<number> {
  const o = parseServeArgs(argv);
  if (o.help) {
    io.stdout(SERVE_HELP);
    return 0;
  }
  const hybrid = await loadHybridSelector(o.hybrid, process.cwd());
  const log = (line: string) => io.stderr(`${line}\n`);
  const metrics = new ServeMetrics();
  const state: ServeState = { engine: null, shuttingDown: false, metrics, maxBodyBytes: o.maxBodyBytes };
  const signals = shutdownSignal(io.signal);
  let server: ReturnType<typeof Bun.serve>;
  try {
    // Bun's own limit is only a backstop (its 413 has no body): the routes refuse past --max-body with an error object.
    server = Bun.serve({ hostname: o.host, port: o.port, idleTimeout: 0, maxRequestBodySize: o.maxBodyBytes + 2 ** 20, fetch: createRoutes(state) });
  } catch (e) {
    signals.dispose();
    throw new HybridgenError(`cannot listen on ${o.host}:${o.port}: ${(e as Error).message}`, "EUSAGE");
  }
  const url = `http://${o.host.includes(":") ? `[${o.host}]` : o.host}:${server.port}`;
  log(`listening on ${url} (loading the model: /health answers 503 until it is ready)`);
  try {
    return await serveModel(o, hybrid, io, state, url, signals.wait, log);
  } finally {
    signals.dispose();
    server.stop(true);
  }
}

async function serveModel(
  o: ReturnType<typeof parseServeArgs>, hybrid: Awaited<ReturnType<typeof loadHybridSelector>>, io: CliIo, state: ServeState, url: string,
  shutdown: Promise<string>, log: (line: string) => void,
): Promise<number> {
  const t0 = performance.now();
  const dir = o.model ?? (await ensureStories15M({ cacheDir: io.env.HYBRIDGEN_CACHE, onProgress: log }));
  const threads = threadsFrom(o, io.env);
  io.uninterruptible?.(true);
  using files = await openModelSource(dir, { dummyWeights: o.dummyWeights, dtype: o.dtype, threads });
  const shape = files.shape;
  const maxContext = o.context ?? Math.min(shape.maxPositions, DEFAULT_MAX_CONTEXT);
  if (maxContext > shape.maxPositions) throw new HybridgenError(`--context ${maxContext} exceeds the model's max_position_embeddings (${shape.maxPositions})`, "ECONTEXT");
  const isHybrid = hybrid.attention === "hybrid";
  const opened = await openBackend(o.device, threads, o.gpuMem);
  using backend = opened.backend;
  // Hybrid attention keeps slot 0 (the model's own sequence) idle beside the --max-batch slots: it holds a window too.
  const slots = isHybrid ? o.maxBatch + 1 : o.maxBatch;
  const window = await resolveWindowBudget(hybrid.gpuKvBudget, backend, files, { maxContext, batch: slots, hybrid: isHybrid, ...(o.kvDtype ? { kvDtype: o.kvDtype } : {}) });
  using model = loadModel(files, backend, {
    maxContext, ...(o.dtype === undefined ? {} : { weightDtype: o.dtype }), ...(o.kvDtype === undefined ? {} : { kvDtype: o.kvDtype }),
    ...(o.prefillBlock === undefined ? {} : { prefillBlock: o.prefillBlock }), ...windowLoadOptions({ ...hybrid, gpuKvBudget: window }),
  });
  // Hybrid attention: every request past the window gets a store the planner placed on the tiers left; slot 0 (the model's own sequence) stays idle.
  const ledger = isHybrid && model.cache.storeCapacity > 0 ? await StoreLedger.open(model.cache, o.tier) : null;
  let nextStore: KvStoreAllocator | null = null;
  const allocator = (): KvStoreAllocator => {
    const a = nextStore ?? ledger!.idle();
    nextStore = null;
    return a;
  };
  const profile = isHybrid ? readHybridProfile(dir, io.env.HYBRIDGEN_CACHE) : null;
  // The --max-batch slots that decode share the runtime's default stage threads, as bench --workload's sequences do; idle slot 0 takes no share.
  using hybrids = await attachHybrid(model, backend, hybrid, { profile, ...(ledger ? { storeAllocator: allocator } : {}), batch: o.maxBatch, ownIdle: true, readDepth: o.tier.readDepth });
  // Each request's sequence is made at its own context; idle slots hold the least (hybrid attention: one position past the window, a store of one block).
  const idleContext = Math.min(maxContext, ledger ? ledger.window + 1 : 1);
  using dec = new BatchDecoder(model, slots, { sequenceContext: idleContext });
  io.uninterruptible?.(false);
  const memory = deviceMemory(backend);
  const hostStoreOnDevice = isHybrid && !opened.device.startsWith("cpu");
  const device = memory && new DeviceLedger(memory, memory.free(), (c) => {
    const b = model.sequenceBytes(c);
    return b.window + b.scores + (hostStoreOnDevice ? b.scratch : 0);
  }, idleContext);
  // The bytes a step reads and the FLOPs a chunk computes, from the shape (the metrics a benchmark sets floors from).
  const info = modelInfo(files.config, shape, files.weights);
  const paramBytes = o.dtype ? DTYPE_BYTES[o.dtype] : Object.values(info.weightBytes).reduce((a, b) => a + (b ?? 0), 0) / info.parameters;
  const embed = shape.vocabSize * shape.hiddenSize;
  const plan = hybrids ? hybridPlan(hybrids.own) : undefined;
  const cost = new StepCost({
    layers: shape.layers, heads: shape.heads, kvHeads: shape.kvHeads, headDim: shape.headDim, kvElementBytes: DTYPE_BYTES[model.cache.dtype],
    decodeWeightBytes: Math.round((info.parameters - (shape.tieEmbeddings ? 0 : embed)) * paramBytes), matmulParams: info.parameters - (shape.tieEmbeddings ? 1 : 2) * embed,
  }, plan ? { logits: plan.logits, candidates: plan.candidates ?? 1, ...(plan.keep === undefined ? {} : { keep: plan.keep }) } : null);
  const name = o.servedName ?? (dir.startsWith(PRESET_PREFIX) ? dir.slice(PRESET_PREFIX.length) : basename(dir));
  const cache = model.cache;
  const scheduler = new ServeScheduler(dec, files.tokenizer, shape.vocabSize, state.metrics, {
    slots: Array.from({ length: o.maxBatch }, (_, i) => (isHybrid ? i + 1 : i)),
    queueLimit: o.maxQueue, chunk: o.prefillChunk ?? model.prefillBlock, maxContext, eos: shape.eosTokenIds,
    bytesPerToken: cost.bytesPerToken, cost,
    ledger, device, idleContext, nextStore: (a) => (nextStore = a), prune: (hybrids as { prune?: () => void } | null)?.prune,
    onError: (m) => log(`error: ${m}`),
    onHybridStats: (slot, line) => log(`slot ${slot} left: ${line}`), // where a request's step went, one line a request
  });
  log(
    `loaded ${dir} (${shape.architecture}, ${shape.layers} layers, dim ${shape.hiddenSize}, context ${maxContext}` +
      `${cache.storeCapacity === 0 ? "" : `, KV window ${cache.gpuKvBudget}`}) on ${opened.device}` +
      `${opened.device.startsWith("cpu") ? ` with ${threadCount(opened.threads)}` : ""}${opened.fallback ? ` (${opened.fallback})` : ""} in ${(performance.now() - t0).toFixed(0)} ms`,
  );
  if (o.preallocate) {
    const t1 = performance.now();
    scheduler.preallocate();
    log(`preallocated ${o.maxBatch} sequences of the whole context${ledger ? `, each with a ${ledger.storeBytes}-byte store` : ""}, in ${(performance.now() - t1).toFixed(0)} ms: kept between requests`);
  }
  if (hybrids) log(hybridPlanLine(hybrids.own));
  if (ledger) log(`KV stores: each request past the window gets one sized to its context (${ledger.storeBytes} bytes at ${maxContext}), placed on the tiers left (--kv-placement ${o.tier.kvPlacement}${o.tier.kvDisk ? `, --kv-disk ${o.tier.kvDisk}` : ""})`);
  if (device) log(`device memory for requests: ${device.budgetBytes} bytes free beside the model; each request's sequence is sized to its context and admitted when it fits`);
  state.engine = { scheduler, tokenizer: files.tokenizer, chatTemplate: files.chatTemplate, maxContext, modelName: name, created: Math.floor(Date.now() / 1000) };
  log(`ready: ${name} (chat template: ${templateName(files.chatTemplate)}), batch ${o.maxBatch}, queue ${o.maxQueue} at ${url}`);

  const why = await shutdown;
  state.shuttingDown = true;
  log(`${why}: not accepting requests; ${scheduler.running} running, ${scheduler.waiting} queued (cancelled), ${o.shutdownGrace} s to finish`);
  scheduler.cancelQueued();
  const grace = new Promise<"late">((resolve) => setTimeout(() => resolve("late"), o.shutdownGrace * 1000).unref());
  if ((await Promise.race([scheduler.idle().then(() => "done" as const), grace])) === "late") log("cancelling the requests still running");
  await scheduler.stop();
  log("stopped");
  return 0;
}
