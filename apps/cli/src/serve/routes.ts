/**
 * The HTTP side of `hybridgen serve` (Bun.serve's fetch): routing, the body limit, request
 * checks, and turning a scheduled job into OpenAI's JSON response or SSE stream. A client that
 * goes away mid-request cancels its job (the scheduler frees the slot at its next turn).
 */
import type { ChatRenderer, Tokenizer } from "@hybridgen/core";
import type { ServeMetrics } from "./metrics.js";
import {
  BadRequest, ChatRequestSchema, CompletionRequestSchema, generationOf, parseBody, type ChatRequest, type CompletionRequest, type Generation,
} from "./openai-requests.js";
import { chunkBody, completionBody, errorResponse, newHead, sse, usageChunk, usageOf, type Endpoint } from "./openai-responses.js";
import { CHAT_PAGE } from "./page.js";
import { chatPromptText, encodePrompt, templateName } from "./prompt-text.js";
import { QueueFull, type ServeJob, type ServeScheduler } from "./scheduler.js";

/** What the routes need once the model is loaded. */
export interface LoadedEngine {
  readonly scheduler: ServeScheduler;
  readonly tokenizer: Tokenizer;
  readonly chatTemplate: ChatRenderer | null | undefined;
  readonly maxContext: number;
  readonly modelName: string;
  readonly created: number;
}

export interface ServeState {
  engine: LoadedEngine | null;
  shuttingDown: boolean;
  readonly metrics: ServeMetrics;
  readonly maxBodyBytes: number;
}

const enc = new TextEncoder();

/** The body as text, refusing more than `limit` bytes whatever Content-Length says (a chunked body has none). */
async function readBody(req: Request, limit: number): Promise<string | "too large"> {
  const declared = Number(req.headers.get("content-length") ?? "0");
  if (declared > limit) return "too large";
  if (!req.body) return "";
  const parts: Uint8Array[] = [];
  let n = 0;
  for await (const chunk of req.body as unknown as AsyncIterable<Uint8Array>) {
    n += chunk.byteLength;
    if (n > limit) return "too large";
    parts.push(chunk);
  }
  return new TextDecoder().decode(Buffer.concat(parts));
}

export function createRoutes(state: ServeState): (req: Request) => Promise<Response> {
  const count = (endpoint: string, res: Response): Response => {
    state.metrics.requests.inc(1, { endpoint, status: String(res.status) });
    return res;
  };
  return async (req) => {
    const path = new URL(req.url).pathname;
    const method = req.method;
    if (path === "/v1/chat/completions" || path === "/v1/completions") {
      const endpoint: Endpoint = path === "/v1/chat/completions" ? "chat" : "completion";
      if (method !== "POST") return count(path, errorResponse(405, `${path} takes POST`));
      return count(path, await complete(state, req, endpoint));
    }
    if (method !== "GET" && method !== "HEAD") return errorResponse(405, `${path} takes GET`);
    switch (path) {
      case "/":
        return new Response(CHAT_PAGE, { headers: { "content-type": "text/html; charset=utf-8" } });
      case "/health":
        if (state.shuttingDown) return Response.json({ status: "shutting down" }, { status: 503 });
        return state.engine ? Response.json({ status: "ok" }) : Response.json({ status: "loading" }, { status: 503 });
      case "/metrics":
        return new Response(state.metrics.render(), { headers: { "content-type": "text/plain; version=0.0.4; charset=utf-8" } });
      case "/v1/models": {
        const e = state.engine;
        if (!e) return errorResponse(503, "the model is loading; retry shortly");
        return Response.json({
          object: "list",
          data: [{ id: e.modelName, object: "model", created: e.created, owned_by: "hybridgen", chat_template: templateName(e.chatTemplate), max_model_len: e.maxContext }],
        });
      }
      default:
        return errorResponse(404, `no route ${path} (routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, /health, /metrics, /)`);
    }
  };
}

