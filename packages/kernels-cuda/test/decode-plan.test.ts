/**
 * hg_decode_plan (native/decode_plan.h), the one pure function that picks each decode op's kernel
 * from the device and the shape: the header compiled by the host C compiler (no GPU, no nvcc) and
 * called through bun:ffi on Llama-3.1-8B's decode shapes and the edges of every choice. Plus
 * CudaBackend.setPlanMajor against the stand-in library.
 */
import { dlopen, FFIType, ptr } from "bun:ffi";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { HybridgenError } from "@hybridgen/spec";
import { CudaBackend } from "../src/index.js";
import { STAND_IN_DEVICE, standInNative } from "./stand-in-native.js";
import { cudaLab } from "../src/lab.js";

const header = fileURLToPath(new URL("../native/decode_plan.h", import.meta.url));
const cc = Bun.which("cc") ?? Bun.which("gcc");
const dir = mkdtempSync(join(tmpdir(), "hg-decode-plan-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const DRIVER = `#include "${header}"
int plan(int major, int sms, int op, int dtype, int k, int m, int epi, int norm, int headDim, int aligned, int qAligned, int *out) {
  HgPlanDevice d = {major, sms};
  HgPlanShape s = {op, dtype, k, m, epi, norm, headDim, aligned, qAligned};
  HgPlan p = hg_decode_plan(d, s);
  out[0] = p.kernel; out[1] = p.slotBytes; out[2] = p.slotsPerWarp; out[3] = p.grid; out[4] = p.lanes; out[5] = p.splitsPerSm; out[6] = p.chunkSplitsPerSm;
  return 0;
}
`;

function loadPlan() {
  const src = join(dir, "plan.c"), lib = join(dir, "libplan.so");
  writeFileSync(src, DRIVER);
  execFileSync(cc!, ["-std=c99", "-Wall", "-Werror", "-O1", "-shared", "-fPIC", "-o", lib, src]);
  const { symbols } = dlopen(lib, { plan: { args: Array(11).fill(FFIType.i32).concat([FFIType.ptr]), returns: FFIType.i32 } });
  return symbols.plan;
}

const [F32, F16, BF16] = [0, 1, 2];
const [GEMV, ATTN, ARGMAX] = [0, 1, 2];
const H200 = { major: 9, sms: 132 };
const A100 = { major: 8, sms: 108 };
type Dev = { major: number; sms: number };
interface Shape { op: number; dtype?: number; k?: number; m?: number; epi?: number; norm?: boolean; headDim?: number; aligned?: boolean; qAligned?: boolean }

describe.skipIf(!cc)("hg_decode_plan (native/decode_plan.h, built with the host C compiler)", () => {
  const fn = cc ? loadPlan() : null;
  const pick = (d: Dev, s: Shape) => {
    const out = new Int32Array(7);
    fn!(d.major, d.sms, s.op, s.dtype ?? BF16, s.k ?? 0, s.m ?? 0, s.epi ?? 0, s.norm ? 1 : 0, s.headDim ?? 0, s.aligned === false ? 0 : 1, s.qAligned === false ? 0 : 1, ptr(out));
    const [kernel, slotBytes, slotsPerWarp, grid, lanes, splitsPerSm, chunkSplitsPerSm] = out;
    return { kernel, slotBytes, slotsPerWarp, grid, lanes, splitsPerSm, chunkSplitsPerSm };
  };
  const stream = (slotBytes: number, slotsPerWarp: number, grid: number) => ({ kernel: 1, slotBytes, slotsPerWarp, grid, lanes: 0, splitsPerSm: 0, chunkSplitsPerSm: 0 });
  const warp = { kernel: 0, slotBytes: 0, slotsPerWarp: 0, grid: 0, lanes: 0, splitsPerSm: 0, chunkSplitsPerSm: 0 };

  it("streams 8B's bf16 GEMVs on an H200: 8 KB slots for 8 KB rows, 16 KB for SiLU·up's gate and up, 7 KB for down's 28 KB rows, grids of 128 blocks", () => {
    expect(pick(H200, { op: GEMV, k: 4096, m: 6144, norm: true })).toEqual(stream(8192, 2, 128));  // norm + qkv
    expect(pick(H200, { op: GEMV, k: 4096, m: 4096, epi: 1 })).toEqual(stream(8192, 2, 128));  // o_proj, x +=
    expect(pick(H200, { op: GEMV, k: 4096, m: 14336, epi: 2, norm: true })).toEqual(stream(16384, 1, 128));  // norm + gate/up, SiLU·up
    expect(pick(H200, { op: GEMV, k: 14336, m: 4096, epi: 1 })).toEqual(stream(7168, 3, 128));  // down: 3 slots beside 57 KB of x
    expect(pick(H200, { op: GEMV, k: 4096, m: 128256, norm: true })).toEqual(stream(8192, 2, 128));  // norm + lm_head
    expect(pick(H200, { op: GEMV, dtype: F16, k: 4096, m: 4096 })).toEqual(stream(8192, 2, 128));
    expect(pick(H200, { op: GEMV, k: 4096, m: 4099 }).grid).toBe(132);  // a prime: one block an SM
  });

  it("gives the one-warp GEMV to older devices, f32 weights, odd or unaligned rows, SiLU·up with +=, and an x too long for shared memory", () => {
    expect(pick(A100, { op: GEMV, k: 4096, m: 6144, norm: true })).toEqual(warp);
    expect(pick(H200, { op: GEMV, dtype: F32, k: 4096, m: 4096 })).toEqual(warp);
    expect(pick(H200, { op: GEMV, k: 4100, m: 4096 })).toEqual(warp);
    expect(pick(H200, { op: GEMV, k: 4096, m: 4096, aligned: false })).toEqual(warp);
    expect(pick(H200, { op: GEMV, k: 4096, m: 4096, epi: 3 })).toEqual(warp);
    expect(pick(H200, { op: GEMV, k: 57344, m: 64, norm: true })).toEqual(warp);  // x and its norm weights: 448 KB
  });

  it("runs decode attention on tensor cores for bf16/f16 caches with head dim 64 or 128, the FMA split-K block elsewhere, flash where neither fits", () => {
    const mma = (lanes: number) => ({ kernel: 2, slotBytes: 0, slotsPerWarp: 0, grid: 0, lanes, splitsPerSm: 4, chunkSplitsPerSm: 2 });
    const fma = (lanes: number) => ({ kernel: 1, slotBytes: 0, slotsPerWarp: 0, grid: 0, lanes, splitsPerSm: 4, chunkSplitsPerSm: 4 });
    expect(pick(H200, { op: ATTN, dtype: BF16, headDim: 128 })).toEqual(mma(16));
    expect(pick(A100, { op: ATTN, dtype: F16, headDim: 64 })).toEqual(mma(8));
    expect(pick(H200, { op: ATTN, dtype: BF16, headDim: 128, qAligned: false })).toEqual(fma(16));
    expect(pick(H200, { op: ATTN, dtype: F32, headDim: 128 })).toEqual(fma(32));
    expect(pick(H200, { op: ATTN, dtype: BF16, headDim: 96 })).toEqual(fma(16));
    expect(pick(H200, { op: ATTN, dtype: F32, headDim: 48 })).toEqual(fma(16));
    for (const s of [{ dtype: BF16, headDim: 36 }, { dtype: F32, headDim: 260 }, { dtype: BF16, headDim: 128, aligned: false }])
      expect(pick(H200, { op: ATTN, ...s }).kernel).toBe(0);
  });

  it("splits one long aligned argmax row over the SMs, and keeps a block a row otherwise", () => {
    expect(pick(H200, { op: ARGMAX, k: 128256, m: 1 })).toMatchObject({ kernel: 1, grid: 125 });
    expect(pick({ major: 9, sms: 80 }, { op: ARGMAX, k: 128256, m: 1 })).toMatchObject({ kernel: 1, grid: 80 });
    expect(pick(H200, { op: ARGMAX, k: 8192, m: 1 })).toMatchObject({ kernel: 1, grid: 8 });
    for (const s of [{ k: 8191, m: 1 }, { k: 128256, m: 2 }, { k: 128256, m: 1, aligned: false }]) expect(pick(H200, { op: ARGMAX, ...s }).kernel).toBe(0);
  });
});

describe("CudaBackend.setPlanMajor", () => {
  it("passes the major to the library, null for the device's own, and refuses others before calling C", () => {
    let major = STAND_IN_DEVICE.major;
    const sets: number[] = [];
    const lib = standInNative({
      answer: (name, args) => {
        if (name === "hg_cu_set_plan_major") {
          sets.push(args[1] as number);
          const old = major;
          major = args[1] as number;
          return old;
        }
        if (name === "hg_cu_get_plan_major") return major;
        return undefined;
      },
    });
    const be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib, device: STAND_IN_DEVICE });
    expect(cudaLab(be).planMajor()).toBe(9);
    cudaLab(be).setPlanMajor(8);
    expect(cudaLab(be).planMajor()).toBe(8);
    cudaLab(be).setPlanMajor(null);
    expect(sets).toEqual([8, 9]);
    for (const bad of [10, 0, 8.5, Number.NaN]) expect(() => cudaLab(be).setPlanMajor(bad)).toThrow(/setPlanMajor: major must be an integer from 1 to 9/);
    expect(() => cudaLab(be).setPlanMajor("8" as never)).toThrow(HybridgenError);
    expect(sets).toEqual([8, 9]);
    be.close();
    expect(() => cudaLab(be).setPlanMajor(8)).toThrow(HybridgenError);
  });
});
