/**
 * Serving benchmark for `hybridgen serve`: N concurrent clients, requests arriving as a Poisson
 * process at each rate, prompt and output lengths drawn uniformly around their means (seeded;
 * --spread 0: every one the mean), every request a streamed /v1/completions with usage. Prints
 * one markdown table row per rate: request throughput, output tokens/s, TTFT and TPOT p50/p99
 * (TPOT: a request's time from its first to its last token over the tokens after the first; the
 * server streams a chunk a token).
 *
 *   ./bun apps/bench/src/serve-bench.ts --serve "--threads 2 --max-batch 8" --clients 16 --requests 64 --rates 2,4,8,inf
 *   ./bun apps/bench/src/serve-bench.ts --url http://127.0.0.1:8080 --clients 32 --requests 128 --rates inf
 *   bun .device/serve-bench.js --server "bun .device/hybridgen.js" --serve "…" --prompt-bytes 32000 --spread 0 --label full --json out.json
 *
 * --serve starts `./hybridgen serve --port 0 ARGS` from the repository root (--server CMD: another
 * launcher, e.g. a bundle), stopped with SIGTERM at the end; --url uses a server already running.
 * Prompts are words, ~--prompt-words of them, or ~--prompt-bytes of text. Greedy (temperature 0);
 * the model may end a text before its budget, so output tokens are counted from each response's
 * usage. --json FILE adds each rate's figures under --label to FILE's results (made if absent;
 * --source TEXT says where and how they were measured). --time-limit S ends a rate after S seconds,
 * --deadline S the whole run S seconds after it started (the server's load included; later rates
 * are skipped): a rate cut short reports the tokens streamed so far (`completed` says how many
 * requests ended). Each rate also reports the mean batch of its decode steps, which shows whether requests
 * queued, the mean wall time of a decode step and of a prefill chunk, the time in neither, and the slot
 * renewals (count, seconds) and reuses (the server's metrics); the server's metrics and, once it
 * exited, its log are printed at the end. Beside the step and the chunk, their floors from what the
 * server counts a step must read and a chunk compute: a step's device bytes at --hbm-gbs plus its
 * link bytes at --link-gbs, a chunk's FLOPs at --peak-tflops or its stores up the link, the longer
 * (the card's rates, given).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { sseData } from "@hybridgen/cli/sse";
import { seededRandom } from "@hybridgen/core";
import { arg, list } from "./args.js";

const WORDS = "once upon a time there was a little girl named lily she loved to play outside in the sun one day she saw a big red ball in the sky and her mom said".split(" ");

interface Outcome {
  /** Null when the time limit came before its first token. */
  readonly ttftMs: number | null;
  readonly tpotMs: number | null;
  readonly outputTokens: number;
  readonly endMs: number;
  /** False when the time limit cut it short. */
  readonly completed: boolean;
}

const quantile = (xs: number[], q: number): number => {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
};

async function startServer(command: string, args: string): Promise<{ url: string; child: ChildProcess; log: () => string }> {
  const [launcher, ...pre] = command ? command.split(/\s+/).filter(Boolean) : [fileURLToPath(new URL("../../../hybridgen", import.meta.url))];
  const child = spawn(launcher!, [...pre, "serve", "--port", "0", ...args.split(/\s+/).filter(Boolean)], { stdio: ["ignore", "ignore", "pipe"] });
  let err = "";
  return new Promise((resolve, reject) => {
    child.stderr!.setEncoding("utf8").on("data", (d: string) => {
      err += d;
      const m = /^ready: .* at (http:\/\/\S+)$/m.exec(err);
      if (m) resolve({ url: m[1]!, child, log: () => err });
    });
    child.on("exit", (code) => reject(new Error(`the server exited (${code}):\n${err}`)));
  });
}

