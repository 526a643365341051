"""torch's scaled_dot_product_attention on flash-bench.ts's shapes, in the same device run: causal,
bf16, 32 query heads, 8 KV heads, head dim 128, batch 1. Times the GQA call transformers makes
(enable_gqa) and each backend torch offers alone. Prints markdown rows with TFLOP/s
(causal flop = 2·2·n²/2·hd·heads). Usage: python3 flash_sdpa.py [2048,8192,32768]"""
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sizes = [int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "2048,8192,32768").split(",")]
H, KV, D = 32, 8, 128
print(f"| torch {torch.__version__} SDPA | tokens | ms | TFLOP/s |")
print("| --- | --- | --- | --- |")


def timed(f, reps):
    f()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        f()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


for n in sizes:
    g = torch.Generator(device="cuda").manual_seed(n)
    q = torch.randn(1, H, n, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, KV, n, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, KV, n, D, device="cuda", dtype=torch.bfloat16, generator=g)
    ke, ve = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)  # heads expanded outside the timing
    reps = 3 if n >= 32768 else 10 if n >= 8192 else 30
    flop = 2 * n * n * D * H
    runs = [("default, enable_gqa", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), None)]
    for name, be in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
        runs.append((name + ", heads expanded", lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=True), be))
    for name, f, be in runs:
        try:
            if be is None:
                ms = timed(f, reps)
            else:
                with sdpa_kernel(be):
                    ms = timed(f, reps)
            print(f"| {name} | {n} | {ms:.2f} | {flop / (ms / 1e3) / 1e12:.0f} |", flush=True)
        except Exception as e:  # a backend torch lacks for this shape or build
            print(f"| {name} | {n} | unavailable: {str(e).splitlines()[0][:80]} | |", flush=True)
    del q, k, v, ke, ve
    torch.cuda.empty_cache()
