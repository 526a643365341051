/**
 * generateBatch(): many prompts, decoded `batch` at a time with continuous batching.
 *
 *   const gen = generateBatch(model, tokenizer, [{ prompt: "a" }, { prompt: "b", maxTokens: 8 }], { batch: 8 });
 *   for await (const e of gen) if (e.type === "done") console.log(e.index, e.result.text);
 *   const { results, tokensPerSec } = await gen.result();
 *
 * Up to `batch` sequences are in flight, each in its own slot (KV cache). A new prompt is
 * prefilled alone (the ordinary path) into a free slot; then every decode step runs the next
 * token of all sequences in flight as ONE forward pass (BatchDecoder.step). When a sequence
 * ends (EOS, stop string, max tokens, context), its slot takes the next prompt of the queue.
 * Each sequence has its own sampler (seed), stop strings and token budget, so its text is
 * what generate() gives for that prompt alone. Events stream per prompt, tagged with the
 * prompt's index; result() lists the results in input order.
 */
import { z } from "zod";
import { BatchDecoder, type BatchModel } from "./batch-decoder.js";
import { MAX_BATCH } from "./decoder-model.js";
import { fail } from "@hybridgen/spec";
import { GenerateOptionsSchema, promptIds, type FinishReason, type GeneratedToken, type GenerateResult } from "./generate.js";
import { claimModel, checkIdle, releaseModel } from "./model-busy.js";
import { nextTurn } from "./next-turn.js";
import { Sampler } from "./sampler.js";
import { TokenText } from "./token-text.js";
import type { Tokenizer } from "./tokenizer.js";

/** One prompt and its own settings (each falls back to the batch options). */
export const BatchRequestSchema = z.object({
  prompt: z.union([z.string(), z.array(z.number().int())]),
  maxTokens: z.number().int().positive().optional(),
  stop: z.array(z.string().min(1)).optional(),
  /** Overrides of the batch's sampling options (absent keys keep the batch's). */
  sampling: z.object({
    temperature: z.number().min(0).optional(),
    topK: z.number().int().min(0).optional(),
    topP: z.number().gt(0).max(1).optional(),
    repetitionPenalty: z.number().min(1).optional(),
    seed: z.number().int().optional(),
  }).strict().optional(),
});
export type BatchRequest = z.input<typeof BatchRequestSchema>;

export const GenerateBatchOptionsSchema = GenerateOptionsSchema.extend({
  /** Sequences decoded together (slots). */
  batch: z.number().int().min(1).max(MAX_BATCH).default(8),
});
export type GenerateBatchOptions = z.input<typeof GenerateBatchOptionsSchema>;

export type BatchEvent =
  /** A token of prompt `index` (its text may be "" while held back, as in generate()). */
  | { readonly type: "token"; readonly index: number; readonly token: GeneratedToken }
  /** Prompt `index` is finished. */
  | { readonly type: "done"; readonly index: number; readonly result: GenerateResult };

export interface BatchGenerateResult {
  /** One per request, in input order. Per-sequence decodeMs is the time of the steps it was in. */
  readonly results: GenerateResult[];
  readonly batch: number;
  /** Batched decode steps run (forward passes after the prefills). */
  readonly steps: number;
  readonly promptTokens: number;
  readonly generatedTokens: number;
  readonly prefillMs: number;
  /** Engine time outside prefills: decode steps and sampling. */
  readonly decodeMs: number;
  /** Aggregate decode throughput: every generated token ÷ decodeMs. */
  readonly tokensPerSec: number;
  readonly promptTokensPerSec: number;
}

export interface BatchGeneration extends AsyncIterable<BatchEvent> {
  /** The final result; drains the stream first if it was not iterated to the end. */
  result(): Promise<BatchGenerateResult>;
}

