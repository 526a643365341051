// `hybridgen serve` on stories15M, driven by the official openai client and by raw HTTP: the
// completions and chat endpoints (streaming or not) give `hybridgen generate`'s text byte for
// byte at temperature 0 and with a seed, with usage, stop strings and OpenAI's exact chunk
// shapes; 32 concurrent streaming clients each get their prompt's text alone; a client that
// disconnects frees its slot; every bad request gets its status and a one-line message; fields
// the server does not use are ignored.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PROMPT } from "./model-fixture.js";
import { requireBuiltBin, runBin } from "./helpers.js";
import { metric, sseEvents, startServer, until, type RunningServer } from "./serve-helpers.js";

let server: RunningServer;
let client: OpenAI;
const tmp = mkdtempSync(join(tmpdir(), "hg-serve-"));

beforeAll(async () => {
  requireBuiltBin();
  server = await startServer(["--threads", "1", "--max-batch", "8", "--max-body", "8K"]);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused", maxRetries: 0 });
});
afterAll(async () => {
  const r = await server?.stop("SIGTERM");
  rmSync(tmp, { recursive: true, force: true });
  expect(r).toEqual({ code: 0, signal: null });
});

/** `hybridgen generate --json` on the same model: the reference text. */
function generated(args: string[]): { text: string; promptTokens: number; generatedTokens: number; finishReason: string } {
  const r = runBin(["generate", "--threads", "1", "--json", ...args]);
  expect(r.code, r.stderr).toBe(0);
  return JSON.parse(r.stdout);
}

