/**
 * The decode-kernel switches of CudaBackend.setDecodeTuning: their native option codes, the
 * values each takes, and reading them back. DEVICE-NOTES.md measures them.
 */
import { HybridgenError } from "@hybridgen/core";

/**
 * Decode-kernel switches (CudaBackend.setDecodeTuning); DEVICE-NOTES.md measures them. Programmatic
 * launch of every decode kernel, the k-split GEMV and RoPE folded into it measured slower and are
 * gone (sixth pass, pruning); so are the split-K attention's last-block merge, longer minimum
 * chunks and cp.async stages (sixth pass, decode attention).
 */
export interface DecodeTuning {
  /** Split-K decode attention (batch 1): token rows each lane loads per round, K and V each (4 default, or 2; batched attention keeps 2). */
  attnUnroll: 2 | 4;
  /**
   * Decode GEMV of bf16/f16 weights as a weight stream (sm_90+): a persistent block an SM copies
   * weight chunks into a shared-memory ring of this many KB with bulk async copies, started
   * before the kernel before it has finished (programmatic launch). 0: off.
   */
  gemvStream: 0 | 64 | 128 | 192;
  /**
   * Decode attention as one launch (sm_90+): a cluster of blocks a KV head, K/V tiles by bulk
   * async copies, the chunks merged through distributed shared memory; the step's K/V append
   * (and, in a recorded step, its RoPE) folded in. Off by default (falls back where clusters do not run).
   */
  attnCluster: boolean;
  /**
   * The split-K attention's two kernels launched programmatically (PDL), so that the merge and the
   * weight stream after it are scheduled while the split kernel drains (1); 2 (the default): a
   * recorded step's RoPE and K/V append kernels before it too; 0 off.
   */
  attnPdl: 0 | 1 | 2;
  /**
   * Split-K attention with 4 rows a round: a lane's 4 token rows folded into the online softmax
   * together (one rescale a round, not a row). On by default since the eighth pass (8B decode
   * 4.53 vs 4.57 ms at 2K, 5.87 vs 6.07 at 32K on the H200; rounding-level differences only).
   */
  attnGroup: boolean;
  /**
   * The stream GEMV's slot size in KB: 8 or 16, or 0 (the default) to choose per GEMV — 16 KB where
   * a row (SiLU·up: its gate and up chunks) fills 16 KB slots as well as 8 KB ones. Same bits.
   */
  gemvSlotKb: 0 | 8 | 16;
  /**
   * Stream GEMV with a norm: x·nw staged in one pass and the norm's scale applied to each dot
   * product, instead of a second pass over x (rounding-level differences). On by default since the
   * tenth pass (8B decode 4.39 vs 4.41 ms at 2K, 5.69–5.73 vs 5.74–5.76 at 32K on the H200).
   */
  gemvNormFold: boolean;
  /**
   * Stream GEMV of plain rows longer than 16 KB that are a multiple of 7 KB (8B's down: 28 KB rows,
   * which 16 KB slots carry as 16 + 12 KB with one slot a warp): 7 KB slots, as many a warp as
   * shared memory holds (3: a 168 KB ring instead of 112 KB of bytes in flight). Same bits. On by
   * default since the tenth pass (down 30.6 vs 32.4 µs in a graph; 8B decode 4.28 vs 4.33 ms at 2K).
   */
  gemvFillRing: boolean;
  /**
   * Split-K attention (batch 1, bf16/f16 cache, head dim 64 or 128) on tensor cores: q·k and p·v as
   * mma.m16n8k16 products, q and the probabilities split into 16-bit high and low parts (≈ 2⁻¹⁸
   * relative); 2: with twice the splits; 3: each warp's next tile loaded while one is computed; 4
   * (the eleventh pass's default): that with half the splits, one wave of its blocks; 0:
   * the FMA block; 5 (the default since the twelfth pass): 3's grid with 4's chunks, so the live
   * blocks are 3's at 2K and 4's from 8K. On the H200, 8B decode with 4 / 3 / 1 / the FMA block in
   * one run: 4.22 / 4.17 / 4.21 / 4.23 ms at 2K, 4.44 / 4.57 / 4.56 / 4.74 at 8K, 5.28 / 5.44 / 5.68 /
   * 5.62 at 32K (3 was 0.03–0.06 ms faster than 4 at 2K in five runs: DEVICE-NOTES.md).
   */
  attnMma: 0 | 1 | 2 | 3 | 4 | 5;
  /**
   * A recorded step's K/V append (the row copies queued right after its RoPE) run inside the RoPE
   * kernel: the block that rotates a K head writes it to the cache, one more block a copy does V. One
   * kernel and one programmatic boundary less a layer; the same bits. On by default since the
   * eleventh pass (RoPE + append + attention in a graph 10.3 vs 10.5 µs a layer at 2K on the H200).
   */
  ropeAppend: boolean;
  /**
   * The argmax kernel (the greedy pick between decode steps, argmaxRows) reads a row as float4s,
   * 8 loads in flight a thread, instead of one float at a time; the same pick. On by default since
   * the twelfth pass (8B decode 4.26 / 4.48 / 5.30 vs 4.26 / 4.52 / 5.34 ms on the H200).
   */
  argmaxVec: boolean;
  /**
   * One long row's argmax (the greedy pick of a decode step) over many blocks, then one warp over
   * their partials, instead of one block reading the whole row; the same pick. On by default since
   * the thirteenth pass (with feedSide, 8B decode at 2K 4.13–4.14 vs 4.14–4.15 ms on the H200).
   */
  argmaxSplit: boolean;
  /**
   * Greedy decode fed on the device: the pick's copy to the host on a stream of its own, so the
   * next step's upload and graph do not queue behind it. On by default since the thirteenth pass.
   */
  feedSide: boolean;
  /**
   * A stream GEMV's grid: the most blocks, down to 15/16 of the SMs, that split its rows evenly
   * (8B on 132 SMs: 128), instead of one block an SM. The same bits. On by default since the
   * thirteenth pass (8B decode 4.17 / 4.40 / 5.27 vs 4.21 / 4.44 / 5.31 ms on the H200).
   */
  gemvGrid: boolean;
}

