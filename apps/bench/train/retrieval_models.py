"""Trains small retrieval models unlike recall-4l, for hybrid attention's accuracy tables.

    python3 apps/bench/train/retrieval_models.py --out DIR [--models ruler-8l,ruler-12l] [--seed 1]
        [--steps N] [--time-budget 90] [--lr 2e-3] [--phases 0.5:512:64,1:4096:8] [--tiny]
    python3 apps/bench/train/llama_files.py NAME DIR   # the files beside returned weights (no torch needed)

Each model is a Llama (HF layout: config.json, model.safetensors in bf16, a word-level
tokenizer.json with recall-4l's vocabulary: <unk> <s> </s> = ? . f0-f999 k0-k255 v0-v255) trained
on a mix of retrieval_mix.py in the formats the eval asks (retrieval-tasks.ts): the ruler mix
(needles `kA vB .`, multi-value keys, a few chains) for ruler-8l and ruler-12l, the vartrack mix
(chains `kA vB .` ... `kC kA .`, asked `? kC`, answered with the walk `kA vB`) for vt-8l; the
questions in the last quarter, the loss on the answers only. The recipe and the seed make the
weights; nothing else is needed (the weights are never committed). With --grow-from the models
start from recall-4l's circuit (see grown()) and lengths grow from 1024 to 4096; from scratch,
from 512 (RoPE theta 1e6, so that the models reach past their last training length).
"""
import argparse, json, math, os, sys, time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_files import SHAPES, VOCAB, write_meta  # noqa: E402
from retrieval_mix import sequence  # noqa: E402

# The training mix of each model (retrieval_mix.py).
MIX = {"vt-8l": "vartrack"}
# recall-4l's shape: the models grow from it (--grow-from), so they start with a working retrieval circuit.
BASE = (4, 256, 8, 2, 768)


class Block(nn.Module):
    def __init__(self, d, h, kv, inter):
        super().__init__()
        self.h, self.kv, self.hd = h, kv, d // h
        self.input_layernorm = nn.RMSNorm(d, eps=1e-5)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=1e-5)
        self.q_proj = nn.Linear(d, h * self.hd, bias=False)
        self.k_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.o_proj = nn.Linear(h * self.hd, d, bias=False)
        self.gate_proj = nn.Linear(d, inter, bias=False)
        self.up_proj = nn.Linear(d, inter, bias=False)
        self.down_proj = nn.Linear(inter, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        y = self.input_layernorm(x)
        q = self.q_proj(y).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(y).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(y).view(b, t, self.kv, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.h)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, -1))
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


def rope(x, cos, sin):
    # Hugging Face Llama's rotate-half convention (what the engine's loader expects).
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Llama(nn.Module):
    def __init__(self, layers, d, h, kv, inter, theta=1e6):
        super().__init__()
        self.embed_tokens = nn.Embedding(len(VOCAB), d)
        self.layers = nn.ModuleList([Block(d, h, kv, inter) for _ in range(layers)])
        self.norm = nn.RMSNorm(d, eps=1e-5)
        self.lm_head = nn.Linear(d, len(VOCAB), bias=False)
        hd = d // h
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, hd, 2).float() / hd), persistent=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids):
        t = ids.shape[1]
        f = torch.outer(torch.arange(t, device=ids.device).float(), self.inv_freq)
        emb = torch.cat((f, f), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        x = self.embed_tokens(ids)
        for blk in self.layers:
            x = blk(x, cos.to(x.dtype), sin.to(x.dtype))
        return self.lm_head(self.norm(x))


def batch(rng, n, length, device, mix):
    seqs = [sequence(rng, length, mix) for _ in range(n)]
    ids = torch.tensor([s[0] for s in seqs], device=device)
    mask = torch.tensor([s[1] for s in seqs], device=device, dtype=torch.bool)
    return ids, mask


def save(model, shape, out):
    layers, d, h, kv, inter = shape
    os.makedirs(out, exist_ok=True)
    tensors = {}
    for name, p in model.state_dict().items():
        key = name if name.startswith("lm_head") else f"model.{name}"
        key = key.replace(".q_proj", ".self_attn.q_proj").replace(".k_proj", ".self_attn.k_proj").replace(".v_proj", ".self_attn.v_proj").replace(".o_proj", ".self_attn.o_proj")
        key = key.replace(".gate_proj", ".mlp.gate_proj").replace(".up_proj", ".mlp.up_proj").replace(".down_proj", ".mlp.down_proj")
        tensors[key] = p.detach().to(torch.bfloat16).contiguous().cpu()
    # Shards of at most 15 MiB (the device's $OUT returns files up to 16 MiB), with the HF index when more than one.
    shards, size = [{}], 0
    for key, t in tensors.items():
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > 15 * 2**20:
            shards.append({})
            size = 0
        shards[-1][key] = t
        size += n
    if len(shards) == 1:
        save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
        for name, shard in zip(names, shards):
            save_file(shard, os.path.join(out, name), metadata={"format": "pt"})
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
                 "weight_map": {k: name for name, shard in zip(names, shards) for k in shard}}
        json.dump(index, open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=1)
    write_meta(shape, out)


