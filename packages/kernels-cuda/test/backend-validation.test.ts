/**
 * The CUDA backend's validation layer against a stand-in for the native library (no GPU
 * needed): bad input is a one-line HybridgenError and never reaches native code; good input
 * reaches it with the right addresses and sizes; native failures become "CUDA error in <op>".
 */
import { describe, expect, it } from "vitest";
import { HybridgenError } from "@hybridgen/spec";
import { ReferenceBackend } from "@hybridgen/spec/kit";
import { CudaBackend, createCudaBackend, cudaAvailability, type CudaNative } from "../src/index.js";
import { MAX_GRAPH_KEYS } from "../src/cuda-backend.js";
import { STAND_IN_DEVICE, STAND_IN_HEAP, standInNative, type NativeCall } from "./stand-in-native.js";
import { cudaLab } from "../src/lab.js";

const HEAP = STAND_IN_HEAP;
const device = STAND_IN_DEVICE;

/** Whether the stand-in's weight stream takes a norm offered with matvec's epilogue bit 4 (else -1: declined). */
let streamTakesNorm = false;

/** The stand-in library, with `fail` answering those symbols (a failure code) instead. */
function fakeNative(calls: NativeCall[], fail: Record<string, number> = {}): CudaNative {
  return standInNative({
    calls,
    answer: (name, args) => {
      if (name in fail) return fail[name];
      if (name === "hg_cu_matvec_max_norm_k") return 57344;
      if (name === "hg_cu_matvec" && ((args[12] as number) & 4) !== 0) return streamTakesNorm ? 0 : -1;
      return undefined;
    },
  });
}

function make(fail: Record<string, number> = {}) {
  const calls: NativeCall[] = [];
  const be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib: fakeNative(calls, fail), device });
  const opCalls = () => calls.filter((c) => !/^hg_cu_(create|heap|arena|num_sms|cublas_info|memset0|write|error_string|set_skinny)/.test(c.name));
  return { be, calls, opCalls };
}

