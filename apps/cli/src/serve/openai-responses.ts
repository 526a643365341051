/**
 * OpenAI's response objects and SSE chunks, field for field: `chat.completion` and
 * `chat.completion.chunk` (the first delta carries the role, the last an empty delta with the
 * finish_reason, then a usage chunk with no choices when stream_options.include_usage), and
 * `text_completion` for both forms of /v1/completions; errors as `{ error: { message, type,
 * param, code } }`.
 */
import type { FinishReason } from "@hybridgen/core";

export type Endpoint = "chat" | "completion";

export interface Usage {
  readonly prompt_tokens: number;
  readonly completion_tokens: number;
  readonly total_tokens: number;
}

export const usageOf = (prompt: number, completion: number): Usage => ({ prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion });

/** The engine's finish reason in OpenAI's words: EOS and a stop string are "stop", a token budget or a full context "length". */
export const openAiFinish = (r: FinishReason): "stop" | "length" => (r === "length" || r === "context" ? "length" : "stop");

/** Identity of one response: every chunk of a stream repeats it. */
export interface ResponseHead {
  readonly id: string;
  readonly created: number;
  readonly model: string;
}

let serial = 0;
export function newHead(endpoint: Endpoint, model: string): ResponseHead {
  const id = `${endpoint === "chat" ? "chatcmpl" : "cmpl"}-${Date.now().toString(36)}${(serial++).toString(36).padStart(4, "0")}`;
  return { id, created: Math.floor(Date.now() / 1000), model };
}

/** The whole response of a request with stream false. */
export function completionBody(endpoint: Endpoint, h: ResponseHead, text: string, finish: FinishReason, usage: Usage): object {
  const finish_reason = openAiFinish(finish);
  if (endpoint === "chat") {
    return {
      id: h.id, object: "chat.completion", created: h.created, model: h.model, system_fingerprint: null,
      choices: [{ index: 0, message: { role: "assistant", content: text, refusal: null }, logprobs: null, finish_reason }],
      usage,
    };
  }
  return { id: h.id, object: "text_completion", created: h.created, model: h.model, system_fingerprint: null, choices: [{ index: 0, text, logprobs: null, finish_reason }], usage };
}

/**
 * One SSE chunk: `text` (a chat delta's content; null for the opening role delta and the closing
 * empty one) with `finish` set on the last; `usage` is null in every chunk when the client asked
 * for usage (OpenAI's include_usage form), absent otherwise.
 */
export function chunkBody(endpoint: Endpoint, h: ResponseHead, part: { text?: string; role?: boolean; finish?: FinishReason }, includeUsage: boolean): object {
  const finish_reason = part.finish ? openAiFinish(part.finish) : null;
  const tail = includeUsage ? { usage: null } : {};
  if (endpoint === "chat") {
    const delta = part.role ? { role: "assistant", content: "" } : part.text === undefined ? {} : { content: part.text };
    return { id: h.id, object: "chat.completion.chunk", created: h.created, model: h.model, system_fingerprint: null, choices: [{ index: 0, delta, logprobs: null, finish_reason }], ...tail };
  }
  return { id: h.id, object: "text_completion", created: h.created, model: h.model, system_fingerprint: null, choices: [{ index: 0, text: part.text ?? "", logprobs: null, finish_reason }], ...tail };
}

/** The usage chunk after the last choice chunk (stream_options.include_usage). */
export function usageChunk(endpoint: Endpoint, h: ResponseHead, usage: Usage): object {
  return { id: h.id, object: endpoint === "chat" ? "chat.completion.chunk" : "text_completion", created: h.created, model: h.model, system_fingerprint: null, choices: [], usage };
}

export const sse = (data: object | "[DONE]"): string => `data: ${data === "[DONE]" ? data : JSON.stringify(data)}\n\n`;

/** The error types OpenAI uses for each status this server returns. */
const ERROR_TYPE: Record<number, string> = {
  400: "invalid_request_error", 404: "invalid_request_error", 405: "invalid_request_error", 413: "invalid_request_error",
  429: "rate_limit_error", 500: "server_error", 503: "server_error",
};

export function errorResponse(status: number, message: string, o: { param?: string | null; code?: string | null } = {}): Response {
  const body = { error: { message, type: ERROR_TYPE[status] ?? "server_error", param: o.param ?? null, code: o.code ?? null } };
  return Response.json(body, { status, headers: status === 503 ? { "retry-after": "1" } : {} });
}