/** One streamed completion: times of its first and last token, and its output tokens (usage's, or the chunks so far when `stop` cuts it short). */
async function request(url: string, prompt: string, maxTokens: number, t0: number, stop: AbortSignal): Promise<Outcome> {
  const sent = performance.now();
  let first = 0, last = 0, chunks = 0, tokens = -1;
  try {
    const res = await fetch(`${url}/v1/completions`, {
      method: "POST", headers: { "content-type": "application/json" }, signal: stop,
      body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, stream: true, stream_options: { include_usage: true } }),
    });
    if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
    for await (const data of sseData(res.body!)) {
      if (data === "[DONE]") continue;
      const msg = JSON.parse(data) as { choices: { text: string; finish_reason: string | null }[]; usage?: { completion_tokens: number } | null; error?: { message: string } };
      if (msg.error) throw new Error(`the stream ended with an error: ${msg.error.message}`);
      // A chunk a token (its text may be empty: a byte tokenizer's ids past 255, or text held back for a stop string).
      if (msg.choices[0] && msg.choices[0].finish_reason === null) {
        last = performance.now();
        if (!first) first = last;
        chunks++;
      }
      if (msg.usage) tokens = msg.usage.completion_tokens;
    }
  } catch (e) {
    if (!stop.aborted) throw e;
  }
  const end = performance.now();
  const completed = tokens >= 0;
  const n = completed ? tokens : chunks;
  if (completed && !first) first = last = end;
  return { ttftMs: first ? first - sent : null, tpotMs: n > 1 && first ? (last - first) / (n - 1) : null, outputTokens: n, endMs: (completed ? end : last || end) - t0, completed };
}

/**
 * Sums and counts of the server's histograms a rate's figures come from: rows per decode step, a step's, a prefill chunk's and a slot
 * renewal's wall time (s); `reuses` (a counter: its count) the requests that took a left sequence without a renewal.
 */
const HISTOGRAMS = { batch: "hybridgen_batch_size_steps", step: "hybridgen_decode_step_seconds", chunk: "hybridgen_prefill_chunk_seconds", renew: "hybridgen_slot_renew_seconds" } as const;
/** Counters read as a sum: the bytes the decode steps must read (device, link) and the FLOPs the chunks must compute, from the model's shape. */
const COUNTERS = { deviceBytes: 'hybridgen_decode_bytes_total{where="device"}', linkBytes: 'hybridgen_decode_bytes_total{where="link"}', flops: "hybridgen_prefill_flops_total", chunkLinkBytes: "hybridgen_prefill_link_bytes_total" } as const;
type Sums = Record<keyof typeof HISTOGRAMS | keyof typeof COUNTERS | "reuses", { sum: number; count: number }>;

async function histogramSums(url: string): Promise<Sums> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const read = (name: string) => Number(new RegExp(`^${name.replace(/[{}"]/g, "\\$&")} (\\S+)$`, "m").exec(text)?.[1] ?? NaN);
  const entries = Object.entries(HISTOGRAMS).map(([k, name]) => [k, { sum: read(`${name}_sum`), count: read(`${name}_count`) }]);
  const counters = Object.entries(COUNTERS).map(([k, name]) => [k, { sum: read(name), count: 0 }]);
  return { ...Object.fromEntries(entries), ...Object.fromEntries(counters), reuses: { sum: 0, count: read("hybridgen_slot_reuses_total") } } as Sums;
}

/** What a rate added to histogram `k`: its sum and count. */
const added = (a: Sums, b: Sums, k: keyof Sums) => ({ sum: b[k].sum - a[k].sum, count: b[k].count - a[k].count });

/** The mean of histogram `k` over what a rate added (NaN: none, or a server without it). */
const meanOver = (a: Sums, b: Sums, k: keyof Sums): number => (b[k].sum - a[k].sum) / (b[k].count - a[k].count);

interface Lengths { promptWords: number; promptBytes: number; outputTokens: number; spread: number }

