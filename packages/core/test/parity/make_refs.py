"""Reference outputs for the parity tests, from Hugging Face transformers.

Reads the checkpoints written by make-checkpoints.ts (config.json, model.safetensors,
prompt.json per case) and the tokenizer inputs, and writes:

  refs.json            per case: full-sequence logits of the 64-token prompt, then 16
                       greedy decode steps (token and logits of each), computed in float64
  tokenizer-refs.json  ids from the Rust `tokenizers` library and chat prompts rendered by
                       transformers' apply_chat_template

Usage: python3 make_refs.py <checkpoint-dir> <out-dir>
Logits are stored as base64 little-endian float32 (relative precision 6e-8).
"""
import base64, json, os, sys, time

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
torch.manual_seed(0)


def b64(t):
    return base64.b64encode(np.ascontiguousarray(t.detach().to(torch.float32).cpu().numpy()).astype("<f4").tobytes()).decode()


refs = {"transformers": transformers.__version__, "torch": torch.__version__, "cases": {}}
models = os.path.join(src, "models")
for name in sorted(os.listdir(models)):
    d = os.path.join(models, name)
    t0 = time.time()
    prompt = json.load(open(os.path.join(d, "prompt.json")))
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64, attn_implementation="eager")
    model.eval()
    ids = torch.tensor([prompt["ids"]], dtype=torch.long)
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=True)
        prefill = full.logits[0]  # [64, vocab]
        past = full.past_key_values
        nxt = int(prefill[-1].argmax())
        tokens, steps = [], []
        for _ in range(prompt["decode_steps"]):
            tokens.append(nxt)
            o = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            past = o.past_key_values
            steps.append(o.logits[0, -1])
            nxt = int(o.logits[0, -1].argmax())
        # The same 80 tokens without a cache: shows how far HF's own two paths differ.
        seq = torch.tensor([prompt["ids"] + tokens], dtype=torch.long)
        nocache = model(input_ids=seq, use_cache=False).logits[0, 64:]
        # And HF in float32, for scale.
        m32 = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        f32 = m32(input_ids=ids).logits[0].to(torch.float64)
    dec = torch.stack(steps)
    rel = lambda a, b: float(((a - b).abs().amax(dim=-1) / b.abs().amax(dim=-1)).max())
    refs["cases"][name] = {
        "ids": prompt["ids"],
        "vocab": int(prefill.shape[-1]),
        "prefill_logits": b64(prefill),
        "decode_tokens": tokens,
        "decode_logits": b64(dec),
        "hf_cache_vs_nocache_rel": rel(nocache, dec),
        "hf_f32_vs_f64_rel": rel(f32, prefill),
        "rope": str(getattr(model.config, "rope_parameters", None)),
    }
    print(f"{name}: {time.time() - t0:.1f}s  f32-vs-f64 {refs['cases'][name]['hf_f32_vs_f64_rel']:.2e}  cache-vs-nocache {refs['cases'][name]['hf_cache_vs_nocache_rel']:.2e}  tokens {tokens}", flush=True)
json.dump(refs, open(os.path.join(out, "refs.json"), "w"))

# Tokenizers: ids from the Rust library (tokenizer.json alone, no special tokens added) and
# from transformers' tokenizer (with its BOS rules); chat prompts from apply_chat_template.
from tokenizers import Tokenizer

cases = json.load(open(os.path.join(src, "tokenizer-cases.json")))
tok_refs = {}
for name in sorted(os.listdir(os.path.join(src, "tokenizers"))):
    d = os.path.join(src, "tokenizers", name)
    rust = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(d)
    entry = {
        "ids": [rust.encode(s, add_special_tokens=False).ids for s in cases["strings"]],
        "auto_ids": [auto(s)["input_ids"] for s in cases["strings"]],
        "decoded": [auto.decode(rust.encode(s, add_special_tokens=False).ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) for s in cases["strings"]],
    }
    if getattr(auto, "chat_template", None):
        entry["chats"] = [auto.apply_chat_template(c["messages"], tokenize=False, add_generation_prompt=True) for c in cases["chats"]]
    tok_refs[name] = entry
    print(f"tokenizer {name}: {len(entry['ids'])} strings, chats: {'chats' in entry}", flush=True)
json.dump(tok_refs, open(os.path.join(out, "tokenizer-refs.json"), "w"))
print("done")
