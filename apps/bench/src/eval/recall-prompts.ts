/**
 * recall-4l's retrieval prompts, shared by recall-eval.ts and quest-recall-4l.ts: a haystack of
 * `length` − 2 tokens (BOS, fillers, `records` records `kA vB .` with distinct keys at random
 * places), then the query `? kA` of one record, asked as two decode steps.
 */
export interface RecallVocabulary {
  readonly fillers: number[];
  readonly keys: number[];
  readonly values: number[];
  readonly dot: number;
  readonly ask: number;
  readonly bos: number;
}

interface Tokenizer {
  encode(text: string, options: { addBos: boolean }): ArrayLike<number>;
}

/** The prompts' words as token ids; each must be one token of the model's vocabulary. */
export function recallVocabulary(tokenizer: Tokenizer, model: string): RecallVocabulary {
  const vocab = (word: string) => {
    const ids = tokenizer.encode(word, { addBos: false });
    if (ids.length !== 1) throw new Error(`"${word}" is not one token of ${model}'s vocabulary`);
    return ids[0]!;
  };
  return {
    fillers: Array.from({ length: 1000 }, (_, i) => vocab(`f${i}`)),
    keys: Array.from({ length: 256 }, (_, i) => vocab(`k${i}`)),
    values: Array.from({ length: 256 }, (_, i) => vocab(`v${i}`)),
    dot: vocab("."), ask: vocab("?"), bos: tokenizer.encode("", { addBos: true })[0]!,
  };
}

export function makeRecallPrompt(v: RecallVocabulary, r: () => number, length: number, records: number): { context: number[]; key: number; answer: number } {
  const body = length - 3; // BOS + body + "? kA"
  const context = Array.from({ length: body }, () => v.fillers[Math.floor(r() * v.fillers.length)]!);
  const keys = new Set<number>();
  while (keys.size < records) keys.add(Math.floor(r() * v.keys.length));
  const recs = [...keys].map((k) => ({ key: v.keys[k]!, value: v.values[Math.floor(r() * v.values.length)]! }));
  // Non-overlapping places: one per equal share of the body.
  const share = Math.floor(body / records);
  recs.forEach((rec, i) => {
    const at = i * share + Math.floor(r() * (share - 3));
    context.splice(at, 3, rec.key, rec.value, v.dot);
  });
  const asked = recs[Math.floor(r() * recs.length)]!;
  return { context: [v.bos, ...context], key: asked.key, answer: asked.value };
}
