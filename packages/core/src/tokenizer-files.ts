/**
 * The tokenizer of a model directory: tokenizer.json through @huggingface/tokenizers
 * (HfTokenizer), except SentencePiece-style BPE files (Llama-2, llama2.c, TinyLlama), which
 * keep the hand-written BpeTokenizer whose ids are proven on stories15M; plus the chat
 * template from tokenizer_config.json or chat_template.jinja.
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { loadTokenizer } from "./bpe-tokenizer.js";
import { ChatTemplate, chatTemplateSource } from "./chat-template.js";
import { fail } from "@hybridgen/spec";
import { readJsonFile } from "./json-file.js";
import { HfTokenizer, tokenText } from "./hf-tokenizer.js";
import type { Tokenizer } from "./tokenizer.js";

function has(component: unknown, type: string): boolean {
  if (component === null || typeof component !== "object") return false;
  const c = component as Record<string, unknown>;
  if (c.type === type) return true;
  const parts = c.decoders ?? c.pretokenizers ?? c.normalizers;
  return Array.isArray(parts) && parts.some((p) => has(p, type));
}

/** SentencePiece-style BPE: "▁" for spaces and byte fallback rather than GPT-2's byte table. */
export function isSentencePieceBpe(json: unknown): boolean {
  if (json === null || typeof json !== "object") return false;
  const j = json as Record<string, unknown>;
  const model = j.model as Record<string, unknown> | undefined;
  if (model?.type !== "BPE" || has(j.decoder, "ByteLevel") || has(j.pre_tokenizer, "ByteLevel")) return false;
  return (
    model.byte_fallback === true || has(j.decoder, "ByteFallback") || has(j.decoder, "Metaspace") || has(j.pre_tokenizer, "Metaspace") ||
    JSON.stringify(j.normalizer ?? null).includes("▁") // Llama-2's Prepend/Replace "▁"
  );
}

export interface TokenizerFiles {
  readonly tokenizer: Tokenizer;
  readonly chatTemplate: ChatTemplate | null;
  /** EOS named by tokenizer_config.json (added to the model's stop ids). */
  readonly eosId: number | null;
}

/**
 * Loads `dir`'s tokenizer. `bosId`/`eosId` (from config.json / generation_config.json) are
 * used by the SentencePiece path, whose tokenizer.json does not say whether to add BOS.
 */
export function loadTokenizerFiles(dir: string, ids: { bosId?: number | null; eosId?: number | null } = {}): TokenizerFiles {
  const tokPath = join(dir, "tokenizer.json");
  if (!existsSync(tokPath)) fail(`${dir}: no tokenizer.json`);
  const cfgPath = join(dir, "tokenizer_config.json");
  const cfgJson = existsSync(cfgPath) ? readJsonFile(cfgPath, "tokenizer_config.json") : {};
  const cfg = (cfgJson !== null && typeof cfgJson === "object" && !Array.isArray(cfgJson) ? cfgJson : {}) as Record<string, unknown>;
  const json = readJsonFile(tokPath, "tokenizer.json");

  let tokenizer: Tokenizer;
  let specials: Record<string, string> = {};
  let eosId: number | null = null;
  if (isSentencePieceBpe(json)) {
    tokenizer = loadTokenizer(tokPath, { bosId: ids.bosId ?? undefined, eosId: ids.eosId ?? undefined });
    for (const key of ["bos_token", "eos_token", "unk_token", "pad_token"]) {
      const text = tokenText(cfg[key]);
      if (text !== null) specials[key] = text;
    }
  } else {
    const hf = new HfTokenizer(json, cfg, { src: tokPath });
    tokenizer = hf;
    specials = { ...hf.specialTokens };
    eosId = hf.eosId;
  }

  const jinjaPath = join(dir, "chat_template.jinja");
  let source = chatTemplateSource(cfg.chat_template, cfgPath);
  if (source === null && existsSync(jinjaPath)) source = readFileSync(jinjaPath, "utf8");
  const chatTemplate = source === null ? null : new ChatTemplate(source, specials, source === cfg.chat_template ? cfgPath : jinjaPath);
  return { tokenizer, chatTemplate, eosId };
}
