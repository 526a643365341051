/**
 * OPTForCausalLM's config.json (facebook/opt-*): the keys the engine reads, the resolved
 * shape, and the tensors a checkpoint holds. The forward pass is opt.ts.
 */
import { z } from "zod";
import { CONFIG_SIZE_LIMITS, configSize, type ModelShape } from "./config.js";
import { parseConfigWith } from "./config-parse.js";
import { fail } from "@hybridgen/spec";
import type { TensorSpec } from "./tensor-spec.js";

/** OPT reads position p from row p + 2 of its learned position table (a fairseq legacy). */
export const OPT_POSITION_OFFSET = 2;

export const OptConfigSchema = z
  .object({
    architectures: z.array(z.string()).optional(),
    model_type: z.string().optional(),
    vocab_size: configSize(CONFIG_SIZE_LIMITS.vocab),
    hidden_size: configSize(CONFIG_SIZE_LIMITS.hidden),
    num_hidden_layers: configSize(CONFIG_SIZE_LIMITS.layers),
    ffn_dim: configSize(CONFIG_SIZE_LIMITS.intermediate),
    num_attention_heads: configSize(CONFIG_SIZE_LIMITS.heads),
    max_position_embeddings: configSize(CONFIG_SIZE_LIMITS.positions),
    /** false (OPT-350m): LayerNorm after each residual add, and no final LayerNorm. */
    do_layer_norm_before: z.boolean().default(true),
    _remove_final_layer_norm: z.boolean().default(false),
    /** Embedding width; ≠ hidden_size means project_in / project_out (OPT-350m: 512 vs 1024). */
    word_embed_proj_dim: configSize(CONFIG_SIZE_LIMITS.hidden).optional(),
    activation_function: z.enum(["relu", "gelu"]).default("relu"),
    enable_bias: z.literal(true).default(true),
    layer_norm_elementwise_affine: z.literal(true).default(true),
    tie_word_embeddings: z.boolean().default(true),
    bos_token_id: z.number().int().nullable().optional(),
    eos_token_id: z.union([z.number().int(), z.array(z.number().int())]).nullable().optional(),
    torch_dtype: z.string().optional(),
    dtype: z.string().optional(),
  })
  .passthrough();

export type OptConfigJson = z.output<typeof OptConfigSchema>;

export function parseOptConfig(json: unknown, src: string): { config: OptConfigJson; shape: ModelShape } {
  const c = parseConfigWith(OptConfigSchema, json, src);
  if (c.hidden_size % c.num_attention_heads !== 0) {
    fail(`${src}: hidden_size: ${c.hidden_size} is not a multiple of num_attention_heads ${c.num_attention_heads} (got ${c.hidden_size})`);
  }
  const eos = c.eos_token_id;
  const shape: ModelShape = {
    architecture: "opt",
    hiddenSize: c.hidden_size,
    intermediateSize: c.ffn_dim,
    layers: c.num_hidden_layers,
    heads: c.num_attention_heads,
    kvHeads: c.num_attention_heads,
    headDim: c.hidden_size / c.num_attention_heads,
    vocabSize: c.vocab_size,
    maxPositions: c.max_position_embeddings,
    normEps: 1e-5,
    ropeTheta: 0,
    tieEmbeddings: c.tie_word_embeddings,
    bosTokenId: c.bos_token_id ?? null,
    eosTokenIds: eos == null ? [] : Array.isArray(eos) ? eos : [eos],
  };
  return { config: c, shape };
}

export const optEmbedDim = (c: OptConfigJson): number => c.word_embed_proj_dim ?? c.hidden_size;
export const optHasFinalNorm = (c: OptConfigJson): boolean => c.do_layer_norm_before && !c._remove_final_layer_norm;

export function optTensorSpecs(c: OptConfigJson): TensorSpec[] {
  const dim = c.hidden_size, ffn = c.ffn_dim, emb = optEmbedDim(c), V = c.vocab_size;
  const d = "model.decoder.";
  const specs: TensorSpec[] = [
    { name: `${d}embed_tokens.weight`, shape: [V, emb], role: "embedding" },
    { name: `${d}embed_positions.weight`, shape: [c.max_position_embeddings + OPT_POSITION_OFFSET, dim], role: "position" },
  ];
  if (emb !== dim) {
    specs.push({ name: `${d}project_in.weight`, shape: [dim, emb], role: "matrix" });
    specs.push({ name: `${d}project_out.weight`, shape: [emb, dim], role: "matrix" });
  }
  for (let l = 0; l < c.num_hidden_layers; l++) {
    const p = `${d}layers.${l}.`;
    const add = (name: string, shape: number[], role: TensorSpec["role"]) => specs.push({ name: p + name, shape, role });
    for (const proj of ["q_proj", "k_proj", "v_proj", "out_proj"]) {
      add(`self_attn.${proj}.weight`, [dim, dim], "matrix");
      add(`self_attn.${proj}.bias`, [dim], "bias");
    }
    add("self_attn_layer_norm.weight", [dim], "norm");
    add("self_attn_layer_norm.bias", [dim], "norm-bias");
    add("fc1.weight", [ffn, dim], "matrix");
    add("fc1.bias", [ffn], "bias");
    add("fc2.weight", [dim, ffn], "matrix");
    add("fc2.bias", [dim], "bias");
    add("final_layer_norm.weight", [dim], "norm");
    add("final_layer_norm.bias", [dim], "norm-bias");
  }
  if (optHasFinalNorm(c)) {
    specs.push({ name: `${d}final_layer_norm.weight`, shape: [dim], role: "norm" });
    specs.push({ name: `${d}final_layer_norm.bias`, shape: [dim], role: "norm-bias" });
  }
  if (!c.tie_word_embeddings) specs.push({ name: "lm_head.weight", shape: [V, emb], role: "matrix" });
  return specs;
}
