/**
 * The CUDA backend's correctness on the GPU machine, in one run (the package README's "Device
 * check" says how it is called):
 *  1. every op against ReferenceBackend on fresh random inputs (device/op-checks.ts), every decode
 *     kernel hg_decode_plan picks (this device's and an sm_80 plan's), the weight stream in
 *     recorded chains (device/stream-checks.ts), the batched-decode kernels (device/batch-checks.ts)
 *     and hybrid attention's window kernels, attnPartial/attnMerge (device/partial-checks.ts; their
 *     time over a scale-run window is printed beside the materialised path's);
 *  2. parity with Hugging Face transformers: core's parity checkpoints (Llama, Qwen2, OPT;
 *     reference logits made by transformers in float64) run on the CUDA backend in f32;
 *  3. graphs on vs off, and greedy decode fed on the device vs the host round trip;
 *  4. bad input on the device: a model larger than the arena, a context overflow, a launch
 *     error the backend survives. `--trap` instead makes a kernel trap (a lost context) and
 *     checks the error names the op and the process exits cleanly.
 * The CPU backend against this one: apps/bench's cuda/cpu-vs-cuda.ts. Prints a table per part and
 * exits non-zero if anything failed. Run from the repository root (the parity references are read
 * from packages/core/test/fixtures). Env: HYBRIDGEN_KERNELS_CUDA_LIB (absolute: the bundle moves).
 */
import { readFileSync } from "node:fs";
import { relL2Error } from "@hybridgen/spec/kit";
import { PARITY_CASES, STORIES15M_SHAPE, dummyModelFiles, generateText, greedyDummyRun, loadModel, parseParityRefs, presetConfig, runParityCase } from "@hybridgen/core";
import { createCudaBackend, cudaAvailability, describeCudaAvailability } from "../src/index.js";
import { runOpChecks } from "./op-checks.js";
import { streamGemvChecks } from "./stream-checks.js";
import { runArgmaxRowsChecks, runBatchAttnChecks, runMatmulSplitChecks, runSkinnyChecks } from "./batch-checks.js";
import { runPartialChecks, timeWindow } from "./partial-checks.js";
import { cudaLab } from "../src/lab.js";

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
    cudaLab(be).injectFault(1);
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

