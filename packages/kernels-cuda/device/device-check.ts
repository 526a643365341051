/**
 * The CUDA backend on the GPU machine, in one run (see DEVICE-NOTES.md for how it is called):
 *  1. every op against ReferenceBackend on fresh random inputs (device/op-checks.ts);
 *  2. parity with Hugging Face transformers: core's parity checkpoints (Llama, Qwen2, OPT;
 *     reference logits made by transformers in float64) run on the CUDA backend in f32;
 *  3. CPU backend vs CUDA backend on dummy-weight models: f32 logits and 32 greedy steps
 *     (identical tokens), and bf16 presets (logits within bf16 tolerance);
 *  4. bad input on the device: a model larger than the arena, a context overflow, a launch
 *     error the backend survives. `--trap` instead makes a kernel trap (a lost context) and
 *     checks the error names the op and the process exits cleanly.
 * Prints a table per part and exits non-zero if anything failed.
 * Env: HYBRIDGEN_KERNELS_CUDA_LIB, HYBRIDGEN_KERNELS_CPU_LIB (absolute paths; the bundle moves).
 */
import { readFileSync } from "node:fs";
import { generateText, loadModel, type Backend, type DType } from "@hybridgen/core";
import { createCudaBackend, cudaAvailability, describeCudaAvailability } from "../src/index.js";
import { createCpuBackend, createNativeRandomFill } from "../../kernels-cpu/src/index.js";
import { PARITY_CASES } from "../../core/test/parity/cases.js";
import { runParityCase, type CaseRef } from "../../core/test/parity/run-parity.js";
import { runOpChecks, relErr } from "./op-checks.js";
import { streamGemvChecks } from "./stream-checks.js";
import { STORIES15M_SHAPE, dummyFiles, shrunkPreset } from "./models.js";

const seed = Number(process.env.HG_TEST_SEED ?? Date.now() % 2 ** 31);
let failures = 0;
const line = (s: string) => console.log(s);
const fmt = (x: number) => (x === 0 ? "0" : x.toExponential(2));

function table(title: string, rows: (string | number)[][]): void {
  line(`\n## ${title}`);
  for (const r of rows) line(`| ${r.map((c) => (typeof c === "number" ? fmt(c) : c)).join(" | ")} |`);
}

function trapRun(): void {
  const be = createCudaBackend({ arenaBytes: 2 ** 30 });
  const x = be.alloc([1, 16]);
  try {
    be.injectFault(1);
    line("trap: no error reported (FAIL)");
    process.exit(1);
  } catch (e) {
    line(`trap: ${(e as Error).message}`);
  }
  try {
    be.relu(x, 1);
  } catch (e) {
    line(`next op: ${(e as Error).message}`);
  }
  be.close();
  line("trap: closed cleanly");
  process.exit(0);
}

function loadRefs(): Map<string, CaseRef> {
  const path = `${process.cwd()}/packages/core/test/fixtures/parity/refs.json`;
  const raw = JSON.parse(readFileSync(path, "utf8")) as { cases: Record<string, { ids: number[]; vocab: number; prefill_logits: string; decode_tokens: number[]; decode_logits: string }> };
  const f32 = (b64: string) => new Float32Array(new Uint8Array(Buffer.from(b64, "base64")).buffer);
  return new Map(Object.entries(raw.cases).map(([k, v]) => [k, { ids: v.ids, vocab: v.vocab, prefill: f32(v.prefill_logits), decodeTokens: v.decode_tokens, decode: f32(v.decode_logits) }]));
}

/** Prefill a random prompt, then greedy decode `steps`: last-prompt logits, decode logits, tokens. */
function run(backend: Backend, json: Record<string, unknown>, dtype: DType, prompt: Int32Array, steps: number, fill: ReturnType<typeof createNativeRandomFill>) {
  using files = dummyFiles(json, dtype, 7, fill);
  using model = loadModel(files, backend, { maxContext: prompt.length + steps + 1, prefillBlock: 64, kvDtype: dtype === "f32" ? "f32" : "bf16" });
  const first = model.forward(prompt, 0);
  const tokens: number[] = [];
  const logits: Float32Array[] = [];
  let tok = model.argmaxLogits();
  for (let s = 0; s < steps; s++) {
    tokens.push(tok);
    logits.push(model.forward(Int32Array.of(tok), prompt.length + s));
    tok = model.argmaxLogits();
  }
  return { first, tokens, logits };
}

