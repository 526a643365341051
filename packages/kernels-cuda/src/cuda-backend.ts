/**
 * CudaBackend: core's Backend contract on one GPU through libhgcuda. Every call is validated
 * here (core's BackendChecks: ownership, liveness, dtype, shapes, ranges, as in CpuBackend;
 * then the kernels' own limits: 32-bit indices, the int scratch) before an address reaches C,
 * so bad input is a HybridgenError and never a wild device access. Ops are
 * queued on the backend's compute stream; read/argmax/synchronize wait for them. Device memory
 * comes from an arena reserved once at creation (DeviceArena does the bookkeeping).
 */
import type { Pointer } from "bun:ffi";
import { SPEC_VERSION, DTYPE_BYTES, HybridgenError, type AttnMergeRow, type AttnPartialRow, type KvAppendRow, type Backend, type BatchAttnRow, type DeviceIndexShape, type DType, type IndexRankRow, type HostTransfers, type MatvecFusion, type Tensor } from "@hybridgen/spec";
import { BackendChecks, isIndex, shapeNumel } from "@hybridgen/spec/kit";
import { DeviceArena, type ArenaStats } from "./arena.js";
import { CudaHostLink } from "./host-link.js";
import { cudaAvailability } from "./availability.js";
import { CudaTensor } from "./cuda-tensor.js";
import { LAB, type CudaLab } from "./lab-key.js";
import { CudaTimer } from "./cuda-timer.js";
import type { CudaDevice } from "./device-record.js";
import { cudaLibraryPath } from "./library-path.js";
import { MAX_HOST_INTS, cudaErrorString, openCudaNative, type CudaNative } from "./native-backend.js";
import { parseCudaBackendOptions, selectCudaDevice, type CudaBackendOptions } from "./options.js";

const DTYPE_CODE: Readonly<Record<DType, number>> = { f32: 0, f16: 1, bf16: 2 };
const F32 = 0;
/** Decode GEMV (ours), cuBLAS GEMM, tiled GEMM (ours, without cuBLAS), skinny tensor-core GEMM (ours, 2..32 rows of f16/bf16 weights). */
export type MatmulPath = "gemv" | "cublas" | "tiled" | "skinny";
const PATH_CODE: Readonly<Record<MatmulPath | "auto", number>> = { auto: -1, gemv: 0, cublas: 1, tiled: 2, skinny: 3 };
const PATH_NAMES: readonly MatmulPath[] = ["gemv", "cublas", "tiled", "skinny"];
/** Rows of attnDecodeBatch in one call (the native table's limit). */
const MAX_BATCH_ATTN_ROWS = 64;
const GEMV_MAX_ROWS = 8;
/** hg_cu_matmul_rows: the skinny kernel does not take this shape (HG_SKINNY_NOT_TAKEN). */
const SKINNY_NOT_TAKEN = -2;
// Execution errors after which the CUDA context is lost for the rest of the process.
const STICKY = new Set([700, 710, 714, 715, 716, 717, 718, 719, 720, 999]);
/** HG_MAX_GRAPH_KEYS in native/common.cuh: hybrid attention records a segment per layer. */
export const MAX_GRAPH_KEYS = 256;

const P = (address: number) => address as Pointer;

/** Which parts of Backend.matvec run inside the GEMV kernel (see CudaBackend.setMatvecFusion). */
export interface MatvecFusionChoice {
  norm: boolean;
  siluMul: boolean;
  accumulate: boolean;
}

/** Batched-decode GEMM switches (CudaBackend.setSkinny); apps/bench/notes/kernels-cuda-device.md measures them. */
export interface SkinnyOptions {
  /** The largest row count "auto" gives the skinny GEMM (1..32, 1 = none); cuBLAS above it when loaded. Default 8. */
  maxRows: number;
  /** k splits summed by the GEMM's last block of each row block, not a second kernel. Default on. */
  fusedReduce: boolean;
  /** Backend.matmulSplit takes batched q/k/v, gate/up and o/down + add (skinny path only; off: it declines). Default on. */
  split: boolean;
}
// The H200's fastest: the skinny GEMM with the fused reduction and matmulSplit up to B = 8, cuBLAS above.
const SKINNY_DEFAULTS: Readonly<SkinnyOptions> = { maxRows: 8, fusedReduce: true, split: true };

/** embeddingFromFeed's stand-in id for the shared embedding check (one row, a valid id). */
const FEED_ROW_ID = new Int32Array(1);

/** Floats of the unfused matvec parts' scratch made before a step (so a step never allocates). */
const MATVEC_SCRATCH_FLOATS = 65536;

function bad(message: string): never {
  throw new HybridgenError(message, "EBADARG");
}

function cString(s: string): Uint8Array {
  return new TextEncoder().encode(`${s}\0`);
}

export interface CudaMemoryStats extends ArenaStats {
  /** Bytes reserved on the device at start (the allocator's capacity plus the backend's scratch). */
  readonly arenaBytes: number;
}

/** The flash option → native/flash.cu's kernel codes. */
const FLASH_CODE: Record<string, number> = { auto: 0, "v2-64": 2, "v2-128": 3, "v2-64x3": 4, v3: 5, v3x3: 6, "v3-all": 7 };

/**
 * Which of matvec's fusions run inside the GEMV kernel (else as their own kernels). Default
 * from the H200 bench (apps/bench/notes/kernels-cuda-device.md): the norm as its own kernel (the one-warp GEMV's
 * per-block prologue cost more than the launch it saves)
 * unless the weight stream takes the GEMV (it normalises once a block, for free), SiLU·up and
 * the residual add in the epilogue.
 */
export const DEFAULT_MATVEC_FUSION: Readonly<MatvecFusionChoice> = { norm: false, siluMul: true, accumulate: true };

export class CudaBackend implements Backend {
  readonly spec = SPEC_VERSION;
  readonly name = "cuda";
  readonly threads = 1;
  readonly device: CudaDevice;
  /** Which cuBLAS was opened ("libcublas.so.13"), or why none ("off", "not found (…)"). */
  readonly cublas: string;
  readonly multiprocessors: number;
  private readonly lib: CudaNative;
  private readonly ctx: Pointer;
  private readonly arena: DeviceArena;
  private readonly heapBase: number;
  private readonly arenaBytes: number;
  private readonly live = new Set<CudaTensor>();
  private isClosed = false;
  /** Set by a sticky CUDA error: the context is unusable for the rest of the process. */
  private lost: string | null = null;
  private matmulPath = PATH_CODE.auto;
  private readonly check: BackendChecks<CudaTensor>;
  /** cudaGraphs option: beginStep/endStep record and replay decode steps. */
  private graphs: boolean;
  /** The flash option's kernel code (native/flash.cu's FLASH_*; 0: the library's choice), sent before each prefill call. */
  private flash: number;
  private fuse: MatvecFusionChoice = { ...DEFAULT_MATVEC_FUSION };
  /** Scratch of the unfused matvec parts (h, y, silu result), grown on demand. */
  private mvScratch: CudaTensor | null = null;
  private readonly stepKeys = new Map<string, number>();
  /** Which key holds each native graph slot (slots are reused round-robin past MAX_GRAPH_KEYS). */
  private readonly slotOwners: (string | undefined)[] = new Array(MAX_GRAPH_KEYS);
  private nextSlot = 0;
  private inStep = false;
  /** attnDecodeBatch: the batched kernels (true) or the per-row calls (benches compare). */
  private batchAttention = true;
  /** setSkinny's values; `skinnySet` once they were sent to the library (reset there at close). */
  private skinnyOpts: SkinnyOptions = { ...SKINNY_DEFAULTS };
  private skinnySet = false;
  /** argmaxRows' device ints (grown on demand; freed with the arena). */
  private pickScratch: CudaTensor | null = null;
  /** attnDecodeBatch's per-row table (BatchAttnRow in native/batch_attn.cu: 8 ints a row). */
  private readonly batchTable = new Int32Array(MAX_BATCH_ATTN_ROWS * 8);
  /** The library's answers that never change (asked once: every decode step asks them per layer). */
  private maxNormK = -1;
  /** Weights whose GEMV declined the norm (a bit per epilogue 0–3): not offered again until the switches change. */
  private normDeclined = new WeakMap<CudaTensor, number>();
  private readonly splitKPath = new Map<number, boolean>();
  /** The host link (copy stream, pinned memory, event timeline), made by hostTransfers(). */
  private hostLink: CudaHostLink | null = null;

  /** `native` replaces the library (tests of the validation layer run without a GPU). */
  constructor(options: CudaBackendOptions = {}, native?: { lib: CudaNative; device: CudaDevice }) {
    const o = parseCudaBackendOptions(options);
    this.graphs = o.cudaGraphs;
    this.flash = FLASH_CODE[o.flash];
    if (native) {
      this.lib = native.lib;
      this.device = native.device;
    } else {
      const path = cudaLibraryPath(o.libraryPath);
      this.device = selectCudaDevice(o, cudaAvailability({ libraryPath: path }));
      this.lib = openCudaNative(path);
    }
    const err = new Uint8Array(512);
    const ctx = this.lib.hg_cu_create(this.device.index, o.arenaBytes ?? 0, o.arenaFraction, o.cublasPath ? cString(o.cublasPath) : null, o.cublas === "off" ? 1 : 0, err, err.length);
    if (!ctx) {
      const end = err.indexOf(0);
      throw new HybridgenError(`CUDA backend on device ${this.device.index} (${this.device.name}): ${new TextDecoder().decode(err.subarray(0, end < 0 ? err.length : end))}`, "ECUDA");
    }
    this.ctx = ctx as Pointer;
    this.heapBase = this.lib.hg_cu_heap_base(ctx);
    this.arenaBytes = this.lib.hg_cu_arena_bytes(ctx);
    this.arena = new DeviceArena(this.lib.hg_cu_heap_bytes(ctx));
    this.multiprocessors = this.lib.hg_cu_num_sms(ctx);
    const info = new Uint8Array(256);
    this.lib.hg_cu_cublas_info(ctx, info, info.length);
    const end = info.indexOf(0);
    this.cublas = new TextDecoder().decode(info.subarray(0, end < 0 ? info.length : end));
    this.check = new BackendChecks({ name: "cuda", className: "CudaBackend", tensorClass: CudaTensor, owner: this, usable: (op) => this.live_(op) });
    this.setSkinny(SKINNY_DEFAULTS); // the library's own defaults are the first version's (32 rows, no fused reduce)
  }

