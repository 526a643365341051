"""Training sequences in the formats of apps/bench/src/eval/retrieval-tasks.ts (numpy only, so the lab VM checks them without torch).

    python3 apps/bench/train/retrieval_mix.py [--mix ruler|vartrack] [--length 256] [--seed 1]   # prints one sequence as words

A sequence is a haystack of fillers with records in its first three quarters and questions with
their answers in the last. Records are chains: `kA vB .` holds a value; `kC kA .` holds a key (kC
holds kA), each link after the record it points to; a chain of no hop is a plain needle. Asked
`? kC`, the answer is the walk `kA vB` (one token a hop, the value last). The ruler mix is mostly
needles with some chains and multi-value keys (`? kA` answers each of kA's values in order); the
vartrack mix asks mostly chains of 1 to 3 hops among needles and distractor chains. The loss mask
marks the answers' tokens.
"""
import argparse

import numpy as np

from llama_files import ASK, DOT, F0, K0, V0, VOCAB

MIXES = ("ruler", "vartrack")


def sequence(rng, length, mix="ruler"):
    """One training sequence (token ids) and its loss mask (answer positions)."""
    toks = rng.integers(F0, F0 + 1000, size=length).tolist()
    mask = [0] * length
    keys = iter(rng.permutation(256).tolist())
    n_records = int(rng.integers(8, max(9, min(64, length // 24))))
    chained = 0.3 if mix == "ruler" else 0.5
    groups, queries = [], []
    while sum(len(g) for g in groups) < n_records:
        hops = int(rng.integers(1, 4)) if rng.random() < chained else 0
        chain = [next(keys) for _ in range(hops + 1)]
        v = int(rng.integers(256))
        groups.append([[K0 + chain[0], V0 + v, DOT]] + [[K0 + chain[i], K0 + chain[i - 1], DOT] for i in range(1, hops + 1)])
        walk = [K0 + c for c in reversed(chain)] + [V0 + v]
        # Asked at its last key (the whole walk) or, now and then, from inside the chain.
        start = 0 if hops == 0 or rng.random() < 0.75 else int(rng.integers(1, hops + 1))
        queries.append((hops, [ASK, walk[start]], walk[start + 1:]))
    if mix == "ruler":
        for _ in range(int(rng.integers(1, 3))):
            k = next(keys)
            vals = rng.integers(256, size=int(rng.integers(2, 5))).tolist()
            groups.append([[K0 + k, V0 + x, DOT] for x in vals])
            queries.append((0, [ASK, K0 + k], [V0 + x for x in vals]))
    # Every group's records keep their order, the groups interleaved at random.
    slots = rng.permutation(sum([[g] * len(recs) for g, recs in enumerate(groups)], [])).tolist()
    nexts = [0] * len(groups)
    records = []
    for g in slots:
        records.append(groups[g][nexts[g]])
        nexts[g] += 1
    body = int(length * 0.75)
    share = max(1, (body - 1) // max(1, len(records)))
    for i, p in enumerate(records):
        at = 1 + i * share + int(rng.integers(0, max(1, share - len(p))))
        if at + len(p) > body:
            break
        toks[at:at + len(p)] = p
    if mix == "vartrack":
        # Every chain and two needles: the walks are what this mix teaches.
        chains = [i for i, q in enumerate(queries) if q[0] > 0]
        order = rng.permutation(chains + [i for i, q in enumerate(queries) if q[0] == 0][:2]).tolist()
    else:
        order = rng.permutation(len(queries)).tolist()
    at = body
    for i in order:
        _, q, a = queries[i]
        seg = q + a + [DOT]
        at += int(rng.integers(0, 8))
        if at + len(seg) > length:
            break
        toks[at:at + len(seg)] = seg
        for j in range(len(a)):
            mask[at + len(q) + j] = 1
        at += len(seg)
    toks[0] = 1
    return toks, mask


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mix", default="ruler", choices=MIXES)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    toks, mask = sequence(np.random.default_rng(args.seed), args.length, args.mix)
    print(" ".join(f"[{VOCAB[t]}]" if m else VOCAB[t] for t, m in zip(toks, mask) if not VOCAB[t].startswith("f")))


if __name__ == "__main__":
    main()