/** A sequence in flight or waiting. */
interface Seq {
  readonly index: number;
  readonly ids: number[];
  readonly sampler: Sampler;
  readonly greedy: boolean;
  readonly maxTokens: number;
  readonly text: TokenText;
  readonly tokens: number[];
  slot: number;
  /** The token to feed in the next step. */
  next: number;
  finish: FinishReason | null;
  prefillMs: number;
  decodeMs: number;
}

/**
 * Start a batched generation. Options, requests and every prompt are checked now (a prompt
 * longer than the context throws, naming its index, before any work).
 */
export function generateBatch(model: BatchModel, tokenizer: Tokenizer, requests: readonly BatchRequest[], options: GenerateBatchOptions = {}): BatchGeneration {
  const parsed = GenerateBatchOptionsSchema.safeParse(options);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    fail(`invalid generate option ${issue.path.join(".")}: ${issue.message}`);
  }
  const opts = parsed.data;
  if (requests.length === 0) fail("generateBatch: no prompts");
  const seqs = requests.map((raw, index): Seq => {
    const r = BatchRequestSchema.safeParse(raw);
    if (!r.success) fail(`prompt ${index}: invalid ${r.error.issues[0].path.join(".")}: ${r.error.issues[0].message}`);
    const ids = promptIds(model, tokenizer, r.data.prompt, opts.addBos, `prompt ${index}`);
    const own = Object.fromEntries(Object.entries(r.data.sampling ?? {}).filter(([, v]) => v !== undefined));
    const sampler = new Sampler(model.shape.vocabSize, { ...opts.sampling, ...own });
    return {
      index, ids, sampler, greedy: sampler.greedy,
      maxTokens: r.data.maxTokens ?? opts.maxTokens, text: new TokenText(tokenizer, r.data.stop ?? opts.stop, ids[ids.length - 1]),
      tokens: [], slot: -1, next: -1, finish: null, prefillMs: 0, decodeMs: 0,
    };
  });
  checkIdle(model);
  const batch = Math.min(opts.batch, seqs.length);
  model.reserveBatch(batch); // fails now for an architecture without batched decode
  let final: BatchGenerateResult | null = null;
  const stream = run(model, seqs, batch, opts.signal, (r) => (final = r));
  return {
    [Symbol.asyncIterator]: () => stream,
    async result() {
      for await (const _ of stream);
      return final!;
    },
  };
}