  // ---- errors and validation ----------------------------------------------------------------

  /** Throws "CUDA error in <op>: <name>: <text>" for a non-zero status. */
  private ok(op: string, rc: number): void {
    if (rc === 0) return;
    const text = cudaErrorString(this.lib, rc);
    if (STICKY.has(rc)) this.lost = `${op}: ${text}`;
    throw new HybridgenError(`CUDA error in ${op}: ${text}${STICKY.has(rc) ? " (the CUDA context is lost; restart the process)" : ""}`, "ECUDA");
  }

  private live_(op: string): Pointer {
    if (this.isClosed) bad(`${op}: CudaBackend is closed`);
    if (this.lost) throw new HybridgenError(`${op}: the CUDA backend is unusable after an earlier error (${this.lost})`, "ECUDA");
    return this.ctx;
  }

  /** Native kernels index rows and columns with 32-bit ints. */
  private static int32(v: number, op: string, what: string): void {
    if (v > 0x7fffffff) bad(`${op}: ${what} ${v} exceeds the kernels' 32-bit index range`);
  }

  // ---- memory ---------------------------------------------------------------------------------

  private allocRaw(shape: number[], dtype: DType, op: string): CudaTensor {
    const bytes = shapeNumel(shape, op) * DTYPE_BYTES[dtype];
    const off = this.arena.allocate(bytes, `${op} of ${dtype}[${shape.join("x")}]`);
    const t = new CudaTensor(this, dtype, shape, this.heapBase + off, bytes, off);
    this.live.add(t);
    return t;
  }

  loadWeight(bytes: Uint8Array, dtype: DType, shape: readonly number[]): Tensor {
    const need = this.check.loadWeight(bytes, dtype, shape);
    const t = this.allocRaw([...shape], dtype, "loadWeight");
    try {
      this.ok("loadWeight", this.lib.hg_cu_upload(this.ctx, P(t.addr), bytes, need));
    } catch (e) {
      this.release(t);
      throw e;
    }
    return t;
  }

  alloc(shape: readonly number[], dtype: DType = "f32"): Tensor {
    this.check.alloc(shape, dtype);
    const t = this.allocRaw([...shape], dtype, "alloc");
    this.ok("alloc", this.lib.hg_cu_memset0(this.ctx, P(t.addr), t.byteLength));
    return t;
  }

  write(t: Tensor, src: Float32Array, offset = 0): void {
    const d = this.check.write(t, src, offset);
    if (src.length === 0) return;
    this.ok("write", this.lib.hg_cu_write(this.ctx, P(d.at(offset)), DTYPE_CODE[d.dtype], src, src.length));
  }

  read(t: Tensor, offset = 0, count?: number): Float32Array {
    const [s, n] = this.check.read(t, offset, count);
    const out = new Float32Array(n);
    if (n > 0) this.ok("read (or an op queued before it)", this.lib.hg_cu_read(this.ctx, out, P(s.at(offset)), DTYPE_CODE[s.dtype], n));
    return out;
  }

  copyRows(dst: Tensor, dstRow: number, src: Tensor, srcRow: number, count: number): void {
    const [d, s] = this.check.copyRows(dst, dstRow, src, srcRow, count);
    if (count === 0) return;
    this.ok("copyRows", this.lib.hg_cu_copy(this.ctx, P(d.at(dstRow * d.cols)), DTYPE_CODE[d.dtype], P(s.at(srcRow * s.cols)), DTYPE_CODE[s.dtype], count * d.cols));
  }

  view(t: Tensor, offset: number, shape: readonly number[]): Tensor {
    const [b, numel] = this.check.view(t, offset, shape);
    const root = b.base ?? b;
    // Not tracked in `live`: a view dies with its base, so per-step views need no free.
    return new CudaTensor(this, b.dtype, [...shape], b.at(offset), numel * b.elementBytes, -1, root);
  }

  free(t: Tensor): void {
    const c = this.check.free(t);
    if (c.base) {
      c.freed = true; // a view: only the handle
      return;
    }
    this.release(c);
  }

  private release(t: CudaTensor): void {
    t.freed = true;
    this.live.delete(t);
    this.arena.release(t.arenaOffset);
  }

  /** Waits for every queued op; throws the first CUDA error among them. */
  synchronize(): void {
    this.live_("synchronize");
    this.ok("synchronize (an op queued earlier)", this.lib.hg_cu_sync(this.ctx));
  }

  /** Frees every tensor and the arena, streams and cuBLAS handle. Idempotent. */
  close(): void {
    if (this.isClosed) return;
    this.isClosed = true;
    this.inStep = false;
    this.hostLink?.close();
    this.hostLink = null;
    // The library keys these by context address: put its own defaults (32 rows, no flags) back for
    // whatever context is made at this address next.
    if (this.skinnySet) this.lib.hg_cu_set_skinny(this.ctx, 32, 0);
    for (const t of this.live) t.freed = true;
    this.live.clear();
    this.arena.reset();
    this.lib.hg_cu_destroy(this.ctx);
  }

  [Symbol.dispose](): void {
    this.close();
  }

  get closed(): boolean {
    return this.isClosed;
  }

  /** Owning tensors alive (views not counted). */
  get liveTensors(): number {
    return this.live.size;
  }

  /** Arena accounting: what is reserved, used, free, the largest block that fits, the peak. */
  memory(): CudaMemoryStats {
    return { ...this.arena.stats(), arenaBytes: this.arenaBytes };
  }

  /** Device address of a tensor's first element, for other native code (valid until free). */
  address(t: Tensor): number {
    return this.check.own(t, "address", "tensor").addr;
  }

  /** Force a matmul path ("auto" by default): tests and benches compare the kernels. */
  private setMatmulPath(path: MatmulPath | "auto"): void {
    if (!(path in PATH_CODE)) bad(`setMatmulPath: unknown path '${path}' (auto, gemv, cublas, tiled, skinny)`);
    this.matmulPath = PATH_CODE[path];
  }

  /**
   * Small same-dtype copyRows (a decode step's K/V appends, one per KV head) are queued and
   * run as one kernel before the next other op (default on); off runs each as its own copy.
   */
  private setBatchCopies(on: boolean): void {
    this.lib.hg_cu_set_batch_copies(this.live_("setBatchCopies"), on ? 1 : 0);
  }


  /**
   * Batched-decode GEMM switches (SkinnyOptions; unset fields keep their values). The defaults
   * are the measured-safe ones; benches flip them to compare in one run.
   */
  private setSkinny(o: Partial<SkinnyOptions>): void {
    const ctx = this.live_("setSkinny");
    for (const key of Object.keys(o)) if (!(key in SKINNY_DEFAULTS)) bad(`setSkinny: unknown option "${key}" (${Object.keys(SKINNY_DEFAULTS).join(", ")})`);
    const next = { ...this.skinnyOpts, ...o };
    if (!(Number.isInteger(next.maxRows) && next.maxRows >= 1 && next.maxRows <= 32)) bad(`setSkinny: maxRows must be an integer in 1..32, got ${next.maxRows}`);
    for (const key of ["fusedReduce", "split"] as const) if (typeof next[key] !== "boolean") bad(`setSkinny: ${key} must be a boolean, got ${String(next[key])}`);
    // Native flags: bit 1 fused reduce (bit 0, the pipelined kernel, is retired).
    this.ok("setSkinny", this.lib.hg_cu_set_skinny(ctx, next.maxRows, next.fusedReduce ? 2 : 0));
    this.skinnyOpts = { maxRows: next.maxRows, fusedReduce: next.fusedReduce, split: next.split };
    this.skinnySet = true;
  }

  private get skinny(): SkinnyOptions {
    return { ...this.skinnyOpts };
  }

