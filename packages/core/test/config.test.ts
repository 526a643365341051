import { describe, expect, it } from "vitest";
import { LlamaConfigSchema, resolveLlamaShape } from "../src/index.js";

describe("LlamaConfigSchema", () => {
  it("resolves GQA shape and transformers-5 rope_parameters", () => {
    const c = LlamaConfigSchema.parse({
      hidden_size: 256, intermediate_size: 512, num_hidden_layers: 4, num_attention_heads: 8,
      num_key_value_heads: 2, vocab_size: 1518, max_position_embeddings: 8192,
      rope_parameters: { rope_theta: 1e6, rope_type: "default" },
    });
    const s = resolveLlamaShape(c);
    expect(s.headDim).toBe(32);
    expect(s.kvHeads).toBe(2);
    expect(s.ropeTheta).toBe(1e6);
  });
  it("rejects heads not divisible by kv heads, naming the path", () => {
    const r = LlamaConfigSchema.safeParse({
      hidden_size: 256, intermediate_size: 512, num_hidden_layers: 4, num_attention_heads: 8,
      num_key_value_heads: 3, vocab_size: 10, max_position_embeddings: 16,
    });
    expect(r.success).toBe(false);
    expect(r.error?.issues[0]?.path).toEqual(["num_key_value_heads"]);
  });
});
