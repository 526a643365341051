/**
 * Batched decode on the CUDA backend against a stand-in for the native library (no GPU needed):
 * attnDecodeBatch refuses bad input before native code, hands the batched kernel a table of the
 * rows' cache addresses and spans, and runs the per-row calls where the batched kernel does not
 * apply; the skinny GEMM path is selectable and reported. The kernels themselves are checked on
 * a GPU by device/batch-bench.ts.
 */
import { describe, expect, it } from "vitest";
import { type BatchAttnRow } from "@hybridgen/spec";
import { ReferenceBackend } from "@hybridgen/spec/kit";
import { CudaBackend } from "../src/index.js";
import { STAND_IN_DEVICE, standInNative, type NativeCall } from "./stand-in-native.js";
import { expectOneLineErrors } from "./one-line-errors.js";
import { cudaLab } from "../src/lab.js";

const device = STAND_IN_DEVICE;

function make(splitK = true) {
  const calls: NativeCall[] = [];
  const answers: Record<string, number> = { hg_cu_attn_decode_path: splitK ? 1 : 0, hg_cu_matmul_path_for: 3 };
  const lib = standInNative({ calls, heapBytes: 1 << 22, answer: (name) => answers[name] });
  const be = new CudaBackend({ arenaBytes: 1 << 23 }, { lib, device });
  const ops = () => calls.filter((c) => /^hg_cu_(attn|copy)/.test(c.name) && !c.name.endsWith("_path"));
  return { be, calls, ops };
}

/** 3 rows, 4 query heads over 2 KV heads of dim 8, caches of 16 (row 2: 24) slots in bf16. */
function setup(be: CudaBackend) {
  const B = 3, heads = 4, kvHeads = 2, hd = 8;
  const q = be.alloc([B, heads * hd]), out = be.alloc([B, heads * hd]);
  const k = be.alloc([B, kvHeads * hd]), v = be.alloc([B, kvHeads * hd]);
  const caps = [16, 16, 24];
  const caches = caps.map((cap) => ({ k: be.alloc([kvHeads, cap, hd], "bf16"), v: be.alloc([kvHeads, cap, hd], "bf16") }));
  const rows: BatchAttnRow[] = caches.map((c, i) => ({ kCache: c.k, vCache: c.v, start: i, slot: i + 5 + i, firstPos: 5 + i }));
  return { B, heads, kvHeads, hd, q, out, k, v, caps, caches, rows };
}