/** setDecodeTuning's switches: native option code and the values it takes (codes 0, 2–7, 10–12, 15–18, 20–25, 27–29, 33–35, 39 and 40 are retired). */
export const DECODE_SWITCHES: Record<keyof DecodeTuning, { code: number; values: readonly (number | boolean)[] }> = {
  attnUnroll: { code: 1, values: [2, 4] },
  gemvStream: { code: 8, values: [0, 64, 128, 192] },
  attnCluster: { code: 9, values: [false, true] },
  attnPdl: { code: 13, values: [0, 1, 2] },
  attnGroup: { code: 14, values: [false, true] },
  gemvSlotKb: { code: 19, values: [0, 8, 16] },
  gemvNormFold: { code: 26, values: [false, true] },
  gemvFillRing: { code: 30, values: [false, true] },
  attnMma: { code: 31, values: [0, 1, 2, 3, 4, 5] },
  ropeAppend: { code: 32, values: [false, true] },
  argmaxVec: { code: 36, values: [false, true] },
  argmaxSplit: { code: 37, values: [false, true] },
  feedSide: { code: 38, values: [false, true] },
  gemvGrid: { code: 41, values: [false, true] },
};

/** [native option code, value] for each switch set in `t`; a one-line error for an unknown switch or value. */
export function encodeDecodeTuning(t: Partial<DecodeTuning>): [number, number][] {
  const codes: [number, number][] = [];
  for (const [key, v] of Object.entries(t)) {
    const sw = (DECODE_SWITCHES as Record<string, { code: number; values: readonly (number | boolean)[] }>)[key];
    if (!sw) bad(`setDecodeTuning: unknown switch "${key}" (${Object.keys(DECODE_SWITCHES).join(", ")})`);
    if (v === undefined) continue;
    if (!sw.values.includes(v as number | boolean)) {
      const what = typeof sw.values[0] === "boolean" ? "a boolean" : sw.values.join(", ").replace(/, (\d+)$/, " or $1");
      bad(`setDecodeTuning: ${key} must be ${what}, got ${String(v)}`);
    }
    codes.push([sw.code, typeof v === "boolean" ? (v ? 1 : 0) : (v as number)]);
  }
  return codes;
}

/** The switches in effect, from the library's answer per option code (-1: unknown, the default then). */
export function readDecodeTuning(get: (code: number) => number): DecodeTuning {
  const value = (key: keyof DecodeTuning, dflt: number) => {
    const v = get(DECODE_SWITCHES[key].code);
    return v < 0 ? dflt : v;
  };
  return {
    attnUnroll: value("attnUnroll", 4) === 2 ? 2 : 4,
    gemvStream: value("gemvStream", 0) as DecodeTuning["gemvStream"],
    attnCluster: value("attnCluster", 0) === 1,
    attnPdl: value("attnPdl", 2) as DecodeTuning["attnPdl"],
    attnGroup: value("attnGroup", 1) === 1,
    gemvSlotKb: value("gemvSlotKb", 0) as DecodeTuning["gemvSlotKb"],
    gemvNormFold: value("gemvNormFold", 1) === 1,
    gemvFillRing: value("gemvFillRing", 1) === 1,
    attnMma: value("attnMma", 5) as DecodeTuning["attnMma"],
    ropeAppend: value("ropeAppend", 1) === 1,
    argmaxVec: value("argmaxVec", 1) === 1,
    argmaxSplit: value("argmaxSplit", 1) === 1,
    feedSide: value("feedSide", 1) === 1,
    gemvGrid: value("gemvGrid", 1) === 1,
  };
}

function bad(message: string): never {
  throw new HybridgenError(message, "EBADARG");
}
