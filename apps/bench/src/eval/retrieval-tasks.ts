/**
 * RULER-like retrieval prompts in the recall-4l vocabulary (`<s> = ? .`, fillers f0–f999, keys
 * k0–k255, values v0–v255; one word, one token), shared by the accuracy eval and, as text, by the
 * training script (apps/bench/train/retrieval_models.py writes the same formats):
 *
 * - needle: records `kA vB .` (distinct keys) spread over a haystack of fillers; asked `? kA`,
 *   answer `vB` (RULER's multi-key needle: many needles, one asked).
 * - multivalue: one key holds several records `kA vB .` at different places; asked `? kA`, the
 *   answer is all its values in order of appearance.
 * - vartrack: a chain of assignments `kA vB .` … `kC kA .` … `kD kC .` (a record whose value is a key:
 *   kD holds kC, kC holds kA; each link later in the haystack) among distractors of which a quarter
 *   hold another distractor's key; asked `? kD`, the answer is the walk `kC kA vB` (the chain followed
 *   to its end, one hop a decode step: each hop's record is at another place in the haystack).
 *
 * The context ends just before the question; the question and all but the last answer token are
 * fed as decode steps, so every answer token depends on decode-time attention.
 */
export interface RetrievalVocabulary {
  readonly fillers: number[];
  readonly keys: number[];
  readonly values: number[];
  readonly dot: number;
  readonly ask: number;
  readonly bos: number;
}

export const TASKS = ["needle", "multivalue", "vartrack"] as const;
export type Task = (typeof TASKS)[number];

export interface RetrievalPrompt {
  /** Prefilled tokens (BOS first). */
  readonly context: number[];
  /** Decode steps after the context: the question, then the answer's tokens but the last. */
  readonly question: number[];
  /** The answer's tokens, each predicted after the question and the answer tokens before it. */
  readonly answer: number[];
}

interface Tokenizer {
  encode(text: string, options: { addBos: boolean }): ArrayLike<number>;
}

export function retrievalVocabulary(tokenizer: Tokenizer, model: string): RetrievalVocabulary {
  const one = (word: string) => {
    const ids = tokenizer.encode(word, { addBos: false });
    if (ids.length !== 1) throw new Error(`"${word}" is not one token of ${model}'s vocabulary`);
    return ids[0]!;
  };
  return {
    fillers: Array.from({ length: 1000 }, (_, i) => one(`f${i}`)),
    keys: Array.from({ length: 256 }, (_, i) => one(`k${i}`)),
    values: Array.from({ length: 256 }, (_, i) => one(`v${i}`)),
    dot: one("."), ask: one("?"), bos: tokenizer.encode("", { addBos: true })[0]!,
  };
}

/** Distinct integers in [0, n). */
function distinct(r: () => number, count: number, n: number): number[] {
  const s = new Set<number>();
  while (s.size < count) s.add(Math.floor(r() * n));
  return [...s];
}

/**
 * A prompt of `length` tokens (context + question + answer) of `task`, `records` records
 * (needle) or distractor records (multivalue, vartrack) in the haystack.
 */
export function retrievalPrompt(v: RetrievalVocabulary, task: Task, r: () => number, length: number, records: number): RetrievalPrompt {
  const int = (n: number) => Math.floor(r() * n);
  const pieces: number[][] = [];
  let question: number[], answer: number[];
  const keyIds = distinct(r, Math.min(255, records + 8), 256);
  const rec = (k: number, val: number) => [v.keys[k]!, v.values[val]!, v.dot];
  if (task === "needle") {
    const recs = keyIds.slice(0, records).map((k) => ({ k, val: int(256) }));
    for (const x of recs) pieces.push(rec(x.k, x.val));
    const asked = recs[int(recs.length)]!;
    question = [v.ask, v.keys[asked.k]!];
    answer = [v.values[asked.val]!];
  } else if (task === "multivalue") {
    const [key, ...others] = keyIds;
    const count = 2 + int(3);
    const vals = Array.from({ length: count }, () => int(256));
    for (const k of others.slice(0, records)) pieces.push(rec(k, int(256)));
    // The asked key's records go in at ordered places among the distractors.
    const at = distinct(r, count, pieces.length + count).sort((a, b) => a - b);
    at.forEach((p, i) => pieces.splice(p, 0, rec(key!, vals[i]!)));
    question = [v.ask, v.keys[key!]!];
    answer = vals.map((x) => v.values[x]!);
  } else {
    const hops = 2 + int(2);
    const chain = keyIds.slice(0, hops + 1);
    const val = int(256);
    const others = keyIds.slice(hops + 1, hops + 1 + records);
    // A quarter of the distractors hold a later distractor's key (chains of their own), the rest a value.
    others.forEach((k, i) => pieces.push(i + 1 < others.length && int(4) === 0 ? [v.keys[k]!, v.keys[others[i + 1 + int(others.length - i - 1)]!]!, v.dot] : rec(k, int(256))));
    const links: number[][] = [rec(chain[0]!, val)];
    for (let i = 1; i <= hops; i++) links.push([v.keys[chain[i]!]!, v.keys[chain[i - 1]!]!, v.dot]);
    const at = distinct(r, links.length, pieces.length + links.length).sort((a, b) => a - b);
    at.forEach((p, i) => pieces.splice(p, 0, links[i]!));
    question = [v.ask, v.keys[chain[hops]!]!];
    answer = [...chain.slice(0, hops).reverse().map((k) => v.keys[k]!), v.values[val]!];
  }
  const body = length - 1 - question.length - answer.length;
  const used = pieces.reduce((a, p) => a + p.length, 0);
  if (used > body) throw new Error(`${task}: ${pieces.length} records do not fit ${length} tokens`);
  const context = Array.from({ length: body }, () => v.fillers[int(v.fillers.length)]!);
  // One piece per equal share of the haystack, at a random place in it.
  const share = Math.floor(body / pieces.length);
  pieces.forEach((p, i) => context.splice(i * share + int(Math.max(1, share - p.length)), p.length, ...p));
  return { context: [v.bos, ...context], question: [...question, ...answer.slice(0, -1)], answer };
}
