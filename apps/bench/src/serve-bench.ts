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
 * --source TEXT says where and how they were measured).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { seededRandom } from "@hybridgen/core";
import { arg, list } from "./args.js";

const WORDS = "once upon a time there was a little girl named lily she loved to play outside in the sun one day she saw a big red ball in the sky and her mom said".split(" ");

interface Outcome {
  readonly ttftMs: number;
  readonly tpotMs: number | null;
  readonly outputTokens: number;
  readonly endMs: number;
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

/** One streamed completion: times of its first and last token, and its usage's output tokens. */
async function request(url: string, prompt: string, maxTokens: number, t0: number): Promise<Outcome> {
  const sent = performance.now();
  const res = await fetch(`${url}/v1/completions`, {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, stream: true, stream_options: { include_usage: true } }),
  });
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  const reader = res.body!.getReader(), dec = new TextDecoder();
  let buf = "", first = 0, last = 0, tokens = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const data = buf.slice(6, cut);
      buf = buf.slice(cut + 2);
      if (data === "[DONE]") continue;
      const msg = JSON.parse(data) as { choices: { text: string; finish_reason: string | null }[]; usage?: { completion_tokens: number } | null; error?: { message: string } };
      if (msg.error) throw new Error(`the stream ended with an error: ${msg.error.message}`);
      // A chunk a token (its text may be empty: a byte tokenizer's ids past 255, or text held back for a stop string).
      if (msg.choices[0] && msg.choices[0].finish_reason === null) {
        last = performance.now();
        if (!first) first = last;
      }
      if (msg.usage) tokens = msg.usage.completion_tokens;
    }
  }
  const end = performance.now();
  if (!first) first = last = end;
  return { ttftMs: first - sent, tpotMs: tokens > 1 ? (last - first) / (tokens - 1) : null, outputTokens: tokens, endMs: end - t0 };
}

interface Lengths { promptWords: number; promptBytes: number; outputTokens: number; spread: number }

async function runRate(url: string, rate: number, o: { clients: number; requests: number; seed: number } & Lengths) {
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
  const t0 = performance.now();
  const outcomes: Outcome[] = [];
  let next = 0;
  const client = async () => {
    while (next < jobs.length) {
      const j = jobs[next++]!;
      const wait = j.at - (performance.now() - t0);
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      outcomes.push(await request(url, j.prompt, j.maxTokens, t0));
    }
  };
  await Promise.all(Array.from({ length: o.clients }, client));
  const seconds = Math.max(...outcomes.map((x) => x.endMs)) / 1000;
  const tokens = outcomes.reduce((n, x) => n + x.outputTokens, 0);
  const ttft = outcomes.map((x) => x.ttftMs), tpot = outcomes.flatMap((x) => (x.tpotMs === null ? [] : [x.tpotMs]));
  return { seconds, tokens, reqPerS: outcomes.length / seconds, tokPerS: tokens / seconds, ttft, tpot };
}

const clients = Number(arg("clients", "16")), requests = Number(arg("requests", "64"));
const lengths: Lengths = {
  promptWords: Number(arg("prompt-words", "24")), promptBytes: Number(arg("prompt-bytes", "0")), outputTokens: Number(arg("output-tokens", "48")), spread: Number(arg("spread", "1")),
};
const seed = Number(arg("seed", "1"));
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
  console.log("| arrival rate (req/s) | requests | time (s) | req/s | output tok/s | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | TPOT p99 (ms) |");
  console.log("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
  const results = [];
  for (const rate of rates) {
    const r = await runRate(url, rate, { clients, requests, seed, ...lengths });
    const f = (x: number) => x.toFixed(1);
    console.log(`| ${Number.isFinite(rate) ? rate : "all at once"} | ${requests} | ${f(r.seconds)} | ${r.reqPerS.toFixed(2)} | ${f(r.tokPerS)} | ${f(quantile(r.ttft, 0.5))} | ${f(quantile(r.ttft, 0.99))} | ${f(quantile(r.tpot, 0.5))} | ${f(quantile(r.tpot, 0.99))} |`);
    results.push({
      label, serve: serveArgs, rate: Number.isFinite(rate) ? rate : "inf", clients, requests, promptWords: lengths.promptWords, promptBytes: lengths.promptBytes,
      maxTokensMean: lengths.outputTokens, spread: lengths.spread, seconds: Number(r.seconds.toFixed(2)), generatedTokens: r.tokens,
      requestsPerSec: Number(r.reqPerS.toFixed(3)), outputTokensPerSec: Number(r.tokPerS.toFixed(1)),
      ttftMs: { p50: q(r.ttft, 0.5), p99: q(r.ttft, 0.99) }, tpotMs: { p50: q(r.tpot, 0.5), p99: q(r.tpot, 0.99) },
    });
  }
  if (jsonFile) {
    const file = existsSync(jsonFile) ? JSON.parse(readFileSync(jsonFile, "utf8")) : { measured: arg("source", ""), results: [] };
    file.results.push(...results);
    writeFileSync(jsonFile, `${JSON.stringify(file, null, 1)}\n`);
  }
} catch (e) {
  if (server) console.error(server.log().split("\n").slice(-20).join("\n"));
  throw e;
} finally {
  server?.child.kill("SIGTERM");
}
