// `hybridgen serve` on a tiny generated Llama with a chat template: /v1/models says the model's
// template is used, and a chat request is rendered through it (system and user messages, the
// generation prompt, no BOS added) — its sampled text (seed, temperature 1) and prompt tokens are
// those of `hybridgen generate --chat --system` with the same seed.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { afterAll, describe, expect, it } from "vitest";
import { requireBuiltBin, runBin } from "./helpers.js";
import { stories15M } from "./model-fixture.js";
import { startServer } from "./serve-helpers.js";
import { writeTinyCheckpoint } from "./tiny-checkpoint.js";

const tmp = mkdtempSync(join(tmpdir(), "hg-serve-tpl-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
const TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}";
const LLAMA = {
  architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 64, intermediate_size: 160, num_hidden_layers: 2, num_attention_heads: 4,
  num_key_value_heads: 2, vocab_size: 32000, max_position_embeddings: 128, rms_norm_eps: 1e-5, rope_theta: 10000, tie_word_embeddings: false,
  bos_token_id: 1, eos_token_id: 2,
};

describe("hybridgen serve on a model with a chat template", () => {
  it("renders chat messages through the template: generate --chat's text and prompt tokens", async () => {
    requireBuiltBin();
    const dir = writeTinyCheckpoint(join(tmp, "tiny-chat"), LLAMA, 101, join(await stories15M(), "tokenizer.json"), {
      "tokenizer_config.json": JSON.stringify({ chat_template: TEMPLATE }),
    });
    const r = runBin(["generate", "--threads", "1", "--model", dir, "--chat", "--system", "Be brief.", "-p", "Tell me a story", "-t", "1", "--top-p", "1", "--seed", "5", "-n", "12", "--json"]);
    expect(r.code, r.stderr).toBe(0);
    const want = JSON.parse(r.stdout);
    const server = await startServer(["--threads", "1", "--model", dir, "--served-model-name", "tiny-chat"]);
    try {
      const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused", maxRetries: 0 });
      expect((await client.models.list()).data[0]).toMatchObject({ id: "tiny-chat", chat_template: "model", max_model_len: 128 });
      const c = await client.chat.completions.create({
        model: "tiny-chat", max_tokens: 12, temperature: 1, top_p: 1, seed: 5,
        messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Tell me a story" }],
      });
      expect(c.model).toBe("tiny-chat");
      expect(c.choices[0]!.message.content).toBe(want.text);
      expect(c.usage).toMatchObject({ prompt_tokens: want.promptTokens, completion_tokens: want.generatedTokens });
    } finally {
      expect(await server.stop()).toEqual({ code: 0, signal: null });
    }
  });
});
