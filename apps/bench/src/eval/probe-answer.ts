/**
 * One recall prompt answered with a probing selector attached after its prefill (fixed K, pre-QKᵀ,
 * exact logits, one stage thread): the per-prompt step of index-recall.ts and quest-recall-4l.ts.
 */
import { argmax, type Backend, type LlamaModel, type TokenSelector } from "@hybridgen/core";
import { createHybridAttention } from "@hybridgen/runtime";

export async function answerWithProbe(
  model: LlamaModel, be: Backend, prompt: { context: number[]; key: number; answer: number }, ask: number, selector: TokenSelector, k: number,
): Promise<boolean> {
  model.reset();
  model.forward(Int32Array.from(prompt.context), 0);
  const h = await createHybridAttention(model, be, { scheduler: "fixed", timing: "pre", selector, logits: "exact", k, cpuStageThreads: 1 });
  try {
    model.forward(Int32Array.of(ask), prompt.context.length);
    return argmax(model.forward(Int32Array.of(prompt.key), prompt.context.length + 1)) === prompt.answer;
  } finally {
    h.close();
  }
}
