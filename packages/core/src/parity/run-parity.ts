/**
 * Runs one parity case on a backend and measures it against the transformers reference (core's
 * test/fixtures/parity/refs.json, parsed by parseParityRefs): the prompt's logits at every position (fed token by token),
 * the last prompt position after a blocked prefill, and 16 greedy decode steps after that
 * prefill (the engine's greedy choice checked, the reference token fed).
 */
import { loadModel } from "../architectures.js";
import type { Backend } from "@hybridgen/spec";
import { ByteTokenizer } from "../byte-tokenizer.js";
import type { ModelFiles } from "../model-files.js";
import { PROMPT_TOKENS, parityCheckpoint, type ParityCase } from "./cases.js";

export interface CaseRef {
  ids: number[];
  vocab: number;
  prefill: Float32Array; // [64, vocab]
  decodeTokens: number[];
  decode: Float32Array; // [16, vocab]
}

function f32(b64: string): Float32Array {
  const bytes = Buffer.from(b64, "base64");
  return new Float32Array(new Uint8Array(bytes).buffer);
}

/** The references file's cases (JSON text of refs.json) by case name. */
export function parseParityRefs(text: string): Map<string, CaseRef> {
  const raw = JSON.parse(text) as { cases: Record<string, { ids: number[]; vocab: number; prefill_logits: string; decode_tokens: number[]; decode_logits: string }> };
  return new Map(Object.entries(raw.cases).map(([k, v]) => [k, { ids: v.ids, vocab: v.vocab, prefill: f32(v.prefill_logits), decodeTokens: v.decode_tokens, decode: f32(v.decode_logits) }]));
}

/** max |a − b| / max |b| over one row. */
export function relError(a: Float32Array, b: Float32Array): number {
  let diff = 0, scale = 0;
  for (let i = 0; i < b.length; i++) {
    diff = Math.max(diff, Math.abs(a[i] - b[i]));
    scale = Math.max(scale, Math.abs(b[i]));
  }
  return diff / scale;
}

export interface ParityResult {
  /** Worst row of the prompt fed token by token. */
  sequence: number;
  /** Last prompt row after a blocked prefill. */
  prefill: number;
  /** Worst decode step. */
  decode: number;
  /** Decode steps whose engine argmax differed from the reference token where the
   * reference's top two were further apart than the tolerance. */
  greedyMismatches: number;
}

export function runParityCase(c: ParityCase, ref: CaseRef, backend: Backend, tol: number, prefillBlock = 16): ParityResult {
  const { config, shape, weights } = parityCheckpoint(c);
  const files: ModelFiles = {
    dir: c.name, config, shape, weights, tokenizer: new ByteTokenizer(shape.vocabSize),
    close: () => {}, [Symbol.dispose]: () => {},
  };
  const V = ref.vocab;
  const row = (a: Float32Array, i: number) => a.subarray(i * V, (i + 1) * V);
  using model = loadModel(files, backend, { maxContext: 96, prefillBlock });
  let sequence = 0;
  for (let i = 0; i < PROMPT_TOKENS; i++) sequence = Math.max(sequence, relError(model.forward(Int32Array.of(ref.ids[i]), i), row(ref.prefill, i)));

  model.reset();
  const prefill = relError(model.forward(Int32Array.from(ref.ids), 0), row(ref.prefill, PROMPT_TOKENS - 1));
  let decode = 0, greedyMismatches = 0;
  let expectedRow = row(ref.prefill, PROMPT_TOKENS - 1);
  for (let s = 0; s < ref.decodeTokens.length; s++) {
    const tok = ref.decodeTokens[s];
    if (model.argmaxLogits() !== tok) {
      const sorted = [...expectedRow].sort((x, y) => y - x);
      const scale = Math.max(...expectedRow.map(Math.abs));
      if (sorted[0] - sorted[1] > tol * scale) greedyMismatches++;
    }
    const logits = model.forward(Int32Array.of(tok), PROMPT_TOKENS + s);
    expectedRow = row(ref.decode, s);
    decode = Math.max(decode, relError(logits, expectedRow));
  }
  return { sequence, prefill, decode, greedyMismatches };
}