describe("CudaBackend.attnDecodeBatch (stand-in native library)", () => {
  it("passes one table of the rows' cache addresses, capacities, slots and spans to the batched kernel", () => {
    const { be, ops } = make();
    const s = setup(be);
    be.attnDecodeBatch(s.out, s.q, s.k, s.v, s.rows, 0.25);
    const [call, ...rest] = ops();
    expect(rest).toEqual([]);
    expect(call.name).toBe("hg_cu_attn_decode_batch");
    expect(call.args.slice(1, 10)).toEqual([be.address(s.out), be.address(s.q), be.address(s.k), be.address(s.v), 2, s.B, s.heads, s.kvHeads, s.hd]);
    expect(call.args[11]).toBe(0.25);
    const t = call.args[10] as Int32Array;
    s.rows.forEach((r, i) => {
      const ka = be.address(r.kCache), va = be.address(r.vCache);
      const row = Array.from(t.subarray(8 * i, 8 * i + 8));
      expect(row[0] >>> 0).toBe(ka % 2 ** 32);
      expect(row[1]).toBe(Math.floor(ka / 2 ** 32));
      expect(row[2] >>> 0).toBe(va % 2 ** 32);
      expect(row[3]).toBe(Math.floor(va / 2 ** 32));
      expect(row.slice(4)).toEqual([s.caps[i], r.slot, r.start, r.firstPos + 1]);
    });
    be.close();
  });

  it("runs the rows one by one (a copy per KV head for K and V, then one-row attention) when switched off or without the split-K kernel", () => {
    for (const [splitK, batched] of [[true, false], [false, true]] as const) {
      const { be, ops } = make(splitK);
      const s = setup(be);
      cudaLab(be).setBatchAttention(batched);
      be.attnDecodeBatch(s.out, s.q, s.k, s.v, s.rows, 0.5);
      const got = ops();
      expect(got.map((c) => c.name)).toEqual(s.rows.flatMap(() => [...Array(2 * s.kvHeads).fill("hg_cu_copy"), "hg_cu_attn_decode"]));
      // Row 2's V copy of KV head 1: cache element (1·cap + slot)·hd from k/v row element 2·kvw + hd (bf16 ← f32).
      const per = 2 * s.kvHeads + 1, r = s.rows[2], cap = s.caps[2];
      const vCopy = got[2 * per + 3];
      expect(vCopy.args.slice(1, 6)).toEqual([be.address(r.vCache) + (cap + r.slot) * s.hd * 2, 2, be.address(s.v) + (2 * s.kvHeads * s.hd + s.hd) * 4, 0, s.hd]);
      const attn = got[2 * per + 2 * s.kvHeads];
      expect(attn.args.slice(1, 13)).toEqual([be.address(s.out) + 2 * s.heads * s.hd * 4, be.address(s.q) + 2 * s.heads * s.hd * 4, be.address(r.kCache), be.address(r.vCache), 2, s.heads, s.kvHeads, s.hd, cap, r.start, r.firstPos, 0.5]);
      be.close();
    }
  });

  it("refuses bad input with one line before any native call", () => {
    const { be, ops } = make();
    const s = setup(be);
    const ref = new ReferenceBackend();
    const foreign = ref.alloc([2, 16, 8], "bf16");
    const f16 = be.alloc([2, 16, 8], "f16");
    const wide = be.alloc([4, 16, 8], "bf16");
    const row = (i: number, patch: Partial<BatchAttnRow>): BatchAttnRow[] => s.rows.map((r, j) => (j === i ? { ...r, ...patch } : r));
    const cases: [() => void, RegExp][] = [
      [() => be.attnDecodeBatch(s.out, s.q, s.k, s.v, [], 1), /attnDecodeBatch: 0 rows, the kernels take 1\.\.64/],
      [() => be.attnDecodeBatch(s.out, s.q, s.k, s.v, Array(65).fill(s.rows[0]), 1), /65 rows/],
      [() => be.attnDecodeBatch(s.out, s.q, s.k, s.v, row(1, { slot: 16 }), 1), /rows\[1\] slot 16 is outside the cache capacity 16/],
      [() => be.attnDecodeBatch(s.out, s.q, s.k, s.v, row(0, { start: 10, firstPos: 6 }), 1), /rows\[0\] keys at slots 10\.\.16 exceed the cache capacity 16/],
      [() => be.attnDecodeBatch(s.out, s.q, s.k, s.v, row(2, { firstPos: -1 }), 1), /rows\[2\] slot, start and firstPos must be non-negative integers/],
      [() => be.attnDecodeBatch(s.out, s.q, s.k, s.v, row(1, { kCache: f16, vCache: f16 }), 1), /rows\[1\]\.kCache f16\[2x16x8\] must be bf16\[2, cap, 8\]/],
      [() => be.attnDecodeBatch(s.out, s.q, s.k, s.v, row(1, { kCache: wide }), 1), /rows\[1\]\.kCache bf16\[4x16x8\] must be bf16\[2, cap, 8\]/],
      [() => be.attnDecodeBatch(s.out, s.q, s.k, s.v, row(2, { vCache: s.caches[0].v }), 1), /rows\[2\]\.vCache .* must have the shape and dtype of its kCache/],
      [() => be.attnDecodeBatch(s.out, s.q, s.k, s.v, row(0, { kCache: foreign }), 1), /rows\[0\]\.kCache belongs to backend 'reference'/],
      [() => be.attnDecodeBatch(s.out, s.q, s.q, s.v, s.rows, 1), /k and v rows must have 16 values/],
      [() => be.attnDecodeBatch(s.out, s.q, s.k, s.v, s.rows, Number.NaN), /scale NaN is not finite/],
      [() => be.attnDecodeBatch(s.q, s.q, s.k, s.v, s.rows, 1), /out must not overlap q, k or v/],
      [() => be.attnDecodeBatch(be.view(s.out, 0, [2, 32]), s.q, s.k, s.v, s.rows, 1), /out .* has 2 rows, 3 requested/],
    ];
    expectOneLineErrors(cases);
    expect(ops()).toEqual([]);
    be.close();
    ref.close();
  });
});

