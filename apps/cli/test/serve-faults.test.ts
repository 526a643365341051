// `hybridgen serve` under pressure and at its edges: a full queue is a 429 with OpenAI's error
// object; SIGTERM lets the running request finish, cancels the queued one (its stream says why)
// and exits 0; while the model loads every route says 503; bad flags are one-line errors.
import { describe, expect, it } from "vitest";
import { ServeMetrics } from "../src/serve/metrics.js";
import { createRoutes } from "../src/serve/routes.js";
import { requireBuiltBin, runBin } from "./helpers.js";
import { PROMPT } from "./model-fixture.js";
import { metric, sseEvents, startServer, until } from "./serve-helpers.js";

describe("hybridgen serve: a full queue, shutdown, loading, bad flags", () => {
  it("past --max-queue a request is a 429; SIGTERM finishes the running request, cancels the queued one and exits 0", async () => {
    requireBuiltBin();
    // A slow model (random weights of OPT-125m's shape: tens of tokens/s here) keeps the first request running while the others arrive.
    const server = await startServer(["--model", "preset:opt-125m", "--dummy-weights", "--context", "512", "--threads", "1", "--max-batch", "1", "--max-queue", "1", "--shutdown-grace", "120"]);
    let stopped: ReturnType<typeof server.stop> | null = null;
    try {
      const body = (n: number) => JSON.stringify({ prompt: PROMPT, max_tokens: n, temperature: 0, stream: true });
      // A stream's headers come with its first token: the responses are awaited once the metrics show where each request is.
      const running = fetch(`${server.url}/v1/completions`, { method: "POST", body: body(100) });
      await until(async () => (await metric(server.url, "hybridgen_requests_running")) === 1, "the first request to run");
      const queued = fetch(`${server.url}/v1/completions`, { method: "POST", body: body(5) });
      await until(async () => (await metric(server.url, "hybridgen_requests_queued")) === 1, "the second request to queue");
      const full = await fetch(`${server.url}/v1/completions`, { method: "POST", body: body(5) });
      expect(full.status).toBe(429);
      expect(await full.json()).toEqual({ error: { message: "the queue is full (1 requests waiting); retry later", type: "rate_limit_error", param: null, code: null } });

      stopped = server.stop("SIGTERM");
      // While the running request finishes, the server takes nothing new.
      await until(async () => (await fetch(`${server.url}/health`)).status === 503, "/health to say the server is stopping");
      expect(await (await fetch(`${server.url}/health`)).json()).toEqual({ status: "shutting down" });
      const late = await fetch(`${server.url}/v1/completions`, { method: "POST", body: body(5) });
      expect(late.status).toBe(503);
      expect(((await late.json()) as { error: { message: string } }).error.message).toBe("the server is shutting down");
      const [a, b] = await Promise.all([running.then((r) => r.text()), queued.then((r) => r.text())]);
      const first = sseEvents(a);
      expect(first[first.length - 1]).toBe("[DONE]");
      expect((first[first.length - 2] as { choices: { finish_reason: string }[] }).choices[0]!.finish_reason).toBe("length");
      expect(sseEvents(b)).toEqual([{ error: { message: "the server is shutting down; the request was cancelled", type: "server_error", param: null, code: null } }, "[DONE]"]);
      expect(await stopped).toEqual({ code: 0, signal: null });
    } finally {
      stopped ??= server.stop("SIGKILL"); // a failure above must not leave the server running
      await stopped;
    }
    expect(server.stderr()).toMatch(/^SIGTERM: not accepting requests; 1 running, 1 queued \(cancelled\), 120 s to finish$/m);
  });

  it("while the model loads, /health and every model route answer 503 with an error object", async () => {
    const routes = createRoutes({ engine: null, shuttingDown: false, metrics: new ServeMetrics(), maxBodyBytes: 1024 });
    const health = await routes(new Request("http://x/health"));
    expect(health.status).toBe(503);
    expect(await health.json()).toEqual({ status: "loading" });
    for (const [path, init] of [["/v1/models", {}], ["/v1/completions", { method: "POST", body: "{}" }], ["/v1/chat/completions", { method: "POST", body: "{}" }]] as const) {
      const r = await routes(new Request(`http://x${path}`, init));
      expect(r.status, path).toBe(503);
      expect(r.headers.get("retry-after")).toBe("1");
      expect(await r.json()).toEqual({ error: { message: "the model is loading; retry shortly", type: "server_error", param: null, code: null } });
    }
    expect((await routes(new Request("http://x/"))).headers.get("content-type")).toMatch(/^text\/html/);
  });

  it("bad flags are one-line errors before anything loads (exit 2)", () => {
    requireBuiltBin();
    const cases: [string[], string][] = [
      [["--max-batch", "0"], 'error: invalid value for --max-batch: "0" is not an integer in [1, 31]'],
      [["--port", "70000"], 'error: invalid value for --port: "70000" is not an integer in [0, 65535]'],
      [["--max-body", "lots"], 'error: invalid value for --max-body: "lots" is not a size (bytes, or a number with K, M, G or T)'],
      [["--device", "tpu"], 'error: invalid value for --device: must be one of auto, cpu, cuda or a backend module (./my-backend.ts) (got "tpu")'],
      [["--bogus"], "error: unknown option --bogus for hybridgen serve (see hybridgen serve --help)"],
      [["--kv-disk", "/tmp"], "error: --kv-placement, --kv-disk and --host-kv-budget place hybrid attention's offloaded store: add --attention hybrid"],
    ];
    for (const [args, line] of cases) {
      const r = runBin(["serve", ...args]);
      expect(r.code, args.join(" ")).toBe(2);
      expect(r.stderr).toBe(`${line}\n`);
    }
    const help = runBin(["serve", "--help"]);
    expect(help.code).toBe(0);
    expect(help.stdout).toMatch(/^Usage: hybridgen serve \[options\]/);
  });

});
