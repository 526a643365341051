"""Recall-4l's word-level vocabulary, the trained models' shapes and the files beside a Llama's weights (config, tokenizer), shared by the training scripts.

    python3 apps/bench/train/llama_files.py NAME DIR   # writes NAME's config and tokenizer files into DIR (beside weights a device run returned)
"""
import json, os, sys

VOCAB = ["<unk>", "<s>", "</s>", "=", "?", "."] + [f"f{i}" for i in range(1000)] + [f"k{i}" for i in range(256)] + [f"v{i}" for i in range(256)]
EQ, ASK, DOT = 3, 4, 5
F0, K0, V0 = 6, 1006, 1262

# name: (layers, hidden, heads, kv heads, intermediate)
SHAPES = {
    "ruler-8l": (8, 256, 8, 8, 768),     # 8 layers, multi-head (a KV head per query head)
    "ruler-12l": (12, 256, 8, 4, 768),   # 12 layers, 4 KV heads of 2 query heads each
    "vt-8l": (8, 256, 8, 4, 768),        # 8 layers, 4 KV heads, taught the vartrack mix's walks
    "tiny": (2, 64, 4, 2, 128),
}


def write_meta(shape, out, rope_theta=1e6, dtype="bfloat16"):
    """config.json, generation_config.json and the tokenizer files of a model of `shape` (the weights' neighbours)."""
    layers, d, h, kv, inter = shape
    os.makedirs(out, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": d, "intermediate_size": inter,
        "num_hidden_layers": layers, "num_attention_heads": h, "num_key_value_heads": kv, "head_dim": d // h,
        "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": rope_theta,
        "vocab_size": len(VOCAB), "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": dtype,
    }
    json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
    json.dump({"bos_token_id": 1, "eos_token_id": 2}, open(os.path.join(out, "generation_config.json"), "w"))
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True} for i, t in enumerate(VOCAB[:3])],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 0}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": None, "model": {"type": "WordLevel", "vocab": {t: i for i, t in enumerate(VOCAB)}, "unk_token": "<unk>"},
    }
    json.dump(tok, open(os.path.join(out, "tokenizer.json"), "w"))
    json.dump({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True, "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 32768},
              open(os.path.join(out, "tokenizer_config.json"), "w"))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in SHAPES:
        sys.exit(f"usage: llama_files.py NAME DIR (NAME one of {', '.join(SHAPES)})")
    write_meta(SHAPES[sys.argv[1]], sys.argv[2])
