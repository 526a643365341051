// `hybridgen serve --gpu-mem` on the CPU backend (its "device" memory capped): each
// request's KV is sized to its prompt + max_tokens and admitted while it fits the bytes left. A
// request that could never fit is a 400 naming max_tokens; two that fit only one at a time run
// one after the other; a client that disconnects gives its bytes back; the metrics show the
// budget and the bytes held.
import { describe, expect, it } from "vitest";
import { requireBuiltBin } from "./helpers.js";
import { metric, sseEvents, startServer, until } from "./serve-helpers.js";

// A slow model (random weights of OPT-125m's shape: tens of tokens/s here, 72 KiB of f32 KV a position) keeps a request running while the others arrive.
const FLAGS = ["--model", "preset:opt-125m", "--dummy-weights", "--context", "1024", "--threads", "1", "--max-batch", "4"];
const BUDGET = 40 * 2 ** 20;
const post = (url: string, body: object, signal?: AbortSignal) =>
  fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body), ...(signal ? { signal } : {}) });

describe("hybridgen serve: admission by each request's bytes under --gpu-mem", () => {
  it("refuses what can never fit (400), queues what does not fit now, and frees a request's bytes when it ends or its client goes", async () => {
    requireBuiltBin();
    // The model's own bytes under a generous cap, then a cap 40 MiB above them: a request of ~400 positions (28 MiB of KV) fits, two do not.
    const probe = await startServer([...FLAGS, "--gpu-mem", "4G"]);
    const used = 4 * 2 ** 30 - (await metric(probe.url, "hybridgen_device_bytes_budget"));
    expect(await probe.stop("SIGTERM")).toEqual({ code: 0, signal: null });
    const server = await startServer([...FLAGS, "--gpu-mem", String(used + BUDGET)]);
    try {
      const { url } = server;
      expect(await metric(url, "hybridgen_device_bytes_budget")).toBe(BUDGET);
      const never = await post(url, { prompt: "Once upon a time", max_tokens: 700, temperature: 0 });
      expect(never.status).toBe(400);
      const body = (await never.json()) as { error: { message: string; param: string; code: string; type: string } };
      expect(body.error).toMatchObject({ param: "max_tokens", code: "kv_memory_exceeded", type: "invalid_request_error" });
      expect(body.error.message).toMatch(/^this request \(\d+ prompt tokens \+ max_tokens 700\) can never be served here: its sequence needs [\d.]+ MiB of device memory, and 40\.0 MiB is left for requests beside the model; lower max_tokens or shorten the prompt$/);

      // Slot 0 (the model's own sequence, sized to the whole context at load) takes the first request
      // for no new bytes; the second holds its 28 MiB; the third (14 MiB) waits for them until the second's client goes.
      const clients = [new AbortController(), new AbortController()];
      const streams = ["Once upon a time", "The little dog"].map((prompt, i) => post(url, { prompt, max_tokens: 400, temperature: 0, stream: true }, clients[i]!.signal));
      await until(async () => (await metric(url, "hybridgen_device_bytes_reserved")) > 27 * 2 ** 20, "the second request to hold its bytes");
      const third = post(url, { prompt: "Lily and Tom", max_tokens: 200, temperature: 0 });
      await until(async () => (await metric(url, "hybridgen_requests_queued")) === 1, "the third request to wait for bytes");
      expect(await metric(url, "hybridgen_requests_running")).toBe(2);
      clients[1]!.abort();
      await streams[1]!.then((r) => r.body?.cancel()).catch(() => {});
      const done = (await (await third).json()) as { choices: { text: string; finish_reason: string }[]; usage: { completion_tokens: number } };
      expect(done.usage.completion_tokens).toBeGreaterThan(0);
      clients[0]!.abort();
      await streams[0]!.then((r) => r.body?.cancel()).catch(() => {});
      await until(async () => (await metric(url, "hybridgen_requests_running")) === 0, "every request to leave");
      expect(await metric(url, "hybridgen_device_bytes_reserved")).toBe(0);
      expect(await metric(url, 'hybridgen_requests_finished_total{reason="cancelled"}')).toBe(2);
      // A request within the budget after all that: served.
      const again = await post(url, { prompt: "Lily", max_tokens: 4, temperature: 0, stream: true });
      expect(sseEvents(await again.text()).at(-1)).toBe("[DONE]");
    } finally {
      expect(await server.stop("SIGTERM")).toEqual({ code: 0, signal: null });
    }
  });
});