  /**
   * Backend.matmulSplit on the skinny GEMM: one launch for a fused weight's row segments into
   * separate outputs, the residual add in its epilogue. Declines (false) unless setSkinny({ split })
   * is on, the weights are f16/bf16 and n rows take the skinny path (auto with n ≤ maxRows, or
   * setMatmulPath("skinny")); the kernel itself declines k % 8 ≠ 0 and misaligned operands.
   */
  matmulSplit(outs: readonly Tensor[], x: Tensor, w: Tensor, n: number, bias: Tensor | undefined, accumulate: boolean): boolean {
    const op = "matmulSplit";
    if (!Array.isArray(outs) || outs.length < 1 || outs.length > 3) bad(`${op}: 1 to 3 outputs, got ${Array.isArray(outs) ? outs.length : typeof outs}`);
    const xi = this.check.f32(x, op, "x");
    const wt = this.check.own(w, op, "w");
    // Declined (core then calls matmul, which validates the same operands) before the rest is
    // validated twice: f32 weights, a row count the split kernel does not take, the split off.
    const path = this.matmulPath, so = this.skinnyOpts;
    const skinny = path === PATH_CODE.skinny || (path === PATH_CODE.auto && n <= so.maxRows);
    if (Number.isInteger(n) && n !== 0 && (!so.split || !skinny || wt.dtype === "f32" || n < 2 || n > 32)) return false;
    if (wt.shape.length !== 2) bad(`${op}: w must be 2-D [m, k], got ${wt}`);
    const [m, k] = wt.shape;
    if (xi.cols !== k) bad(`${op}: x rows have ${xi.cols} values but w ${wt} expects k=${k}`);
    this.check.rowsAtLeast(xi, n, op, "x");
    CudaBackend.int32(n, op, "row count");
    const os = outs.map((t, j) => {
      const o = this.check.f32(t, op, `outs[${j}]`);
      this.check.rowsAtLeast(o, n, op, `outs[${j}]`);
      return o;
    });
    const widths = os.map((o) => o.cols);
    if (widths.reduce((a, b) => a + b, 0) !== m) bad(`${op}: the outputs' widths ${widths.join(" + ")} must add up to w's ${m} rows`);
    const b = bias === undefined ? undefined : this.check.own(bias, op, "bias");
    if (b && b.numel !== m) bad(`${op}: bias ${b} must have m=${m} elements`);
    os.forEach((o, j) => {
      if (o.overlaps(xi, n, n)) bad(`${op}: outs[${j}] must not overlap x`);
      if (b && o.overlaps(b, n, b.rows)) bad(`${op}: outs[${j}] must not overlap bias`);
      for (let i = 0; i < j; i++) if (o.overlaps(os[i], n, n)) bad(`${op}: outs[${j}] must not overlap outs[${i}]`);
    });
    if (typeof accumulate !== "boolean") bad(`${op}: accumulate must be a boolean`);
    if (n === 0) return true;
    const o1 = os[1] ? P(os[1].addr) : null, o2 = os[2] ? P(os[2].addr) : null;
    const rc = this.lib.hg_cu_matmul_rows(this.ctx, P(os[0].addr), o1, o2, widths[0], widths[1] ?? 0, widths[2] ?? 0, accumulate ? 1 : 0, P(xi.addr), P(wt.addr), DTYPE_CODE[wt.dtype], b ? P(b.addr) : null, b ? DTYPE_CODE[b.dtype] : 0, n, k);
    if (rc === SKINNY_NOT_TAKEN) return false;
    this.ok(op, rc);
    return true;
  }

  /**
   * The path a matmul of n rows takes under "auto": for f32 weights by default; give the weight
   * dtype (and k) for f16/bf16, where 2..maxRows (setSkinny) rows take the skinny tensor-core GEMM.
   */
  private matmulPathFor(n: number, dtype: DType = "f32", k = 4096): MatmulPath {
    const ctx = this.live_("matmulPathFor");
    const code = dtype === "f32" ? this.lib.hg_cu_matmul_path(ctx, n) : this.lib.hg_cu_matmul_path_for(ctx, n, DTYPE_CODE[dtype], k);
    return PATH_NAMES[code];
  }

  /**
   * Read bandwidth (bytes read per second) streaming `bytes` of one arena block `iters` times, for
   * the benches: `{ mode: "loads" }` plain 16-byte loads, or `{ mode: "bulk", slotKb, ringKb }` the
   * weight-stream GEMV's structure (one block an SM, cp.async.bulk copies of slotKb into a ring of
   * ringKb, consumers that only hand slots back; sm_90). A bad probe is a one-line error.
   */
  private readBandwidth(probe: { mode: "loads" } | { mode: "bulk"; slotKb: number; ringKb: number }, bytes = 2 ** 31, iters = 5): number {
    const ctx = this.live_("readBandwidth");
    if (probe.mode === "bulk" && (![4, 8, 16, 32].includes(probe.slotKb) || ![64, 128, 192].includes(probe.ringKb) || probe.ringKb < 8 * probe.slotKb))
      bad(`readBandwidth: a bulk probe takes slotKb 4, 8, 16 or 32 and ringKb 64, 128 or 192 holding a slot for each of 8 warps, got ${probe.slotKb} / ${probe.ringKb}`);
    if (!Number.isInteger(bytes) || bytes < 16 || !Number.isInteger(iters) || iters < 1) bad(`readBandwidth: bytes must be an integer ≥ 16 and iters ≥ 1, got ${bytes} / ${iters}`);
    const elems = Math.ceil(bytes / 16) * 4;
    const a = this.allocRaw([elems], "f32", "readBandwidth");
    try {
      const out = new Float64Array(1);
      const [mode, slot, ring] = probe.mode === "loads" ? [0, 0, 0] : [1, probe.slotKb, probe.ringKb];
      this.ok("readBandwidth", this.lib.hg_cu_read_bandwidth(ctx, P(a.addr), elems * 4, mode, slot, ring, iters, out));
      return out[0];
    } finally {
      this.release(a);
    }
  }

  /**
   * V rows without a CPU copy, measured: `kmax` selected rows per KV head of a pinned host store
   * [kvHeads, cap, rowBytes] gathered (a) by one CPU thread into a pinned buffer, then one DMA,
   * (b) by a device kernel reading the mapped host memory, (c) by one copy per run of consecutive
   * ids; ascending random ids (top-K-like) or the last kmax slots (a window). Milliseconds per
   * gather, runs per head, and whether the three results are byte-identical.
   */
  private gatherBench(o: { kvHeads: number; cap: number; kmax: number; rowBytes: number; contiguous: boolean; iters?: number }) {
    const ctx = this.live_("gatherBench");
    const { kvHeads, cap, kmax, rowBytes, contiguous, iters = 20 } = o;
    for (const [k, v] of Object.entries({ kvHeads, cap, kmax, rowBytes, iters })) {
      if (!(Number.isInteger(v) && v > 0)) throw new HybridgenError(`gatherBench: ${k} must be a positive integer, got ${v}`);
    }
    if (rowBytes % 16 !== 0 || kmax > cap) throw new HybridgenError(`gatherBench: rowBytes must be a multiple of 16 and kmax ≤ cap (got ${rowBytes}, ${kmax} > ${cap})`);
    const out = new Float64Array(6);
    const dev = this.allocRaw([Math.ceil((3 * kvHeads * kmax * rowBytes) / 4)], "f32", "gatherBench");
    try {
      const ids = this.allocRaw([kvHeads * kmax], "f32", "gatherBench");
      try {
        const input = Float64Array.of(kvHeads, cap, kmax, rowBytes, contiguous ? 1 : 0, iters);
        this.ok("gatherBench", this.lib.hg_cu_gather_bench(ctx, P(dev.addr), P(ids.addr), input, out));
      } finally {
        this.release(ids);
      }
    } finally {
      this.release(dev);
    }
    return { cpuGatherMs: out[0], dmaMs: out[1], mappedMs: out[2], runCopiesMs: out[3], runsPerHead: out[4], identical: out[5] === 1 };
  }

  /**
   * Device-to-device copy bandwidth (bytes read + written per second) copying `bytes` between
   * two arena blocks `iters` times: the memory-bandwidth ceiling, measured in the same run.
   */
  copyBandwidth(bytes = 2 ** 30, iters = 10): number {
    const ctx = this.live_("copyBandwidth");
    const elems = Math.ceil(bytes / 4);
    const a = this.allocRaw([elems], "f32", "copyBandwidth");
    try {
      const b = this.allocRaw([elems], "f32", "copyBandwidth");
      try {
        const out = new Float64Array(1);
        this.ok("copyBandwidth", this.lib.hg_cu_copy_bandwidth(ctx, P(b.addr), P(a.addr), elems * 4, iters, out));
        return out[0];
      } finally {
        this.release(b);
      }
    } finally {
      this.release(a);
    }
  }

  /** The bench-only switches and probes (@hybridgen/kernels-cuda/lab's cudaLab(backend)); not part of the Backend a program uses. */
  [LAB](): CudaLab {
    return {
      setMatmulPath: (path) => this.setMatmulPath(path),
      matmulPathFor: (n, dtype, k) => this.matmulPathFor(n, dtype, k),
      setBatchCopies: (on) => this.setBatchCopies(on),
      setSkinny: (o) => this.setSkinny(o),
      skinny: () => this.skinny,
      setMatvecFusion: (f) => this.setMatvecFusion(f),
      matvecFusion: () => this.matvecFusion,
      setCudaGraphs: (on) => this.setCudaGraphs(on),
      resetGraphs: () => this.resetGraphs(),
      graphStats: () => this.graphStats(),
      profilerRange: (on) => this.profilerRange(on),
      setPlanMajor: (major) => this.setPlanMajor(major),
      planMajor: () => this.planMajor,
      attnDecodeIsSplitK: (dtype, headDim) => this.attnDecodeIsSplitK(dtype, headDim),
      attnCausalUsesTensorCores: (dtype, headDim) => this.attnCausalUsesTensorCores(dtype, headDim),
      setBatchAttention: (batched) => this.setBatchAttention(batched),
      readBandwidth: (probe, bytes, iters) => this.readBandwidth(probe, bytes, iters),
      gatherBench: (o) => this.gatherBench(o),
      injectFault: (kind) => this.injectFault(kind),
      setFlash: (flash) => {
        if (!(flash in FLASH_CODE)) bad(`setFlash: unknown kernel '${flash}' (${Object.keys(FLASH_CODE).join(", ")})`);
        this.flash = FLASH_CODE[flash]!;
      },
    };
  }