async function main(): Promise<void> {
  if (process.argv.includes("--trap")) trapRun();
  const a = cudaAvailability();
  line(`# device check (seed ${seed})\n${describeCudaAvailability(a)}`);
  if (!a.available) process.exit(1);
  const cuda = createCudaBackend({ arenaBytes: 40 * 2 ** 30 });
  line(`cuBLAS: ${cuda.cublas}; arena ${cuda.memory().arenaBytes} bytes`);

  // 1. ops
  let t0 = performance.now();
  const ops = [...runOpChecks(cuda, seed), ...streamGemvChecks(cuda, seed + 2)];
  const bad = ops.filter((r) => !r.ok);
  failures += bad.length;
  table(`ops vs ReferenceBackend: ${ops.length - bad.length}/${ops.length} pass (${((performance.now() - t0) / 1e3).toFixed(1)} s)`, [
    ["check", "error", "tol"],
    ...(bad.length ? bad : [...ops.filter((r) => r.name.startsWith("matmul cublas") || r.name.startsWith("attnAggregate+")).slice(0, 12), ...ops.filter((r) => r.name.startsWith("stream GEMV chain"))]).map((r) => [r.name + (r.ok ? "" : " FAIL"), r.err, r.tol]),
  ]);

  // 2. transformers parity (f32 checkpoints, f32 weights on the GPU)
  const refs = loadRefs();
  const parityRows: (string | number)[][] = [["case", "sequence", "prefill", "decode", "greedy mismatches"]];
  for (const c of PARITY_CASES) {
    const r = runParityCase(c, refs.get(c.name)!, cuda, 1e-3, 24);
    const ok = r.sequence < 1e-3 && r.prefill < 1e-3 && r.decode < 1e-3 && r.greedyMismatches === 0;
    if (!ok) failures++;
    parityRows.push([c.name + (ok ? "" : " FAIL"), r.sequence, r.prefill, r.decode, String(r.greedyMismatches)]);
  }
  table("parity with transformers (float64 references), CUDA f32, tol 1e-3", parityRows);

  // 3. CPU vs CUDA
  const fill = createNativeRandomFill();
  const cpu = createCpuBackend();
  const rnd = (n: number, vocab: number) => Int32Array.from({ length: n }, (_, i) => (i * 7919 + seed) % vocab);
  const models: [string, Record<string, unknown>, DType, number, number, number][] = [
    // name, config, dtype, prompt, steps, tolerance
    ["stories15M shape", STORIES15M_SHAPE, "f32", 40, 32, 1e-4],
    ["qwen2 (1.5b family, small)", shrunkPreset("qwen2.5-1.5b", { hidden_size: 256, intermediate_size: 512, num_hidden_layers: 3, num_attention_heads: 8, num_key_value_heads: 2, vocab_size: 4096 }), "f32", 40, 32, 1e-4],
    ["opt (125m family, small)", shrunkPreset("opt-125m", { hidden_size: 256, ffn_dim: 1024, num_hidden_layers: 3, num_attention_heads: 4, vocab_size: 4096, word_embed_proj_dim: 256 }), "f32", 40, 32, 1e-4],
    ["preset llama-3.2-1b", shrunkPreset("llama-3.2-1b", {}), "bf16", 100, 4, 1e-2],
    ["preset qwen2.5-1.5b", shrunkPreset("qwen2.5-1.5b", {}), "bf16", 100, 4, 1e-2],
    ["preset opt-125m", shrunkPreset("opt-125m", {}), "bf16", 100, 4, 1e-2],
  ];
  const cmpRows: (string | number)[][] = [["model", "dtype", "prefill logits", "worst decode logits", "greedy tokens equal", "cpu s", "cuda s"]];
  for (const [name, json, dt, plen, steps, tol] of models) {
    const vocab = json.vocab_size as number;
    const prompt = rnd(plen, vocab);
    t0 = performance.now();
    const c = run(cpu, json, dt, prompt, steps, fill);
    const tCpu = (performance.now() - t0) / 1e3;
    t0 = performance.now();
    const g = run(cuda, json, dt, prompt, steps, fill);
    const tGpu = (performance.now() - t0) / 1e3;
    const pre = relErr(g.first, c.first);
    let dec = 0;
    // Decode logits compared while the token streams agree (after a divergence they differ by design).
    for (let s = 0; s < steps && g.tokens[s] === c.tokens[s]; s++) dec = Math.max(dec, relErr(g.logits[s], c.logits[s]));
    const same = g.tokens.every((t, i) => t === c.tokens[i]);
    const ok = pre <= tol && dec <= tol && (dt !== "f32" || same);
    if (!ok) failures++;
    cmpRows.push([name + (ok ? "" : " FAIL"), dt, pre, dec, `${same} (${steps})`, tCpu.toFixed(1), tGpu.toFixed(1)]);
  }
  cpu.close();
  {
    // The same decode with CUDA graphs off: graphs change launch order only, not results.
    const prompt = rnd(40, 32000);
    const s0 = cuda.graphStats();
    const on = run(cuda, STORIES15M_SHAPE, "f32", prompt, 32, fill);
    const s1 = cuda.graphStats();
    cuda.setCudaGraphs(false);
    const off = run(cuda, STORIES15M_SHAPE, "f32", prompt, 32, fill);
    cuda.setCudaGraphs(true);
    let worst = relErr(on.first, off.first);
    for (let i = 0; i < 32; i++) worst = Math.max(worst, relErr(on.logits[i], off.logits[i]));
    const same = on.tokens.every((t, i) => t === off.tokens[i]);
    const captures = s1.captures - s0.captures, replays = s1.replays - s0.replays, drained = s1.drained - s0.drained;
    const ok = worst <= 1e-5 && same && captures >= 1 && replays >= 30 && drained === 0;
    if (!ok) failures++;
    cmpRows.push([`stories15M shape: CUDA graphs on vs off${ok ? "" : " FAIL"}`, "f32", worst, `${captures} captures, ${replays} replays, ${drained} drained (${s1.lastDrain})`, `${same} (32)`, "", ""]);
  }
  for (const [name, json, dt] of [["stories15M shape", STORIES15M_SHAPE, "f32"], ["preset llama-3.2-1b", shrunkPreset("llama-3.2-1b", {}), "bf16"]] as const) {
    // Greedy decode fed on the device (generate's path on CUDA: each step launched before the host
    // reads its token) against the host round trip of run(): the same tokens, up to an EOS.
    const prompt = rnd(40, (json as Record<string, unknown>).vocab_size as number), steps = 32;
    const host = run(cuda, json as Record<string, unknown>, dt, prompt, steps, fill);
    using files = dummyFiles(json as Record<string, unknown>, dt, 7, fill);
    using model = loadModel(files, cuda, { maxContext: prompt.length + steps + 1, prefillBlock: 64, kvDtype: dt === "f32" ? "f32" : "bf16" });
    const r = await generateText(model, files.tokenizer, Array.from(prompt), { maxTokens: steps, sampling: { temperature: 0 }, addBos: false });
    const same = r.tokens.length > 0 && r.tokens.every((t, i) => t === host.tokens[i]) && (r.finishReason === "eos" || r.tokens.length === steps);
    if (!same || !model.feedsOnDevice) failures++;
    cmpRows.push([`${name}: greedy fed on the device vs host round trip${same ? "" : " FAIL"}`, dt, "", `feedsOnDevice ${model.feedsOnDevice}, finish ${r.finishReason}`, `${same} (${r.tokens.length})`, "", ""]);
  }
  table("CPU backend vs CUDA backend (dummy weights; f32 tol 1e-4 and identical greedy tokens, bf16 tol 1e-2)", cmpRows);

  // 4. bad input on the device
  const badRows: string[][] = [["case", "result"]];
  {
    using small = createCudaBackend({ arenaBytes: 2 ** 30 });
    try {
      using files = dummyFiles(shrunkPreset("llama-3.2-1b", {}), "bf16", 1, fill);
      loadModel(files, small, { maxContext: 64 });
      badRows.push(["1B model into a 1 GiB arena", "loaded (FAIL)"]);
      failures++;
    } catch (e) {
      const used = small.memory().usedBytes;
      badRows.push(["1B model into a 1 GiB arena", `${(e as Error).message} | after: ${used} bytes used${used ? " (FAIL)" : ""}`]);
      if (used) failures++;
    }
    using files = dummyFiles(STORIES15M_SHAPE, "f32", 1, fill);
    using m = loadModel(files, small, { maxContext: 32 });
    try {
      m.forward(rnd(40, 32000), 0);
      badRows.push(["40 tokens into a 32-token context", "accepted (FAIL)"]);
      failures++;
    } catch (e) {
      badRows.push(["40 tokens into a 32-token context", (e as Error).message]);
    }
    try {
      small.injectFault(0);
      badRows.push(["invalid launch", "no error (FAIL)"]);
      failures++;
    } catch (e) {
      const logits = m.forward(rnd(8, 32000), 0);
      badRows.push(["invalid launch", `${(e as Error).message} | then a forward: ${logits.every(Number.isFinite) ? "fine" : "NaN (FAIL)"}`]);
    }
  }
  table("bad input on the device", badRows);
  cuda.close();
  line(`\n${failures === 0 ? "ALL PASS" : `${failures} FAILED`}`);
  process.exit(failures === 0 ? 0 : 1);
}

await main();
