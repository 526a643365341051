"""What a layer's output loses when its attention keeps the window and the top-K offloaded tokens,
beside the attention mass those tokens hold: the question a mass target stands in for (numpy only).

    python3 apps/bench/train/output_error.py DIR [--length 4096] [--window 256] [--sinks 4] [--prompts 4] [--rows 4] [--at question|haystack] [--seed 1] [--mix ruler]

DIR is a Llama in the HF layout (bf16 or f32 safetensors, one file or shards), e.g. recall-4l or a
model of retrieval_models.py / tiny_retrieval.py. Prompts are retrieval_mix.py's sequences; the rows
analysed are the questions' key rows (`? kA`: the row that must find kA's record), or with --at
haystack the rows before the first question (where a prompt ends: the rows the prefill calibration
samples). Per layer and
grid K, on those rows: the mass the window and the true query's top-K offloaded tokens hold (K per
KV head, ranked by the group's largest logit, as the engine selects), and the change of the
layer's attention output (after o_proj, every head at the same K, renormalised over what is kept)
relative to the residual stream it is added to. Prints per layer the K reaching mass 0.95 and the
K at which the relative change falls under 1% and 5%.
"""
import argparse, json, os, struct, sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_files import ASK, K0  # noqa: E402
from retrieval_mix import MIXES, sequence  # noqa: E402


def load(dir_):
    """Every tensor of DIR's safetensors file(s) as f32."""
    index = os.path.join(dir_, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    out = {}
    for f in files:
        data = open(os.path.join(dir_, f), "rb").read()
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + n])
        for k, v in header.items():
            if k == "__metadata__":
                continue
            a, b = v["data_offsets"]
            raw = data[8 + n + a:8 + n + b]
            if v["dtype"] == "BF16":
                t = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
            elif v["dtype"] == "F32":
                t = np.frombuffer(raw, dtype=np.float32)
            else:
                sys.exit(f"{f}: {k} is {v['dtype']} (bf16 or f32 expected)")
            out[k] = t.reshape(v["shape"]).astype(np.float32)
    return out


def rms(x, g, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., h:], x[..., :h]], -1) * sin


def grid(upto):
    ks = []
    i = 0
    while True:
        k = round(4 * 2 ** (i / 2))
        if not ks or k > ks[-1]:
            ks.append(k)
        if k >= upto:
            return ks
        i += 1