  /** A pair of CUDA events on the compute stream: mark() before and after work, then ms(). */
  timer(): CudaTimer {
    this.live_("timer");
    return new CudaTimer(this.lib, this.ctx, (op, rc) => this.ok(op, rc));
  }

  /**
   * Backend.hostTransfers: the copy stream's link to host memory (pinning, async copies ordered
   * by events, T_gpu / T_tx timing), made on first call; closed with the backend.
   */
  hostTransfers(): HostTransfers {
    const ctx = this.live_("hostTransfers");
    this.hostLink ??= new CudaHostLink({
      lib: this.lib, ctx,
      own: (t, op) => { this.live_(op); return this.check.own(t, op, "tensor"); },
      ok: (op, rc) => this.ok(op, rc),
      allocBytes: (bytes, op) => this.allocRaw([Math.ceil(bytes / 4)], "f32", op),
      release: (t) => this.release(t),
    });
    return this.hostLink;
  }

  /** Test hook: 0 = an invalid launch (recoverable), 1 = a trap inside a kernel (the context is lost). */
  private injectFault(kind: 0 | 1): void {
    this.ok(kind === 0 ? "injectFault(invalid launch)" : "injectFault(trap)", this.lib.hg_cu_test_fault(this.live_("injectFault"), kind));
  }

  // ---- elementwise and row ops --------------------------------------------------------------

  private uploadable(n: number, op: string): void {
    if (n > MAX_HOST_INTS) bad(`${op}: ${n} indices in one call exceed the backend's limit of ${MAX_HOST_INTS}`);
  }

  embedding(out: Tensor, table: Tensor, ids: Int32Array): void {
    const [o, tb] = this.check.embedding(out, table, ids);
    if (ids.length === 0) return;
    this.uploadable(ids.length, "embedding");
    this.ok("embedding", this.lib.hg_cu_embedding(this.ctx, P(o.addr), P(tb.addr), DTYPE_CODE[tb.dtype], tb.cols, ids, ids.length));
  }

  matmul(out: Tensor, x: Tensor, w: Tensor, n: number, bias?: Tensor): void {
    const [o, xi, wt, b] = this.check.matmul(out, x, w, n, bias);
    if (b && o.overlaps(b, n, b.rows)) bad("matmul: out must not overlap bias");
    CudaBackend.int32(n, "matmul", "row count");
    if (n === 0) return;
    const [m, k] = wt.shape;
    let path = this.matmulPath;
    if (path === PATH_CODE.gemv && n > GEMV_MAX_ROWS) path = PATH_CODE.auto;
    this.ok("matmul", this.lib.hg_cu_matmul(this.ctx, P(o.addr), P(xi.addr), P(wt.addr), DTYPE_CODE[wt.dtype], b ? P(b.addr) : null, b ? DTYPE_CODE[b.dtype] : 0, n, k, m, path));
  }

  /**
   * The decode GEMV with core's fusions (Backend.matvec): the rmsNorm of x computed by every
   * block into shared memory, the residual add or SiLU·up in the epilogue; one launch.
   */
  matvec(out: Tensor, x: Tensor, w: Tensor, f: MatvecFusion): void {
    const [o, xi, wt, b, nw, m, k] = this.check.matvec(out, x, w, f);
    if (this.maxNormK < 0) this.maxNormK = this.lib.hg_cu_matvec_max_norm_k();
    const maxNormK = this.maxNormK;
    if (nw && k > maxNormK && this.fuse.norm) bad(`matvec: a fused norm takes rows of at most ${maxNormK} values, x has ${k}`);
    const rows = wt.shape[0], wd = DTYPE_CODE[wt.dtype], bp = b ? P(b.addr) : null, bt = b ? DTYPE_CODE[b.dtype] : 0;
    const eps = nw ? (f.normEps as number) : 0;
    const normApart = nw !== undefined && !this.fuse.norm;
    const siluApart = f.siluMul === true && !this.fuse.siluMul;
    const addApart = f.accumulate === true && (!this.fuse.accumulate || siluApart);
    if (normApart && !siluApart && !addApart) {
      // The weight stream takes the norm at no cost (once a block, while its first weights land):
      // the library runs it there, or declines (-1) and the norm runs as its own kernel below.
      const epi = (f.accumulate ? 1 : 0) | (f.siluMul ? 2 : 0) | 4, bit = 1 << (epi & 3), declined = this.normDeclined.get(wt) ?? 0;
      if ((declined & bit) === 0) {
        const r = this.lib.hg_cu_matvec(this.ctx, P(o.addr), P(xi.addr), P(wt.addr), wd, bp, bt, P(nw.addr), DTYPE_CODE[nw.dtype], eps, k, m, epi);
        if (r !== -1) return this.ok("matvec", r);
        this.normDeclined.set(wt, declined | bit);
      }
    }
    if (!normApart && !siluApart && !addApart) {
      const epi = (f.accumulate ? 1 : 0) | (f.siluMul ? 2 : 0);
      this.ok("matvec", this.lib.hg_cu_matvec(this.ctx, P(o.addr), P(xi.addr), P(wt.addr), wd, bp, bt, nw ? P(nw.addr) : null, nw ? DTYPE_CODE[nw.dtype] : 0, eps, k, m, epi));
      return;
    }
    // Some parts as their own kernels (setMatvecFusion): h, y and the SiLU·up result in a scratch.
    const a64 = (n: number) => Math.ceil(n / 64) * 64;
    const yOff = normApart ? a64(k) : 0, rOff = yOff + (siluApart ? a64(rows) : 0);
    const s = this.matvecScratch(rOff + (addApart ? m : 0));
    const hA = s.addr, yA = hA + yOff * 4, rA = hA + rOff * 4;
    let xA = xi.addr;
    if (nw && normApart) {
      this.ok("matvec (rmsNorm)", this.lib.hg_cu_rmsnorm(this.ctx, P(hA), P(xi.addr), P(nw.addr), DTYPE_CODE[nw.dtype], 1, k, eps));
      xA = hA;
    }
    const nwFused = nw && !normApart ? P(nw.addr) : null, ntFused = nw && !normApart ? DTYPE_CODE[nw.dtype] : 0;
    if (siluApart) {
      this.ok("matvec", this.lib.hg_cu_matvec(this.ctx, P(yA), P(xA), P(wt.addr), wd, bp, bt, nwFused, ntFused, eps, k, rows, 0));
      this.ok("matvec (siluMul)", this.lib.hg_cu_silu_mul(this.ctx, P(f.accumulate ? rA : o.addr), P(yA), P(yA + m * 4), m));
    } else {
      const epi = f.siluMul ? 2 : 0;
      this.ok("matvec", this.lib.hg_cu_matvec(this.ctx, P(addApart ? rA : o.addr), P(xA), P(wt.addr), wd, bp, bt, nwFused, ntFused, eps, k, m, epi | (f.accumulate && !addApart ? 1 : 0)));
    }
    if (addApart) this.ok("matvec (add)", this.lib.hg_cu_add(this.ctx, P(o.addr), P(o.addr), P(rA), m));
  }

  /** Which matvec fusions run inside the GEMV (default DEFAULT_MATVEC_FUSION); the rest run as their own kernels. */
  private setMatvecFusion(fuse: MatvecFusionChoice): void {
    this.fuse = { norm: fuse.norm, siluMul: fuse.siluMul, accumulate: fuse.accumulate };
    if (this.mvScratch && fuse.norm && fuse.siluMul && fuse.accumulate) {
      if (this.inStep) this.endStep();
      this.free(this.mvScratch);
      this.mvScratch = null;
    }
  }

  private get matvecFusion(): MatvecFusionChoice {
    return { ...this.fuse };
  }

  private matvecScratch(floats: number): CudaTensor {
    if (!this.mvScratch || this.mvScratch.numel < floats) {
      if (this.inStep) this.endStep(); // allocating writes zeros: not inside a recorded step
      if (this.mvScratch) this.free(this.mvScratch);
      this.mvScratch = null;
      this.mvScratch = this.alloc([Math.max(floats, MATVEC_SCRATCH_FLOATS)]) as CudaTensor;
    }
    return this.mvScratch;
  }

  rmsNorm(out: Tensor, x: Tensor, weight: Tensor, n: number, eps: number): void {
    const [o, xi, w] = this.check.rmsNorm(out, x, weight, n, eps);
    if (n === 0) return;
    this.ok("rmsNorm", this.lib.hg_cu_rmsnorm(this.ctx, P(o.addr), P(xi.addr), P(w.addr), DTYPE_CODE[w.dtype], n, xi.cols, eps));
  }

  layerNorm(out: Tensor, x: Tensor, weight: Tensor, bias: Tensor, n: number, eps: number): void {
    const [o, xi, w, b] = this.check.layerNorm(out, x, weight, bias, n, eps);
    if (n === 0) return;
    this.ok("layerNorm", this.lib.hg_cu_layernorm(this.ctx, P(o.addr), P(xi.addr), P(w.addr), DTYPE_CODE[w.dtype], P(b.addr), DTYPE_CODE[b.dtype], n, xi.cols, eps));
  }

  rope(x: Tensor, n: number, positions: Int32Array, heads: number, headDim: number, cos: Tensor, sin: Tensor): void {
    const [xi, c, s] = this.check.rope(x, n, positions, heads, headDim, cos, sin);
    if (n === 0) return;
    this.uploadable(n, "rope");
    CudaBackend.int32(heads, "rope", "heads");
    this.ok("rope", this.lib.hg_cu_rope(this.ctx, P(xi.addr), n, xi.cols, positions, heads, headDim, P(c.addr), P(s.addr), c.cols));
  }

