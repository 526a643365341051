/** The key of CudaBackend's bench-only switches and probes: not exported from the package's main entry, so only /lab reaches them. */
import type { DType } from "@hybridgen/spec";
import type { MatmulPath, MatvecFusionChoice, SkinnyOptions } from "./cuda-backend.js";

export const LAB: unique symbol = Symbol("@hybridgen/kernels-cuda:lab");

/** What the benches and device checks switch and probe on a CudaBackend (apps/bench, device/, tests). */
export interface CudaLab {
  /** Force a matmul path ("auto" by default) to compare the kernels; matmulPathFor: the path "auto" takes for n rows. */
  setMatmulPath(path: MatmulPath | "auto"): void;
  matmulPathFor(n: number, dtype?: DType, k?: number): MatmulPath;
  /** The small-copy queue of copyRows (default on). */
  setBatchCopies(on: boolean): void;
  /** Batched-decode GEMM switches (unset fields keep their values). */
  setSkinny(o: Partial<SkinnyOptions>): void;
  skinny(): SkinnyOptions;
  /** Which of matvec's fusions run inside the GEMV kernel. */
  setMatvecFusion(fuse: MatvecFusionChoice): void;
  matvecFusion(): MatvecFusionChoice;
  /** Decode-step CUDA graphs on or off, forgotten, and counted. */
  setCudaGraphs(on: boolean): void;
  resetGraphs(): void;
  graphStats(): { captures: number; replays: number; drained: number; eagerSteps: number; recordedOps: number; lastDrain: string };
  /** A profiler's capture range (ncu/nsys with --profile-from-start off). */
  profilerRange(on: boolean): void;
  /** The compute capability major the decode kernels are picked for (null: the device's). */
  setPlanMajor(major: number | null): void;
  planMajor(): number;
  attnDecodeIsSplitK(dtype: DType, headDim: number): boolean;
  attnCausalUsesTensorCores(dtype: DType, headDim: number): boolean;
  /** attnDecodeBatch's batched kernels (default) or per-row calls. */
  setBatchAttention(batched: boolean): void;
  /** Read bandwidth of plain loads or of the weight stream's bulk copies (bytes/s). */
  readBandwidth(probe: { mode: "loads" } | { mode: "bulk"; slotKb: number; ringKb: number }, bytes?: number, iters?: number): number;
  /** V rows without a CPU copy: CPU gather + DMA, a mapped-memory kernel, per-run copies (ms per gather). */
  gatherBench(o: { kvHeads: number; cap: number; kmax: number; rowBytes: number; contiguous: boolean; iters?: number }): {
    cpuGatherMs: number; dmaMs: number; mappedMs: number; runCopiesMs: number; runsPerHead: number; identical: boolean;
  };
  /** The prefill kernel this backend sends before each prefill call (its flash option, switched within a run to compare). */
  setFlash(flash: "auto" | "v2-64" | "v2-64x3" | "v2-128" | "v3" | "v3x3" | "v3-all"): void;
  /** Test hook: an invalid launch (0) or a trapping kernel (1). */
  injectFault(kind: 0 | 1): void;
}
