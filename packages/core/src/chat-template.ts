/**
 * Chat templates from tokenizer_config.json (or chat_template.jinja), rendered with
 * @huggingface/jinja as transformers' apply_chat_template does: `messages`,
 * `add_generation_prompt` and the special tokens (bos_token, eos_token, …) are in scope.
 */
import { Template } from "@huggingface/jinja";
import { z } from "zod";
import { fail } from "@hybridgen/spec";

export const ChatMessageSchema = z.object({
  role: z.enum(["system", "user", "assistant"]),
  content: z.string(),
});
export type ChatMessage = z.infer<typeof ChatMessageSchema>;

/** What a model's chat template offers (ChatTemplate implements it). */
export interface ChatRenderer {
  readonly source: string;
  render(messages: readonly ChatMessage[], options?: { addGenerationPrompt?: boolean }): string;
}

export class ChatTemplate implements ChatRenderer {
  private readonly template: Template;

  constructor(
    readonly source: string,
    private readonly specialTokens: Readonly<Record<string, string>> = {},
    private readonly src = "chat template",
  ) {
    try {
      this.template = new Template(source);
    } catch (e) {
      fail(`${src}: the chat template does not parse (${(e as Error).message.split("\n")[0]})`);
    }
  }

  /** The prompt text for `messages`, ending where the assistant's reply starts. */
  render(messages: readonly ChatMessage[], options: { addGenerationPrompt?: boolean } = {}): string {
    const parsed = z.array(ChatMessageSchema).min(1, "at least one message").safeParse(messages);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      fail(`chat messages: ${issue.path.join(".") || "(root)"}: ${issue.message}`);
    }
    try {
      return this.template.render({
        ...this.specialTokens,
        messages: parsed.data,
        add_generation_prompt: options.addGenerationPrompt ?? true,
      });
    } catch (e) {
      fail(`${this.src}: rendering the chat template failed (${(e as Error).message.split("\n")[0]})`);
    }
  }
}

/**
 * The template of a tokenizer_config.json value: a string, or a list of {name, template}
 * (the one named "default" is used).
 */
export function chatTemplateSource(value: unknown, src: string): string | null {
  if (value === undefined || value === null) return null;
  if (typeof value === "string") return value;
  if (Array.isArray(value)) {
    const named = value.find((t) => t && typeof t === "object" && (t as { name?: unknown }).name === "default") as { template?: unknown } | undefined;
    if (named && typeof named.template === "string") return named.template;
  }
  fail(`${src}: chat_template is neither a string nor a list with a "default" template`);
}