  siluMul(out: Tensor, gate: Tensor, up: Tensor, n: number): void {
    const o = this.check.f32(out, "siluMul", "out");
    const g = this.check.f32(gate, "siluMul", "gate");
    const u = this.check.f32(up, "siluMul", "up");
    const count = this.check.elementwise("siluMul", n, [o, "out"], [g, "gate"], [u, "up"]);
    if (count) this.ok("siluMul", this.lib.hg_cu_silu_mul(this.ctx, P(o.addr), P(g.addr), P(u.addr), count));
  }

  relu(x: Tensor, n: number): void {
    const xi = this.check.f32(x, "relu", "x");
    const count = this.check.elementwise("relu", n, [xi, "x"]);
    if (count) this.ok("relu", this.lib.hg_cu_relu(this.ctx, P(xi.addr), count));
  }

  gelu(x: Tensor, n: number): void {
    const xi = this.check.f32(x, "gelu", "x");
    const count = this.check.elementwise("gelu", n, [xi, "x"]);
    if (count) this.ok("gelu", this.lib.hg_cu_gelu(this.ctx, P(xi.addr), count));
  }

  add(out: Tensor, a: Tensor, b: Tensor, n: number): void {
    const o = this.check.f32(out, "add", "out");
    const ai = this.check.f32(a, "add", "a");
    const bi = this.check.f32(b, "add", "b");
    const count = this.check.elementwise("add", n, [o, "out"], [ai, "a"], [bi, "b"]);
    if (count) this.ok("add", this.lib.hg_cu_add(this.ctx, P(o.addr), P(ai.addr), P(bi.addr), count));
  }

  softmax(x: Tensor, rows: number, cols: number): void {
    const xi = this.check.softmax(x, rows, cols);
    if (rows === 0 || cols === 0) return;
    CudaBackend.int32(rows, "softmax", "rows");
    this.ok("softmax", this.lib.hg_cu_softmax(this.ctx, P(xi.addr), rows, xi.cols, cols));
  }

  /**
   * Backend.argmaxRows: out[i] = argmax(x, i) for i < n in one launch (a block a row, argmax's
   * tie rule) and one copy of the n indices: a batched step's greedy picks in one round trip.
   */
  argmaxRows(x: Tensor, n: number, out: Int32Array): void {
    const op = "argmaxRows";
    const xi = this.check.f32(x, op, "x");
    this.check.rowsAtLeast(xi, n, op, "x");
    if (!(out instanceof Int32Array) || out.length < n) bad(`${op}: out must be an Int32Array of at least ${n} values`);
    if (xi.cols < 1) bad(`${op}: x ${xi} has empty rows`);
    CudaBackend.int32(xi.cols, op, "row width");
    CudaBackend.int32(n, op, "row count");
    if (n === 0) return;
    if (!this.pickScratch || this.pickScratch.numel < n) {
      if (this.pickScratch) this.release(this.pickScratch);
      this.pickScratch = null;
      this.pickScratch = this.allocRaw([Math.max(n, 64)], "f32", op);
      this.live.delete(this.pickScratch); // internal: not one of the caller's live tensors
    }
    this.ok(op, this.lib.hg_cu_argmax_rows(this.ctx, P(xi.addr), n, xi.cols, P(this.pickScratch.addr), out));
  }

  // Greedy decode fed on the device (Backend.argmaxToFeed; native/token_feed.cu).
  private feedWidth = 0; // the row width of the last argmaxToFeed: its pick is below it
  private readonly feedOut = new Int32Array(1);
  private readonly feedPicked = [false, false];

  argmaxToFeed(x: Tensor, row: number, slot: number): void {
    const xi = this.check.argmax(x, row);
    if (slot !== 0 && slot !== 1) bad(`argmaxToFeed: slot must be 0 or 1, got ${slot}`);
    CudaBackend.int32(xi.cols, "argmaxToFeed", "row width");
    this.ok("argmaxToFeed", this.lib.hg_cu_argmax_feed(this.ctx, P(xi.at(row * xi.cols)), xi.cols, slot));
    this.feedWidth = xi.cols;
    this.feedPicked[slot] = true;
  }

  embeddingFromFeed(out: Tensor, table: Tensor): void {
    if (this.feedWidth === 0) bad("embeddingFromFeed: nothing was picked into the feed (argmaxToFeed first)");
    const [o, tb] = this.check.embedding(out, table, FEED_ROW_ID);
    // the pick is an index into a row of feedWidth values: it must be a row of the table
    if (this.feedWidth > tb.rows) bad(`embeddingFromFeed: the feed holds picks below ${this.feedWidth}, the table has ${tb.rows} rows`);
    this.ok("embeddingFromFeed", this.lib.hg_cu_embedding_feed(this.ctx, P(o.addr), P(tb.addr), DTYPE_CODE[tb.dtype], tb.cols));
  }

  feedResult(slot: number): number {
    this.live_("feedResult");
    if (slot !== 0 && slot !== 1) bad(`feedResult: slot must be 0 or 1, got ${slot}`);
    if (!this.feedPicked[slot]) bad(`feedResult: slot ${slot} has no pick (argmaxToFeed first)`);
    this.ok("feedResult (or an op queued before it)", this.lib.hg_cu_feed_result(this.ctx, slot, this.feedOut));
    return this.feedOut[0];
  }

  argmax(x: Tensor, row: number): number {
    const xi = this.check.argmax(x, row);
    CudaBackend.int32(xi.cols, "argmax", "row width");
    const r = this.lib.hg_cu_argmax(this.ctx, P(xi.at(row * xi.cols)), xi.cols);
    if (r < 0) this.ok("argmax (or an op queued before it)", -r);
    return r;
  }

  // ---- decode-step graphs ----------------------------------------------------------------------

  /**
   * Starts a decode step (core's Attention calls it for one-token blocks): until endStep() the
   * GEMVs, row ops, attention stages and K/V appends are recorded instead of launched; their
   * per-step values (token id, position, span length, copy destinations) go to a small blob.
   * endStep() replays the CUDA graph captured for `key` when the recorded launches match the
   * ones it was captured from, else captures a new one: one graph launch instead of ~420 kernel
   * launches a step. Any other op in between (a read, a write, a cuBLAS GEMM) first runs what
   * was recorded, and the step finishes eagerly. No-op with the option cudaGraphs: false.
   */
  beginStep(key: string): void {
    const ctx = this.live_("beginStep");
    if (!this.graphs) return;
    if (this.inStep) this.endStep();
    let id = this.stepKeys.get(key);
    if (id === undefined) {
      id = this.nextSlot;
      this.nextSlot = (this.nextSlot + 1) % MAX_GRAPH_KEYS;
      const previous = this.slotOwners[id];
      if (previous !== undefined) {
        // A reused slot starts clean: the previous key's graph and its "run eagerly for the
        // next steps" counter (after a drained step) belong to that key, not this one.
        this.stepKeys.delete(previous);
        this.lib.hg_cu_step_forget(ctx, id);
      }
      this.slotOwners[id] = key;
      this.stepKeys.set(key, id);
    }
    // The unfused matvec parts' scratch is made before the step (allocating inside would end it).
    if (!this.mvScratch && !(this.fuse.norm && this.fuse.siluMul && this.fuse.accumulate)) this.matvecScratch(MATVEC_SCRATCH_FLOATS);
    this.ok("beginStep", this.lib.hg_cu_step_begin(ctx, id));
    this.inStep = true;
  }

  /** Ends the step begun by beginStep(): replays or captures its graph (see beginStep). */
  endStep(): void {
    if (!this.inStep) return;
    this.inStep = false;
    this.ok("endStep (an op of the recorded decode step)", this.lib.hg_cu_step_end(this.live_("endStep")));
  }

  /** Turns decode-step graphs on or off (the cudaGraphs option; benches compare both). */
  private setCudaGraphs(on: boolean): void {
    if (this.inStep) this.endStep();
    this.graphs = on;
  }

  /** Opens (true) or closes a profiler's capture range: ncu or nsys started with --profile-from-start off profile what runs inside. */
  private profilerRange(on: boolean): void {
    const ctx = this.live_("profilerRange");
    if (this.inStep) this.endStep();
    this.ok("profilerRange (cudaProfilerStart/Stop)", this.lib.hg_cu_profiler(ctx, on ? 1 : 0));
  }

  /** Counters of the decode-step graphs since creation. */
  private graphStats(): { captures: number; replays: number; drained: number; eagerSteps: number; recordedOps: number; lastDrain: string } {
    const c = new Float64Array(5);
    const ctx = this.live_("graphStats");
    this.lib.hg_cu_step_stats(ctx, c);
    const info = new Uint8Array(96);
    this.lib.hg_cu_step_info(ctx, info, info.length);
    const end = info.indexOf(0);
    // "<entry point that last drained a step>:<last capture error>"
    const lastDrain = new TextDecoder().decode(info.subarray(0, end < 0 ? info.length : end));
    return { captures: c[0], replays: c[1], drained: c[2], eagerSteps: c[3], recordedOps: c[4], lastDrain };
  }

  /** Forgets every captured graph (the next step of each key captures again). */
  private resetGraphs(): void {
    const ctx = this.live_("resetGraphs");
    if (this.inStep) this.endStep();
    this.lib.hg_cu_step_reset(ctx);
  }