async function complete(state: ServeState, req: Request, endpoint: Endpoint): Promise<Response> {
  const arrivedMs = performance.now();
  if (state.shuttingDown) return errorResponse(503, "the server is shutting down");
  const raw = await readBody(req, state.maxBodyBytes);
  if (raw === "too large") return errorResponse(413, `the request body is larger than ${state.maxBodyBytes} bytes (--max-body)`);
  const e = state.engine;
  if (!e) return errorResponse(503, "the model is loading; retry shortly");
  let body: unknown;
  try {
    body = JSON.parse(raw);
  } catch (err) {
    return errorResponse(400, `the request body is not valid JSON (${(err as Error).message})`);
  }
  let ids: number[], gen: Generation;
  try {
    if (endpoint === "chat") {
      const r: ChatRequest = parseBody(ChatRequestSchema, body);
      gen = generationOf(r, null);
      ids = encodePrompt(e.tokenizer, chatPromptText(r.messages, e.chatTemplate));
    } else {
      const r: CompletionRequest = parseBody(CompletionRequestSchema, body);
      gen = generationOf(r, 16);
      ids = encodePrompt(e.tokenizer, { text: typeof r.prompt === "string" ? r.prompt : r.prompt[0]!, addBos: true });
    }
  } catch (err) {
    if (err instanceof BadRequest) return errorResponse(400, err.message, { param: err.param });
    return errorResponse(400, `the prompt cannot be rendered: ${(err as Error).message}`.replace(/\s*\n\s*/g, " "));
  }
  const what = endpoint === "chat" ? "messages" : "prompt";
  if (ids.length === 0) return errorResponse(400, `${what}: the prompt is empty`, { param: what });
  const maxTokens = gen.maxTokens ?? e.maxContext - ids.length;
  if (ids.length + maxTokens > e.maxContext || maxTokens < 1) {
    return errorResponse(400, `this model's context is ${e.maxContext} tokens; the prompt is ${ids.length} tokens` +
      `${gen.maxTokens === null ? " and leaves no room for an answer" : ` and max_tokens ${maxTokens} (${ids.length + maxTokens} in all)`}: shorten the prompt or lower max_tokens`,
    { param: gen.maxTokens === null ? what : "max_tokens", code: "context_length_exceeded" });
  }
  // A request the server's memory could never hold, even idle, is refused now rather than queued for good.
  const never = e.scheduler.refusal(ids.length + maxTokens);
  if (never) {
    return errorResponse(400, `this request (${ids.length} prompt tokens + max_tokens ${maxTokens}) can never be served here: ${never}; lower max_tokens or shorten the prompt`,
      { param: "max_tokens", code: "kv_memory_exceeded" });
  }
  const head = newHead(endpoint, e.modelName);
  const sampling = { temperature: gen.temperature, topP: gen.topP, topK: 0, repetitionPenalty: 1, ...(gen.seed === undefined ? {} : { seed: gen.seed }) };
  return gen.stream
    ? streamed(e.scheduler, req, endpoint, head, gen, { ids, maxTokens, sampling, stop: gen.stop, arrivedMs })
    : whole(e.scheduler, req, endpoint, head, { ids, maxTokens, sampling, stop: gen.stop, arrivedMs });
}

type JobSpec = Omit<ServeJob, "onText" | "onFinish">;

/** A failed job's error in a response: the server stopping (503) or an engine error (500). */
const failed = (error: string | undefined) => (error ? errorResponse(500, error) : errorResponse(503, "the server is shutting down; the request was cancelled"));

function whole(scheduler: ServeScheduler, req: Request, endpoint: Endpoint, head: ReturnType<typeof newHead>, spec: JobSpec): Promise<Response> | Response {
  return new Promise<Response>((resolve) => {
    try {
      const handle = scheduler.submit({
        ...spec,
        onText() {},
        onFinish(r) {
          req.signal.removeEventListener("abort", handle.cancel);
          if (r.finish === "abort") resolve(failed(r.error));
          else resolve(Response.json(completionBody(endpoint, head, r.text, r.finish, usageOf(r.promptTokens, r.completionTokens))));
        },
      });
      req.signal.addEventListener("abort", handle.cancel, { once: true });
    } catch (err) {
      if (!(err instanceof QueueFull)) throw err;
      resolve(errorResponse(scheduler.shuttingDown ? 503 : 429, err.message));
    }
  });
}

function streamed(scheduler: ServeScheduler, req: Request, endpoint: Endpoint, head: ReturnType<typeof newHead>, gen: Generation, spec: JobSpec): Response {
  let controller!: ReadableStreamDefaultController<Uint8Array>;
  let closed = false;
  let handle: { cancel(): void } | null = null;
  const stream = new ReadableStream<Uint8Array>({
    start(c) {
      controller = c;
    },
    cancel() {
      closed = true;
      handle?.cancel();
    },
  });
  // A client that went away may have closed the stream under us: nothing more to send then.
  const send = (data: object | "[DONE]") => {
    if (closed) return;
    try {
      controller.enqueue(enc.encode(sse(data)));
    } catch {
      closed = true;
    }
  };
  const cancel = () => handle?.cancel();
  try {
    handle = scheduler.submit({
      ...spec,
      onText: (text) => send(chunkBody(endpoint, head, { text }, gen.includeUsage)),
      onFinish(r) {
        req.signal.removeEventListener("abort", cancel);
        if (r.finish === "abort") {
          // The client is gone (nothing to send), or the server is stopping or failed: say so in the stream.
          if (!req.signal.aborted) send({ error: { message: r.error ?? "the server is shutting down; the request was cancelled", type: "server_error", param: null, code: null } });
        } else {
          send(chunkBody(endpoint, head, { finish: r.finish }, gen.includeUsage));
          if (gen.includeUsage) send(usageChunk(endpoint, head, usageOf(r.promptTokens, r.completionTokens)));
        }
        send("[DONE]");
        if (!closed) {
          closed = true;
          try {
            controller.close();
          } catch {
            /* already closed by the client */
          }
        }
      },
    });
  } catch (err) {
    if (!(err instanceof QueueFull)) throw err;
    return errorResponse(scheduler.shuttingDown ? 503 : 429, err.message);
  }
  req.signal.addEventListener("abort", cancel, { once: true });
  // The opening role delta goes out before the first token, as OpenAI's does.
  if (endpoint === "chat") send(chunkBody(endpoint, head, { role: true }, gen.includeUsage));
  return new Response(stream, { headers: { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache", connection: "keep-alive" } });
}