async function runRate(url: string, rate: number, o: { clients: number; requests: number; seed: number; limitS: number } & Lengths) {
  const rnd = seededRandom(o.seed);
  const around = (mean: number) => Math.max(1, Math.round(mean * (1 - o.spread / 2 + o.spread * rnd())));
  const words = (n: number) => Array.from({ length: n }, () => WORDS[Math.floor(rnd() * WORDS.length)]).join(" ");
  let at = 0;
  const jobs = Array.from({ length: o.requests }, () => {
    at += Number.isFinite(rate) ? -Math.log(1 - rnd()) / rate * 1000 : 0; // exponential gaps: Poisson arrivals
    let prompt: string;
    if (o.promptBytes > 0) {
      const bytes = around(o.promptBytes);
      prompt = words(Math.ceil(bytes / 3)).slice(0, bytes).trimEnd();
    } else prompt = words(around(o.promptWords));
    return { at, prompt, maxTokens: around(o.outputTokens) };
  });
  const sums0 = await histogramSums(url);
  const stop = new AbortController();
  const limit = Number.isFinite(o.limitS) ? setTimeout(() => stop.abort(), o.limitS * 1000) : null;
  const t0 = performance.now();
  const outcomes: Outcome[] = [];
  let next = 0;
  const client = async () => {
    while (next < jobs.length && !stop.signal.aborted) {
      const j = jobs[next++]!;
      const wait = j.at - (performance.now() - t0);
      if (wait > 0) {
        await new Promise<void>((resolve) => {
          const t = setTimeout(resolve, wait);
          stop.signal.addEventListener("abort", () => (clearTimeout(t), resolve()), { once: true });
        });
      }
      if (!stop.signal.aborted) outcomes.push(await request(url, j.prompt, j.maxTokens, t0, stop.signal));
    }
  };
  await Promise.all(Array.from({ length: o.clients }, client));
  if (limit) clearTimeout(limit);
  const cut = stop.signal.aborted;
  const seconds = (cut ? performance.now() - t0 : Math.max(...outcomes.map((x) => x.endMs))) / 1000;
  const sums1 = await histogramSums(url);
  const tokens = outcomes.reduce((n, x) => n + x.outputTokens, 0);
  const ttft = outcomes.flatMap((x) => (x.ttftMs === null ? [] : [x.ttftMs])), tpot = outcomes.flatMap((x) => (x.tpotMs === null ? [] : [x.tpotMs]));
  const completed = outcomes.filter((x) => x.completed).length;
  const renew = added(sums0, sums1, "renew"), step = added(sums0, sums1, "step"), chunk = added(sums0, sums1, "chunk");
  return {
    seconds, tokens, completed, reqPerS: completed / seconds, tokPerS: tokens / seconds, ttft, tpot,
    meanBatch: meanOver(sums0, sums1, "batch"), steps: step.count, stepMs: (step.sum / step.count) * 1000, chunks: chunk.count, chunkMs: (chunk.sum / chunk.count) * 1000,
    // The loop's time in neither a decode step nor a prefill chunk (renewals, admission, streaming, idle turns).
    outsideS: seconds - step.sum - chunk.sum,
    renewS: renew.sum, renewals: renew.count, reuses: added(sums0, sums1, "reuses").count,
    // What a step must read and a chunk compute (the server's model of the work), per step and per chunk.
    deviceBytesPerStep: added(sums0, sums1, "deviceBytes").sum / step.count, linkBytesPerStep: added(sums0, sums1, "linkBytes").sum / step.count,
    flopsPerChunk: added(sums0, sums1, "flops").sum / chunk.count, linkBytesPerChunk: added(sums0, sums1, "chunkLinkBytes").sum / chunk.count,
  };
}

/**
 * The floors a step's and a chunk's measured time are set beside: a decode step's device bytes at
 * --hbm-gbs and its link bytes at --link-gbs, one after the other (a hybrid step's rows are gathered
 * on the compute stream between its kernels); a chunk's FLOPs at --peak-tflops or the stores it brings
 * up at --link-gbs, whichever is longer (the copy stream may overlap the kernels). NaN where a rate or
 * the server's counters are missing.
 */
