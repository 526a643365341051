/**
 * generate(): prompt in, a stream of tokens out, then a final result.
 *
 *   const gen = generate(model, tokenizer, "Once upon a time", { maxTokens: 64 });
 *   for await (const t of gen) process.stdout.write(t.text);
 *   const { finishReason, timings } = await gen.result();
 *
 * Text is decoded with a streaming TextDecoder, so a character whose UTF-8 bytes arrive in
 * several byte tokens comes out whole. Text that might be the start of a stop string is
 * held back until it is known not to be one; the stop string itself is never emitted.
 */
import { z } from "zod";
import type { ModelShape } from "./config.js";
import { check, fail } from "@hybridgen/spec";
import { checkIdle, claimModel, releaseModel } from "./model-busy.js";
import { nextTurn } from "./next-turn.js";
import { Sampler, SamplingOptionsSchema } from "./sampler.js";
import { TokenText } from "./token-text.js";
import type { Tokenizer } from "./tokenizer.js";

/** What generate needs from a model (LlamaModel has it). */
export interface GenerativeModel {
  readonly shape: Pick<ModelShape, "vocabSize" | "eosTokenIds">;
  readonly maxContext: number;
  /** Rows per prefill call; generate checks for abort between them. */
  readonly prefillBlock?: number;
  reset(): void;
  step(ids: Int32Array, startPos: number): void;
  /** The prompt is this long though prefilled block by block (DecoderModel: its last block is the one a prefill observer sees). */
  expectPrompt?(tokens: number): void;
  readLogits(): Float32Array;
  argmaxLogits(): number;
  /** Greedy decode fed on the device (DecoderModel has it; used when feedsOnDevice is true). */
  readonly feedsOnDevice?: boolean;
  pickToFeed?(slot: number): void;
  stepFed?(startPos: number): void;
  fedToken?(slot: number): number;
}

export const GenerateOptionsSchema = z.object({
  maxTokens: z.number().int().positive().default(256),
  /** Generation ends before the first occurrence of any of these. */
  stop: z.array(z.string().min(1)).default([]),
  sampling: SamplingOptionsSchema.prefault({}),
  signal: z.custom<AbortSignal>((v) => v instanceof AbortSignal, "expected an AbortSignal").optional(),
  /** Prepend BOS to a string prompt (when the tokenizer has one). */
  addBos: z.boolean().default(true),
});
export type GenerateOptions = z.input<typeof GenerateOptionsSchema>;

export interface GeneratedToken {
  /** The token id; -1 for a final item that only flushes held-back text (at EOS or abort). */
  readonly id: number;
  /** The text this item releases (may be "" while a multi-byte character or a possible stop
   * string is pending). */
  readonly text: string;
  /** 0-based index among generated tokens. */
  readonly index: number;
}

export type FinishReason = "eos" | "length" | "stop" | "abort" | "context";

export interface GenerateResult {
  readonly text: string;
  readonly tokens: number[];
  readonly promptTokens: number;
  readonly finishReason: FinishReason;
  /** The sampling seed used (drawn at random when none was given). */
  readonly seed: number;
  readonly timings: {
    readonly prefillMs: number;
    /** Engine time after the prefill: sampling and decode forwards (not the consumer's). */
    readonly decodeMs: number;
    readonly promptTokensPerSec: number;
    readonly tokensPerSec: number;
  };
}

export interface Generation extends AsyncIterable<GeneratedToken> {
  /** The final result; drains the stream first if it was not iterated to the end. */
  result(): Promise<GenerateResult>;
}

/**
 * Start generating. Options and the prompt are checked now (a prompt longer than the context
 * throws before any work); tokens are produced as the returned Generation is iterated.
 */
export function generate(model: GenerativeModel, tokenizer: Tokenizer, prompt: string | readonly number[], options: GenerateOptions = {}): Generation {
  const parsed = GenerateOptionsSchema.safeParse(options);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    fail(`invalid generate option ${issue.path.join(".")}: ${issue.message}`);
  }
  const opts = parsed.data;
  const ids = promptIds(model, tokenizer, prompt, opts.addBos, "the prompt");
  checkIdle(model);
  const sampler = new Sampler(model.shape.vocabSize, opts.sampling);
  let final: GenerateResult | null = null;
  const stream = run(model, tokenizer, ids, opts, sampler, (r) => (final = r));
  return {
    [Symbol.asyncIterator]: () => stream,
    async result() {
      for await (const _ of stream);
      return final!;
    },
  };
}

/** Convenience: run to the end and return the result. */
export function generateText(model: GenerativeModel, tokenizer: Tokenizer, prompt: string | readonly number[], options: GenerateOptions = {}): Promise<GenerateResult> {
  return generate(model, tokenizer, prompt, options).result();
}

