"""Trains a tiny Llama on the multi-key needle task with numpy alone (no torch, no GPU): a model
nobody profiled that the lab VM can make in minutes and evaluate at short contexts.

    python3 apps/bench/train/tiny_retrieval.py --out DIR [--seed 1] [--steps 8000]
    python3 apps/bench/train/tiny_retrieval.py --out DIR --mix vartrack --start DIR/needle-3l --steps 1500 --lr 1e-3   # vt-3l
    python3 apps/bench/train/tiny_retrieval.py --out DIR --mix vartrack --start DIR/vt-3l --grow 8 --steps 400 --lr 1e-3   # vt-8l-tiny
    python3 apps/bench/train/tiny_retrieval.py --out DIR --mix vartrack --start DIR/needle-3l --steps 2000 --lr 1e-3 --span 20000   # vt-3l-long
    python3 apps/bench/train/tiny_retrieval.py --check     # the hand-written gradients against finite differences, and grown()'s logits
    python3 apps/bench/train/tiny_retrieval.py --out DIR --parity   # initial weights and numpy's logits, for the engine to match

The model (DIR/needle-3l: config.json, model.safetensors in f32, recall-4l's word-level
tokenizer) is a Llama of 3 layers, hidden 64, 2 heads of 32 sharing one KV head, SwiGLU 128,
RoPE theta 1e6 (half of each head's pairs turn less than a radian over 1K tokens: room to match
content), trained from random weights — but for layer 0's first head, which starts as a
previous-token head (previous_token_head) — on haystacks of fillers holding many records
`kA vB .` (distinct keys) followed by questions `? kA vB .`: the loss is on the answers only.
Lengths grow from 64 to 256 tokens. It is the eval's `needle` task
(apps/bench/src/eval/retrieval-tasks.ts); the seed and the step count make the weights (never
committed), and DIR/needle-3l/recipe.json records the recipe and the answer accuracy reached.
With --mix vartrack --start DIR/needle-3l it fine-tunes that model on retrieval_mix.py's vartrack
mix (chains asked as walks, `? kC` answered `kA vB`, every hop a needle lookup) into DIR/vt-3l.
With --grow N as well (--start DIR/vt-3l --grow 8) the start model's layers are spread over N
(grown(): the layers between them start adding nothing) and the deeper model is fine-tuned into
DIR/vt-Nl-tiny — a deeper vartrack model the lab VM can make without torch.
With --span S the training sequences' positions are stretched over up to S positions
(skipped_positions(): jumps between fillers, records and questions whole) and each filler weighs
in attention as the S/T fillers it stands for (filler_bias()), so that 512-token sequences teach
the distances and the dilution of a 16K context (models trained on plain positions answer at
twice their training length at most); the models are then named vt-3l-long, vt-8l-long.
"""
import argparse, json, math, os, struct, sys, time

# One BLAS thread: the products are small, and on a shared machine more threads spin and wait.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_files import VOCAB, DOT, ASK, F0, K0, V0, write_meta  # noqa: E402
import retrieval_mix  # noqa: E402

# (layers, hidden, heads, kv heads, intermediate)
SHAPE = (3, 64, 2, 1, 128)
NAME = "needle-3l"
THETA = 1e6
EPS = 1e-5


def init(shape, rng, dtype=np.float32):
    layers, d, h, kv, inter = shape
    hd = d // h
    n = lambda *s: (rng.standard_normal(s) * 0.02).astype(dtype)
    p = {"embed": n(len(VOCAB), d), "norm": np.ones(d, dtype), "lm_head": n(len(VOCAB), d)}
    for i in range(layers):
        p.update({f"{i}.ln1": np.ones(d, dtype), f"{i}.q": n(h * hd, d), f"{i}.k": n(kv * hd, d), f"{i}.v": n(kv * hd, d),
                  f"{i}.o": n(d, h * hd), f"{i}.ln2": np.ones(d, dtype), f"{i}.gate": n(inter, d), f"{i}.up": n(inter, d),
                  f"{i}.down": n(d, inter)})
    return p


