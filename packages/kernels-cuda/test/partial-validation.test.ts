/**
 * attnPartial / attnMerge on the CUDA backend against a stand-in for the native library (no GPU
 * needed): bad input is a one-line HybridgenError before native code; good input reaches
 * hg_cu_attn_partial / hg_cu_attn_merge with the tensors' addresses, the shapes and the spans
 * table. The kernels themselves: device/partial-checks.ts on a GPU.
 */
import { describe, expect, it } from "vitest";
import { CudaBackend } from "../src/index.js";
import { STAND_IN_DEVICE, standInNative, type NativeCall } from "./stand-in-native.js";
import { expectOneLineErrors } from "./one-line-errors.js";

function make() {
  const calls: NativeCall[] = [];
  const be = new CudaBackend({ arenaBytes: 1 << 23 }, { lib: standInNative({ calls, heapBytes: 1 << 22 }), device: STAND_IN_DEVICE });
  const ops = () => calls.filter((c) => /^hg_cu_attn_(partial|merge)$/.test(c.name));
  return { be, ops };
}

describe("CudaBackend attnPartial / attnMerge (stand-in native library)", () => {
  it("passes addresses, shapes and the spans through", () => {
    const { be, ops } = make();
    const q = be.alloc([2, 8 * 64]), k = be.alloc([2, 300, 64], "bf16"), v = be.alloc([2, 300, 64], "bf16");
    const part = be.alloc([8, 66]), out = be.alloc([1, 8 * 64]), logits = be.alloc([8, 400]), vals = be.alloc([2, 32, 64], "bf16");
    be.attnPartial(part, q, 1, k, v, Int32Array.of(0, 4, 200, 100, 4, 57), 0.125);
    be.attnMerge(out, 0, part, logits, 4, vals, 0, 32);
    be.attnPartial(part, q, 0, k, v, new Int32Array(0), 0.125);
    const [p, m, empty] = ops();
    expect(p.name).toBe("hg_cu_attn_partial");
    expect(p.args.slice(1, 13)).toEqual([be.address(part), be.address(q) + 8 * 64 * 4, be.address(k), be.address(v), 2, 8, 2, 64, 300, Int32Array.of(0, 4, 200, 100, 4, 57), 3, 0.125]);
    expect(m.args.slice(1, 13)).toEqual([be.address(out), be.address(part), be.address(logits) + 16, 400, be.address(vals), 2, 8, 2, 64, 32, 0, 32]);
    expect(empty.args.slice(10, 12)).toEqual([null, 0]);
    be.close();
  });

  it("attnMergeRows checks each row as attnMerge, refuses rows of another shape, and passes one table of every row's addresses and counts", () => {
    const calls: NativeCall[] = [];
    const be = new CudaBackend({ arenaBytes: 1 << 23 }, { lib: standInNative({ calls, heapBytes: 1 << 22 }), device: STAND_IN_DEVICE });
    const part = [be.alloc([8, 66]), be.alloc([8, 66])], out = be.alloc([2, 8 * 64]), logits = [be.alloc([8, 400]), be.alloc([8, 400])];
    const vals = [be.alloc([2, 32, 64], "bf16"), be.alloc([2, 16, 64], "bf16")];
    const row = (i: number) => ({ out, outRow: i, part: part[i]!, logits: logits[i]!, col: 4 * i, v: vals[i]!, start: 0, count: i === 0 ? 32 : 16 });
    expectOneLineErrors([
      [() => be.attnMergeRows([]), /^attnMergeRows: 1 to 4096 rows are needed$/],
      [() => be.attnMergeRows([row(0), { ...row(1), count: 17 }]), /^attnMerge: tokens 0\.\.17 exceed the cache capacity 16$/],
      [() => be.attnMergeRows([row(0), { ...row(1), logits: be.alloc([8, 300]) }]), /^attnMergeRows: row 1: 8 heads, 2 KV heads, head dim 64, logits 300 wide, V bf16: not row 0's 8, 2, 64, 400, bf16$/],
    ]);
    expect(calls.filter((c) => c.name === "hg_cu_attn_merge_rows")).toEqual([]);
    be.attnMergeRows([row(0), row(1)]);
    const m = calls.filter((c) => c.name === "hg_cu_attn_merge_rows").at(-1)!;
    expect([...(m.args[1] as Float64Array)]).toEqual([
      be.address(out), be.address(part[0]!), be.address(logits[0]!), be.address(vals[0]!), 32, 0, 32,
      be.address(out) + 8 * 64 * 4, be.address(part[1]!), be.address(logits[1]!) + 16, be.address(vals[1]!), 16, 0, 16,
    ]);
    expect(m.args.slice(2)).toEqual([2, 2, 8, 2, 64, 400]);
    be.close();
  });

  it("attnPartialRows checks each row as attnPartial, refuses rows of another shape or scale, and passes one table of every row's addresses and spans", () => {
    const calls: NativeCall[] = [];
    const be = new CudaBackend({ arenaBytes: 1 << 23 }, { lib: standInNative({ calls, heapBytes: 1 << 22 }), device: STAND_IN_DEVICE });
    const q = be.alloc([2, 8 * 64]), part = [be.alloc([8, 66]), be.alloc([8, 66])];
    const k = [be.alloc([2, 300, 64], "bf16"), be.alloc([2, 300, 64], "bf16")], v = [be.alloc([2, 300, 64], "bf16"), be.alloc([2, 300, 64], "bf16")];
    const row = (i: number) => ({ part: part[i]!, q, qRow: i, k: k[i]!, v: v[i]!, spans: i === 0 ? Int32Array.of(0, 4, 200, 100) : Int32Array.of(0, 4, 10, 50, 100, 7), scale: 0.125 });
    expectOneLineErrors([
      [() => be.attnPartialRows([]), /^attnPartialRows: 1 to 4096 rows are needed$/],
      [() => be.attnPartialRows([row(0), { ...row(1), spans: Int32Array.of(290, 20) }]), /^attnPartial: tokens 290\.\.310 exceed the cache capacity 300$/],
      [() => be.attnPartialRows([row(0), { ...row(1), k: be.alloc([2, 200, 64], "bf16"), v: be.alloc([2, 200, 64], "bf16") }]), /^attnPartialRows: row 1: 8 heads, 2 KV heads, head dim 64, cap 200, K bf16, scale 0\.125: not row 0's 8, 2, 64, 300, bf16, 0\.125$/],
      [() => be.attnPartialRows([row(0), { ...row(1), scale: 0.5 }]), /^attnPartialRows: row 1: .*scale 0\.5: not row 0's .*0\.125$/],
    ]);
    expect(calls.filter((c) => c.name === "hg_cu_attn_partial_rows")).toEqual([]);
    be.attnPartialRows([row(0), row(1)]);
    const m = calls.filter((c) => c.name === "hg_cu_attn_partial_rows").at(-1)!;
    expect([...(m.args[1] as Float64Array)]).toEqual([
      be.address(part[0]!), be.address(q), be.address(k[0]!), be.address(v[0]!), 0, 4, 200, 100, 0, 0, 0, 0,
      be.address(part[1]!), be.address(q) + 8 * 64 * 4, be.address(k[1]!), be.address(v[1]!), 0, 4, 10, 50, 100, 7, 0, 0,
    ]);
    expect(m.args.slice(2)).toEqual([2, 2, 8, 2, 64, 300, 0.125]);
    be.close();
  });

  it("appendKvRows checks each row's windows, new rows and slot, refuses windows of another shape, and passes one table of addresses and slots", () => {
    const calls: NativeCall[] = [];
    const be = new CudaBackend({ arenaBytes: 1 << 23 }, { lib: standInNative({ calls, heapBytes: 1 << 22 }), device: STAND_IN_DEVICE });
    const kv = be.alloc([2, 2 * 64]), wk = [be.alloc([2, 300, 64], "bf16"), be.alloc([2, 300, 64], "bf16")], wv = [be.alloc([2, 300, 64], "bf16"), be.alloc([2, 300, 64], "bf16")];
    const kNew = [be.view(kv, 0, [2, 64]), be.view(kv, 128, [2, 64])], vNew = [be.alloc([2, 64]), be.alloc([2, 64])];
    const row = (i: number) => ({ k: wk[i]!, v: wv[i]!, slot: 7 + i, kNew: kNew[i]!, vNew: vNew[i]! });
    expectOneLineErrors([
      [() => be.appendKvRows([]), /^appendKvRows: 1 to 4096 rows are needed$/],
      [() => be.appendKvRows([row(0), { ...row(1), slot: 300 }]), /^appendKvRows: row 1: slot 300 out of range \[0, 300\)$/],
      [() => be.appendKvRows([row(0), { ...row(1), kNew: be.alloc([2, 64], "bf16") }]), /^appendKvRows: row 1: kNew must be f32, got bf16$/],
      [() => be.appendKvRows([row(0), { ...row(1), v: be.alloc([2, 300, 64], "f16") }]), /^appendKvRows: row 1: the windows K .* and V .* must be one \[kvHeads, cap, headDim\] shape and dtype$/],
      [() => be.appendKvRows([row(0), { ...row(1), k: be.alloc([2, 200, 64], "bf16"), v: be.alloc([2, 200, 64], "bf16") }]), /^appendKvRows: row 1: window .* is not row 0's \[2, 300, 64\] bf16$/],
    ]);
    expect(calls.filter((c) => c.name === "hg_cu_window_append_rows")).toEqual([]);
    be.appendKvRows([row(0), row(1)]);
    const m = calls.filter((c) => c.name === "hg_cu_window_append_rows").at(-1)!;
    expect([...(m.args[1] as Float64Array)]).toEqual([
      be.address(wk[0]!), be.address(wv[0]!), be.address(kv), be.address(vNew[0]!), 7,
      be.address(wk[1]!), be.address(wv[1]!), be.address(kv) + 128 * 4, be.address(vNew[1]!), 8,
    ]);
    expect(m.args.slice(2)).toEqual([2, 2, 2, 64, 300]);
    be.close();
  });

  it("refuses bad input before native code", () => {
    const { be, ops } = make();
    const q = be.alloc([1, 4 * 16]), k = be.alloc([2, 20, 16], "f16"), part = be.alloc([4, 18]), out = be.alloc([1, 64]), logits = be.alloc([4, 10]);
    const big = be.alloc([1, 2, 300]), bigPart = be.alloc([2, 302]), bigQ = be.alloc([1, 600]);
    const cases: [() => void, RegExp][] = [
      [() => be.attnPartial(part, q, 0, k, k, Int32Array.of(0, 5, 1), 1), /^attnPartial: spans must be an Int32Array of start, count pairs \(at most 4\)$/],
      [() => be.attnPartial(part, q, 0, k, k, Int32Array.of(18, 3), 1), /^attnPartial: tokens 18\.\.21 exceed the cache capacity 20$/],
      [() => be.attnPartial(be.alloc([4, 16]), q, 0, k, k, Int32Array.of(0, 1), 1), /^attnPartial: part f32\[4x16\] must be \[4, 18\]/],
      [() => be.attnPartial(part, q, 1, k, k, Int32Array.of(0, 1), 1), /^attnPartial: q row 1 is outside/],
      [() => be.attnPartial(part, q, 0, k, be.alloc([2, 20, 16], "bf16"), Int32Array.of(0, 1), 1), /^attnPartial: v .* must have the shape and dtype of k/],
      [() => be.attnPartial(part, q, 0, k, k, Int32Array.of(0, 1), Number.NaN), /^attnPartial: scale NaN is not finite$/],
      [() => be.attnPartial(bigPart, bigQ, 0, big, big, Int32Array.of(0, 1), 1), /^attnPartial: head dim 300 exceeds the kernels' limit of 256$/],
      [() => be.attnMerge(out, 0, part, logits, 8, k, 0, 3), /^attnMerge: columns 8\.\.11 exceed logits width 10$/],
      [() => be.attnMerge(out, 0, part, logits, 0, k, 19, 3), /^attnMerge: tokens 19\.\.22 exceed the cache capacity 20$/],
      [() => be.attnMerge(out, 1, part, logits, 0, k, 0, 3), /^attnMerge: out row 1 is outside/],
      [() => be.attnMerge(out, 0, be.alloc([3, 18]), logits, 0, k, 0, 3), /^attnMerge: part f32\[3x18\] must be \[4, 18\]/],
    ];
    expectOneLineErrors(cases);
    expect(ops()).toEqual([]);
    be.close();
  });
});