async function main(): Promise<void> {
  if (process.argv.includes("--trap")) trapRun();
  const a = cudaAvailability();
  line(`# device check (seed ${seed})\n${describeCudaAvailability(a)}`);
  if (!a.available) process.exit(1);
  const cuda = createCudaBackend({ arenaBytes: 40 * 2 ** 30 });
  line(`cuBLAS: ${cuda.cublas}; arena ${cuda.memory().arenaBytes} bytes`);

  // 1. ops
  let t0 = performance.now();
  const batchChecks = (name: string, f: () => ReturnType<typeof runOpChecks>) => {
    try {
      return f();
    } catch (e) {
      return [{ name: `${name}: ${(e as Error).message}`, err: Infinity, tol: 0, ok: false }];
    }
  };
  const ops = [
    ...runOpChecks(cuda, seed), ...streamGemvChecks(cuda, seed + 2),
    ...batchChecks("skinny GEMM", () => runSkinnyChecks(cuda, seed + 11)), ...batchChecks("matmulSplit", () => runMatmulSplitChecks(cuda, seed + 13)),
    ...batchChecks("argmaxRows", () => runArgmaxRowsChecks(cuda, seed + 14)), ...batchChecks("attnDecodeBatch", () => runBatchAttnChecks(cuda, seed + 12)),
    ...batchChecks("attnPartial", () => runPartialChecks(cuda, seed + 15)),
  ];
  const bad = ops.filter((r) => !r.ok);
  failures += bad.length;
  table(`ops vs ReferenceBackend: ${ops.length - bad.length}/${ops.length} pass (${((performance.now() - t0) / 1e3).toFixed(1)} s)`, [
    ["check", "error", "tol"],
    ...(bad.length ? bad : [...ops.filter((r) => r.name.startsWith("matmul cublas") || r.name.startsWith("attnAggregate+")).slice(0, 12), ...ops.filter((r) => r.name.startsWith("stream GEMV chain"))]).map((r) => [r.name + (r.ok ? "" : " FAIL"), r.err, r.tol]),
  ]);
  {
    // Hybrid attention's window at the scale run's size: the partial against the materialised path (no pass/fail).
    const w = timeWindow(cuda);
    line(`\nwindow of ${w.tokens} tokens (32/8 heads, d128, bf16): attnPartial + attnMerge ${w.partialMs.toFixed(3)} ms (K and V read at ${w.gbPerS.toFixed(0)} GB/s), materialised logits + softmax + aggregate ${w.materializedMs.toFixed(3)} ms`);
  }

  // 2. transformers parity (f32 checkpoints, f32 weights on the GPU)
  const refs = parseParityRefs(readFileSync(`${process.cwd()}/packages/core/test/fixtures/parity/refs.json`, "utf8"));
  const parityRows: (string | number)[][] = [["case", "sequence", "prefill", "decode", "greedy mismatches"]];
  for (const c of PARITY_CASES) {
    const r = runParityCase(c, refs.get(c.name)!, cuda, 1e-3, 24);
    const ok = r.sequence < 1e-3 && r.prefill < 1e-3 && r.decode < 1e-3 && r.greedyMismatches === 0;
    if (!ok) failures++;
    parityRows.push([c.name + (ok ? "" : " FAIL"), r.sequence, r.prefill, r.decode, String(r.greedyMismatches)]);
  }
  table("parity with transformers (float64 references), CUDA f32, tol 1e-3", parityRows);

  // 3. graphs, and the greedy feed
  const rnd = (n: number, vocab: number) => Int32Array.from({ length: n }, (_, i) => (i * 7919 + seed) % vocab);
  const cmpRows: (string | number)[][] = [["model", "dtype", "worst logits", "what", "greedy tokens equal"]];
  {
    // The same decode with CUDA graphs off: graphs change launch order only, not results.
    const prompt = rnd(40, 32000);
    const s0 = cudaLab(cuda).graphStats();
    const on = greedyDummyRun(cuda, STORIES15M_SHAPE, "f32", prompt, 32);
    const s1 = cudaLab(cuda).graphStats();
    cudaLab(cuda).setCudaGraphs(false);
    const off = greedyDummyRun(cuda, STORIES15M_SHAPE, "f32", prompt, 32);
    cudaLab(cuda).setCudaGraphs(true);
    let worst = relL2Error(on.first, off.first);
    for (let i = 0; i < 32; i++) worst = Math.max(worst, relL2Error(on.logits[i], off.logits[i]));
    const same = on.tokens.every((t, i) => t === off.tokens[i]);
    const captures = s1.captures - s0.captures, replays = s1.replays - s0.replays, drained = s1.drained - s0.drained;
    const ok = worst <= 1e-5 && same && captures >= 1 && replays >= 30 && drained === 0;
    if (!ok) failures++;
    cmpRows.push([`stories15M shape: CUDA graphs on vs off${ok ? "" : " FAIL"}`, "f32", worst, `${captures} captures, ${replays} replays, ${drained} drained (${s1.lastDrain})`, `${same} (32)`]);
  }
  for (const [name, json, dt] of [["stories15M shape", STORIES15M_SHAPE, "f32"], ["llama-3.2-1b, 4 layers", presetConfig("llama-3.2-1b", { num_hidden_layers: 4 }), "bf16"]] as const) {
    // Greedy decode fed on the device (generate's path on CUDA: each step launched before the host
    // reads its token) against the host round trip of greedyDummyRun(): the same tokens, up to an EOS.
    const prompt = rnd(40, (json as Record<string, unknown>).vocab_size as number), steps = 32;
    const host = greedyDummyRun(cuda, json as Record<string, unknown>, dt, prompt, steps);
    using files = dummyModelFiles(json as Record<string, unknown>, dt, 7);
    using model = loadModel(files, cuda, { maxContext: prompt.length + steps + 1, prefillBlock: 64, kvDtype: dt === "f32" ? "f32" : "bf16" });
    const r = await generateText(model, files.tokenizer, Array.from(prompt), { maxTokens: steps, sampling: { temperature: 0 }, addBos: false });
    const same = r.tokens.length > 0 && r.tokens.every((t, i) => t === host.tokens[i]) && (r.finishReason === "eos" || r.tokens.length === steps);
    if (!same || !model.feedsOnDevice) failures++;
    cmpRows.push([`${name}: greedy fed on the device vs host round trip${same ? "" : " FAIL"}`, dt, "", `feedsOnDevice ${model.feedsOnDevice}, finish ${r.finishReason}`, `${same} (${r.tokens.length})`]);
  }
  table("CUDA graphs on vs off; greedy fed on the device vs the host round trip", cmpRows);

  // 4. bad input on the device
  const badRows: string[][] = [["case", "result"]];
  {
    using small = createCudaBackend({ arenaBytes: 2 ** 30 });
    try {
      using files = dummyModelFiles(presetConfig("llama-3.2-1b"), "bf16", 1);
      loadModel(files, small, { maxContext: 64 });
      badRows.push(["1B model into a 1 GiB arena", "loaded (FAIL)"]);
      failures++;
    } catch (e) {
      const used = small.memory().usedBytes;
      badRows.push(["1B model into a 1 GiB arena", `${(e as Error).message} | after: ${used} bytes used${used ? " (FAIL)" : ""}`]);
      if (used) failures++;
    }
    using files = dummyModelFiles(STORIES15M_SHAPE, "f32", 1);
    using m = loadModel(files, small, { maxContext: 32 });
    try {
      m.forward(rnd(40, 32000), 0);
      badRows.push(["40 tokens into a 32-token context", "accepted (FAIL)"]);
      failures++;
    } catch (e) {
      badRows.push(["40 tokens into a 32-token context", (e as Error).message]);
    }
    try {
      cudaLab(small).injectFault(0);
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