def previous_token_head(p, shape, rng):
    """Layer 0's first head starts out attending to the previous token: every token's embedding is
    given the same norm and a shared direction u (orthogonal to the rest, so u·y is the same for
    every token after the RMS norm), the head's key reads u into the first half of the four fastest
    RoPE pairs and its query reads u turned back by one position's angle there, so the score is
    ∝ Σᵢ cos(θᵢ(Δ − 1)), highest at Δ = 1 (all of the head's attention at init, checked over 512
    tokens). The rest is random and everything trains: a value then carries its key, and the
    retrieval head of the later layers forms without the long plateau of a random start."""
    layers, d, h, kv, inter = shape
    hd, half = d // h, d // h // 2
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    e = p["embed"].astype(np.float64)
    e -= np.outer(e @ u, u)
    e *= 0.02 * math.sqrt(d) / np.linalg.norm(e, axis=1, keepdims=True)
    # Half a token's norm: the token keeps ≈ 89% of each normalized input.
    p["embed"] = (e + 0.5 * 0.02 * math.sqrt(d) * u).astype(p["embed"].dtype)
    theta = 1.0 / THETA ** (np.arange(0, hd, 2) / hd)
    w = (np.arange(half) < 4).astype(np.float64)  # the slow pairs barely tell Δ = 1 from Δ = 0
    k0 = np.concatenate([w, np.zeros(half)])
    q0 = np.concatenate([w * np.cos(theta), -w * np.sin(theta)])
    p["0.k"][:hd] = (4 * np.outer(k0, u)).astype(p["0.k"].dtype)
    p["0.q"][:hd] = (4 * np.outer(q0, u)).astype(p["0.q"].dtype)


def grown(p, shape, layers, rng):
    """A model of `layers` layers computing what p (of `shape`) computes: p's layers spread over the depth
    (layer j at round(j·layers/n)), the layers between them with zero output projections (attention's o,
    the MLP's down) so that they add nothing at first, the rest of their weights random."""
    n = shape[0]
    deep = (layers,) + tuple(shape[1:])
    q = init(deep, rng, p["embed"].dtype)
    at = {round(j * layers / n): j for j in range(n)}
    for i in range(layers):
        for w in ("ln1", "q", "k", "v", "o", "ln2", "gate", "up", "down"):
            if i in at:
                q[f"{i}.{w}"] = p[f"{at[i]}.{w}"].copy()
            elif w in ("o", "down"):
                q[f"{i}.{w}"][:] = 0
    for w in ("embed", "norm", "lm_head"):
        q[w] = p[w].copy()
    return q, deep


def rope_tables(pos, hd, dtype):
    """cos and sin of every position in `pos` (any shape), with a last axis of hd."""
    inv = 1.0 / THETA ** (np.arange(0, hd, 2) / hd)
    f = np.asarray(pos)[..., None] * inv
    emb = np.concatenate([f, f], axis=-1)
    return np.cos(emb).astype(dtype), np.sin(emb).astype(dtype)


def skipped_positions(rng, ids, span):
    """Position ids that stretch each sequence over up to `span` positions (PoSE-style): jumps are put
    between two fillers of the haystack (before the first question), so records and questions keep
    consecutive positions while the distances between them reach those of a `span`-token context;
    a quarter of the sequences keep plain positions."""
    B, T = ids.shape
    pos = np.tile(np.arange(T), (B, 1))
    filler = (ids >= F0) & (ids < F0 + 1000)
    for b in range(B):
        if span <= T or rng.random() < 0.25:
            continue
        asks = np.nonzero(ids[b] == ASK)[0]
        end = asks[0] if len(asks) else T
        at = np.nonzero(filler[b, 1:end] & filler[b, :end - 1])[0] + 1
        if len(at) == 0:
            continue
        extra = int(T * math.exp(rng.uniform(0, math.log(span / T)))) - T
        cuts = np.sort(rng.choice(at, size=min(len(at), 8), replace=False))
        share = rng.dirichlet(np.ones(len(cuts))) * extra
        jump = np.zeros(T, dtype=np.int64)
        jump[cuts] = np.floor(share).astype(np.int64)
        pos[b] += np.cumsum(jump)
    return pos


def filler_bias(ids, pos):
    """Each filler key's log-weight in attention where `pos` stretches its sequence over S > T positions:
    log(S/T), as if it stood for the S/T fillers of an S-token haystack — so that a short sequence also
    teaches the dilution of a long one (the records' count does not grow with the context, the fillers' does)."""
    span = (pos[:, -1] + 1) / ids.shape[1]
    return np.where((ids >= F0) & (ids < F0 + 1000), np.log(span)[:, None], 0.0)


