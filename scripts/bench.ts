// `bun run bench`: stories15M speed on the CPU backend at f32, bf16 and f16 weights.
// Decode: greedy, "Once upon a time", up to 256 tokens (the story ends at EOS after 217).
// Prefill: a 128-token prompt. Best of REPS runs after a warm-up; ratios are to the f32 row
// measured in this same run. Run `bun run build` first (this imports the built packages).
import { cpus } from "node:os";
import { ensureStories15M, generate, LlamaModel, openModelDir } from "../packages/core/dist/index.js";
import { cpuFeatures, createCpuBackend } from "../packages/kernels-cpu/dist/index.js";

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

const f32 = rows[0]!;
const cpu = cpus()[0]?.model ?? "unknown CPU";
console.log(`stories15M on ${cpu}, ${THREADS} threads, ISA ${cpuFeatures().chosen}, best of ${REPS} (${new Date().toISOString().slice(0, 10)})\n`);
console.log("| weights | prefill tok/s (128-token prompt) | vs f32 | decode tok/s (greedy) | vs f32 | tokens |");
console.log("| --- | ---: | ---: | ---: | ---: | ---: |");
for (const r of rows) {
  console.log(
    `| ${r.dtype} | ${r.prefill.toFixed(0)} | ${(r.prefill / f32.prefill).toFixed(2)}× | ${r.decode.toFixed(0)} | ${(r.decode / f32.decode).toFixed(2)}× | ${r.tokens} |`,
  );
}