def analyse(w, cfg, ids, rows, window, sinks):
    """Per layer: [rows][grid] mass and relative change, and the grid."""
    L, d, H, KV = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, G, eps, theta = d // H, H // KV, cfg["rms_norm_eps"], cfg.get("rope_theta") or cfg.get("rope_parameters", {}).get("rope_theta", 1e6)
    n = len(ids)
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    ang = np.arange(n)[:, None] * inv[None]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    x = w["model.embed_tokens.weight"][ids]
    offl = [max(0, r + 1 - window) - sinks for r in rows]
    ks = grid(max(1, max(offl)))
    mass, change = np.zeros((L, len(rows), len(ks))), np.zeros((L, len(rows), len(ks)))
    for l in range(L):
        p = f"model.layers.{l}."
        h = rms(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(n, H, hd).transpose(1, 0, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(n, KV, hd).transpose(1, 0, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(n, KV, hd).transpose(1, 0, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        wo = w[p + "self_attn.o_proj.weight"]
        att = np.empty((H, n, hd), dtype=np.float32)
        for a in range(0, n, 512):  # causal attention in row blocks
            b = min(n, a + 512)
            s = np.einsum("gqd,gkd->gqk", q[:, a:b].reshape(KV, G * (b - a), hd), k[:, :b]).reshape(H, b - a, b) / np.sqrt(hd)
            s = np.where(np.arange(b)[None, None, :] <= np.arange(a, b)[None, :, None], s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            att[:, a:b] = np.einsum("gqk,gkd->gqd", s.reshape(KV, G * (b - a), b), v[:, :b]).reshape(H, b - a, hd)
        attn_out = att.transpose(1, 0, 2).reshape(n, d) @ wo.T
        resid = x + attn_out
        for i, r in enumerate(rows):
            lo, hi = sinks, max(sinks, r + 1 - window)  # offloaded [lo, hi)
            s = np.einsum("hd,hkd->hk", q[:, r], np.repeat(k[:, :r + 1], G, 0)) / np.sqrt(hd)
            pr = np.exp(s - s.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            keep = np.zeros((H, r + 1), dtype=bool)
            keep[:, :lo] = keep[:, hi:] = True
            vv = np.repeat(v[:, :r + 1], G, 0)
            full = np.einsum("hk,hkd->hd", pr, vv)
            # The engine's order: per KV head, the group's largest logit.
            order = np.argsort(-s[:, lo:hi].reshape(KV, G, -1).max(1), axis=-1, kind="stable") + lo
            for j, K in enumerate(ks):
                sel = keep.copy()
                for g in range(KV):
                    sel[g * G:(g + 1) * G, order[g, :K]] = True
                pk = np.where(sel, pr, 0)
                m = pk.sum(-1)
                mass[l, i, j] = m.mean()
                part = np.einsum("hk,hkd->hd", pk, vv) / m[:, None]
                change[l, i, j] = np.linalg.norm((full - part).reshape(-1) @ wo.T) / np.linalg.norm(resid[r])
        x = resid
        h2 = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h2 @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((gate / (1 + np.exp(-gate))) * (h2 @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return mass, change, ks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--rows", type=int, default=4, help="question rows a prompt")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mix", default="ruler", choices=MIXES)
    ap.add_argument("--at", default="question", choices=("question", "haystack"), help="the rows analysed: the questions' key rows, or the haystack's last rows")
    a = ap.parse_args()
    if a.length <= a.window + a.sinks:
        sys.exit(f"--length must exceed the window and sinks ({a.window + a.sinks})")
    cfg = json.load(open(os.path.join(a.dir, "config.json")))
    w = load(a.dir)
    rng = np.random.default_rng(a.seed)
    masses, changes = [], []
    for _ in range(a.prompts):
        ids, _ = sequence(rng, a.length, a.mix)
        ids = np.asarray(ids)
        asked = [i + 1 for i in range(len(ids) - 1) if ids[i] == ASK and ids[i + 1] >= K0]
        # The haystack's last rows (what the prefill calibration samples: the prompt ends there) or the questions' key rows (what the decode steps need).
        rows = asked[:a.rows] if a.at == "question" else list(range(asked[0] - 1 - a.rows, asked[0] - 1))
        mass, change, ks = analyse(w, cfg, ids, rows, a.window, a.sinks)
        masses.append(mass)
        changes.append(change)
    mass, change = np.concatenate(masses, 1).mean(1), np.concatenate(changes, 1).mean(1)
    first = lambda ok: next((ks[j] for j in range(len(ks)) if ok[j]), ks[-1])
    print(f"{os.path.basename(a.dir.rstrip('/'))}, {a.length} tokens, window {a.window} + {a.sinks} sinks, {a.prompts} prompts x {a.rows} {a.at} rows ({a.mix} mix)")
    print("| layer | K for mass 0.95 | K for change < 5% | K for change < 1% | mass at K 64 | change at K 64 | change at K 4 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    j64 = ks.index(64) if 64 in ks else len(ks) - 1
    for l in range(mass.shape[0]):
        print(f"| {l} | {first(mass[l] >= 0.95)} | {first(change[l] < 0.05)} | {first(change[l] < 0.01)} | {mass[l, j64]:.3f} | {change[l, j64]:.4f} | {change[l, 0]:.4f} |")
    # The grid's last K keeps every offloaded token: the full mass and no change, or the selection is wrong.
    print(f"every offloaded token kept: mass {mass[:, -1].min():.6f}, change {change[:, -1].max():.2e}")


if __name__ == "__main__":
    main()