def grown(shape, base_dir):
    """A model of `shape` that computes exactly what recall-4l (in base_dir) computes: its layers
    spread over the depth, the layers between them adding nothing (output projections zero, the
    rest random), each of its KV heads copied to the query heads it served."""
    from safetensors.torch import load_file
    layers, d, h, kv, inter = shape
    bl, bd, bh, bkv, binter = BASE
    assert (d, h, inter) == (bd, bh, binter) and kv % bkv == 0 and layers >= bl
    src = {k: v.float() for k, v in load_file(os.path.join(base_dir, "model.safetensors")).items()}
    model = Llama(*shape)
    st = model.state_dict()
    hd, rep = d // h, kv // bkv
    expand = lambda w: w.view(bkv, hd, d).repeat_interleave(rep, dim=0).reshape(kv * hd, d)
    at = {round(j * layers / bl): j for j in range(bl)}
    for i in range(layers):
        p = f"layers.{i}."
        if i in at:
            q = f"model.layers.{at[i]}."
            for ours, theirs in [("input_layernorm", "input_layernorm"), ("post_attention_layernorm", "post_attention_layernorm"), ("q_proj", "self_attn.q_proj"),
                                 ("o_proj", "self_attn.o_proj"), ("gate_proj", "mlp.gate_proj"), ("up_proj", "mlp.up_proj"), ("down_proj", "mlp.down_proj")]:
                st[p + ours + ".weight"] = src[q + theirs + ".weight"]
            st[p + "k_proj.weight"] = expand(src[q + "self_attn.k_proj.weight"])
            st[p + "v_proj.weight"] = expand(src[q + "self_attn.v_proj.weight"])
        else:
            st[p + "o_proj.weight"] = torch.zeros_like(st[p + "o_proj.weight"])
            st[p + "down_proj.weight"] = torch.zeros_like(st[p + "down_proj.weight"])
    st["embed_tokens.weight"], st["norm.weight"], st["lm_head.weight"] = src["model.embed_tokens.weight"], src["model.norm.weight"], src["lm_head.weight"]
    model.load_state_dict(st)
    return model


def evaluate(model, rng, length, device, mix, n=16):
    model.eval()
    with torch.no_grad(), torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        ids, mask = batch(rng, n, length, device, mix)
        pred = model(ids[:, :-1]).argmax(-1)
        hit = (pred == ids[:, 1:])[mask[:, 1:]]
    model.train()
    return hit.float().mean().item()


def train(name, args, device):
    shape, mix = SHAPES[name], MIX.get(name, "ruler")
    seed = args.seed * 1000 + sorted(SHAPES).index(name)
    torch.manual_seed(seed)
    rng, probe = np.random.default_rng(seed), np.random.default_rng(seed + 1)
    model = (grown(shape, args.grow_from) if args.grow_from else Llama(*shape)).to(device)
    if args.grow_from:
        print(f"{name}: grown from {args.grow_from}, answer-token accuracy before training {evaluate(model, rng, 1024, device, mix):.3f}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.05)
    # (until this share of the steps: sequence length, batch)
    phases = args.phases or ([(1.0, 256, 8)] if args.tiny else [(0.4, 1024, 32), (0.8, 2048, 16), (1.0, 4096, 8)] if args.grow_from else [(0.3, 512, 64), (0.7, 1024, 32), (0.9, 2048, 16), (1.0, 4096, 8)])
    t0, step = time.time(), 0
    while step < args.steps and time.time() - t0 < args.time_budget:
        # The schedule follows whichever runs out first, the steps or the time budget.
        frac = max(step / args.steps, (time.time() - t0) / args.time_budget)
        length, bs = next((l, b) for (f, l, b) in phases if frac < f)
        lr = args.lr * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, mask = batch(rng, bs, length, device, mix)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.float()[mask[:, 1:]], ids[:, 1:][mask[:, 1:]])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % args.log_every == 0:
            # Every fifth line the answer-token accuracy on fresh 1K batches (its own generator: the training data stay the seed's).
            acc = f" answers@1K {evaluate(model, probe, 1024, device, mix, n=8):.3f}" if step % (5 * args.log_every) == 0 else ""
            print(f"{name} step {step} len {length} loss {loss.item():.3f}{acc} ({time.time() - t0:.0f} s)", flush=True)
    lengths = [256] if args.tiny else [2048, 4096]
    acc = {l: evaluate(model, rng, l, device, mix) for l in lengths}
    print(f"{name}: {step} steps in {time.time() - t0:.0f} s, answer-token accuracy {acc}", flush=True)
    out = os.path.join(args.out, name)
    save(model, shape, out)
    json.dump({"model": name, "shape": dict(zip(["layers", "hidden", "heads", "kv_heads", "intermediate"], shape)), "mix": mix, "seed": args.seed, "steps": step,
               "lr": args.lr, "phases": phases, "answer_accuracy": acc, "seconds": round(time.time() - t0, 1), "device": str(device)},
              open(os.path.join(out, "recipe.json"), "w"), indent=2)


def phases_arg(text):
    """--phases FRAC:LENGTH:BATCH,...: increasing shares of the schedule ending at 1, lengths and batches positive."""
    try:
        phases = [(float(f), int(l), int(b)) for f, l, b in (p.split(":") for p in text.split(","))]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FRAC:LENGTH:BATCH,... (got {text!r})")
    fracs = [f for f, _, _ in phases]
    if fracs != sorted(set(fracs)) or fracs[0] <= 0 or fracs[-1] != 1 or any(l < 16 or b < 1 for _, l, b in phases):
        raise argparse.ArgumentTypeError(f"shares must increase to 1, lengths be at least 16 and batches at least 1 (got {text!r})")
    return phases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="ruler-8l,ruler-12l")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--time-budget", type=float, default=90, help="seconds per model at most")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model on 256-token sequences (a CPU smoke test)")
    ap.add_argument("--grow-from", default="", help="recall-4l's directory: start from its layers (see grown()) instead of random weights")
    ap.add_argument("--phases", type=phases_arg, default=None,
                    help="FRAC:LENGTH:BATCH,... (until FRAC of the schedule: sequences of LENGTH tokens, BATCH a step; the last FRAC 1)")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    for name in (["tiny"] if args.tiny else args.models.split(",")):
        train(name, args, device)


if __name__ == "__main__":
    main()