/** The prompt's token ids, checked: not empty, ids in the vocabulary, within the context. */
export function promptIds(model: Pick<GenerativeModel, "shape" | "maxContext">, tokenizer: Tokenizer, prompt: string | readonly number[], addBos: boolean, what: string): number[] {
  const ids = typeof prompt === "string" ? tokenizer.encode(prompt, { addBos }) : Array.from(prompt);
  check(ids.length > 0, `${what} is empty`);
  const vocab = model.shape.vocabSize;
  for (const id of ids) if (!(Number.isInteger(id) && id >= 0 && id < vocab)) fail(`${what === "the prompt" ? "prompt" : `${what}:`} token id ${id} out of range [0, ${vocab})`);
  check(ids.length <= model.maxContext, `${what} has ${ids.length} tokens but the context holds ${model.maxContext}`);
  return ids;
}

async function* run(
  model: GenerativeModel, tokenizer: Tokenizer, promptIds: number[],
  opts: z.output<typeof GenerateOptionsSchema>, sampler: Sampler, done: (r: GenerateResult) => void,
): AsyncGenerator<GeneratedToken> {
  const { maxTokens, stop, signal } = opts;
  const greedy = sampler.greedy;
  const eos = new Set(model.shape.eosTokenIds);
  const tokens: number[] = [];
  const P = promptIds.length;
  const out = new TokenText(tokenizer, stop, promptIds[P - 1]);
  let finish: FinishReason | null = null;
  let prefillMs = 0, decodeMs = 0;
  const aborted = () => signal?.aborted === true;

  claimModel(model);
  try {
    model.reset();
    model.expectPrompt?.(P);
    sampler.observeAll(promptIds);
    // Prefill block by block, so an abort (Ctrl-C) is seen during a long prompt too.
    const block = model.prefillBlock ?? P;
    const all = Int32Array.from(promptIds);
    for (let off = 0; off < P && !finish; off += block) {
      if (aborted()) finish = "abort";
      else {
        const t0 = performance.now();
        model.step(all.subarray(off, Math.min(P, off + block)), off);
        prefillMs += performance.now() - t0;
        if (off + block < P) await nextTurn();
      }
    }
    const one = new Int32Array(1);
    // Greedy decode fed on the device: step index + 1 (which embeds token `index` on the device)
    // is launched before the host reads token `index`, so the device never waits for the host.
    // When token `index` ends generation, that step ran for nothing (the next generate resets).
    const fed = greedy && model.feedsOnDevice === true;
    if (fed && !finish) model.pickToFeed!(0);
    for (let index = 0; !finish; index++) {
      if (aborted()) {
        finish = "abort";
        break;
      }
      let t0 = performance.now();
      let id: number;
      if (fed) {
        if (index + 1 < maxTokens && P + index < model.maxContext) {
          model.stepFed!(P + index);
          model.pickToFeed!((index + 1) & 1);
        }
        id = model.fedToken!(index & 1);
      } else {
        id = greedy ? model.argmaxLogits() : sampler.sample(model.readLogits());
      }
      decodeMs += performance.now() - t0;
      if (eos.has(id)) {
        finish = "eos";
        break;
      }
      tokens.push(id);
      sampler.observe(id);
      // The last token (length, or no position left to feed it back) releases everything.
      const last = index + 1 >= maxTokens || P + index >= model.maxContext;
      const { release, stopped } = out.push(id, last);
      if (stopped) finish = "stop";
      else if (last) finish = index + 1 >= maxTokens ? "length" : "context";
      yield { id, text: release, index };
      if (finish) break;

      await nextTurn(); // let signal handlers (Ctrl-C) run between tokens
      if (aborted()) {
        finish = "abort";
        break;
      }
      if (fed) continue; // this token's step is already running
      t0 = performance.now();
      one[0] = id;
      model.step(one, P + index);
      decodeMs += performance.now() - t0;
    }
    if (finish === "eos" || finish === "abort") {
      const rest = out.flush();
      if (rest) {
        yield { id: -1, text: rest, index: tokens.length };
      }
    }
  } finally {
    // Reached with finish unset when the consumer stops iterating early.
    releaseModel(model);
    const reason = finish ?? "abort";
    done({
      text: out.text, tokens, promptTokens: P, finishReason: reason, seed: sampler.options.seed,
      timings: {
        prefillMs, decodeMs,
        promptTokensPerSec: prefillMs > 0 ? (P * 1000) / prefillMs : 0,
        tokensPerSec: decodeMs > 0 ? (tokens.length * 1000) / decodeMs : 0,
      },
    });
  }
}