def rot(x):
    # Hugging Face Llama's rotate-half (what the engine's loader expects).
    a, b = np.split(x, 2, axis=-1)
    return np.concatenate([-b, a], axis=-1)


def rot_t(z):
    # rot's transpose: <rot(x), z> = <x, rot_t(z)>.
    a, b = np.split(z, 2, axis=-1)
    return np.concatenate([b, -a], axis=-1)


def mm(x, w):
    # As one 2-D product: numpy's 3-D @ 2-D runs ~100× slower than the same product flattened.
    return (x.reshape(-1, x.shape[-1]) @ w).reshape(*x.shape[:-1], w.shape[-1])


def bmm(a, b):
    # Slice by slice: numpy's stacked float32 matmul runs ~20× slower here than a loop of 2-D products.
    out = np.empty((a.shape[0], a.shape[1], b.shape[2]), dtype=np.result_type(a, b))
    for j in range(a.shape[0]):
        np.matmul(a[j], b[j], out=out[j])
    return out


def rms_fwd(x, g):
    r = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + EPS)
    return x * r * g, r


def rms_bwd(dy, x, r, g):
    dn = dy * g
    dx = r * dn - r ** 3 * x * (dn * x).mean(-1, keepdims=True)
    return dx, (dy * x * r).reshape(-1, x.shape[-1]).sum(0)