async function* run(
  model: BatchModel, seqs: Seq[], batch: number, signal: AbortSignal | undefined, done: (r: BatchGenerateResult) => void,
): AsyncGenerator<BatchEvent> {
  const eos = new Set(model.shape.eosTokenIds);
  const aborted = () => signal?.aborted === true;
  const active: Seq[] = [];
  let queued = 0, steps = 0, prefillMs = 0, decodeMs = 0;

  /** Takes the chosen token `id` of `s` (EOS, stop, budget, context); yields its events. */
  function* accept(s: Seq, id: number): Generator<BatchEvent> {
    if (eos.has(id)) {
      s.finish = "eos";
      const rest = s.text.flush();
      if (rest) yield { type: "token", index: s.index, token: { id: -1, text: rest, index: s.tokens.length } };
      return;
    }
    const index = s.tokens.length;
    s.tokens.push(id);
    s.sampler.observe(id);
    const P = s.ids.length;
    // The last token (budget, or no position left to feed it back) releases everything.
    const last = index + 1 >= s.maxTokens || P + index >= model.maxContext;
    const { release, stopped } = s.text.push(id, last);
    if (stopped) s.finish = "stop";
    else if (last) s.finish = index + 1 >= s.maxTokens ? "length" : "context";
    yield { type: "token", index: s.index, token: { id, text: release, index } };
    s.next = id;
  }

  claimModel(model);
  let decoder: BatchDecoder | null = null;
  const free = Array.from({ length: batch }, (_, i) => batch - 1 - i); // slot 0 first
  try {
    const dec = (decoder = new BatchDecoder(model, batch));
    const pick = (s: Seq): number => (s.greedy ? dec.argmax(s.slot) : s.sampler.sample(dec.logits(s.slot)));
    const picks = new Int32Array(batch); // a step's greedy picks, one backend call (argmaxSlots)
    for (;;) {
      // Continuous batching: free slots take queued prompts (prefilled one at a time).
      while (free.length > 0 && queued < seqs.length && !aborted()) {
        const s = seqs[queued++];
        s.slot = free.pop()!;
        s.sampler.observeAll(s.ids);
        const all = Int32Array.from(s.ids), P = all.length, block = model.prefillBlock;
        for (let off = 0; off < P && !s.finish; off += block) {
          if (aborted()) s.finish = "abort";
          else {
            const t0 = performance.now();
            dec.prefill(s.slot, all.subarray(off, Math.min(P, off + block)), off);
            s.prefillMs += performance.now() - t0;
            if (off + block < P) await nextTurn();
          }
        }
        if (!s.finish) {
          const t0 = performance.now();
          const id = pick(s);
          const ms = performance.now() - t0;
          s.decodeMs += ms;
          decodeMs += ms;
          yield* accept(s, id);
        }
        prefillMs += s.prefillMs;
        if (s.finish) {
          free.push(s.slot);
          yield finished(s);
        } else {
          active.push(s);
        }
      }
      if (active.length === 0) break;
      await nextTurn(); // let signal handlers (Ctrl-C) run between steps
      if (aborted()) break;

      // One forward pass for every sequence in flight, then each picks its token.
      const t0 = performance.now();
      const slots = active.map((s) => s.slot);
      dec.step(slots, Int32Array.from(active, (s) => s.next));
      steps++;
      if (active.some((s) => s.greedy)) dec.argmaxSlots(slots, picks);
      const ids = active.map((s, i) => (s.greedy ? picks[i] : pick(s)));
      const ms = performance.now() - t0;
      decodeMs += ms;
      for (let i = 0; i < active.length; i++) {
        const s = active[i];
        s.decodeMs += ms;
        yield* accept(s, ids[i]);
      }
      for (let i = active.length - 1; i >= 0; i--) {
        const s = active[i];
        if (!s.finish) continue;
        active.splice(i, 1);
        free.push(s.slot);
        yield finished(s);
      }
    }
    // Aborted: what is in flight or queued ends with "abort".
    for (const s of seqs) {
      if (s.finish) continue;
      s.finish = "abort";
      const rest = s.text.flush();
      if (rest) yield { type: "token", index: s.index, token: { id: -1, text: rest, index: s.tokens.length } };
      yield finished(s);
    }
  } finally {
    decoder?.close();
    releaseModel(model);
    const results = seqs.map(resultOf);
    const promptTokens = seqs.reduce((a, s) => a + s.ids.length, 0), generated = seqs.reduce((a, s) => a + s.tokens.length, 0);
    done({
      results, batch, steps, promptTokens, generatedTokens: generated, prefillMs, decodeMs,
      tokensPerSec: decodeMs > 0 ? (generated * 1000) / decodeMs : 0,
      promptTokensPerSec: prefillMs > 0 ? (promptTokens * 1000) / prefillMs : 0,
    });
  }
}

function finished(s: Seq): BatchEvent {
  return { type: "done", index: s.index, result: resultOf(s) };
}

function resultOf(s: Seq): GenerateResult {
  const P = s.ids.length;
  return {
    text: s.text.text, tokens: s.tokens.slice(), promptTokens: P, finishReason: s.finish ?? "abort", seed: s.sampler.options.seed,
    timings: {
      prefillMs: s.prefillMs, decodeMs: s.decodeMs,
      promptTokensPerSec: s.prefillMs > 0 ? (P * 1000) / s.prefillMs : 0,
      tokensPerSec: s.decodeMs > 0 ? (s.tokens.length * 1000) / s.decodeMs : 0,
    },
  };
}
