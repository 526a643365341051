/**
 * `hybridgen generate --prompts FILE [--batch N]`: every prompt of a JSONL file through
 * core's generateBatch (continuous batching, one forward pass a step for the N sequences in
 * flight). stdout gets one JSON line per prompt as it finishes, with its "index" among the
 * file's prompts (and its "line"); stderr gets the totals: aggregate decode tokens/s and the batch.
 */
import { generateBatch, type CausalLM, type Tokenizer } from "@hybridgen/core";
import { formatRate, samplingOf, type GenerateCliOptions } from "../generate-options.js";
import type { CliIo } from "../io.js";
import type { JsonlPrompt } from "../read-prompts-jsonl.js";

/** A prompt of the file, rendered (chat template) and tokenized. */
export interface EncodedPrompt extends JsonlPrompt {
  readonly text: string;
  readonly ids: number[];
}

/** Runs every prompt; returns true when Ctrl-C stopped it (unfinished prompts end with "abort"). */
export async function runPromptsBatch(
  model: CausalLM, tokenizer: Tokenizer, prompts: readonly EncodedPrompt[], opts: GenerateCliOptions, io: CliIo, device: string,
): Promise<boolean> {
  const gen = generateBatch(
    model, tokenizer,
    prompts.map((p) => ({
      prompt: p.ids,
      maxTokens: p.max_tokens,
      sampling: { temperature: p.temperature, seed: p.seed },
    })),
    {
      batch: opts.batch ?? 1,
      maxTokens: opts.maxTokens,
      stop: opts.stop,
      sampling: samplingOf(opts), // without --seed each prompt draws one
      signal: io.signal,
    },
  );
  let aborted = false;
  for await (const e of gen) {
    if (e.type !== "done") continue;
    const p = prompts[e.index], r = e.result;
    aborted ||= r.finishReason === "abort";
    io.stdout(
      `${JSON.stringify({
        index: e.index,
        line: p.line,
        prompt: p.text,
        text: r.text,
        finishReason: r.finishReason,
        promptTokens: r.promptTokens,
        generatedTokens: r.tokens.length,
        tokens: r.tokens,
        seed: r.seed,
        timings: r.timings,
      })}\n`,
    );
  }
  const res = await gen.result();
  io.stderr(
    `prompts: ${res.results.length}, batch: ${res.batch} | prompt: ${res.promptTokens} tokens, ${formatRate(res.promptTokensPerSec)} tok/s | ` +
      `generated: ${res.generatedTokens} tokens, ${formatRate(res.tokensPerSec)} tok/s (all sequences) in ${res.steps} decode steps | device: ${device}\n`,
  );
  return aborted;
}
