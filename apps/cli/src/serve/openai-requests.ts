/**
 * The request bodies of `POST /v1/chat/completions` and `POST /v1/completions`, checked field by
 * field: a bad one is a 400 whose one-line message names the field (`max_tokens: must be at least
 * 1`); fields this server does not use are ignored, as OpenAI-compatible servers do.
 */
import { z } from "zod";

const Stop = z.union([z.string(), z.array(z.string()).max(16, "at most 16 stop strings")]).nullish();

const Common = {
  model: z.string().nullish(),
  stream: z.boolean().nullish(),
  stream_options: z.object({ include_usage: z.boolean().nullish() }).nullish(),
  /** Absent: /v1/completions 16 (OpenAI's default), chat the rest of the context. */
  max_tokens: z.number().int("must be an integer").min(1, "must be at least 1").nullish(),
  /** Newer clients send this name for chat. */
  max_completion_tokens: z.number().int("must be an integer").min(1, "must be at least 1").nullish(),
  temperature: z.number().min(0, "must be ≥ 0").max(2, "must be ≤ 2").nullish(),
  top_p: z.number().gt(0, "must be > 0").max(1, "must be ≤ 1").nullish(),
  seed: z.number().int("must be an integer").min(0, "must be ≥ 0").max(0xffffffff, "must be < 2^32").nullish(),
  stop: Stop,
  n: z.number().int("must be an integer").min(1, "must be 1").max(1, "must be 1 (this server returns one choice)").nullish(),
};

/** A message's content: a string, or OpenAI's list of text parts. */
const Content = z.union([
  z.string(),
  z.array(z.object({ type: z.literal("text", { error: "only text parts are supported" }), text: z.string() })),
]);

export const ChatRequestSchema = z.object({
  ...Common,
  messages: z.array(z.object({
    role: z.enum(["system", "user", "assistant", "developer"], { error: "must be system, user, assistant or developer" }),
    content: Content.nullish(),
  })).min(1, "must hold at least one message"),
});

export const CompletionRequestSchema = z.object({
  ...Common,
  prompt: z.union([z.string().min(1, "must not be empty"), z.array(z.string().min(1, "must not be empty")).length(1, "must be one string (this server returns one choice)")]),
});

export type ChatRequest = z.infer<typeof ChatRequestSchema>;
export type CompletionRequest = z.infer<typeof CompletionRequestSchema>;
export type ChatMessageIn = ChatRequest["messages"][number];

/** What both endpoints ask of the engine once the prompt is text. */
export interface Generation {
  readonly maxTokens: number | null;
  readonly temperature: number;
  readonly topP: number;
  readonly seed: number | undefined;
  readonly stop: string[];
  readonly stream: boolean;
  readonly includeUsage: boolean;
}

/** A field's name as the client wrote it, from a zod path: `messages[0].role`. */
function fieldOf(path: readonly PropertyKey[]): string {
  return path.reduce<string>((s, p) => (typeof p === "number" ? `${s}[${p}]` : s ? `${s}.${String(p)}` : String(p)), "");
}

/** What a field of several accepted shapes must be (zod says only "Invalid input"). */
const UNION_WANT: Record<string, string> = {
  prompt: "must be a string (or an array of one string)",
  stop: "must be a string or an array of strings",
  content: "must be a string or an array of text parts",
};

/** zod's type names in words. */
const TYPE_NAME: Record<string, string> = {
  int: "an integer", number: "a number", boolean: "a boolean", string: "a string", array: "an array", object: "an object",
};

/** A 400 whose message names the field. */
export class BadRequest extends Error {
  constructor(message: string, readonly param: string | null = null) {
    super(message);
  }
}

/** The value at a zod path in the body (undefined when absent). */
function valueAt(body: unknown, path: readonly PropertyKey[]): unknown {
  let v = body;
  for (const p of path) v = typeof v === "object" && v !== null ? (v as Record<PropertyKey, unknown>)[p] : undefined;
  return v;
}

/** Parses `body` with `schema`; the first issue becomes a one-line BadRequest naming its field. */
export function parseBody<T>(schema: z.ZodType<T>, body: unknown): T {
  if (typeof body !== "object" || body === null || Array.isArray(body)) throw new BadRequest("the request body must be a JSON object");
  const r = schema.safeParse(body);
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  const field = fieldOf(issue.path);
  const last = issue.path[issue.path.length - 1];
  const message = issue.code === "invalid_union" && typeof last === "string" && UNION_WANT[last]
    ? UNION_WANT[last]
    : issue.code === "invalid_type" ? (valueAt(body, issue.path) === undefined ? "is required" : `must be ${TYPE_NAME[issue.expected] ?? issue.expected}`) : issue.message;
  throw new BadRequest(`${field || "body"}: ${message}`, field || null);
}

/** Options common to both endpoints, with OpenAI's defaults (temperature 1, top_p 1). */
export function generationOf(r: ChatRequest | CompletionRequest, defaultMaxTokens: number | null): Generation {
  const maxCompletion = "max_completion_tokens" in r ? r.max_completion_tokens : undefined;
  return {
    maxTokens: r.max_tokens ?? maxCompletion ?? defaultMaxTokens,
    temperature: r.temperature ?? 1,
    topP: r.top_p ?? 1,
    seed: r.seed ?? undefined,
    stop: r.stop == null ? [] : (typeof r.stop === "string" ? [r.stop] : r.stop).filter((s) => s.length > 0),
    stream: r.stream === true,
    includeUsage: r.stream_options?.include_usage === true,
  };
}

/** A message's text (a list of text parts joined). */
export function messageText(m: ChatMessageIn): string {
  if (m.content == null) return "";
  return typeof m.content === "string" ? m.content : m.content.map((p) => p.text).join("");
}
