/**
 * Op benchmark: `./bun apps/bench/src/cpu/ops.ts [--quick]` (after `bun run build`).
 * Prints, for each op, the time per call, the GB/s of weights (or K) it reads, and that as a
 * fraction of the streamSum bandwidth measured in the same run on a buffer of the same size.
 * Env: HYBRIDGEN_ISA, BENCH_THREADS.
 */
import type { DType, Tensor } from "@hybridgen/spec";
import { dlopen, FFIType, type Pointer } from "bun:ffi";
import { execFileSync } from "node:child_process";
import { mkdirSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { createCpuBackend, cpuFeatures } from "@hybridgen/kernels-cpu";
import { bestSeconds, filledTensor } from "./measure.js";
import { cpus } from "node:os";

const quick = process.argv.includes("--quick");
const be = createCpuBackend(process.env.BENCH_THREADS ? { threads: Number(process.env.BENCH_THREADS) } : {});
const features = cpuFeatures();

function time(fn: () => void, budget = quick ? 0.05 : 0.25): number {
  return bestSeconds(fn, budget, 3);
}

function filled(shape: number[], dtype: DType = "f32"): Tensor {
  return filledTensor(be, shape, dtype, 1);
}

const streamCache = new Map<number, number>();
/** streamSum GB/s over a fresh buffer of `bytes` (cached per size). */
function streamGBs(bytes: number): number {
  const key = Math.max(bytes, 1 << 16);
  if (!streamCache.has(key)) {
    const t = filled([Math.ceil(key / 4)]);
    const s = time(() => be.streamSum(t));
    streamCache.set(key, key / s / 1e9);
    be.free(t);
  }
  return streamCache.get(key)!;
}

/** apps/bench/src/cpu/omp-baseline.c built with gcc -Ofast -march=native -fopenmp, or undefined without gcc/OpenMP. */
function ompBaseline(): ((out: Pointer, x: Pointer, w: Pointer, k: number, m: number) => void) | undefined {
  const src = fileURLToPath(new URL("./omp-baseline.c", import.meta.url));
  const dir = fileURLToPath(new URL("../../bench-out/", import.meta.url));
  const lib = `${dir}omp-baseline.so`;
  try {
    mkdirSync(dir, { recursive: true });
    execFileSync(process.env.CC || "gcc", ["-Ofast", "-march=native", "-fopenmp", "-shared", "-fPIC", "-o", lib, src], { stdio: "ignore" });
    const { symbols } = dlopen(lib, { omp_gemv: { args: [FFIType.ptr, FFIType.ptr, FFIType.ptr, FFIType.i32, FFIType.i32], returns: FFIType.void } });
    return (out, x, w, k, m) => symbols.omp_gemv(out, x, w, k, m);
  } catch {
    return undefined;
  }
}

const rows: string[][] = [];
function row(op: string, shape: string, dtype: string, seconds: number, bytes: number): void {
  const gbs = bytes / seconds / 1e9;
  const base = streamGBs(bytes);
  rows.push([op, shape, dtype, (seconds * 1e6).toFixed(1), gbs.toFixed(1), base.toFixed(1), `${((gbs / base) * 100).toFixed(0)}%`]);
}

function printTable(title: string, header: string[], body: string[][]): void {
  console.log(`\n${title}\n`);
  const all = [header, ...body];
  const widths = header.map((_, i) => Math.max(...all.map((r) => r[i].length)));
  const fmt = (r: string[]) => `| ${r.map((c, i) => (i < 3 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join(" | ")} |`;
  console.log(fmt(header));
  console.log(`|${widths.map((w, i) => (i < 3 ? ":" : "-") + "-".repeat(w) + (i < 3 ? "-" : ":")).join("|")}|`);
  for (const r of body) console.log(fmt(r));
}

console.log(`kernels-cpu bench — ${cpus()[0]?.model ?? "cpu"}, ${features.cpus} CPUs, isa=${be.isa}, threads=${be.threads}, ${new Date().toISOString().slice(0, 10)}`);

// ---- matmul ---------------------------------------------------------------------------
const dtypes: DType[] = ["f32", "f16", "bf16"];
const shapes = [
  [1, 288, 288],
  [1, 768, 288],
  [1, 288, 768],
  [1, 32000, 288],
  [1, 4096, 4096],
  [1, 14336, 4096],
  [16, 768, 288],
  [16, 4096, 4096],
].filter(([, m, k]) => !quick || m * k < 20e6);
for (const [n, m, k] of shapes) {
  for (const dtype of dtypes) {
    const w = filled([m, k], dtype);
    const x = filled([n, k]);
    const out = be.alloc([n, m]);
    const s = time(() => be.matmul(out, x, w, n));
    row("matmul", `n=${n} ${m}x${k}`, dtype, s, m * k * (dtype === "f32" ? 4 : 2));
    be.free(w);
    be.free(x);
    be.free(out);
  }
}

// ---- small ops: the per-call cost a decode step pays ---------------------------------
{
  const x = filled([1, 768]);
  const y = filled([1, 768]);
  const w = filled([768]);
  const small: [string, () => void][] = [
    ["rmsNorm", () => be.rmsNorm(x, x, w, 1, 1e-5)],
    ["siluMul", () => be.siluMul(x, x, y, 1)],
    ["add", () => be.add(x, x, y, 1)],
  ];
  for (const [name, fn] of small) row(name, "n=1 k=768", "f32", time(fn), 768 * 4);
}

printTable("matmul and small ops (GB/s = weight bytes / time; stream = streamSum GB/s over as many bytes, same run)", ["op", "shape", "dtype", "µs", "GB/s", "stream GB/s", "of stream"], rows);

// ---- stories15M: all matmuls of one decode token, distinct weights -----------------------
{
  const dim = 288, hidden = 768, layers = 6, vocab = 32000;
  const mats: [number, number][] = [];
  for (let l = 0; l < layers; l++) mats.push([dim, dim], [dim, dim], [dim, dim], [dim, dim], [hidden, dim], [hidden, dim], [dim, hidden]);
  mats.push([vocab, dim]);
  const ws = mats.map(([m, k]) => filled([m, k]));
  const xs = filled([1, hidden]);
  const outs = filled([1, vocab]);
  const xv = (k: number) => be.view(xs, 0, [1, k]);
  const ov = (m: number) => be.view(outs, 0, [1, m]);
  const plan = mats.map(([m, k], i) => [ws[i], xv(k), ov(m)] as const);
  const ours = () => {
    for (const [w, x, o] of plan) be.matmul(o, x, w, 1);
  };
  const bytes = mats.reduce((a, [m, k]) => a + m * k * 4, 0);
  const omp = ompBaseline();
  const ompStep = omp
    ? () => {
        for (const [i, [m, k]] of mats.entries()) omp(be.address(outs), be.address(xs), be.address(ws[i]), k, m);
      }
    : undefined;
  // Alternate blocks of 30 steps so both see the same machine over time; the first 10 steps
  // of a block are not counted (the other side's idle threads may still be spinning: libgomp
  // spins for milliseconds after a parallel region).
  const a: number[] = [];
  const b: number[] = [];
  const ratios: number[] = [];
  const median = (v: number[]) => [...v].sort((p, q) => p - q)[v.length >> 1];
  const block = (fn: () => void) => {
    const ts: number[] = [];
    for (let i = 0; i < 30; i++) {
      const t0 = Bun.nanoseconds();
      fn();
      if (i >= 10) ts.push((Bun.nanoseconds() - t0) / 1e6);
    }
    return median(ts);
  };
  // Alternate blocks of 30 steps so both see the same machine; a block's first 10 steps are
  // not counted (the other side's idle threads may still spin: libgomp spins for
  // milliseconds after a parallel region). The ratio is the median of adjacent-block ratios.
  for (let round = 0; round < (quick ? 6 : 20); round++) {
    const ma = block(ours);
    a.push(ma);
    if (ompStep) {
      const mb = block(ompStep);
      b.push(mb);
      ratios.push(mb / ma);
    }
  }
  const ma = median(a);
  if (process.env.BENCH_DEBUG) console.log("ours", a.map((v) => v.toFixed(2)).join(" "), "\nomp ", b.map((v) => v.toFixed(2)).join(" "));
  console.log(`\nstories15M decode step, matmuls only (${mats.length} calls, ${(bytes / 1e6).toFixed(1)} MB f32 weights): ` +
    `median ${ma.toFixed(3)} ms/token = ${(1000 / ma).toFixed(0)} tok/s upper bound, ${(bytes / ma / 1e6).toFixed(1)} GB/s ` +
    `(streamSum over ${(bytes / 1e6).toFixed(0)} MB: ${streamGBs(bytes).toFixed(1)} GB/s)`);
  if (ompStep) {
    console.log(`  same matmuls, llama2.c-style OpenMP GEMV (gcc -Ofast -march=native -fopenmp), alternated with ours: ` +
      `median ${median(b).toFixed(3)} ms/token; per-round speed-up of CpuBackend: median ${median(ratios).toFixed(2)}x ` +
      `(range ${Math.min(...ratios).toFixed(2)}-${Math.max(...ratios).toFixed(2)})`);
  } else {
    console.log("  (OpenMP baseline skipped: gcc -fopenmp not available)");
  }
  for (const w of ws) be.free(w);
}

// ---- a whole stories15M-shaped decode step (random weights), every op through the backend --
{
  const dim = 288, hidden = 768, layers = 6, heads = 6, hd = dim / heads, vocab = 32000, seq = 256;
  const pos = 128; // tokens already in the cache
  const w = (m: number, k: number) => filled([m, k]);
  const L = Array.from({ length: layers }, () => ({
    att: filled([dim]), ffn: filled([dim]),
    wq: w(dim, dim), wk: w(dim, dim), wv: w(dim, dim), wo: w(dim, dim),
    w1: w(hidden, dim), w3: w(hidden, dim), w2: w(dim, hidden),
    kc: filled([heads, seq, hd]), vc: filled([heads, seq, hd]),
  }));
  const emb = w(vocab, dim), fin = filled([dim]), cls = w(vocab, dim);
  const cos = filled([seq, hd / 2]), sin = filled([seq, hd / 2]);
  const x = be.alloc([1, dim]), xb = be.alloc([1, dim]), q = be.alloc([1, dim]), k = be.alloc([1, dim]), v = be.alloc([1, dim]);
  const att = be.alloc([heads, seq]), o = be.alloc([1, dim]), h1 = be.alloc([1, hidden]), h3 = be.alloc([1, hidden]);
  const logits = be.alloc([1, vocab]);
  const ids = Int32Array.of(1), posArr = Int32Array.of(pos);
  const kRows = be.view(k, 0, [heads, hd]), vRows = be.view(v, 0, [heads, hd]);
  const step = () => {
    be.embedding(x, emb, ids);
    for (const l of L) {
      be.rmsNorm(xb, x, l.att, 1, 1e-5);
      be.matmul(q, xb, l.wq, 1);
      be.matmul(k, xb, l.wk, 1);
      be.matmul(v, xb, l.wv, 1);
      be.rope(q, 1, posArr, heads, hd, cos, sin);
      be.rope(k, 1, posArr, heads, hd, cos, sin);
      for (let h = 0; h < heads; h++) {
        // cache rows are [heads * seq] rows of hd: head h, position pos is row h * seq + pos
        be.copyRows(l.kc, h * seq + pos, kRows, h, 1);
        be.copyRows(l.vc, h * seq + pos, vRows, h, 1);
      }
      be.attnLogits(att, 0, q, 0, l.kc, 0, pos + 1, 1 / Math.sqrt(hd));
      be.softmax(att, heads, pos + 1);
      be.attnAggregate(xb, 0, att, 0, l.vc, 0, pos + 1, false);
      be.matmul(o, xb, l.wo, 1);
      be.add(x, x, o, 1);
      be.rmsNorm(xb, x, l.ffn, 1, 1e-5);
      be.matmul(h1, xb, l.w1, 1);
      be.matmul(h3, xb, l.w3, 1);
      be.siluMul(h1, h1, h3, 1);
      be.matmul(o, h1, l.w2, 1);
      be.add(x, x, o, 1);
    }
    be.rmsNorm(x, x, fin, 1, 1e-5);
    be.matmul(logits, x, cls, 1);
    be.argmax(logits, 0);
  };
  // median of single steps: the figure a decode loop would see
  for (let i = 0; i < 20; i++) step();
  const times: number[] = [];
  for (let i = 0; i < (quick ? 100 : 500); i++) {
    const t0 = Bun.nanoseconds();
    step();
    times.push((Bun.nanoseconds() - t0) / 1e6);
  }
  times.sort((a, b) => a - b);
  const med = times[times.length >> 1];
  console.log(`stories15M-shaped decode step at position ${pos}, all ${layers * 22 + 4} ops: ` +
    `median ${med.toFixed(3)} ms = ${(1000 / med).toFixed(0)} tok/s, best ${times[0].toFixed(3)} ms`);
}

// ---- attention logits over long contexts -------------------------------------------------
{
  const kvHeads = 8, d = 128, heads = 32;
  const body: string[][] = [];
  const maxTokens = quick ? 16 * 1024 : 256 * 1024;
  for (const dtype of ["f32", "bf16"] as DType[]) {
    const k = filled([kvHeads, maxTokens, d], dtype);
    const q = filled([1, heads * d]);
    const logits = be.alloc([heads, maxTokens]);
    for (let tokens = 1024; tokens <= maxTokens; tokens *= 4) {
      // the span is the last `tokens` slots; at 256K all of them
      const s = time(() => be.attnLogits(logits, 0, q, 0, k, maxTokens - tokens, tokens, 0.088));
      const bytes = tokens * kvHeads * d * (dtype === "f32" ? 4 : 2);
      const base = streamGBs(bytes);
      const gbs = bytes / s / 1e9;
      body.push(["attnLogits", `${tokens / 1024}K tok`, dtype, (s * 1e3).toFixed(3), gbs.toFixed(1), base.toFixed(1), `${((gbs / base) * 100).toFixed(0)}%`]);
    }
    // the hybrid stage's pre-QK path: score a selected set of slots scattered over the cache
    for (const sel of [1024, 16384]) {
      const slots = new Int32Array(sel);
      let seed = 12345;
      for (let i = 0; i < sel; i++) {
        // xorshift32: every bit random, unlike the low bits of a power-of-two LCG
        seed ^= seed << 13;
        seed ^= seed >>> 17;
        seed ^= seed << 5;
        slots[i] = (seed >>> 0) % maxTokens;
      }
      const s = time(() => be.attnLogitsGather(logits, 0, q, 0, k, slots, 0.088));
      const bytes = sel * kvHeads * d * (dtype === "f32" ? 4 : 2);
      const base = streamGBs(maxTokens * kvHeads * d * (dtype === "f32" ? 4 : 2)); // rows come from the whole cache
      const gbs = bytes / s / 1e9;
      body.push(["attnLogitsGather", `${sel / 1024}K of ${maxTokens / 1024}K`, dtype, (s * 1e3).toFixed(3), gbs.toFixed(1), base.toFixed(1), `${((gbs / base) * 100).toFixed(0)}%`]);
    }
    // aggregation of V over the same spans (V has K's shape), for scale
    const probs = filled([heads, maxTokens]);
    const out = be.alloc([1, heads * d]);
    for (let tokens = 4096; tokens <= maxTokens; tokens *= 8) {
      const s = time(() => be.attnAggregate(out, 0, probs, 0, k, maxTokens - tokens, tokens, false));
      const bytes = tokens * kvHeads * d * (dtype === "f32" ? 4 : 2);
      const base = streamGBs(bytes);
      const gbs = bytes / s / 1e9;
      body.push(["attnAggregate", `${tokens / 1024}K tok`, dtype, (s * 1e3).toFixed(3), gbs.toFixed(1), base.toFixed(1), `${((gbs / base) * 100).toFixed(0)}%`]);
    }
    be.free(probs);
    be.free(out);
    be.free(k);
    be.free(q);
    be.free(logits);
  }
  printTable(`attention, ${heads} query heads on ${kvHeads} KV heads × ${d} dims (GB/s = K or V bytes / time)`, ["op", "span", "K dtype", "ms", "GB/s", "stream GB/s", "of stream"], body);
}
be.close();