describe("CudaBackend skinny GEMM path (stand-in native library)", () => {
  it("setMatmulPath('skinny') passes path 3; matmulPathFor asks the native side with the weight dtype", () => {
    const { be, calls } = make();
    const x = be.alloc([4, 64]), w = be.alloc([48, 64], "bf16"), out = be.alloc([4, 48]);
    cudaLab(be).setMatmulPath("skinny");
    be.matmul(out, x, w, 4);
    expect(calls.find((c) => c.name === "hg_cu_matmul")!.args[10]).toBe(3);
    expect(cudaLab(be).matmulPathFor(16, "bf16", 64)).toBe("skinny");
    expect(calls.find((c) => c.name === "hg_cu_matmul_path_for")!.args.slice(1)).toEqual([16, 2, 64]);
    expect(cudaLab(be).matmulPathFor(16)).toBe("cublas");
    expect(() => cudaLab(be).setMatmulPath("fast" as "auto")).toThrow(/unknown path 'fast' \(auto, gemv, cublas, tiled, skinny\)/);
    be.close();
  });
});

describe("CudaBackend.setSkinny and matmulSplit (stand-in native library)", () => {
  /** [q, k, v] outputs of 3 rows over a fused bf16 weight [48 + 16 + 16, 64] with a bias. */
  function splitSetup(be: CudaBackend) {
    const n = 3, k = 64;
    const x = be.alloc([4, k]), w = be.alloc([80, k], "bf16"), bias = be.alloc([80]);
    const q = be.alloc([4, 48]), kk = be.alloc([4, 16]), v = be.alloc([4, 16]);
    return { n, k, x, w, bias, q, kk, v };
  }

  it("the measured defaults reach the library at creation; split off declines; on, one hg_cu_matmul_rows call with the outputs, widths and accumulate flag", () => {
    const { be, calls } = make();
    const s = splitSetup(be);
    expect(cudaLab(be).skinny()).toEqual({ maxRows: 8, fusedReduce: true, split: true });
    expect(calls.filter((c) => c.name === "hg_cu_set_skinny").map((c) => c.args.slice(1))).toEqual([[8, 2]]);
    cudaLab(be).setSkinny({ split: false });
    expect(be.matmulSplit([s.q, s.kk, s.v], s.x, s.w, s.n, s.bias, false)).toBe(false);
    expect(calls.some((c) => c.name === "hg_cu_matmul_rows")).toBe(false);
    cudaLab(be).setSkinny({ split: true, fusedReduce: false, maxRows: 16 });
    expect(calls.filter((c) => c.name === "hg_cu_set_skinny").at(-1)!.args.slice(1)).toEqual([16, 0]);
    cudaLab(be).setSkinny({ fusedReduce: true });
    expect(calls.filter((c) => c.name === "hg_cu_set_skinny").at(-1)!.args.slice(1)).toEqual([16, 2]);
    expect(cudaLab(be).skinny()).toEqual({ maxRows: 16, fusedReduce: true, split: true });
    expect(be.matmulSplit([s.q, s.kk, s.v], s.x, s.w, s.n, s.bias, false)).toBe(true);
    const call = calls.find((c) => c.name === "hg_cu_matmul_rows")!;
    expect(call.args.slice(1, 15)).toEqual([
      be.address(s.q), be.address(s.kk), be.address(s.v), 48, 16, 16, 0, be.address(s.x), be.address(s.w), 2, be.address(s.bias), 0, s.n, s.k,
    ]);
    // One output with the residual add; no bias.
    const x2 = be.alloc([4, 80]);
    const wo = be.alloc([64, 80], "f16");
    expect(be.matmulSplit([s.x], x2, wo, s.n, undefined, true)).toBe(true);
    expect(calls.filter((c) => c.name === "hg_cu_matmul_rows").at(-1)!.args.slice(1, 15)).toEqual([
      be.address(s.x), null, null, 64, 0, 0, 1, be.address(x2), be.address(wo), 1, null, 0, s.n, 80,
    ]);
    be.close();
    // close() puts the library's entry for this context back to the defaults.
    expect(calls.filter((c) => c.name === "hg_cu_set_skinny").at(-1)!.args.slice(1)).toEqual([32, 0]);
  });

  it("declines f32 weights, one row, rows above maxRows and a forced non-skinny path", () => {
    const { be, calls } = make();
    const s = splitSetup(be);
    cudaLab(be).setSkinny({ split: true, maxRows: 2 });
    const wf = be.alloc([80, s.k]);
    expect(be.matmulSplit([s.q, s.kk, s.v], s.x, wf, s.n, undefined, false)).toBe(false);
    expect(be.matmulSplit([s.q, s.kk, s.v], s.x, s.w, 1, undefined, false)).toBe(false);
    expect(be.matmulSplit([s.q, s.kk, s.v], s.x, s.w, 3, undefined, false)).toBe(false); // 3 > maxRows
    cudaLab(be).setMatmulPath("skinny");
    expect(be.matmulSplit([s.q, s.kk, s.v], s.x, s.w, 3, undefined, false)).toBe(true); // forced
    cudaLab(be).setMatmulPath("cublas");
    expect(be.matmulSplit([s.q, s.kk, s.v], s.x, s.w, 2, undefined, false)).toBe(false);
    expect(calls.filter((c) => c.name === "hg_cu_matmul_rows")).toHaveLength(1);
    be.close();
  });

  it("bad input: one-line errors before any native call", () => {
    const { be, calls } = make();
    const s = splitSetup(be);
    cudaLab(be).setSkinny({ split: true });
    const wide = be.alloc([4, 20]), half = be.alloc([4, 48], "bf16"), shortBias = be.alloc([79]);
    const cases: [() => unknown, RegExp][] = [
      [() => be.matmulSplit([], s.x, s.w, s.n, undefined, false), /matmulSplit: 1 to 3 outputs, got 0/],
      [() => be.matmulSplit([s.q, s.kk, s.v, s.v], s.x, s.w, s.n, undefined, false), /1 to 3 outputs, got 4/],
      [() => be.matmulSplit([s.q, s.kk, wide], s.x, s.w, s.n, undefined, false), /widths 48 \+ 16 \+ 20 must add up to w's 80 rows/],
      [() => be.matmulSplit([half, s.kk, s.v], s.x, s.w, s.n, undefined, false), /outs\[0\] must be f32, got bf16/],
      [() => be.matmulSplit([s.q, s.kk, s.v], s.x, s.w, 5, undefined, false), /x .* has 4 rows, 5 requested/],
      [() => be.matmulSplit([s.q, s.kk, s.v], s.x, s.w, s.n, shortBias, false), /bias .* must have m=80 elements/],
      [() => be.matmulSplit([s.q, s.q, s.v], s.x, s.w, s.n, undefined, false), /widths|outs\[1\] must not overlap outs\[0\]/],
      [() => be.matmulSplit([s.q, s.kk, s.kk], s.x, s.w, s.n, undefined, false), /outs\[2\] must not overlap outs\[1\]/],
      [() => be.matmulSplit([s.x], s.x, be.alloc([64, 64], "bf16"), s.n, undefined, true), /outs\[0\] must not overlap x/],
      [() => cudaLab(be).setSkinny({ maxRows: 33 }), /setSkinny: maxRows must be an integer in 1\.\.32, got 33/],
      [() => cudaLab(be).setSkinny({ fusedReduce: 1 as unknown as boolean }), /setSkinny: fusedReduce must be a boolean, got 1/],
      // the retired pipelined kernel's switches
      [() => cudaLab(be).setSkinny({ pipeline: true } as never), /setSkinny: unknown option "pipeline" \(maxRows, fusedReduce, split\)/],
      [() => cudaLab(be).setSkinny({ pipelineMinRows: 2 } as never), /setSkinny: unknown option "pipelineMinRows"/],
    ];
    expectOneLineErrors(cases);
    expect(calls.filter((c) => c.name === "hg_cu_matmul_rows")).toHaveLength(0);
    be.close();
  });
});

describe("CudaBackend.argmaxRows (stand-in native library)", () => {
  it("one hg_cu_argmax_rows call with x, n, the row width, a device scratch and the caller's array; bad input refused first", () => {
    const { be, calls } = make();
    const x = be.alloc([8, 1000]), out = new Int32Array(8);
    be.argmaxRows(x, 6, out);
    const call = calls.find((c) => c.name === "hg_cu_argmax_rows")!;
    expect(call.args.slice(1, 4)).toEqual([be.address(x), 6, 1000]);
    expect(call.args[5]).toBeInstanceOf(Int32Array); // the caller's array (the stand-in keeps a copy)
    expect((call.args[5] as Int32Array).length).toBe(8);
    expect(be.liveTensors).toBe(1); // the scratch is internal
    expectOneLineErrors([
      [() => be.argmaxRows(x, 9, new Int32Array(9)), /argmaxRows: x .* has 8 rows, 9 requested/],
      [() => be.argmaxRows(x, 4, new Int32Array(3)), /argmaxRows: out must be an Int32Array of at least 4 values/],
      [() => be.argmaxRows(be.alloc([2, 4], "bf16"), 2, new Int32Array(2)), /argmaxRows: x must be f32, got bf16/],
    ]);
    expect(calls.filter((c) => c.name === "hg_cu_argmax_rows")).toHaveLength(1);
    be.close();
  });
});