describe("CudaBackend validation (stand-in native library)", () => {
  it("createCudaBackend on a machine without a GPU throws the availability reason", () => {
    const a = cudaAvailability();
    if (a.available) return; // a GPU machine: gpu.test.ts covers it
    expect(() => createCudaBackend()).toThrow(HybridgenError);
    expect(() => createCudaBackend()).toThrow(/^CUDA unavailable: /);
  });

  it("rejects bad input before any native op call", () => {
    const { be, opCalls } = make();
    const x = be.alloc([4, 64]);
    const w = be.alloc([32, 64], "bf16");
    const out = be.alloc([4, 32]);
    const k = be.alloc([2, 100, 16], "f16");
    const lg = be.alloc([4, 120]);
    const q = be.alloc([1, 64]);
    const ref = new ReferenceBackend();
    const foreign = ref.alloc([4, 64]);
    const cases: [() => void, RegExp][] = [
      [() => be.matmul(out, x, w, 5), /matmul: x f32\[4x64\] has 4 rows, 5 requested/],
      [() => be.matmul(out, out, w, 1), /x rows have 32 values but w bf16\[32x64\] expects k=64/],
      [() => be.matmul(out, foreign, w, 1), /x belongs to backend 'reference'/],
      [() => be.matmul(out, x, w, 1, x), /bias f32\[4x64\] must have m=32 elements/],
      [() => be.matmul(w, x, w, 1), /out must be f32, got bf16/],
      [() => be.embedding(x, be.alloc([10, 64], "bf16"), Int32Array.of(3, 10)), /id 10 at position 1 is outside the table's 10 rows/],
      [() => be.rmsNorm(x, x, be.alloc([63]), 1, 1e-5), /weight f32\[63\] must have 64 elements/],
      [() => be.rmsNorm(x, x, be.alloc([64]), 1, -1), /eps -1 must be >= 0/],
      [() => be.softmax(lg, 5, 10), /has 4 rows, 5 requested/],
      [() => be.softmax(lg, 1, 121), /121 columns requested/],
      [() => be.argmax(lg, 4), /row 4 is outside/],
      [() => be.rope(x, 1, Int32Array.of(9), 4, 16, be.alloc([8, 8]), be.alloc([8, 8])), /position 9 of row 0 is outside the tables' 8 positions/],
      [() => be.rope(x, 1, Int32Array.of(0), 4, 16, be.alloc([8, 9]), be.alloc([8, 9])), /rotary width 18 exceeds headDim 16/],
      [() => be.attnLogits(lg, 0, q, 0, k, 90, 20, 1), /tokens 90..110 exceed the cache capacity 100/],
      [() => be.attnLogits(lg, 110, q, 0, k, 0, 20, 1), /columns 110..130 exceed logits width 120/],
      [() => be.attnLogits(lg, 0, q, 1, k, 0, 20, 1), /q row 1 is outside/],
      [() => be.attnLogitsGather(lg, 0, q, 0, k, Int32Array.of(1, 100), 1), /slot 100 at index 1 is outside the cache capacity 100/],
      [() => be.attnAggregateGather(q, 0, lg, 0, k, Int32Array.of(-1), false), /slot -1 at index 0/],
      [() => be.attnAggregate(q, 0, lg, 0, be.alloc([3, 100, 16]), 0, 5, false), /4 query heads are not a multiple of 3 KV heads/],
      [() => be.copyRows(out, 0, x, 0, 1), /row widths differ/],
      [() => be.copyRows(be.alloc([4, 64], "bf16"), 0, be.alloc([4, 64], "f16"), 0, 1), /cannot convert f16 rows to bf16/],
      [() => be.copyRows(x, 3, x, 0, 2), /dst rows 3..5 exceed 4 rows/],
      [() => be.write(x, new Float32Array(10), 250), /10 values at offset 250 do not fit/],
      [() => be.read(x, 200, 100), /100 values at offset 200 are outside/],
      [() => be.view(x, 200, [100]), /100 elements at offset 200 are outside/],
      [() => be.alloc([2, 0]), /dimension that is not a positive integer/],
      [() => be.alloc([2], "f64" as never), /unknown dtype 'f64'/],
      [() => be.loadWeight(new Uint8Array(10), "bf16", [2, 3]), /bf16\[2x3\] needs 12 bytes, got 10/],
      [() => cudaLab(be).setMatmulPath("fast" as never), /unknown path 'fast'/],
    ];
    for (const [fn, msg] of cases) {
      expect(fn, String(msg)).toThrow(HybridgenError);
      expect(fn).toThrow(msg);
    }
    expect(opCalls()).toEqual([]);
    be.free(x);
    expect(() => be.free(x)).toThrow(/already freed/);
    expect(() => be.relu(x, 1)).toThrow(/x was freed/);
    const v = be.view(out, 32, [1, 32]);
    be.free(out);
    expect(() => be.relu(v, 1)).toThrow(/its base tensor was/);
    expect(opCalls()).toEqual([]);
    be.close();
    expect(() => be.alloc([1])).toThrow(/CudaBackend is closed/);
    ref.close();
  });

  it("passes device addresses and sizes through, and accounts for memory", () => {
    const { be, calls } = make();
    const x = be.alloc([2, 64]);
    const w = be.alloc([48, 64], "bf16");
    const out = be.alloc([2, 48]);
    expect(be.memory()).toMatchObject({ usedBytes: 512 + 6144 + 512, liveBlocks: 3, capacityBytes: 1 << 20 });
    be.matmul(out, x, w, 2);
    const mm = calls.find((c) => c.name === "hg_cu_matmul")!;
    expect(mm.args.slice(1, 5)).toEqual([be.address(out), be.address(x), be.address(w), 2]);
    expect(mm.args.slice(6, 11)).toEqual([0, 2, 64, 48, -1]);
    expect(be.address(x)).toBe(HEAP);
    const row1 = be.view(x, 64, [1, 64]);
    expect(be.address(row1)).toBe(HEAP + 256);
    expect(() => be.alloc([1 << 20])).toThrow(/^CUDA out of memory: alloc of f32\[1048576\] needs 4194304 bytes, but the device arena has \d+ bytes free of 1048576$/);
    be.free(w);
    expect(be.memory().liveBlocks).toBe(2);
    be.close();
  });

  it("turns a native failure into 'CUDA error in <op>', and a lost context into a refusal", () => {
    const { be } = make({ hg_cu_add: 1, hg_cu_relu: 700 });
    const x = be.alloc([1, 8]);
    expect(() => be.add(x, x, x, 1)).toThrow(/^CUDA error in add: cudaErrorFake1: fake failure$/);
    be.gelu(x, 1); // a launch error leaves the backend usable
    expect(() => be.relu(x, 1)).toThrow(/^CUDA error in relu: cudaErrorFake700: fake failure \(the CUDA context is lost; restart the process\)$/);
    expect(() => be.gelu(x, 1)).toThrow(/gelu: the CUDA backend is unusable after an earlier error \(relu: cudaErrorFake700/);
    be.close();
  });

  it("the side stream: beginSide / endSide / joinSide reach hg_cu_side as ops 0 / 1 / 2; its failure is 'CUDA error in <op>'", () => {
    const { be, calls } = make();
    be.beginSide();
    be.endSide();
    be.joinSide();
    expect(calls.filter((c) => c.name === "hg_cu_side").map((c) => c.args[1])).toEqual([0, 1, 2]);
    be.close();
    const failing = make({ hg_cu_side: 1 }).be;
    expect(() => failing.beginSide()).toThrow(/^CUDA error in beginSide: cudaErrorFake1: fake failure$/);
    failing.close();
  });

  it("reports a failed context creation with the device and the reason", () => {
    const calls: NativeCall[] = [];
    const lib = fakeNative(calls);
    (lib as unknown as Record<string, unknown>).hg_cu_create = (...args: unknown[]) => {
      (args[5] as Uint8Array).set(new TextEncoder().encode("an arena of 99 bytes was requested, but device 0 has 7 bytes free\0"));
      return null;
    };
    expect(() => new CudaBackend({}, { lib, device })).toThrow(/^CUDA backend on device 0 \(Stand-in GPU\): an arena of 99 bytes was requested, but device 0 has 7 bytes free$/);
  });

  it("hands a graph slot to a new key clean: the previous key's graph and skip counter are forgotten", () => {
    const { be, calls } = make();
    const slotOf = (key: string) => {
      be.beginStep(key);
      be.endStep();
      const begins = calls.filter((c) => c.name === "hg_cu_step_begin");
      return begins[begins.length - 1].args[1] as number;
    };
    const N = MAX_GRAPH_KEYS;
    const keys = Array.from({ length: N + 2 }, (_, i) => `decode-${i}`);
    const slots = keys.map(slotOf);
    expect(slots).toEqual([...Array.from({ length: N }, (_, i) => i), 0, 1]);
    // the first N keys took fresh slots; keys N and N + 1 took over slots 0 and 1 and reset them
    expect(calls.filter((c) => c.name === "hg_cu_step_forget").map((c) => c.args[1])).toEqual([0, 1]);
    // a key keeps its slot while it owns it; an evicted key gets a fresh (reset) slot
    expect(slotOf(`decode-${N + 1}`)).toBe(1);
    expect(slotOf("decode-0")).toBe(2);
    expect(calls.filter((c) => c.name === "hg_cu_step_forget").map((c) => c.args[1])).toEqual([0, 1, 2]);
    be.close();
  });

  it("matvec (fused decode GEMV): bad input is refused before native code; good input passes its flags", () => {
    const { be, calls, opCalls } = make();
    const x = be.alloc([2, 64]), out = be.alloc([1, 32]), out16 = be.alloc([1, 16]);
    const w = be.alloc([32, 64], "bf16"), nw = be.alloc([64], "bf16"), bias = be.alloc([32]);
    const before = opCalls().length;
    const cases: [() => void, RegExp][] = [
      [() => be.matvec(out, be.alloc([1, 63]), w, {}), /^matvec: x rows have 63 values but w bf16\[32x64\] expects k=64$/],
      [() => be.matvec(out16, x, w, {}), /^matvec: out rows have 16 values but the result has 32$/],
      [() => be.matvec(out, x, w, { siluMul: true }), /^matvec: out rows have 32 values but the result has 16$/],
      [() => be.matvec(out, x, be.alloc([31, 64], "bf16"), { siluMul: true }), /siluMul needs w with an even row count/],
      [() => be.matvec(out, x, w, { normWeight: be.alloc([32]), normEps: 1e-5 }), /normWeight f32\[32\] must have 64 elements/],
      [() => be.matvec(out, x, w, { normWeight: nw }), /normEps undefined must be a number >= 0/],
      [() => be.matvec(out, x, w, { bias: be.alloc([16]) }), /bias f32\[16\] must have 32 elements/],
      [() => be.matvec(be.view(x, 0, [1, 32]), x, w, {}), /out must not overlap x/],
    ];
    for (const [f, re] of cases) expect(f).toThrow(re);
    expect(opCalls().length).toBe(before + 0);
    // The default: the norm offered to the weight stream (epilogue bit 4); declined, it runs as
    // its own kernel into the scratch, SiLU·up and += in the GEMV.
    streamTakesNorm = true;
    let from = calls.length;
    be.matvec(out16, x, w, { bias, normWeight: nw, normEps: 1e-5, siluMul: true, accumulate: true });
    expect(calls.slice(from).filter((c) => /^hg_cu_(rmsnorm|matvec)$/.test(c.name)).map((c) => [c.name, c.args.slice(7)])).toEqual([["hg_cu_matvec", [be.address(nw), 2, 1e-5, 64, 16, 7]]]);
    streamTakesNorm = false;
    from = calls.length;
    be.matvec(out16, x, w, { bias, normWeight: nw, normEps: 1e-5, siluMul: true, accumulate: true });
    expect(calls.slice(from).filter((c) => /^hg_cu_(rmsnorm|matvec)$/.test(c.name)).map((c) => c.name)).toEqual(["hg_cu_matvec", "hg_cu_rmsnorm", "hg_cu_matvec"]);
    const norm = calls.filter((c) => c.name === "hg_cu_rmsnorm").at(-1)!;
    const viaScratch = calls.filter((c) => c.name === "hg_cu_matvec").at(-1)!;
    expect(norm.args[2]).toBe(be.address(x));
    expect(viaScratch.args[2]).toBe(norm.args[1]); // x of the GEMV = the normed scratch row
    expect(viaScratch.args.slice(7)).toEqual([null, 0, 1e-5, 64, 16, 3]);
    expect(viaScratch.args[1]).toBe(be.address(out16));
    // Declined once, this weight's norm is not offered again (one FFI call a GEMV fewer) until
    // the decode plan's device changes.
    const offers = () => calls.filter((c) => c.name === "hg_cu_matvec" && ((c.args[12] as number) & 4) !== 0).length;
    const offered = offers();
    be.matvec(out16, x, w, { bias, normWeight: nw, normEps: 1e-5, siluMul: true, accumulate: true });
    expect(offers()).toBe(offered);
    cudaLab(be).setPlanMajor(8);
    be.matvec(out16, x, w, { bias, normWeight: nw, normEps: 1e-5, siluMul: true, accumulate: true });
    expect(offers()).toBe(offered + 1);
    cudaLab(be).setMatvecFusion({ norm: true, siluMul: true, accumulate: true });
    be.matvec(out16, x, w, { bias, normWeight: nw, normEps: 1e-5, siluMul: true, accumulate: true });
    const mv = calls.filter((c) => c.name === "hg_cu_matvec").at(-1)!;
    // ..., wt, bias, bt, nw, nt, eps, k, m, epi
    expect(mv.args.slice(4, 5)).toEqual([2]);
    expect(mv.args[7]).toBe(be.address(nw));
    expect(mv.args.slice(8)).toEqual([2, 1e-5, 64, 16, 3]);
    be.matvec(out, x, w, {});
    expect(calls.filter((c) => c.name === "hg_cu_matvec").at(-1)!.args.slice(5)).toEqual([null, 0, null, 0, 0, 64, 32, 0]);
    // Everything apart: GEMV into the scratch, SiLU·up into the scratch, then out += it.
    cudaLab(be).setMatvecFusion({ norm: false, siluMul: false, accumulate: false });
    from = calls.length;
    be.matvec(out16, x, w, { normWeight: nw, normEps: 1e-5, siluMul: true, accumulate: true });
    expect(calls.slice(from).map((c) => c.name).filter((n) => n !== "hg_cu_memset0" && n !== "hg_cu_matvec_max_norm_k")).toEqual(["hg_cu_rmsnorm", "hg_cu_matvec", "hg_cu_silu_mul", "hg_cu_add"]);
    const add = calls.at(-1)!;
    expect(add.args.slice(1, 3)).toEqual([be.address(out16), be.address(out16)]);
    be.close();
  });

  it("readBandwidth: probes reach the library with their mode codes; bad probes are refused before it", () => {
    const { be, calls } = make();
    const probes = () => calls.filter((c) => c.name === "hg_cu_read_bandwidth");
    cudaLab(be).readBandwidth({ mode: "loads" }, 4096, 2);
    cudaLab(be).readBandwidth({ mode: "bulk", slotKb: 16, ringKb: 128 }, 4096, 3);
    expect(probes().map((c) => c.args.slice(2, 7))).toEqual([[4096, 0, 0, 0, 2], [4096, 1, 16, 128, 3]]);
    expect(() => cudaLab(be).readBandwidth({ mode: "bulk", slotKb: 32, ringKb: 192 })).toThrow(/slotKb 4, 8, 16 or 32 and ringKb 64, 128 or 192 holding a slot for each of 8 warps, got 32 \/ 192/);
    expect(() => cudaLab(be).readBandwidth({ mode: "bulk", slotKb: 12, ringKb: 128 })).toThrow(HybridgenError);
    expect(() => cudaLab(be).readBandwidth({ mode: "loads" }, 0)).toThrow(/bytes must be an integer ≥ 16/);
    expect(probes()).toHaveLength(2);
    expect(be.memory().usedBytes).toBe(0);
    be.close();
  });

  it("the flash option: every prefill call sends its backend's kernel, so two backends in a process never mix; the lab switches it", () => {
    const calls: NativeCall[] = [];
    const lib = fakeNative(calls);
    const v2 = new CudaBackend({ arenaBytes: 1 << 21, flash: "v2-128" }, { lib, device });
    const auto = new CudaBackend({ arenaBytes: 1 << 21 }, { lib, device });
    const prefill = (be: CudaBackend) => {
      const [heads, kvHeads, headDim, n, cap] = [4, 2, 64, 3, 8];
      const k = be.alloc([kvHeads, cap, headDim], "bf16"), v = be.alloc([kvHeads, cap, headDim], "bf16");
      const q = be.alloc([n, heads * headDim]), out = be.alloc([n, heads * headDim]);
      be.attnCausal(out, q, n, k, v, 0, 0, 0.125);
      for (const t of [k, v, q, out]) be.free(t);
    };
    prefill(v2);
    prefill(auto);
    prefill(v2);
    cudaLab(auto).setFlash("v3x3");
    prefill(auto);
    const sent = calls.filter((c) => /^hg_cu_(flash_variant|attn_causal)$/.test(c.name)).map((c) => (c.name === "hg_cu_flash_variant" ? c.args[0] : "causal"));
    expect(sent).toEqual([3, "causal", 0, "causal", 3, "causal", 6, "causal"]);
    expect(() => cudaLab(auto).setFlash("v4" as never)).toThrow(/setFlash: unknown kernel 'v4' \(auto, v2-64, v2-128, v2-64x3, v3, v3x3, v3-all\)/);
    expect(() => new CudaBackend({ flash: "v1" as never }, { lib, device })).toThrow(/^CUDA backend options: flash: /);
    v2.close();
    auto.close();
  });
});
