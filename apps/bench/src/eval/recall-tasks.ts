/**
 * Retrieval tasks for `hybridgen eval --tasks` on recall-4l: one JSON object a line,
 * {"context": "<haystack> ? kA", "answer": "vB"}, where the haystack is --length − 3 words of
 * fillers f0–f999 holding --records records `kA vB .` with distinct keys, one per equal share
 * of it (as apps/bench/src/eval/recall-eval.ts lays them out), and kA is one of them. With `--tail 2`, eval
 * feeds `? kA` as decode steps, so the answer needs decode-time attention to reach back.
 *
 *   ./bun apps/bench/src/eval/recall-tasks.ts [--length 2048] [--items 20] [--records 64] [--seed 1] > recall-2k.jsonl
 *
 * Every word is one token of recall-4l's vocabulary (BOS is added by the tokenizer).
 */
import { seededRandom } from "@hybridgen/core";

const arg = (name: string, def: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const LENGTH = arg("length", 2048), ITEMS = arg("items", 20), RECORDS = arg("records", 64), SEED = arg("seed", 1);
const body = LENGTH - 3; // BOS, the body, then "? kA"
if (!(RECORDS >= 1 && RECORDS <= 256 && Math.floor(body / RECORDS) >= 4)) throw new Error("--records must be 1…256 with at least 4 words of haystack each");

const r = seededRandom(SEED * 7919 + LENGTH);
const int = (n: number) => Math.floor(r() * n);
const lines: string[] = [];
for (let item = 0; item < ITEMS; item++) {
  const words = Array.from({ length: body }, () => `f${int(1000)}`);
  const keys = new Set<number>();
  while (keys.size < RECORDS) keys.add(int(256));
  const records = [...keys].map((k) => ({ key: `k${k}`, value: `v${int(256)}` }));
  const share = Math.floor(body / RECORDS);
  records.forEach((rec, i) => words.splice(i * share + int(share - 3), 3, rec.key, rec.value, "."));
  const asked = records[int(records.length)]!;
  lines.push(JSON.stringify({ context: `${words.join(" ")} ? ${asked.key}`, answer: asked.value }));
}
console.log(lines.join("\n"));
