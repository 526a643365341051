/**
 * A recall-4l text for `hybridgen profile-kmin --text`: a haystack of fillers f0–f999 with
 * records `kA vB .` (distinct keys) in its first 60%, and queries `? kA vB .` of those records
 * spread over the rest, so that teacher forcing passes through answers that need attention to
 * reach far back (see ../shared/models/README.md).
 *
 *   ./bun apps/bench/src/eval/recall-haystack.ts [--words 2000] [--records 24] [--queries 16] [--seed 1] > haystack.txt
 *
 * --words counts whitespace-separated words: one token each in recall-4l's vocabulary.
 * Run `bun run build` first (this imports the built core).
 */
import { seededRandom } from "@hybridgen/core";

const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const WORDS = arg("words", 2000), RECORDS = arg("records", 24), QUERIES = arg("queries", 16), SEED = arg("seed", 1);
if (!(QUERIES <= RECORDS && RECORDS * 3 < WORDS * 0.6 && QUERIES * 4 < WORDS * 0.4)) throw new Error("too many records or queries for --words");

const rand = seededRandom(SEED);
const int = (n: number) => Math.floor(rand() * n);
const filler = () => `f${int(1000)}`;

/** Distinct sorted positions in [lo, hi) at least `gap` apart (a record or query fits between). */
function places(count: number, lo: number, hi: number, gap: number): number[] {
  const out = new Set<number>();
  while (out.size < count) {
    const p = lo + int(hi - lo - gap);
    if ([...out].every((q) => Math.abs(q - p) >= gap)) out.add(p);
  }
  return [...out].sort((a, b) => a - b);
}

const keys = new Set<number>();
while (keys.size < RECORDS) keys.add(int(256));
const records = [...keys].map((k) => ({ key: `k${k}`, value: `v${int(256)}` }));
const split = Math.floor(WORDS * 0.6);
const recordAt = new Map(places(RECORDS, 0, split, 4).map((p, i) => [p, records[i]!]));
const asked = [...records].sort(() => rand() - 0.5).slice(0, QUERIES);
const queryAt = new Map(places(QUERIES, split, WORDS, 5).map((p, i) => [p, asked[i]!]));

const words: string[] = [];
while (words.length < WORDS) {
  const r = recordAt.get(words.length), q = queryAt.get(words.length);
  if (r) words.push(r.key, r.value, ".");
  else if (q) words.push("?", q.key, q.value, ".");
  else words.push(filler());
}
console.log(words.slice(0, WORDS).join(" "));
