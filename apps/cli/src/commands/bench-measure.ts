/**
 * The measurements of `hybridgen bench`: per model and context, full attention (every KV row on
 * the device) at each batch size, then at each batch size every offloading configuration from
 * the same prefilled, checkpointed KV caches (one per sequence, each with the device window of
 * --gpu-kv-budget tokens; a configuration is attached to each sequence). Decode is greedy from
 * the same first token; ms/token is the median wall time of the steps after the warm-up.
 */
import { BatchDecoder, HybridgenError, loadModel, seededRandom, type Backend, type CausalLM, type ModelFiles } from "@hybridgen/core";
import { attachAttentionConfig, attachAttentionConfigs, attentionConfig, prepareHostStore, sequenceModel, type AttachedAttention, type AttentionConfig } from "@hybridgen/runtime";
import type { BenchOptions } from "./bench-args.js";

/** One attention configuration's outcome, as every bench table row starts. */
export interface ConfigOutcome {
  readonly config: string;
  readonly family: AttentionConfig["family"];
  readonly kind: AttentionConfig["kind"];
  readonly status: "ok" | "failed" | "skipped";
  /** Why it failed (e.g. out of device memory) or was skipped. */
  readonly note?: string;
}

export interface BenchPoint extends ConfigOutcome {
  readonly model: string;
  readonly context: number;
  readonly batch: number;
  /** Median wall ms per decode step (one token of each sequence in the batch). */
  readonly msPerToken?: number;
  /** Tokens per second over the whole batch. */
  readonly tokensPerSec?: number;
  /** Offloaded tokens after the prefill. */
  readonly offloaded?: number;
  /** Hybrid configurations: K and timing at the last step. */
  readonly finalK?: number;
  readonly finalTiming?: string;
  /** Hybrid configurations: mean stage times per step after the warm-up (ms): device, CPU stage, transfers. */
  readonly stageMs?: { readonly gpu: number; readonly cpu: number; readonly tx: number };
  readonly summary?: string;
}

export interface BenchContext {
  readonly backend: Backend;
  readonly progress: (line: string) => void;
  readonly signal?: AbortSignal;
}

/**
 * Prefill block: large enough that a long context over a store in host memory is not uploaded
 * again block after block, small enough that the device window (budget + one block) stays near
 * the budget.
 */
const PREFILL_BLOCK = 4096;

/** The median step: one step slowed by another process on a shared machine does not move it. */
const median = (xs: readonly number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s.length % 2 ? s[s.length >> 1]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};
const message = (e: unknown) => (e instanceof Error ? e.message : String(e)).split("\n")[0]!;

/** The synthetic fill: `n` seeded random token ids (special ids below 3 left out). */
export function syntheticTokens(n: number, vocab: number, seed: number): Int32Array {
  const r = seededRandom(seed);
  return Int32Array.from({ length: n }, () => 3 + Math.floor(r() * (vocab - 3)));
}

/** Greedy decode of `steps` tokens from `first` at position `pos`; wall ms per step. */
function decode(model: CausalLM, first: number, pos: number, steps: number, signal?: AbortSignal): number[] {
  const walls: number[] = [];
  let tok = first;
  for (let s = 0; s < steps && !signal?.aborted; s++) {
    const t0 = performance.now();
    model.step(Int32Array.of(tok), pos + s);
    tok = model.argmaxLogits();
    walls.push(performance.now() - t0);
  }
  return walls;
}