const post = (path: string, body: string | object) =>
  fetch(`${server.url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: typeof body === "string" ? body : JSON.stringify(body) });

describe("hybridgen serve: OpenAI's endpoints give generate's text", () => {
  it("a completion at temperature 0 is generate's text byte for byte, with usage", async () => {
    const want = generated(["-p", PROMPT, "-t", "0", "-n", "60"]);
    const r = await client.completions.create({ model: "any-name", prompt: PROMPT, max_tokens: 60, temperature: 0 });
    expect(r.object).toBe("text_completion");
    expect(r.model).toBe("stories15M");
    expect(r.choices).toHaveLength(1);
    expect(r.choices[0]!.text).toBe(want.text);
    expect(r.choices[0]!.finish_reason).toBe("length");
    expect(r.usage).toEqual({ prompt_tokens: want.promptTokens, completion_tokens: 60, total_tokens: want.promptTokens + 60 });
  });

  it("a streamed chat (stories15M has no template: the contents joined) is generate's text; role first, finish_reason last, usage, [DONE]", async () => {
    const want = generated(["-p", PROMPT, "-t", "0", "-n", "40"]);
    const stream = await client.chat.completions.create({
      model: "x", messages: [{ role: "user", content: PROMPT }], max_tokens: 40, temperature: 0, stream: true, stream_options: { include_usage: true },
    });
    const chunks: OpenAI.Chat.Completions.ChatCompletionChunk[] = [];
    for await (const c of stream) chunks.push(c);
    expect(chunks[0]!.choices[0]!.delta).toEqual({ role: "assistant", content: "" });
    expect(chunks.every((c) => c.object === "chat.completion.chunk" && c.id === chunks[0]!.id)).toBe(true);
    const text = chunks.map((c) => c.choices[0]?.delta.content ?? "").join("");
    expect(text).toBe(want.text);
    const last = chunks[chunks.length - 2]!;
    expect(last.choices[0]).toMatchObject({ delta: {}, finish_reason: "length" });
    expect(chunks.slice(0, -2).every((c) => c.choices[0]!.finish_reason === null && c.usage === null)).toBe(true);
    expect(chunks[chunks.length - 1]).toMatchObject({ choices: [], usage: { prompt_tokens: want.promptTokens, completion_tokens: 40, total_tokens: want.promptTokens + 40 } });

    // The wire format itself: SSE data lines ending in [DONE]; without include_usage no usage key.
    const res = await post("/v1/completions", { prompt: PROMPT, max_tokens: 5, temperature: 0, stream: true });
    expect(res.headers.get("content-type")).toMatch(/^text\/event-stream/);
    const events = sseEvents(await res.text());
    expect(events[events.length - 1]).toBe("[DONE]");
    const objs = events.slice(0, -1) as Record<string, unknown>[];
    expect(objs).toHaveLength(6); // a chunk a token (its text may be empty), then the finish
    expect(objs.every((e) => e.object === "text_completion" && !("usage" in e))).toBe(true);
    expect((objs[objs.length - 1]!.choices as { finish_reason: string }[])[0]!.finish_reason).toBe("length");
    // Fields this server does not use are ignored, as OpenAI-compatible servers do.
    const extra = await post("/v1/completions", { prompt: PROMPT, max_tokens: 5, temperature: 0, user: "u1", logit_bias: { "50256": -100 }, frequency_penalty: 0, echo: false, best_of: 1, suffix: null });
    expect(extra.status).toBe(200);
    const plain = await client.completions.create({ model: "m", prompt: PROMPT, max_tokens: 5, temperature: 0 });
    expect(((await extra.json()) as { choices: { text: string }[] }).choices[0]!.text).toBe(plain.choices[0]!.text);
  });

  it("stop strings: the text ends before the stop and finish_reason is stop, as generate --stop; streamed too", async () => {
    const want = generated(["-p", PROMPT, "-t", "0", "-n", "100", "--stop", "Lily", "--stop", "zzz"]);
    expect(want.finishReason).toBe("stop");
    const r = await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: PROMPT }], max_tokens: 100, temperature: 0, stop: ["Lily", "zzz"] });
    expect(r.object).toBe("chat.completion");
    expect(r.choices[0]!.message).toMatchObject({ role: "assistant", content: want.text });
    expect(r.choices[0]!.finish_reason).toBe("stop");
    const s = await client.completions.create({ model: "m", prompt: PROMPT, max_tokens: 100, temperature: 0, stop: "Lily", stream: true });
    let text = "", finish = null;
    for await (const c of s) {
      text += c.choices[0]!.text;
      finish = c.choices[0]!.finish_reason ?? finish;
    }
    expect(text).toBe(want.text);
    expect(finish).toBe("stop");
  });

  it("a seed reproduces generate's sampling (temperature 0.8, top_p 0.9), every time", async () => {
    const want = generated(["-p", "The dragon", "-t", "0.8", "--top-p", "0.9", "--seed", "7", "-n", "40"]);
    for (let i = 0; i < 2; i++) {
      const r = await client.completions.create({ model: "m", prompt: "The dragon", max_tokens: 40, temperature: 0.8, top_p: 0.9, seed: 7 });
      expect(r.choices[0]!.text).toBe(want.text);
    }
  });

  it("32 concurrent streaming clients are all answered, each with its prompt's greedy text alone", async () => {
    const starts = ["Once upon a time", "The little dog", "Lily and Tom", "A big red ball", "The sun was", "In the park", "The cat saw", "One day, a bird"];
    const prompts = starts.flatMap((s) => ["", " went", " said", " and"].map((t) => s + t));
    const file = join(tmp, "prompts.jsonl");
    writeFileSync(file, prompts.map((p) => JSON.stringify({ prompt: p })).join("\n"));
    const r = runBin(["generate", "--threads", "1", "--prompts", file, "--batch", "1", "-t", "0", "-n", "24"]);
    expect(r.code, r.stderr).toBe(0);
    const alone = new Map<number, string>(r.stdout.trim().split("\n").map((l) => JSON.parse(l)).map((o: { index: number; text: string }) => [o.index, o.text]));
    const texts = await Promise.all(prompts.map(async (prompt) => {
      const s = await client.completions.create({ model: "m", prompt, max_tokens: 24, temperature: 0, stream: true });
      let text = "";
      for await (const c of s) text += c.choices[0]!.text;
      return text;
    }));
    texts.forEach((t, i) => expect(t, prompts[i]).toBe(alone.get(i)));
    // Steps ran several sequences at once (the histogram's le="1" bucket holds fewer than all steps).
    const m = await (await fetch(`${server.url}/metrics`)).text();
    const one = Number(/hybridgen_batch_size_steps_bucket\{le="1"\} (\d+)/.exec(m)![1]), all = Number(/hybridgen_batch_size_steps_count (\d+)/.exec(m)![1]);
    expect(one).toBeLessThan(all);
    expect(await metric(server.url, "hybridgen_requests_running")).toBe(0);
  });

  it("a client that disconnects mid-stream, or before its whole response, is cancelled and its slot comes back (metrics)", async () => {
    const cancelled = `hybridgen_requests_finished_total{reason="cancelled"}`;
    const before = await metric(server.url, cancelled), tokens = await metric(server.url, "hybridgen_generation_tokens_total");
    const ac = new AbortController();
    const res = await fetch(`${server.url}/v1/completions`, { method: "POST", body: JSON.stringify({ prompt: PROMPT, max_tokens: 250, temperature: 0, stream: true }), signal: ac.signal });
    const reader = res.body!.getReader();
    for (let i = 0; i < 3; i++) await reader.read();
    ac.abort();
    await until(async () => (await metric(server.url, cancelled)) === before + 1 && (await metric(server.url, "hybridgen_requests_running")) === 0, "the cancelled request to leave");
    expect(await metric(server.url, "hybridgen_generation_tokens_total")).toBeLessThan(tokens + 150); // the story alone runs 217 tokens to EOS
    // The slot serves the next request.
    const r = await client.completions.create({ model: "m", prompt: PROMPT, max_tokens: 3, temperature: 0 });
    expect(r.choices[0]!.finish_reason).toBe("length");
    // A client of a whole (not streamed) response that goes away is cancelled too.
    const whole = new AbortController(), generated = await metric(server.url, "hybridgen_generation_tokens_total");
    const pending = fetch(`${server.url}/v1/completions`, { method: "POST", body: JSON.stringify({ prompt: PROMPT, max_tokens: 250, temperature: 0 }), signal: whole.signal }).catch(() => null);
    await until(async () => (await metric(server.url, "hybridgen_generation_tokens_total")) > generated + 2, "the whole request to generate");
    whole.abort();
    expect(await pending).toBeNull();
    await until(async () => (await metric(server.url, cancelled)) === before + 2 && (await metric(server.url, "hybridgen_requests_running")) === 0, "the whole request to leave");
    expect(await metric(server.url, "hybridgen_generation_tokens_total")).toBeLessThan(generated + 150);
  });

  it("every bad request gets its status and a one-line message naming the field", async () => {
    const msg = { messages: [{ role: "user", content: "hi" }] };
    const cases: [string, string | object, number, RegExp][] = [
      ["/v1/completions", "{not json", 400, /^the request body is not valid JSON \(/],
      ["/v1/completions", "[1,2]", 400, /^the request body must be a JSON object$/],
      ["/v1/chat/completions", { messages: [] }, 400, /^messages: must hold at least one message$/],
      ["/v1/chat/completions", { messages: "hi" }, 400, /^messages: must be an array$/],
      ["/v1/chat/completions", {}, 400, /^messages: is required$/],
      ["/v1/chat/completions", { messages: [{ role: "robot", content: "x" }] }, 400, /^messages\[0\]\.role: must be system, user, assistant or developer$/],
      ["/v1/chat/completions", { ...msg, n: 2 }, 400, /^n: must be 1 \(this server returns one choice\)$/],
      ["/v1/chat/completions", { ...msg, stream: "yes" }, 400, /^stream: must be a boolean$/],
      ["/v1/completions", { prompt: "x", max_tokens: -5 }, 400, /^max_tokens: must be at least 1$/],
      ["/v1/completions", { prompt: "x", max_tokens: 2.5 }, 400, /^max_tokens: must be an integer$/],
      ["/v1/completions", { prompt: 5 }, 400, /^prompt: must be a string \(or an array of one string\)$/],
      ["/v1/completions", { prompt: "x", temperature: "hot" }, 400, /^temperature: must be a number$/],
      ["/v1/completions", { prompt: "x", top_p: 0 }, 400, /^top_p: must be > 0$/],
      ["/v1/completions", { prompt: "x", max_tokens: 1000 }, 400, /^this model's context is 256 tokens; the prompt is 2 tokens and max_tokens 1000 \(1002 in all\): shorten the prompt or lower max_tokens$/],
      ["/v1/completions", { prompt: "x".repeat(9000) }, 413, /^the request body is larger than 8192 bytes \(--max-body\)$/],
    ];
    for (const [path, body, status, message] of cases) {
      const res = await post(path, body);
      const e = (await res.json()) as { error: { message: string; type: string } };
      expect(res.status, JSON.stringify(body).slice(0, 80)).toBe(status);
      expect(e.error.message).toMatch(message);
      expect(e.error.message).not.toMatch(/\n/);
      expect(e.error.type).toBe("invalid_request_error");
    }
    const over = (await (await post("/v1/completions", { prompt: "x", max_tokens: 1000 })).json()) as { error: object };
    expect(over.error).toMatchObject({ param: "max_tokens", code: "context_length_exceeded" });
    expect((await fetch(`${server.url}/v1/completions`)).status).toBe(405);
    expect((await fetch(`${server.url}/nope`)).status).toBe(404);
    // The client raises the same status.
    await expect(client.completions.create({ model: "m", prompt: "x", max_tokens: 1000 })).rejects.toMatchObject({ status: 400 });
  });

  it("GET /v1/models names the model and its template; /health is 200; /metrics has every metric", async () => {
    const models = await client.models.list();
    expect(models.data).toEqual([expect.objectContaining({ id: "stories15M", object: "model", owned_by: "hybridgen", chat_template: "plain", max_model_len: 256 })]);
    expect((await fetch(`${server.url}/health`)).status).toBe(200);
    const text = await (await fetch(`${server.url}/metrics`)).text();
    for (const name of [
      "hybridgen_requests_running", "hybridgen_requests_queued", "hybridgen_generation_tokens_total", "hybridgen_time_to_first_token_seconds_bucket",
      "hybridgen_time_per_output_token_seconds_count", "hybridgen_batch_size", "hybridgen_kv_bytes{tier=\"window\"}", "hybridgen_hybrid_k", "hybridgen_cpu_stage_seconds_sum",
      "hybridgen_decode_step_seconds_count", "hybridgen_prefill_chunk_seconds_count",
    ]) expect(text).toContain(`\n${name}`);
    expect(text).toMatch(/^# HELP hybridgen_requests_running /);
  });
});