  /**
   * Picks the decode kernels (native/decode_plan.h) as for a device of this compute capability
   * major, from 1 to this device's own (null: its own), so checks and benches run another device's
   * kernels here. Captured step graphs hold the old launches: a change drops them.
   */
  private setPlanMajor(major: number | null): void {
    const ctx = this.live_("setPlanMajor");
    const own = this.device.major;
    const m = major ?? own;
    if (!(Number.isInteger(m) && m >= 1 && m <= own)) bad(`setPlanMajor: major must be an integer from 1 to ${own} (this device's) or null, got ${String(major)}`);
    if (this.inStep) this.endStep();
    this.normDeclined = new WeakMap();  // the weight stream may now take (or decline) the norm
    if (this.lib.hg_cu_set_plan_major(ctx, m) < 0) bad(`setPlanMajor: the library refused major ${m}`);
  }

  /** The compute capability major the decode kernels are picked for. */
  private get planMajor(): number {
    return this.lib.hg_cu_get_plan_major(this.live_("planMajor"));
  }

  // ---- prefill attention ------------------------------------------------------------------------

  /**
   * Causal attention of n query rows (positions firstPos + i) over cached keys [0, firstPos + i]
   * at slots start + j, without the score matrix: a flash-style kernel (tensor cores for
   * bf16/f16 caches with head dim 64 or 128, a warp-per-row kernel otherwise).
   */
  attnCausal(out: Tensor, q: Tensor, n: number, k: Tensor, v: Tensor, start: number, firstPos: number, scale: number): void {
    const op = "attnCausal";
    const o = this.check.f32(out, op, "out");
    const qi = this.check.f32(q, op, "q");
    const kt = this.check.own(k, op, "k");
    const vt = this.check.own(v, op, "v");
    if (kt.shape.length !== 3) bad(`${op}: k must be 3-D [kvHeads, cap, headDim], got ${kt}`);
    if (vt.shape.length !== 3 || vt.shape.some((d, i) => d !== kt.shape[i]) || vt.dtype !== kt.dtype) bad(`${op}: v ${vt} must have the shape and dtype of k ${kt}`);
    const [kvHeads, cap, headDim] = kt.shape;
    if (qi.cols % headDim !== 0 || (qi.cols / headDim) % kvHeads !== 0) bad(`${op}: q rows have ${qi.cols} values, not a multiple of ${kvHeads} KV heads x headDim ${headDim}`);
    const heads = qi.cols / headDim;
    if (o.cols !== qi.cols) bad(`${op}: out rows have ${o.cols} values, q rows ${qi.cols}`);
    this.check.rowsAtLeast(qi, n, op, "q");
    this.check.rowsAtLeast(o, n, op, "out");
    if (!isIndex(start) || !isIndex(firstPos)) bad(`${op}: start and firstPos must be non-negative integers`);
    if (start + firstPos + n > cap) bad(`${op}: keys at slots ${start}..${start + firstPos + n} exceed the cache capacity ${cap}`);
    if (headDim > 256) bad(`${op}: head dim ${headDim} exceeds the kernels' limit of 256`);
    if (!Number.isFinite(scale)) bad(`${op}: scale ${scale} is not finite`);
    if (o.overlaps(qi, n, n)) bad(`${op}: out must not overlap q`);
    CudaBackend.int32(kt.numel, op, "k elements");
    CudaBackend.int32(n * qi.cols, op, "q elements");
    if (n === 0) return;
    if (n === 1) {
      // A decode step: split-K flash decoding, recordable in the step's graph.
      this.ok(op, this.lib.hg_cu_attn_decode(this.ctx, P(o.addr), P(qi.addr), P(kt.addr), P(vt.addr), DTYPE_CODE[kt.dtype], heads, kvHeads, headDim, cap, start, firstPos, scale));
      return;
    }
    this.lib.hg_cu_flash_variant(this.flash);
    this.ok(op, this.lib.hg_cu_attn_causal(this.ctx, P(o.addr), P(qi.addr), qi.cols, P(kt.addr), P(vt.addr), DTYPE_CODE[kt.dtype], heads, kvHeads, headDim, cap, start, firstPos, n, scale));
  }

  /** Whether a one-row attnCausal (a decode step) takes the split-K kernels (else the flash kernel). */
  private attnDecodeIsSplitK(dtype: DType, headDim: number): boolean {
    const key = DTYPE_CODE[dtype] * 65536 + headDim;
    let yes = this.splitKPath.get(key);
    if (yes === undefined) {
      yes = this.lib.hg_cu_attn_decode_path(DTYPE_CODE[dtype], headDim) === 1;
      this.splitKPath.set(key, yes);
    }
    return yes;
  }

  /** Whether attnCausal takes the tensor-core kernel for this cache dtype and head dim. */
  private attnCausalUsesTensorCores(dtype: DType, headDim: number): boolean {
    return this.lib.hg_cu_attn_causal_path(DTYPE_CODE[dtype], headDim) === 1;
  }

  // ---- batched decode attention -------------------------------------------------------------

  /**
   * Backend.attnDecodeBatch: the B rows' K/V appends, split-K decode attention of every row over
   * its own cache, and the merge: three launches for all rows, recordable in a decode step (the
   * per-row table of cache addresses and spans goes with the step's blob, so one captured graph
   * serves every step). Where the split-K kernel does not take the cache (dtype/head dim, a
   * misaligned cache) or after setBatchAttention(false), each row runs as before: one copy per
   * KV head for K and V, then a one-row decode attention.
   */
  attnDecodeBatch(out: Tensor, q: Tensor, k: Tensor, v: Tensor, rows: readonly BatchAttnRow[], scale: number): void {
    const op = "attnDecodeBatch";
    const o = this.check.f32(out, op, "out");
    const qi = this.check.f32(q, op, "q");
    const kn = this.check.f32(k, op, "k");
    const vn = this.check.f32(v, op, "v");
    const B = rows.length;
    if (!(B >= 1 && B <= MAX_BATCH_ATTN_ROWS)) bad(`${op}: ${B} rows, the kernels take 1..${MAX_BATCH_ATTN_ROWS}`);
    const first = this.check.own(rows[0].kCache, op, "rows[0].kCache");
    if (first.shape.length !== 3) bad(`${op}: rows[0].kCache must be 3-D [kvHeads, cap, headDim], got ${first}`);
    const [kvHeads, , headDim] = first.shape;
    const dtype = first.dtype;
    if (qi.cols % headDim !== 0 || (qi.cols / headDim) % kvHeads !== 0) bad(`${op}: q rows have ${qi.cols} values, not a multiple of ${kvHeads} KV heads x headDim ${headDim}`);
    const heads = qi.cols / headDim, kvw = kvHeads * headDim;
    if (o.cols !== qi.cols) bad(`${op}: out rows have ${o.cols} values, q rows ${qi.cols}`);
    if (kn.cols !== kvw || vn.cols !== kvw) bad(`${op}: k and v rows must have ${kvw} values (kvHeads ${kvHeads} x headDim ${headDim}), got ${kn.cols} and ${vn.cols}`);
    this.check.rowsAtLeast(qi, B, op, "q");
    this.check.rowsAtLeast(o, B, op, "out");
    this.check.rowsAtLeast(kn, B, op, "k");
    this.check.rowsAtLeast(vn, B, op, "v");
    if (o.overlaps(qi, B, B) || o.overlaps(kn, B, B) || o.overlaps(vn, B, B)) bad(`${op}: out must not overlap q, k or v`);
    if (headDim > 256) bad(`${op}: head dim ${headDim} exceeds the kernels' limit of 256`);
    if (!Number.isFinite(scale)) bad(`${op}: scale ${scale} is not finite`);
    const t = this.batchTable;
    let aligned = true;
    for (let i = 0; i < B; i++) {
      const r = rows[i];
      const kc = this.check.own(r.kCache, op, `rows[${i}].kCache`);
      const vc = this.check.own(r.vCache, op, `rows[${i}].vCache`);
      if (kc.shape.length !== 3 || kc.shape[0] !== kvHeads || kc.shape[2] !== headDim || kc.dtype !== dtype) {
        bad(`${op}: rows[${i}].kCache ${kc} must be ${dtype}[${kvHeads}, cap, ${headDim}] like rows[0].kCache`);
      }
      if (vc.shape.length !== 3 || vc.shape.some((d, j) => d !== kc.shape[j]) || vc.dtype !== kc.dtype) bad(`${op}: rows[${i}].vCache ${vc} must have the shape and dtype of its kCache ${kc}`);
      const cap = kc.shape[1];
      if (!isIndex(r.slot) || !isIndex(r.start) || !isIndex(r.firstPos)) bad(`${op}: rows[${i}] slot, start and firstPos must be non-negative integers`);
      if (r.slot >= cap) bad(`${op}: rows[${i}] slot ${r.slot} is outside the cache capacity ${cap}`);
      if (r.start + r.firstPos + 1 > cap) bad(`${op}: rows[${i}] keys at slots ${r.start}..${r.start + r.firstPos} exceed the cache capacity ${cap}`);
      CudaBackend.int32(kc.numel, op, `rows[${i}] cache elements`);
      aligned &&= kc.addr % 16 === 0 && vc.addr % 16 === 0;
      const o8 = 8 * i;
      t[o8] = kc.addr % 2 ** 32;
      t[o8 + 1] = Math.floor(kc.addr / 2 ** 32);
      t[o8 + 2] = vc.addr % 2 ** 32;
      t[o8 + 3] = Math.floor(vc.addr / 2 ** 32);
      t[o8 + 4] = cap;
      t[o8 + 5] = r.slot;
      t[o8 + 6] = r.start;
      t[o8 + 7] = r.firstPos + 1;
    }
    const code = DTYPE_CODE[dtype];
    if (this.batchAttention && aligned && this.attnDecodeIsSplitK(dtype, headDim)) {
      this.ok(op, this.lib.hg_cu_attn_decode_batch(this.ctx, P(o.addr), P(qi.addr), P(kn.addr), P(vn.addr), code, B, heads, kvHeads, headDim, t, scale));
      return;
    }
    for (let i = 0; i < B; i++) {
      const o8 = 8 * i, cap = t[o8 + 4], slot = t[o8 + 5];
      const kc = rows[i].kCache as CudaTensor, vc = rows[i].vCache as CudaTensor;
      for (let g = 0; g < kvHeads; g++) {
        const dst = (g * cap + slot) * headDim, src = i * kvw + g * headDim;
        this.ok(op, this.lib.hg_cu_copy(this.ctx, P(kc.at(dst)), code, P(kn.at(src)), F32, headDim));
        this.ok(op, this.lib.hg_cu_copy(this.ctx, P(vc.at(dst)), code, P(vn.at(src)), F32, headDim));
      }
      this.ok(op, this.lib.hg_cu_attn_decode(this.ctx, P(o.at(i * qi.cols)), P(qi.at(i * qi.cols)), P(kc.addr), P(vc.addr), code, heads, kvHeads, headDim, cap, t[o8 + 6], t[o8 + 7] - 1, scale));
    }
  }

