// `hybridgen serve --attention hybrid` with every request's store on the disk tier
// (--host-kv-budget 0): concurrent requests each get the text of `hybridgen generate` alone with
// the same flags; while they run, the metrics show their stores on disk and the hybrid steps'
// K; once they are done no disk file is left (each left with its request). SIGINT while requests
// hold stores on disk (--shutdown-grace 0) cancels them, their streams say why, no file is left,
// exit 0; SIGTERM (the signal a service manager sends, on its own path) does the same. With
// --preallocate the stores are on disk from load, kept while idle, and gone after SIGTERM.
import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { requireBuiltBin, runBin } from "./helpers.js";
import { metric, sseEvents, startServer, until } from "./serve-helpers.js";

const dir = mkdtempSync(join(tmpdir(), "hg-serve-kv-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const HYBRID = ["--attention", "hybrid", "--gpu-kv-budget", "32", "--sink-tokens", "4", "--k", "16", "--kv-disk", dir, "--host-kv-budget", "0"];
const PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom went to the park.", "A big red ball"];

describe("hybridgen serve with hybrid attention, each request's store on the disk tier", () => {
  it("gives each request generate's text alone; stores show on disk while running and leave with their requests; SIGINT mid-stream removes them and exits 0", async () => {
    requireBuiltBin();
    const want = PROMPTS.map((p) => {
      const r = runBin(["generate", "--threads", "1", "--json", "-p", p, "-t", "0", "-n", "60", ...HYBRID]);
      expect(r.code, r.stderr).toBe(0);
      return JSON.parse(r.stdout).text as string;
    });
    expect(readdirSync(dir)).toEqual([]);
    const server = await startServer(["--threads", "1", "--max-batch", "3", "--shutdown-grace", "0", ...HYBRID]);
    let stopped: ReturnType<typeof server.stop> | null = null;
    try {
      expect(server.stderr()).toMatch(/^hybrid: selector topk, fixed scheduler \(K 16 post/m);
      // A stream's headers come with its first token: the responses are awaited after the metrics are read.
      const res = PROMPTS.map((prompt) => fetch(`${server.url}/v1/completions`, {
        method: "POST", body: JSON.stringify({ prompt, max_tokens: 60, temperature: 0, stream: true }),
      }));
      // Three run (one waits for a slot), each on a store of its own in files under the disk tier.
      await until(async () => (await metric(server.url, "hybridgen_requests_running")) === 3, "three requests running");
      expect(await metric(server.url, `hybridgen_kv_bytes{tier="disk"}`)).toBeGreaterThan(0);
      expect(readdirSync(dir).length).toBeGreaterThan(0);
      const texts = await Promise.all(res.map(async (r) => {
        const events = sseEvents(await (await r).text());
        expect(events[events.length - 1]).toBe("[DONE]");
        return (events.slice(0, -1) as { choices: { text: string }[] }[]).map((e) => e.choices[0]!.text).join("");
      }));
      expect(texts).toEqual(want);
      await until(async () => (await metric(server.url, "hybridgen_requests_running")) === 0, "every request to leave");
      expect(readdirSync(dir)).toEqual([]);
      expect(await metric(server.url, `hybridgen_kv_bytes{tier="disk"}`)).toBe(0);
      expect(await metric(server.url, "hybridgen_hybrid_k")).toBe(16);
      expect(await metric(server.url, `hybridgen_hybrid_steps_total{timing="post"}`)).toBeGreaterThan(0);
      expect(await metric(server.url, "hybridgen_cpu_stage_seconds_count")).toBeGreaterThan(0);
      // Every step and chunk timed; each request's hybrid stats logged as it left.
      expect(await metric(server.url, "hybridgen_decode_step_seconds_count")).toBe(await metric(server.url, "hybridgen_decode_steps_total"));
      expect(await metric(server.url, "hybridgen_prefill_chunk_seconds_count")).toBe(await metric(server.url, "hybridgen_prefill_chunks_total"));
      // A renewal as each request came and as it left, but for a request that took the sequence one left (both renewals saved).
      const reused = await metric(server.url, "hybridgen_slot_reuses_total");
      expect(await metric(server.url, "hybridgen_slot_renew_seconds_count") + 2 * reused).toBe(2 * PROMPTS.length);
      expect(server.stderr().match(/^slot [1-3] left: hybrid: \d+ tokens offloaded, mean rows selected per KV head [\d.]+, per layer: CPU stage [\d.]+ ms/gm)).toHaveLength(PROMPTS.length);

      // Two long requests hold stores on disk when SIGINT comes: cancelled at once (grace 0), their files gone, exit 0.
      const long = PROMPTS.slice(0, 2).map((prompt) => fetch(`${server.url}/v1/completions`, {
        method: "POST", body: JSON.stringify({ prompt, max_tokens: 200, temperature: 0, stream: true }),
      }));
      await until(async () => (await metric(server.url, "hybridgen_requests_running")) === 2 && (await metric(server.url, "hybridgen_generation_tokens_total")) > 4 * 60 + 2, "two long requests decoding");
      expect(readdirSync(dir).length).toBeGreaterThan(0);
      stopped = server.stop("SIGINT");
      for (const r of long) {
        const events = sseEvents(await (await r).text());
        expect(events.slice(-2)).toEqual([{ error: { message: "the server is shutting down; the request was cancelled", type: "server_error", param: null, code: null } }, "[DONE]"]);
      }
      expect(await stopped).toEqual({ code: 0, signal: null });
    } finally {
      stopped ??= server.stop("SIGKILL"); // a failure above must not leave the server running
      await stopped;
    }
    expect(server.stderr()).toMatch(/^SIGINT: not accepting requests; 2 running, 0 queued \(cancelled\), 0 s to finish$/m);
    expect(readdirSync(dir)).toEqual([]);
  });

  it("SIGTERM while requests hold stores on disk (--shutdown-grace 0): their streams end with the cancel, no file is left, exit 0", async () => {
    requireBuiltBin();
    const server = await startServer(["--threads", "1", "--max-batch", "2", "--shutdown-grace", "0", ...HYBRID]);
    let stopped: ReturnType<typeof server.stop> | null = null;
    try {
      const long = PROMPTS.slice(2).map((prompt) => fetch(`${server.url}/v1/completions`, {
        method: "POST", body: JSON.stringify({ prompt, max_tokens: 200, temperature: 0, stream: true }),
      }));
      await until(async () => (await metric(server.url, "hybridgen_requests_running")) === 2 && (await metric(server.url, "hybridgen_generation_tokens_total")) > 2 * 40, "two requests decoding past the window");
      expect(await metric(server.url, `hybridgen_kv_bytes{tier="disk"}`)).toBeGreaterThan(0);
      expect(readdirSync(dir).length).toBeGreaterThan(0);
      stopped = server.stop("SIGTERM");
      for (const r of long) {
        const events = sseEvents(await (await r).text());
        expect(events.slice(-2)).toEqual([{ error: { message: "the server is shutting down; the request was cancelled", type: "server_error", param: null, code: null } }, "[DONE]"]);
      }
      expect(await stopped).toEqual({ code: 0, signal: null });
    } finally {
      stopped ??= server.stop("SIGKILL");
      await stopped;
    }
    expect(server.stderr()).toMatch(/^SIGTERM: not accepting requests; 2 running, 0 queued \(cancelled\), 0 s to finish$/m);
    expect(readdirSync(dir)).toEqual([]);
  });

  it("--preallocate: every slot's store is on disk once the server is ready and stays while idle; a request is generate's text with no renewal; SIGTERM removes the files, exit 0", async () => {
    requireBuiltBin();
    const r = runBin(["generate", "--threads", "1", "--json", "-p", PROMPTS[1]!, "-t", "0", "-n", "60", ...HYBRID]);
    expect(r.code, r.stderr).toBe(0);
    expect(readdirSync(dir)).toEqual([]);
    const server = await startServer(["--threads", "1", "--max-batch", "2", "--preallocate", ...HYBRID]);
    let stopped: ReturnType<typeof server.stop> | null = null;
    try {
      expect(server.stderr()).toMatch(/^preallocated 2 sequences of the whole context, each with a \d+-byte store, in \d+ ms: kept between requests$/m);
      const held = readdirSync(dir).length;
      expect(held).toBeGreaterThan(0);
      expect(await metric(server.url, "hybridgen_slot_renew_seconds_count")).toBe(2);
      const res = await fetch(`${server.url}/v1/completions`, { method: "POST", body: JSON.stringify({ prompt: PROMPTS[1], max_tokens: 60, temperature: 0 }) });
      expect(((await res.json()) as { choices: { text: string }[] }).choices[0]!.text).toBe(JSON.parse(r.stdout).text);
      expect(await metric(server.url, "hybridgen_slot_renew_seconds_count")).toBe(2);
      expect(await metric(server.url, "hybridgen_slot_reuses_total")).toBe(1);
      expect(readdirSync(dir)).toHaveLength(held);
      stopped = server.stop("SIGTERM");
      expect(await stopped).toEqual({ code: 0, signal: null });
    } finally {
      stopped ??= server.stop("SIGKILL");
      await stopped;
    }
    expect(readdirSync(dir)).toEqual([]);
  });
});