def forward_backward(p, shape, ids, mask, keep=None, pos=None, bias=None):
    """Mean cross-entropy over the masked positions' next tokens, the gradients of every weight, and the answers right; `keep` (a list) gets the masked positions' logits;
    `pos` (B × T) position ids, 0 … T−1 when absent; `bias` (B × T) added to every score of each key (filler_bias)."""
    layers, d, h, kv, inter = shape
    hd, rep = d // h, h // kv
    B, T = ids.shape
    if pos is None:
        cos, sin = rope_tables(np.arange(T), hd, p["embed"].dtype)
        cos_q, sin_q = np.tile(cos, (rep, 1)), np.tile(sin, (rep, 1))
    else:
        # Per sequence: rows b·kv … b·kv + kv − 1 of the batched products are sequence b's KV heads.
        cos, sin = (np.repeat(t, kv, axis=0) for t in rope_tables(pos, hd, p["embed"].dtype))
        cos_q, sin_q = np.tile(cos, (1, rep, 1)), np.tile(sin, (1, rep, 1))
    causal = np.tile(np.triu(np.full((T, T), -np.inf, dtype=p["embed"].dtype), 1), (rep, 1))
    if bias is not None:
        causal = causal + np.repeat(bias.astype(causal.dtype), kv, axis=0)[:, None, :]
    x = p["embed"][ids]
    saved = []
    for i in range(layers):
        x_in = x
        y, r1 = rms_fwd(x, p[f"{i}.ln1"])
        # Each KV head's query heads stacked along the rows (head i reads KV head i // rep, as Llama's repeat_kv): plain batched products, no broadcasting.
        q = mm(y, p[f"{i}.q"].T).reshape(B, T, kv, rep, hd).transpose(0, 2, 3, 1, 4).reshape(B * kv, rep * T, hd)
        k = mm(y, p[f"{i}.k"].T).reshape(B, T, kv, hd).transpose(0, 2, 1, 3).reshape(B * kv, T, hd)
        v = np.ascontiguousarray(mm(y, p[f"{i}.v"].T).reshape(B, T, kv, hd).transpose(0, 2, 1, 3).reshape(B * kv, T, hd))
        qr, kr = q * cos_q + rot(q) * sin_q, k * cos + rot(k) * sin
        s = bmm(qr, kr.transpose(0, 2, 1)) / math.sqrt(hd) + causal
        s -= s.max(-1, keepdims=True)
        pr = np.exp(s)
        pr /= pr.sum(-1, keepdims=True)
        a = bmm(pr, v).reshape(B, kv, rep, T, hd).transpose(0, 3, 1, 2, 4).reshape(B, T, h * hd)
        x = x + mm(a, p[f"{i}.o"].T)
        x_mid = x
        y2, r2 = rms_fwd(x, p[f"{i}.ln2"])
        gt, up = mm(y2, p[f"{i}.gate"].T), mm(y2, p[f"{i}.up"].T)
        sg = 1.0 / (1.0 + np.exp(-gt))
        act = gt * sg * up
        x = x + mm(act, p[f"{i}.down"].T)
        saved.append((x_in, y, r1, qr, kr, v, pr, a, x_mid, y2, r2, gt, up, sg, act))
    yf, rf = rms_fwd(x, p["norm"])
    # Only the answer positions' logits: the lm_head over every position would cost most of a step.
    pos = np.nonzero(mask[:, 1:])
    hid = yf[pos]
    logits = hid @ p["lm_head"].T
    if keep is not None:
        keep.append(logits.copy())
    target = ids[:, 1:][pos]
    logits -= logits.max(-1, keepdims=True)
    z = np.exp(logits).sum(-1)
    prob = np.exp(logits) / z[:, None]
    n = len(target)
    loss = (np.log(z) - logits[np.arange(n), target]).mean()
    right = int((prob.argmax(-1) == target).sum())
    g = {key: np.zeros_like(val) for key, val in p.items()}
    dlog = prob
    dlog[np.arange(n), target] -= 1
    dlog /= n
    g["lm_head"] = dlog.T @ hid
    dyf = np.zeros_like(yf)
    dyf[pos] = dlog @ p["lm_head"]
    dx, g["norm"] = rms_bwd(dyf, x, rf, p["norm"])
    for i in reversed(range(layers)):
        x_in, y, r1, qr, kr, v, pr, a, x_mid, y2, r2, gt, up, sg, act = saved[i]
        flat = lambda t: t.reshape(-1, t.shape[-1])
        g[f"{i}.down"] = flat(dx).T @ flat(act)
        dact = mm(dx, p[f"{i}.down"])
        dup = dact * gt * sg
        dgt = dact * up * sg * (1 + gt * (1 - sg))
        g[f"{i}.gate"], g[f"{i}.up"] = flat(dgt).T @ flat(y2), flat(dup).T @ flat(y2)
        dy2 = mm(dgt, p[f"{i}.gate"]) + mm(dup, p[f"{i}.up"])
        dxm, g[f"{i}.ln2"] = rms_bwd(dy2, x_mid, r2, p[f"{i}.ln2"])
        dx = dx + dxm
        g[f"{i}.o"] = flat(dx).T @ flat(a)
        da = mm(dx, p[f"{i}.o"]).reshape(B, T, kv, rep, hd).transpose(0, 2, 3, 1, 4).reshape(B * kv, rep * T, hd)
        dpr = bmm(da, v.transpose(0, 2, 1))
        dv = bmm(pr.transpose(0, 2, 1), da)
        ds = pr * (dpr - (dpr * pr).sum(-1, keepdims=True)) / math.sqrt(hd)
        dqr = bmm(ds, kr)
        dkr = bmm(ds.transpose(0, 2, 1), qr)
        dq = dqr * cos_q + rot_t(dqr * sin_q)
        dk = dkr * cos + rot_t(dkr * sin)
        dq = dq.reshape(B, kv, rep, T, hd).transpose(0, 3, 1, 2, 4).reshape(B * T, h * hd)
        dk, dv = (t.reshape(B, kv, T, hd).transpose(0, 2, 1, 3).reshape(B * T, kv * hd) for t in (dk, dv))
        g[f"{i}.q"], g[f"{i}.k"], g[f"{i}.v"] = dq.T @ flat(y), dk.T @ flat(y), dv.T @ flat(y)
        dy = (dq @ p[f"{i}.q"] + dk @ p[f"{i}.k"] + dv @ p[f"{i}.v"]).reshape(B, T, d)
        dxi, g[f"{i}.ln1"] = rms_bwd(dy, x_in, r1, p[f"{i}.ln1"])
        dx = dx + dxi
    np.add.at(g["embed"], ids, dx)
    return loss, g, right, n


