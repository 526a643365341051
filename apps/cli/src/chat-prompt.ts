import { HybridgenError, type ChatMessage, type ModelFiles } from "@hybridgen/core";

/** The prompt text for `--chat`: the user's text (and `--system`) through the model's chat template. */
export function renderChat(files: ModelFiles, user: string, system: string | undefined): string {
  if (!files.chatTemplate) {
    throw new HybridgenError(`${files.dir} has no chat template (tokenizer_config.json chat_template or chat_template.jinja): drop --chat`, "ECHAT");
  }
  const messages: ChatMessage[] = [...(system === undefined ? [] : [{ role: "system" as const, content: system }]), { role: "user", content: user }];
  return files.chatTemplate.render(messages, { addGenerationPrompt: true });
}