  /** attnDecodeBatch through the batched kernels (default) or row by row (benches compare). */
  private setBatchAttention(batched: boolean): void {
    this.live_("setBatchAttention");
    this.batchAttention = batched;
  }

  // ---- hybrid attention's window -------------------------------------------------------------

  /**
   * Backend.attnPartial: the split-K decode kernels over up to 4 spans, emitting the partial
   * (native/span_attn.cu); recordable in a decode step (the spans go with the step's blob).
   */
  attnPartial(part: Tensor, q: Tensor, qRow: number, k: Tensor, v: Tensor, spans: Int32Array, scale: number): void {
    const op = "attnPartial";
    const [pt, qi, kt, vt, [heads, kvHeads, headDim, cap]] = this.check.attnPartial(part, q, qRow, k, v, spans);
    if (headDim > 256) bad(`${op}: head dim ${headDim} exceeds the kernels' limit of 256`);
    if (!Number.isFinite(scale)) bad(`${op}: scale ${scale} is not finite`);
    this.attnLimits(op, kt, "k");
    this.ok(op, this.lib.hg_cu_attn_partial(this.ctx, P(pt.addr), P(qi.at(qRow * qi.cols)), P(kt.addr), P(vt.addr), DTYPE_CODE[kt.dtype], heads, kvHeads, headDim, cap, spans.length ? spans : null, spans.length / 2, scale));
  }

  /** Backend.attnPartialRows: every row's attnPartial in one op (native/span_attn.cu's blocks of each, over a rows table); each row checked as attnPartial checks it. */
  attnPartialRows(rows: readonly AttnPartialRow[]): void {
    const op = "attnPartialRows";
    if (!Array.isArray(rows) || rows.length === 0 || rows.length > 4096) bad(`${op}: 1 to 4096 rows are needed`);
    const table = new Float64Array(12 * rows.length);
    let shape: { heads: number; kvHeads: number; headDim: number; cap: number; dtype: string; scale: number } | null = null;
    rows.forEach((r, i) => {
      const which = `${op}: row ${i}`;
      const [pt, qi, kt, vt, [heads, kvHeads, headDim, cap]] = this.check.attnPartial(r.part, r.q, r.qRow, r.k, r.v, r.spans);
      if (headDim > 256) bad(`${which}: head dim ${headDim} exceeds the kernels' limit of 256`);
      if (!Number.isFinite(r.scale)) bad(`${which}: scale ${r.scale} is not finite`);
      this.attnLimits(which, kt, "k");
      shape ??= { heads, kvHeads, headDim, cap, dtype: kt.dtype, scale: r.scale };
      if (heads !== shape.heads || kvHeads !== shape.kvHeads || headDim !== shape.headDim || cap !== shape.cap || kt.dtype !== shape.dtype || r.scale !== shape.scale) {
        bad(`${which}: ${heads} heads, ${kvHeads} KV heads, head dim ${headDim}, cap ${cap}, K ${kt.dtype}, scale ${r.scale}: not row 0's ${shape.heads}, ${shape.kvHeads}, ${shape.headDim}, ${shape.cap}, ${shape.dtype}, ${shape.scale}`);
      }
      table.set([pt.addr, qi.at(r.qRow * qi.cols), kt.addr, vt.addr], 12 * i);
      table.set(r.spans, 12 * i + 4);
    });
    const x = shape!;
    this.ok(op, this.lib.hg_cu_attn_partial_rows(this.ctx, table, rows.length, DTYPE_CODE[x.dtype as keyof typeof DTYPE_CODE], x.heads, x.kvHeads, x.headDim, x.cap, x.scale));
  }

  /** Backend.appendKvRows: every row's new K and V into its window in one launch (native/span_attn.cu), over a rows table. */
  appendKvRows(rows: readonly KvAppendRow[]): void {
    const op = "appendKvRows";
    if (!Array.isArray(rows) || rows.length === 0 || rows.length > 4096) bad(`${op}: 1 to 4096 rows are needed`);
    const table = new Float64Array(5 * rows.length);
    let shape: { kvHeads: number; cap: number; headDim: number; dtype: string } | null = null;
    rows.forEach((r, i) => {
      const which = `${op}: row ${i}`;
      const k = this.check.own(r.k, which, "k"), v = this.check.own(r.v, which, "v"), kn = this.check.f32(r.kNew, which, "kNew"), vn = this.check.f32(r.vNew, which, "vNew");
      const [kvHeads, cap, headDim] = k.shape;
      if (k.shape.length !== 3 || v.shape.length !== 3 || v.shape.some((d, j) => d !== k.shape[j]) || v.dtype !== k.dtype) bad(`${which}: the windows K ${k} and V ${v} must be one [kvHeads, cap, headDim] shape and dtype`);
      if (kn.numel < kvHeads! * headDim! || vn.numel < kvHeads! * headDim!) bad(`${which}: the new K ${kn} and V ${vn} must hold [${kvHeads}, ${headDim}] floats`);
      if (!(Number.isInteger(r.slot) && r.slot >= 0 && r.slot < cap!)) bad(`${which}: slot ${r.slot} out of range [0, ${cap})`);
      shape ??= { kvHeads: kvHeads!, cap: cap!, headDim: headDim!, dtype: k.dtype };
      if (kvHeads !== shape.kvHeads || cap !== shape.cap || headDim !== shape.headDim || k.dtype !== shape.dtype) bad(`${which}: window ${k} is not row 0's [${shape.kvHeads}, ${shape.cap}, ${shape.headDim}] ${shape.dtype}`);
      table.set([k.addr, v.addr, kn.addr, vn.addr, r.slot], 5 * i);
    });
    const x = shape!;
    this.ok(op, this.lib.hg_cu_window_append_rows(this.ctx, table, rows.length, DTYPE_CODE[x.dtype as keyof typeof DTYPE_CODE], x.kvHeads, x.headDim, x.cap));
  }

  /** Backend.beginSide / endSide / joinSide (native/side_stream.cu). */
  beginSide(): void {
    this.ok("beginSide", this.lib.hg_cu_side(this.live_("beginSide"), 0));
  }

  endSide(): void {
    this.ok("endSide", this.lib.hg_cu_side(this.live_("endSide"), 1));
  }

  joinSide(): void {
    this.ok("joinSide", this.lib.hg_cu_side(this.live_("joinSide"), 2));
  }

  /** Backend.indexRankScratch (native/page_index.cu). */
  indexRankScratch(x: DeviceIndexShape, want: number): number {
    return this.lib.hg_cu_index_rank_scratch(this.live_("indexRankScratch"), x.form, x.kvHeads, x.group, x.headDim, x.pageCapacity, want);
  }

  /** Backend.indexRank: each head's chunks' best pages, then each head's best of those (native/page_index.cuh). */
  indexRank(out: Tensor, outOffset: number, index: Tensor, x: DeviceIndexShape, q: Tensor, count: number, want: number, scratch: Tensor): void {
    const op = "indexRank";
    const r = this.rankRow(op, { out, outOffset, index, q, count, want, scratch }, x, want);
    this.ok(op, this.lib.hg_cu_index_rank(this.ctx, P(r.out), P(r.codes), P(r.codes + x.scalesOffset), P(r.q), P(r.scratch), r.scratchBytes > 2 ** 31 - 1 ? 2 ** 31 - 1 : r.scratchBytes,
      x.form, x.kvHeads, x.group, x.headDim, x.pageCapacity, count, want));
  }

