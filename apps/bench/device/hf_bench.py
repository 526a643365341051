"""Hugging Face transformers on the same shape as bench.ts, in the same device run:
preset llama-3.1-8b with random bf16 weights, batch 1. Prefill tokens/s with SDPA, and eager
decode ms/token after a prompt of each context length. Prints markdown rows."""
import json, sys, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM

contexts = [int(c) for c in (sys.argv[1] if len(sys.argv) > 1 else "2048").split(",")]
steps = 32
cfg = json.load(open("packages/core/src/presets/llama-3.1-8b.json"))
torch.manual_seed(0)
rows = ["| transformers " + torch.__version__ + " | context | prefill s (sdpa) | prefill tok/s | eager decode ms/token |", "| --- | --- | --- | --- | --- |"]
for impl in ["sdpa"]:
    config = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures",)}, attn_implementation=impl)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    with torch.no_grad():  # warm-up: cuBLAS handles and kernels, outside the timings
        model(torch.arange(512, device="cuda")[None], use_cache=True, logits_to_keep=1)
        torch.cuda.synchronize()
    for ctx in contexts:
        ids = (torch.arange(ctx, device="cuda") * 7919 + 13) % config.vocab_size
        with torch.no_grad():
            model.config._attn_implementation = "sdpa"
            torch.cuda.synchronize(); t = time.perf_counter()
            out = model(ids[None], use_cache=True, logits_to_keep=1)  # the last row's logits, as ours
            torch.cuda.synchronize(); pre = time.perf_counter() - t
            model.config._attn_implementation = "eager"
            past = out.past_key_values
            tok = out.logits[:, -1:].argmax(-1)
            out = model(tok, past_key_values=past, use_cache=True)  # warm-up step
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize(); t = time.perf_counter()
            for _ in range(steps):
                out = model(tok, past_key_values=past, use_cache=True)
                past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize(); dec = (time.perf_counter() - t) / steps
        rows.append(f"| | {ctx} | {pre:.2f} | {ctx / pre:.0f} | {dec * 1e3:.2f} |")
        print(rows[-1], flush=True)
        del out, past
        torch.cuda.empty_cache()
print("\n".join(rows))