def sequence(rng, length):
    """A haystack of fillers with records `kA vB .` (distinct keys) in its first 60%, then questions `? kA vB .` on them; the mask marks each answer."""
    toks = rng.integers(F0, F0 + 1000, size=length)
    mask = np.zeros(length, dtype=bool)
    body = int(length * 0.6)
    # As many questions as the rest holds (4 tokens each): the answers are the only signal, so the more the better.
    n_rec = int(rng.integers(2, max(3, min(64, (length - body) // 4, body // 6) + 1)))
    keys = rng.permutation(256)[:n_rec]
    vals = rng.integers(0, 256, size=n_rec)
    share = (body - 1) // n_rec
    for j in range(n_rec):
        at = 1 + j * share + int(rng.integers(0, share - 2))
        toks[at:at + 3] = (K0 + keys[j], V0 + vals[j], DOT)
    at = body
    for j in rng.permutation(n_rec):
        if at + 4 > length:
            break
        toks[at:at + 4] = (ASK, K0 + keys[j], V0 + vals[j], DOT)
        mask[at + 2] = True
        at += 4 + int(rng.integers(0, 2))
    toks[0] = 1
    return toks, mask


def batch(rng, n, length, mix="needle"):
    seqs = [sequence(rng, length) if mix == "needle" else retrieval_mix.sequence(rng, length, mix) for _ in range(n)]
    return np.stack([np.asarray(s[0]) for s in seqs]), np.stack([np.asarray(s[1], dtype=bool) for s in seqs])


def accuracy(p, shape, rng, length, mix="needle", n=16):
    ids, mask = batch(rng, n, length, mix)
    _, _, right, total = forward_backward(p, shape, ids, mask)
    return right / total


def save_safetensors(p, shape, out):
    """The weights under Hugging Face Llama's names, f32, in the safetensors layout (8-byte header size, JSON header, data)."""
    layers = shape[0]
    names = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight"}
    for i in range(layers):
        for ours, theirs in [("ln1", "input_layernorm"), ("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"), ("v", "self_attn.v_proj"), ("o", "self_attn.o_proj"),
                             ("ln2", "post_attention_layernorm"), ("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"), ("down", "mlp.down_proj")]:
            names[f"{i}.{ours}"] = f"model.layers.{i}.{theirs}.weight"
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for key in sorted(p, key=lambda k: names[k]):
        b = np.ascontiguousarray(p[key], dtype="<f4").tobytes()
        header[names[key]] = {"dtype": "F32", "shape": list(p[key].shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def load_safetensors(path, shape):
    """The weights save_safetensors wrote (f32), under this script's names."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header, data = json.loads(f.read(size)), f.read()
    names = {"model.embed_tokens.weight": "embed", "model.norm.weight": "norm", "lm_head.weight": "lm_head"}
    for i in range(shape[0]):
        for ours, theirs in [("ln1", "input_layernorm"), ("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"), ("v", "self_attn.v_proj"), ("o", "self_attn.o_proj"),
                             ("ln2", "post_attention_layernorm"), ("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"), ("down", "mlp.down_proj")]:
            names[f"model.layers.{i}.{theirs}.weight"] = f"{i}.{ours}"
    p = {}
    for key, t in header.items():
        if key == "__metadata__":
            continue
        if t["dtype"] != "F32" or key not in names:
            sys.exit(f"{path}: {key} is not a {NAME} weight in f32")
        a, b = t["data_offsets"]
        p[names[key]] = np.frombuffer(data[a:b], dtype="<f4").reshape(t["shape"]).copy()
    if len(p) != len(names):
        sys.exit(f"{path}: {len(names) - len(p)} of {NAME}'s weights missing")
    return p


def parity(out):
    """Writes to `out` a model with this script's initial weights (sharpened so attention is far from uniform),
    ids.json (a training sequence) and logits.f32 (numpy's logits after each of its tokens): the engine,
    given the model, must compute the same logits (apps/bench/test/tiny-retrieval.test.ts)."""
    rng = np.random.default_rng(5)
    p = init(SHAPE, rng)
    previous_token_head(p, SHAPE, rng)
    for key in p:
        if not key.endswith(("ln1", "ln2", "norm")):
            p[key] *= 8
    ids, _ = batch(rng, 1, 96)
    keep = []
    forward_backward(p, SHAPE, ids, np.ones_like(ids, dtype=bool), keep)
    model = os.path.join(out, NAME)
    write_meta(SHAPE, model, rope_theta=THETA, dtype="float32")
    save_safetensors(p, SHAPE, model)
    json.dump(ids[0].tolist(), open(os.path.join(out, "ids.json"), "w"))
    keep[0].astype("<f4").tofile(os.path.join(out, "logits.f32"))


def check():
    """The hand-written gradients against central differences in float64 on a small model; exits non-zero past 1e-5 relative."""
    shape = (2, 16, 4, 2, 24)
    rng = np.random.default_rng(0)
    p = init(shape, rng, np.float64)
    for key in p:
        p[key] = p[key] * 5 + (1.0 if key.endswith(("ln1", "ln2", "norm")) else 0.0)
    ids, mask = batch(rng, 2, 40)
    # Plain positions, then stretched ones (skipped_positions: jumps between fillers) with the fillers' weights (filler_bias) through the same products.
    stretched = skipped_positions(np.random.default_rng(0), ids, 400)
    assert (stretched != np.arange(40)).any(), "the check's positions were not stretched"
    worst = 0.0
    for pos in (None, stretched):
        bias = None if pos is None else filler_bias(ids, pos)
        _, g, _, _ = forward_backward(p, shape, ids, mask, pos=pos, bias=bias)
        for key in p:
            flat = p[key].reshape(-1)
            for j in rng.choice(flat.size, size=min(6, flat.size), replace=False):
                keep = flat[j]
                flat[j] = keep + 1e-6
                up = forward_backward(p, shape, ids, mask, pos=pos, bias=bias)[0]
                flat[j] = keep - 1e-6
                down = forward_backward(p, shape, ids, mask, pos=pos, bias=bias)[0]
                flat[j] = keep
                num, ana = (up - down) / 2e-6, g[key].reshape(-1)[j]
                # Relative to the gradient's size, with a floor where central differences lose digits to rounding.
                err = abs(num - ana) / max(1e-3, abs(num) + abs(ana))
                worst = max(worst, err)
                if err > 1e-5:
                    print(f"{key}[{j}]{' (stretched positions)' if pos is not None else ''}: numeric {num:.8g}, analytic {ana:.8g}")
    print(f"gradient check: worst relative error {worst:.2e}")
    # A grown model's logits are its start's: the layers put between add nothing before training.
    keep, keep_deep = [], []
    forward_backward(p, shape, ids, mask, keep)
    deep, deep_shape = grown(p, shape, 5, rng)
    forward_backward(deep, deep_shape, ids, mask, keep_deep)
    gap = float(np.abs(keep[0] - keep_deep[0]).max())
    print(f"grown to {deep_shape[0]} layers: logits within {gap:.1e} of the start's")
    # Stretched positions move only between two fillers before the first question: records and questions stay consecutive.
    ids, _ = batch(rng, 16, 256, "vartrack")
    pos = skipped_positions(rng, ids, 20000)
    step = np.diff(pos, axis=1)
    filler = (ids >= F0) & (ids < F0 + 1000)
    first_ask = np.argmax(ids == ASK, axis=1)
    jumps = np.argwhere(step > 1)
    placed = all(filler[b, t] and filler[b, t + 1] and t + 1 < first_ask[b] for b, t in jumps)
    moved = int((pos[:, -1] > 255).sum())
    ok_pos = placed and (step >= 1).all() and (pos < 20000).all() and 0 < moved < 16
    print(f"stretched positions: {moved} of 16 sequences, the longest over {pos[:, -1].max() + 1} positions, "
          f"{'jumps only between fillers before the questions' if placed else 'a jump inside a record or question'}")
    sys.exit(0 if worst <= 1e-5 and gap <= 1e-9 and ok_pos else 1)


def train(args):
    rng = np.random.default_rng(args.seed)
    shape = SHAPE
    name = NAME if args.mix == "needle" else "vt-3l"
    if args.start:
        p = load_safetensors(os.path.join(args.start, "model.safetensors"), SHAPE)
        if args.grow:
            p, shape = grown(p, SHAPE, args.grow, rng)
            name = f"{'needle' if args.mix == 'needle' else 'vt'}-{args.grow}l-tiny"
    else:
        p = init(SHAPE, rng)
        previous_token_head(p, SHAPE, rng)
    if args.span:
        # Trained for long contexts: vt-3l-long, vt-8l-long.
        name = name.replace("-tiny", "") + "-long"
    name = args.name or name
    m = {k: np.zeros_like(v) for k, v in p.items()}
    s = {k: np.zeros_like(v) for k, v in p.items()}
    b1, b2, wd = 0.9, 0.98, 0.01
    # (until this share of the steps: sequence length, batch) — short first, where the retrieval circuit forms fastest;
    # a fine-tune starts where its model's lookups work (the vartrack mix needs room for a few chains).
    phases = [(0.4, 128, 24), (0.8, 256, 12), (1.0, 512, 6)] if args.start else [(0.6, 64, 48), (0.85, 128, 24), (1.0, 256, 12)]
    t0 = time.time()
    for step in range(args.steps):
        frac = step / args.steps
        length, bs = next((l, b) for (f, l, b) in phases if frac < f)
        lr = args.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        ids, mask = batch(rng, bs, length, args.mix)
        pos = skipped_positions(rng, ids, args.span) if args.span else None
        loss, g, right, n = forward_backward(p, shape, ids, mask, pos=pos, bias=None if pos is None else filler_bias(ids, pos))
        norm = math.sqrt(sum(float((v * v).sum()) for v in g.values()))
        clip = min(1.0, 1.0 / (norm + 1e-6))
        for k in p:
            gk = g[k] * clip
            m[k] = b1 * m[k] + (1 - b1) * gk
            s[k] = b2 * s[k] + (1 - b2) * gk * gk
            mh, sh = m[k] / (1 - b1 ** (step + 1)), s[k] / (1 - b2 ** (step + 1))
            decay = wd if p[k].ndim == 2 else 0.0
            p[k] -= lr * (mh / (np.sqrt(sh) + 1e-8) + decay * p[k])
        if (step + 1) % args.log_every == 0:
            print(f"{name} step {step + 1} len {length} loss {loss:.3f} answers {right}/{n} ({time.time() - t0:.0f} s)", flush=True)
    acc = {l: round(accuracy(p, shape, rng, l, args.mix), 3) for l in (256, 512, 1024)}
    print(f"{name}: {args.steps} steps in {time.time() - t0:.0f} s, answer accuracy {acc}", flush=True)
    out = os.path.join(args.out, name)
    write_meta(shape, out, rope_theta=THETA, dtype="float32")
    save_safetensors(p, shape, out)
    json.dump({"model": name, "shape": dict(zip(["layers", "hidden", "heads", "kv_heads", "intermediate"], shape)), "rope_theta": THETA,
               "mix": args.mix, "start": args.start or None, "grown_to": args.grow or None, "seed": args.seed, "steps": args.steps, "lr": args.lr, "phases": phases, "span": args.span or None, "answer_accuracy": acc,
               "seconds": round(time.time() - t0, 1)}, open(os.path.join(out, "recipe.json"), "w"), indent=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8000)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--mix", default="needle", choices=("needle", "vartrack"), help="needle: this script's needle task; vartrack: retrieval_mix.py's walks")
    ap.add_argument("--start", default="", help="a trained needle-3l's directory: fine-tune its weights instead of starting from random ones")
    ap.add_argument("--name", default="", help="the output model's name (default: from the mix, --grow and --span, e.g. vt-8l-long)")
    ap.add_argument("--span", type=int, default=0, help="stretch the training sequences' positions over up to this many (skipped_positions()): distances of long contexts on short sequences")
    ap.add_argument("--grow", type=int, default=0, help="with --start: spread the start model's layers over this many (grown()) before fine-tuning")
    ap.add_argument("--check", action="store_true", help="compare the gradients with finite differences and exit")
    ap.add_argument("--parity", action="store_true", help="write a model with initial weights and numpy's logits into --out (the engine's parity test) and exit")
    args = ap.parse_args()
    if args.check:
        check()
    if not args.out:
        ap.error("--out is required")
    if args.parity:
        parity(args.out)
        return
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    if args.grow and (not args.start or args.grow < SHAPE[0]):
        ap.error(f"--grow needs --start and at least {SHAPE[0]} layers")
    train(args)


if __name__ == "__main__":
    main()
