/**
 * The Llama family's config side: which tensors a LlamaForCausalLM checkpoint holds. The
 * forward pass is llama.ts; Qwen2 (qwen2.ts) reuses both with q/k/v biases.
 */
import type { LlamaConfigJson, ModelShape } from "./config.js";
import type { TensorSpec } from "./tensor-spec.js";

export interface LlamaBiases {
  readonly qkv: boolean;
  readonly o: boolean;
  readonly mlp: boolean;
}

/** Biases of a Llama config: attention_bias puts them on q, k, v and o; mlp_bias on the MLP. */
export function llamaBiases(c: LlamaConfigJson): LlamaBiases {
  return { qkv: c.attention_bias === true, o: c.attention_bias === true, mlp: c.mlp_bias === true };
}

export function llamaTensorSpecs(s: ModelShape, biases: LlamaBiases): TensorSpec[] {
  const dim = s.hiddenSize, inter = s.intermediateSize, q = s.heads * s.headDim, kv = s.kvHeads * s.headDim;
  const specs: TensorSpec[] = [{ name: "model.embed_tokens.weight", shape: [s.vocabSize, dim], role: "embedding" }];
  for (let l = 0; l < s.layers; l++) {
    const p = `model.layers.${l}.`;
    const add = (name: string, shape: number[], role: TensorSpec["role"]) => specs.push({ name: p + name, shape, role });
    add("input_layernorm.weight", [dim], "norm");
    add("self_attn.q_proj.weight", [q, dim], "matrix");
    add("self_attn.k_proj.weight", [kv, dim], "matrix");
    add("self_attn.v_proj.weight", [kv, dim], "matrix");
    if (biases.qkv) {
      add("self_attn.q_proj.bias", [q], "bias");
      add("self_attn.k_proj.bias", [kv], "bias");
      add("self_attn.v_proj.bias", [kv], "bias");
    }
    add("self_attn.o_proj.weight", [dim, q], "matrix");
    if (biases.o) add("self_attn.o_proj.bias", [dim], "bias");
    add("post_attention_layernorm.weight", [dim], "norm");
    add("mlp.gate_proj.weight", [inter, dim], "matrix");
    add("mlp.up_proj.weight", [inter, dim], "matrix");
    add("mlp.down_proj.weight", [dim, inter], "matrix");
    if (biases.mlp) {
      add("mlp.gate_proj.bias", [inter], "bias");
      add("mlp.up_proj.bias", [inter], "bias");
      add("mlp.down_proj.bias", [dim], "bias");
    }
  }
  specs.push({ name: "model.norm.weight", shape: [dim], role: "norm" });
  if (!s.tieEmbeddings) specs.push({ name: "lm_head.weight", shape: [s.vocabSize, dim], role: "matrix" });
  return specs;
}