/** Every point of one model, in the order the tables list them. */
export async function measureModel(files: ModelFiles, name: string, o: BenchOptions, cx: BenchContext): Promise<BenchPoint[]> {
  const points: BenchPoint[] = [];
  const configs = o.configs.map((c) => attentionConfig(c, o.k));
  const max = files.shape.maxPositions;
  for (const context of o.contexts) {
    if (context + o.steps > max) throw new HybridgenError(`--contexts ${context} plus --steps ${o.steps} exceeds ${name}'s max_position_embeddings (${max})`, "ECONTEXT");
  }
  const total = o.contexts.length * configs.length * o.batches.length;
  const note = (p: BenchPoint) => {
    points.push(p);
    const what = p.status === "ok" ? `${p.msPerToken!.toFixed(2)} ms/token, ${p.tokensPerSec!.toFixed(1)} tok/s` : `${p.status}: ${p.note}`;
    cx.progress(`[${points.length}/${total}] ${name} context ${p.context} batch ${p.batch} ${p.config}: ${what}`);
  };
  // One model per kind, sized for the longest context, reused (reset) for every context.
  const maxContext = Math.max(...o.contexts) + o.steps;
  const load = (windowed: boolean) => loadModel(files, cx.backend, {
    maxContext, prefillBlock: Math.min(PREFILL_BLOCK, maxContext), kvDtype: o.kvDtype,
    ...(o.dtype === undefined ? {} : { weightDtype: o.dtype }),
    ...(windowed ? { gpuKvBudget: o.gpuKvBudget, sinkTokens: o.sinkTokens } : {}),
  });
  const base = (c: AttentionConfig, context: number, batch: number) => ({ model: name, context, batch, config: c.name, family: c.family, kind: c.kind });
  const fulls = configs.filter((x) => x.kind === "full");
  if (fulls.length > 0) {
    let model: CausalLM | null = null;
    try {
      model = load(false);
    } catch (e) {
      for (const c of fulls) for (const context of o.contexts) for (const batch of o.batches) note({ ...base(c, context, batch), status: "failed", note: message(e) });
    }
    try {
      for (const context of o.contexts) {
        const prompt = syntheticTokens(context, files.shape.vocabSize, o.seed);
        for (const c of fulls) {
          for (const batch of o.batches) {
            if (cx.signal?.aborted || !model) break;
            try {
              note({ ...base(c, context, batch), status: "ok", ...measureFull(model, prompt, batch, o, cx.signal) });
            } catch (e) {
              note({ ...base(c, context, batch), status: "failed", note: message(e) });
            }
          }
        }
      }
    } finally {
      model?.close();
    }
  }
  const offloading = configs.filter((x) => x.kind !== "full");
  if (offloading.length === 0 || cx.signal?.aborted) return ordered(points, o);
  const runnable = o.contexts.filter((context) => {
    if (o.gpuKvBudget < context) return true;
    for (const c of offloading) for (const batch of o.batches) note({ ...base(c, context, batch), status: "skipped", note: `the device window (${o.gpuKvBudget}) holds the whole context` });
    return false;
  });
  if (runnable.length === 0) return ordered(points, o);
  using model = load(true);
  for (const context of runnable) {
    const prompt = syntheticTokens(context, files.shape.vocabSize, o.seed);
    for (const batch of o.batches) {
      if (cx.signal?.aborted) return ordered(points, o);
      // Every sequence of the batch holds the same prefilled context, checkpointed once.
      using dec = new BatchDecoder(model, batch);
      const slots = Array.from({ length: batch }, (_, i) => i), seqs = slots.map((i) => sequenceModel(model, dec.sequence(i)));
      const first = new Int32Array(batch);
      const t0 = performance.now();
      for (const i of slots) {
        await prepareHostStore(seqs[i]!, cx.backend, o.threads ?? 1);
        dec.prefill(i, prompt, 0);
        first[i] = dec.argmax(i);
      }
      const offloaded = model.cache.storeCount;
      cx.progress(`${name} context ${context} batch ${batch}: prefilled in ${((performance.now() - t0) / 1e3).toFixed(1)} s; ${offloaded} tokens offloaded per sequence, window ${o.gpuKvBudget} with ${o.sinkTokens} sinks`);
      const cps = seqs.map((s) => s.cache.checkpoint());
      try {
        for (const c of offloading) {
          if (cx.signal?.aborted) return ordered(points, o);
          const attached: AttachedAttention[] = [];
          try {
            // The configuration on each sequence (its own scheduler; a batch's stages are lanes of one native stage).
            attached.push(...await attachAttentionConfigs(seqs, cx.backend, c, o.cpuStageThreads === undefined ? {} : { cpuStageThreads: o.cpuStageThreads }));
            const walls = decodeSteps(dec, Array.from(first, (_, i) => i), first, o.steps, cx.signal);
            const ms = median(walls.slice(o.warmup));
            const a = attached[0]!, trace = a.trace(), last = trace.at(-1), tail = trace.slice(o.warmup);
            const avg = (f: (t: (typeof tail)[number]) => number) => tail.reduce((x, t) => x + f(t), 0) / tail.length;
            note({
              ...base(c, context, batch), status: "ok", msPerToken: ms, tokensPerSec: (1000 * batch) / ms, offloaded,
              ...(last ? { finalK: last.k, finalTiming: last.timing } : {}),
              ...(tail.length ? { stageMs: { gpu: avg((t) => t.tGpuMs), cpu: avg((t) => t.tCpuMs), tx: avg((t) => t.tTxMs) } } : {}),
              summary: a.summary(),
            });
          } catch (e) {
            if (e instanceof HybridgenError && !/memory/i.test(e.message)) throw e;
            note({ ...base(c, context, batch), status: "failed", note: message(e) });
          } finally {
            for (const a of attached) a.close();
            seqs.forEach((s, i) => s.cache.restore(cps[i]!));
          }
        }
      } finally {
        for (const cp of cps) cp[Symbol.dispose]();
      }
    }
  }
  return ordered(points, o);
}

/** Greedy batched decode of `steps` steps of `slots`, each from its `first` token (at its cache's length); wall ms per step. */
export function decodeSteps(dec: BatchDecoder, slots: number[], first: Int32Array, steps: number, signal?: AbortSignal): number[] {
  const ids = Int32Array.from(first), walls: number[] = [];
  for (let s = 0; s < steps && !signal?.aborted; s++) {
    const t0 = performance.now();
    dec.step(slots, ids);
    dec.argmaxSlots(slots, ids);
    walls.push(performance.now() - t0);
  }
  return walls;
}

/** Points by context, then configuration in --configs order, then batch (the tables' order). */
function ordered(points: BenchPoint[], o: BenchOptions): BenchPoint[] {
  const rank = (p: BenchPoint) => o.configs.indexOf(p.config);
  return points.sort((a, b) => a.context - b.context || a.batch - b.batch || rank(a) - rank(b));
}

/** Full attention at `batch` sequences, each prefilled with the context. */
function measureFull(m: CausalLM, prompt: Int32Array, batch: number, o: BenchOptions, signal?: AbortSignal): { msPerToken: number; tokensPerSec: number } {
  let walls: number[];
  if (batch === 1) {
    m.reset();
    m.step(prompt, 0);
    walls = decode(m, m.argmaxLogits(), prompt.length, o.steps, signal);
  } else {
    using dec = new BatchDecoder(m, batch);
    const slots = Array.from({ length: batch }, (_, i) => i);
    const ids = new Int32Array(batch);
    for (const s of slots) {
      dec.prefill(s, prompt, 0);
      ids[s] = dec.argmax(s);
    }
    walls = [];
    for (let s = 0; s < o.steps && !signal?.aborted; s++) {
      const t0 = performance.now();
      dec.step(slots, ids);
      dec.argmaxSlots(slots, ids);
      walls.push(performance.now() - t0);
    }
  }
  const ms = median(walls.slice(o.warmup));
  return { msPerToken: ms, tokensPerSec: (1000 * batch) / ms };
}