function floors(r: { deviceBytesPerStep: number; linkBytesPerStep: number; flopsPerChunk: number; linkBytesPerChunk: number }, rates: { hbmGBs: number; linkGBs: number; peakTflops: number }) {
  const link = (bytes: number) => (bytes > 0 ? bytes / (rates.linkGBs * 1e6) : 0);
  return { stepFloorMs: r.deviceBytesPerStep / (rates.hbmGBs * 1e6) + link(r.linkBytesPerStep), chunkFloorMs: Math.max(r.flopsPerChunk / (rates.peakTflops * 1e9), link(r.linkBytesPerChunk)) };
}

const clients = Number(arg("clients", "16")), requests = Number(arg("requests", "64"));
const lengths: Lengths = {
  promptWords: Number(arg("prompt-words", "24")), promptBytes: Number(arg("prompt-bytes", "0")), outputTokens: Number(arg("output-tokens", "48")), spread: Number(arg("spread", "1")),
};
const seconds = (name: string) => Number(arg(name, "inf").replace(/^inf$/, "Infinity"));
const floorRates = { hbmGBs: Number(arg("hbm-gbs", "NaN")), linkGBs: Number(arg("link-gbs", "NaN")), peakTflops: Number(arg("peak-tflops", "NaN")) };
const seed = Number(arg("seed", "1")), limitS = seconds("time-limit"), deadlineMs = performance.now() + seconds("deadline") * 1000;
const rates = list("rates", "2,4,8,inf").map((r) => (r === "inf" ? Infinity : Number(r)));
const given = arg("url", ""), serveArgs = arg("serve", "--threads 2"), label = arg("label", serveArgs), jsonFile = arg("json", "");
const server = given ? null : await startServer(arg("server", ""), serveArgs);
// Stopped from outside (a time limit): the server goes at once, not left holding the device.
process.on("SIGTERM", () => {
  server?.child.kill("SIGKILL");
  process.exit(143);
});
const url = given || server!.url;
const prompts = lengths.promptBytes > 0 ? `~${lengths.promptBytes} bytes of words` : `~${lengths.promptWords} words`;
const spread = lengths.spread === 0 ? "fixed" : `uniform ${1 - lengths.spread / 2}–${1 + lengths.spread / 2}×`;
const q = (xs: number[], p: number) => Number(quantile(xs, p).toFixed(1));
try {
  console.log(`server ${url}${server ? ` (hybridgen serve ${serveArgs})` : ""}; ${clients} clients, ${requests} requests a rate, prompt ${prompts}, output ~${lengths.outputTokens} tokens (${spread}), greedy\n`);
  console.log("| arrival rate (req/s) | requests | time (s) | req/s | output tok/s | mean batch | decode steps | step (ms) | step floor (ms) | GB a step (device / link) | prefill chunks | chunk (ms) | chunk floor (ms) | GB a chunk up the link | outside both (s) | renewals (n, s) | reuses | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | TPOT p99 (ms) |");
  console.log(`|${" ---: |".repeat(21)}`);
  const results = [];
  for (const rate of rates) {
    const left = (deadlineMs - performance.now()) / 1000;
    if (left <= 1) break;
    const r = await runRate(url, rate, { clients, requests, seed, limitS: Math.min(limitS, left - 1), ...lengths });
    const f = (x: number) => x.toFixed(1), gb = (x: number) => (x / 1e9).toFixed(3);
    const fl = floors(r, floorRates);
    const done = r.completed === requests ? String(requests) : `${r.completed} of ${requests} (time limit)`;
    console.log(
      `| ${Number.isFinite(rate) ? rate : "all at once"} | ${done} | ${f(r.seconds)} | ${r.reqPerS.toFixed(2)} | ${f(r.tokPerS)} | ${r.meanBatch.toFixed(2)} | ${r.steps} | ${f(r.stepMs)} | ${fl.stepFloorMs.toFixed(2)} | ` +
        `${gb(r.deviceBytesPerStep)} / ${gb(r.linkBytesPerStep)} | ${r.chunks} | ${f(r.chunkMs)} | ${fl.chunkFloorMs.toFixed(2)} | ${gb(r.linkBytesPerChunk)} | ${r.outsideS.toFixed(2)} | ${r.renewals}, ${r.renewS.toFixed(2)} | ${r.reuses} | ` +
        `${f(quantile(r.ttft, 0.5))} | ${f(quantile(r.ttft, 0.99))} | ${f(quantile(r.tpot, 0.5))} | ${f(quantile(r.tpot, 0.99))} |`,
    );
    results.push({
      label, serve: serveArgs, rate: Number.isFinite(rate) ? rate : "inf", clients, requests, completed: r.completed, promptWords: lengths.promptWords, promptBytes: lengths.promptBytes,
      maxTokensMean: lengths.outputTokens, spread: lengths.spread, seconds: Number(r.seconds.toFixed(2)), generatedTokens: r.tokens,
      requestsPerSec: Number(r.reqPerS.toFixed(3)), outputTokensPerSec: Number(r.tokPerS.toFixed(1)), meanBatch: Number(r.meanBatch.toFixed(2)),
      ...(Number.isFinite(r.stepMs) ? { steps: r.steps, meanStepMs: Number(r.stepMs.toFixed(1)) } : {}), ...(Number.isFinite(r.chunkMs) ? { chunks: r.chunks, meanChunkMs: Number(r.chunkMs.toFixed(1)) } : {}),
      ...(Number.isFinite(r.deviceBytesPerStep) ? { deviceBytesPerStep: Math.round(r.deviceBytesPerStep), linkBytesPerStep: Math.round(r.linkBytesPerStep) } : {}),
      ...(Number.isFinite(r.flopsPerChunk) ? { flopsPerChunk: Math.round(r.flopsPerChunk) } : {}), ...(Number.isFinite(r.linkBytesPerChunk) ? { linkBytesPerChunk: Math.round(r.linkBytesPerChunk) } : {}),
      ...(Number.isFinite(fl.stepFloorMs) ? { stepFloorMs: Number(fl.stepFloorMs.toFixed(2)) } : {}), ...(Number.isFinite(fl.chunkFloorMs) ? { chunkFloorMs: Number(fl.chunkFloorMs.toFixed(2)) } : {}),
      ...(Object.values(floorRates).some(Number.isFinite) ? { floorRates } : {}),
      ...(Number.isFinite(r.outsideS) ? { outsideStepsS: Number(r.outsideS.toFixed(2)) } : {}),
      ...(Number.isFinite(r.renewals) ? { renewals: r.renewals, renewS: Number(r.renewS.toFixed(2)) } : {}), ...(Number.isFinite(r.reuses) ? { reuses: r.reuses } : {}),
      ttftMs: { p50: q(r.ttft, 0.5), p99: q(r.ttft, 0.99) }, tpotMs: { p50: q(r.tpot, 0.5), p99: q(r.tpot, 0.99) },
    });
  }
  if (jsonFile) {
    const file = existsSync(jsonFile) ? JSON.parse(readFileSync(jsonFile, "utf8")) : { measured: arg("source", ""), results: [] };
    file.results.push(...results);
    writeFileSync(jsonFile, `${JSON.stringify(file, null, 1)}\n`);
  }
  // The server's own account (hybrid K, CPU-stage time, KV bytes per tier, steps): its metrics less the histograms' buckets.
  const metrics = (await (await fetch(`${url}/metrics`)).text()).split("\n").filter((l) => l && !l.startsWith("#") && !l.includes("_bucket{"));
  console.log(`\nserver metrics:\n${metrics.join("\n")}`);
} finally {
  // The server is gone before this exits (a next server on the same device must not meet its memory), SIGKILL past 10 s.
  if (server && server.child.exitCode === null && server.child.signalCode === null) {
    const exited = new Promise((resolve) => server.child.once("exit", resolve));
    server.child.kill("SIGTERM");
    const late = setTimeout(() => server.child.kill("SIGKILL"), 10_000);
    await exited;
    clearTimeout(late);
  }
  // After its exit: the requests a time limit cut leave as their clients go, each logging its hybrid stats line.
  if (server) console.log(`\nserver log:\n${server.log().split("\n").slice(-60).join("\n")}`);
}