  /** Backend.indexRankRows: every row's ranking in one launch of each kernel (native/page_index.cuh's rank_with over a rows table). */
  indexRankRows(rows: readonly IndexRankRow[], x: DeviceIndexShape): void {
    const op = "indexRankRows";
    if (rows.length === 0) return;
    const wantMax = Math.max(...rows.map((r) => r.want));
    // Each row as the native RankRow: codes, q, out, scratch (lo/hi words), count, want, two words unused.
    const table = new Int32Array(12 * rows.length), words = new Uint32Array(table.buffer);
    rows.forEach((row, i) => {
      const r = this.rankRow(`${op}: row ${i}`, row, x, wantMax);
      [r.codes, r.q, r.out, r.scratch].forEach((a, j) => {
        words[12 * i + 2 * j] = a % 2 ** 32;
        words[12 * i + 2 * j + 1] = Math.floor(a / 2 ** 32);
      });
      table[12 * i + 8] = row.count;
      table[12 * i + 9] = row.want;
    });
    this.ok(op, this.lib.hg_cu_index_rank_rows(this.ctx, table, rows.length, x.form, x.kvHeads, x.group, x.headDim, x.pageCapacity, x.scalesOffset, wantMax));
  }

  /** One ranking's arguments checked (its scratch for a launch whose largest want is `planWant`): their addresses. */
  private rankRow(op: string, row: IndexRankRow, x: DeviceIndexShape, planWant: number): { out: number; codes: number; q: number; scratch: number; scratchBytes: number } {
    const { out, outOffset, index, q, count, want, scratch } = row;
    const o = this.check.own(out, op, "out"), ix = this.check.own(index, op, "index"), qt = this.check.f32(q, op, "q"), sc = this.check.own(scratch, op, "scratch");
    const codeBytes = x.form === 1 ? 2 * x.headDim : x.headDim, need = this.indexRankScratch(x, planWant);
    if (need === 0) bad(`${op}: the device does not rank form ${x.form}, ${x.kvHeads} KV heads × ${x.group} × headDim ${x.headDim}, ${x.pageCapacity} pages, want ${planWant}`);
    if (sc.byteLength < need) bad(`${op}: scratch of ${sc.byteLength} bytes, ${need} needed`);
    if (x.scalesOffset % 4 !== 0 || x.scalesOffset < x.pageCapacity * x.kvHeads * codeBytes || x.scalesOffset + x.pageCapacity * x.kvHeads * 4 > ix.byteLength) {
      bad(`${op}: index of ${ix.byteLength} bytes does not hold ${x.pageCapacity} pages × ${x.kvHeads} KV heads with scales at byte ${x.scalesOffset}`);
    }
    if (!(Number.isInteger(count) && count >= 0 && count <= x.pageCapacity)) bad(`${op}: count ${count} out of range [0, ${x.pageCapacity}]`);
    if (!(Number.isInteger(want) && want >= 1 && want <= planWant)) bad(`${op}: want ${want} out of range [1, ${planWant}]`);
    if (qt.byteLength < x.kvHeads * x.group * x.headDim * 4) bad(`${op}: q holds ${qt.byteLength / 4} floats, ${x.kvHeads * x.group * x.headDim} needed`);
    if (!(Number.isInteger(outOffset) && outOffset >= 0 && outOffset % 4 === 0 && outOffset + x.kvHeads * want * 4 <= o.byteLength)) bad(`${op}: out of ${o.byteLength} bytes does not hold [${x.kvHeads}, ${want}] int32 from byte ${outOffset}`);
    return { out: o.addr + outOffset, codes: ix.addr, q: qt.addr, scratch: sc.addr, scratchBytes: sc.byteLength };
  }

  /** Backend.attnMerge: split over column chunks, then combined with the window's partial (native/span_attn.cu); recordable (start and count per step). */
  attnMerge(out: Tensor, outRow: number, part: Tensor, logits: Tensor, col: number, v: Tensor, start: number, count: number): void {
    const op = "attnMerge";
    const [o, pt, l, vt, [heads, kvHeads, headDim, cap]] = this.check.attnMerge(out, outRow, part, logits, col, v, start, count);
    if (headDim > 256) bad(`${op}: head dim ${headDim} exceeds the kernels' limit of 256`);
    this.attnLimits(op, vt, "v");
    CudaBackend.int32(l.numel, op, "logits elements");
    this.ok(op, this.lib.hg_cu_attn_merge(this.ctx, P(o.at(outRow * o.cols)), P(pt.addr), P(l.at(col)), l.cols, P(vt.addr), DTYPE_CODE[vt.dtype], heads, kvHeads, headDim, cap, start, count));
  }

  /** Backend.attnMergeRows: every row's attnMerge in one op (native/span_attn.cu's blocks of each, over a rows table); each row checked as attnMerge checks it. */
  attnMergeRows(rows: readonly AttnMergeRow[]): void {
    const op = "attnMergeRows";
    if (!Array.isArray(rows) || rows.length === 0 || rows.length > 4096) bad(`${op}: 1 to 4096 rows are needed`);
    const table = new Float64Array(7 * rows.length);
    let shape: { heads: number; kvHeads: number; headDim: number; width: number; dtype: string } | null = null;
    rows.forEach((r, i) => {
      const which = `${op}: row ${i}`;
      const [o, pt, l, vt, [heads, kvHeads, headDim, cap]] = this.check.attnMerge(r.out, r.outRow, r.part, r.logits, r.col, r.v, r.start, r.count);
      if (headDim > 256) bad(`${which}: head dim ${headDim} exceeds the kernels' limit of 256`);
      this.attnLimits(which, vt, "v");
      CudaBackend.int32(l.numel, which, "logits elements");
      shape ??= { heads, kvHeads, headDim, width: l.cols, dtype: vt.dtype };
      if (heads !== shape.heads || kvHeads !== shape.kvHeads || headDim !== shape.headDim || l.cols !== shape.width || vt.dtype !== shape.dtype) {
        bad(`${which}: ${heads} heads, ${kvHeads} KV heads, head dim ${headDim}, logits ${l.cols} wide, V ${vt.dtype}: not row 0's ${shape.heads}, ${shape.kvHeads}, ${shape.headDim}, ${shape.width}, ${shape.dtype}`);
      }
      table.set([o.at(r.outRow * o.cols), pt.addr, l.at(r.col), vt.addr, cap, r.start, r.count], 7 * i);
    });
    const x = shape!;
    this.ok(op, this.lib.hg_cu_attn_merge_rows(this.ctx, table, rows.length, DTYPE_CODE[x.dtype as keyof typeof DTYPE_CODE], x.heads, x.kvHeads, x.headDim, x.width));
  }

  // ---- attention stages ---------------------------------------------------------------------

  /** The kernels' limits on top of core's checks: 32-bit element indices of K/V, the int scratch for slots. */
  private attnLimits(op: string, kv: CudaTensor, kvWhat: string, slots?: Int32Array): void {
    CudaBackend.int32(kv.numel, op, `${kvWhat} elements`);
    if (slots) this.uploadable(slots.length, op);
  }

  attnLogits(logits: Tensor, outCol: number, q: Tensor, qRow: number, k: Tensor, start: number, count: number, scale: number): void {
    const [l, qi, kt, [heads, kvHeads, headDim, cap]] = this.check.attnLogits(logits, outCol, q, qRow, k, start, count);
    this.attnLimits("attnLogits", kt, "k");
    if (count === 0) return;
    this.ok("attnLogits", this.lib.hg_cu_attn_logits(this.ctx, P(l.at(outCol)), l.cols, P(qi.at(qRow * qi.cols)), P(kt.addr), DTYPE_CODE[kt.dtype], heads, kvHeads, headDim, cap, start, null, count, scale));
  }

  attnLogitsGather(logits: Tensor, outCol: number, q: Tensor, qRow: number, k: Tensor, slots: Int32Array, scale: number): void {
    const [l, qi, kt, [heads, kvHeads, headDim, cap]] = this.check.attnLogitsGather(logits, outCol, q, qRow, k, slots);
    this.attnLimits("attnLogitsGather", kt, "k", slots);
    const count = slots.length;
    if (count === 0) return;
    this.ok("attnLogitsGather", this.lib.hg_cu_attn_logits(this.ctx, P(l.at(outCol)), l.cols, P(qi.at(qRow * qi.cols)), P(kt.addr), DTYPE_CODE[kt.dtype], heads, kvHeads, headDim, cap, 0, slots, count, scale));
  }

  attnAggregate(out: Tensor, outRow: number, probs: Tensor, probCol: number, v: Tensor, start: number, count: number, accumulate: boolean): void {
    const [o, p, vt, [heads, kvHeads, headDim, cap]] = this.check.attnAggregate(out, outRow, probs, probCol, v, start, count);
    this.attnLimits("attnAggregate", vt, "v");
    this.ok("attnAggregate", this.lib.hg_cu_attn_aggregate(this.ctx, P(o.at(outRow * o.cols)), P(p.at(probCol)), p.cols, P(vt.addr), DTYPE_CODE[vt.dtype], heads, kvHeads, headDim, cap, start, null, count, accumulate ? 1 : 0));
  }

  attnAggregateGather(out: Tensor, outRow: number, probs: Tensor, probCol: number, v: Tensor, slots: Int32Array, accumulate: boolean): void {
    const [o, p, vt, [heads, kvHeads, headDim, cap]] = this.check.attnAggregateGather(out, outRow, probs, probCol, v, slots);
    this.attnLimits("attnAggregateGather", vt, "v", slots);
    const count = slots.length;
    this.ok("attnAggregateGather", this.lib.hg_cu_attn_aggregate(this.ctx, P(o.at(outRow * o.cols)), P(p.at(probCol)), p.cols, P(vt.addr), DTYPE_CODE[vt.dtype], heads, kvHeads, headDim, cap, 0, count ? slots : null, count, accumulate ? 1 : 0));
  }
}

/** Creates a CudaBackend (throws "CUDA unavailable: …" where no GPU can be used). */
export function createCudaBackend(options: CudaBackendOptions = {}): CudaBackend {
  return new CudaBackend(options);
}
