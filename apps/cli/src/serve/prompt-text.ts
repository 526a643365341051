/**
 * The prompt a request asks for, as text and token ids: /v1/completions' prompt as `hybridgen
 * generate` encodes it (BOS first); chat messages through the model's chat template (which
 * carries its own special tokens, as `generate --chat`), or, for a model without one
 * (stories15M), the plain fallback: the messages' contents joined by newlines, encoded as a
 * completion prompt.
 */
import type { ChatRenderer, Tokenizer } from "@hybridgen/core";
import { messageText, type ChatMessageIn } from "./openai-requests.js";

/** Which template /v1/models reports and chat requests go through. */
export const templateName = (t: ChatRenderer | null | undefined): "model" | "plain" => (t ? "model" : "plain");

export function chatPromptText(messages: readonly ChatMessageIn[], template: ChatRenderer | null | undefined): { text: string; addBos: boolean } {
  if (!template) return { text: messages.map(messageText).join("\n"), addBos: true };
  const rendered = template.render(
    messages.map((m) => ({ role: m.role === "developer" ? "system" : m.role, content: messageText(m) })),
    { addGenerationPrompt: true },
  );
  return { text: rendered, addBos: false };
}

export function encodePrompt(tokenizer: Tokenizer, p: { text: string; addBos: boolean }): number[] {
  return tokenizer.encode(p.text, { addBos: p.addBos });
}
