/**
 * CpuBackend: the Backend contract on top of libhgcpu through bun:ffi.
 * Every call is validated (core's BackendChecks: ownership, liveness, dtype, shapes, ranges)
 * before any pointer reaches C, so bad input is a HybridgenError and never a wild memory access.
 */
import { ptr as addressOf, type Pointer } from "bun:ffi";
import { SPEC_VERSION, DTYPE_BYTES, HybridgenError, type Backend, type DType, type HostRegion, type Tensor } from "@hybridgen/spec";
import { BackendChecks, shapeNumel } from "@hybridgen/spec/kit";
import { native, type NativeLib } from "./native.js";
import { chooseIsa, isaCode, type Isa } from "./features.js";
import { CpuBackendOptionsSchema, type CpuBackendOptions } from "./options.js";
import { CpuTensor } from "./tensor.js";

const DTYPE_CODE: Readonly<Record<DType, number>> = { f32: 0, f16: 1, bf16: 2 };
const F32 = 0;

function bad(message: string): never {
  throw new HybridgenError(message, "EBADARG");
}

export class CpuBackend implements Backend {
  readonly spec = SPEC_VERSION;
  readonly name = "cpu";
  readonly threads: number;
  readonly isa: Isa;
  private ctx: Pointer;
  private isClosed = false;
  private readonly lib: NativeLib;
  private readonly live = new Set<CpuTensor>();
  private readonly check: BackendChecks<CpuTensor>;
  /** The "device" memory cap (memoryCapBytes), or null; `inUse` counts weights and allocations under it. */
  readonly memoryCapBytes: number | null;
  private inUse = 0;
  /** Tensors counted in `inUse` (a tiered store's or allocHost's tensors are not). */
  private readonly charged = new WeakSet<CpuTensor>();

  constructor(options: CpuBackendOptions = {}) {
    const parsed = CpuBackendOptionsSchema.safeParse(options);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      bad(`CpuBackend options: ${issue.path.join(".") || "options"}: ${issue.message}`);
    }
    this.lib = native();
    this.isa = chooseIsa(parsed.data.isa);
    this.memoryCapBytes = parsed.data.memoryCapBytes ?? null;
    const ctx = this.lib.hg_create(parsed.data.threads ?? 0, isaCode(this.isa));
    if (!ctx) bad(`CpuBackend: could not create the ${this.isa} kernel context (out of memory?)`);
    this.ctx = ctx as Pointer;
    this.threads = this.lib.hg_ctx_threads(this.ctx);
    const lib = this.lib;
    this.check = new BackendChecks({
      name: "cpu",
      className: "CpuBackend",
      tensorClass: CpuTensor,
      owner: this,
      usable: (op) => this.live_(op),
      findBadSlot: (slots, cap) => Number(lib.hg_check_slots(slots, slots.length, cap)),
    });
  }

  private live_(op: string): Pointer {
    if (this.isClosed) bad(`${op}: CpuBackend is closed`);
    return this.ctx;
  }

  // ---- memory ---------------------------------------------------------------------------

  loadWeight(bytes: Uint8Array, dtype: DType, shape: readonly number[]): Tensor {
    const need = this.check.loadWeight(bytes, dtype, shape);
    const address = addressOf(bytes);
    if (address % DTYPE_BYTES[dtype] === 0) {
      this.charge(need, "loadWeight", dtype, shape);
      const t = new CpuTensor(this, dtype, [...shape], address, need, false, bytes);
      this.charged.add(t);
      this.live.add(t);
      return t;
    }
    // Misaligned for its element type (e.g. an odd safetensors offset): copy once.
    const t = this.allocRaw([...shape], dtype, "loadWeight");
    this.lib.hg_convert(this.ctx, t.ptr, DTYPE_CODE[dtype], bytes, DTYPE_CODE[dtype], need / DTYPE_BYTES[dtype]);
    return t;
  }

  alloc(shape: readonly number[], dtype: DType = "f32"): Tensor {
    this.check.alloc(shape, dtype);
    return this.allocRaw([...shape], dtype, "alloc");
  }

  /**
   * A tensor in host memory outside the memory cap: the offloaded KV store of a capped backend
   * standing in for a GPU (the store would be in host memory beside a real one).
   */
  allocHost(shape: readonly number[], dtype: DType = "f32"): Tensor {
    this.check.alloc(shape, dtype);
    return this.allocRaw([...shape], dtype, "allocHost", true);
  }

  /** Bytes of the "device" memory in use under the cap (weights and allocations, not allocHost's). */
  get memoryInUseBytes(): number {
    return this.inUse;
  }

  private charge(bytes: number, op: string, dtype: DType, shape: readonly number[]): void {
    if (this.memoryCapBytes !== null && this.inUse + bytes > this.memoryCapBytes) {
      throw new HybridgenError(
        `out of device memory: ${op} of ${dtype}[${shape.join("x")}] needs ${bytes} bytes, but ${this.inUse} of the ${this.memoryCapBytes}-byte cap are in use`, "ENOMEM",
      );
    }
    this.inUse += bytes;
  }

  private allocRaw(shape: number[], dtype: DType, op: string, host = false): CpuTensor {
    const bytes = shapeNumel(shape, op) * DTYPE_BYTES[dtype];
    if (!host) this.charge(bytes, op, dtype, shape);
    const p = this.lib.hg_alloc(bytes);
    if (!p) {
      if (!host) this.inUse -= bytes;
      bad(`${op}: out of memory allocating ${bytes} bytes for ${dtype}[${shape.join("x")}]`);
    }
    const t = new CpuTensor(this, dtype, shape, p as Pointer, bytes, true);
    if (!host) this.charged.add(t);
    this.live.add(t);
    return t;
  }

  write(t: Tensor, src: Float32Array, offset = 0): void {
    const d = this.check.write(t, src, offset);
    if (src.length === 0) return;
    this.lib.hg_convert(this.ctx, d.at(offset), DTYPE_CODE[d.dtype], src, F32, src.length);
  }

  read(t: Tensor, offset = 0, count?: number): Float32Array {
    const [s, n] = this.check.read(t, offset, count);
    const out = new Float32Array(n);
    if (n > 0) this.lib.hg_convert(this.ctx, out, F32, s.at(offset), DTYPE_CODE[s.dtype], n);
    return out;
  }

  copyRows(dst: Tensor, dstRow: number, src: Tensor, srcRow: number, count: number): void {
    const [d, s] = this.check.copyRows(dst, dstRow, src, srcRow, count);
    if (count === 0) return;
    this.lib.hg_convert(this.ctx, d.at(dstRow * d.cols), DTYPE_CODE[d.dtype], s.at(srcRow * s.cols), DTYPE_CODE[s.dtype], count * d.cols);
  }

  view(t: Tensor, offset: number, shape: readonly number[]): Tensor {
    const [b, numel] = this.check.view(t, offset, shape);
    const root = b.base ?? b;
    // Not tracked in `live`: a view dies with its base (CpuTensor.dead), so an engine can make
    // views per step without anything to free; unreferenced handles are simply collected.
    return new CpuTensor(this, b.dtype, [...shape], b.at(offset), numel * b.elementBytes, false, undefined, root);
  }

  free(t: Tensor): void {
    this.release(this.check.free(t));
  }

  private release(t: CpuTensor): void {
    if (this.charged.delete(t)) this.inUse -= t.byteLength;
    t.freed = true;
    this.live.delete(t);
    if (t.owned) this.lib.hg_free(t.ptr, t.byteLength);
  }

  /** Frees every live tensor and stops the thread pool. Idempotent. */
  close(): void {
    if (this.isClosed) return;
    for (const t of [...this.live]) {
      t.freed = true;
      if (t.owned) this.lib.hg_free(t.ptr, t.byteLength);
    }
    this.live.clear();
    this.inUse = 0;
    this.lib.hg_destroy(this.ctx);
    this.isClosed = true;
  }

  [Symbol.dispose](): void {
    this.close();
  }

  get closed(): boolean {
    return this.isClosed;
  }

  /** Tensors currently alive (allocated or loaded, not freed; views are not counted). */
  get liveTensors(): number {
    return this.live.size;
  }

  /** Native address of a tensor's first element, for other native code (kept valid until free). */
  address(t: Tensor): Pointer {
    return this.check.own(t, "address", "tensor").ptr;
  }

  /** Backend.hostRegion: a tensor's host memory, for a device backend's copies (valid until free). */
  hostRegion(t: Tensor): HostRegion {
    const c = this.check.own(t, "hostRegion", "tensor");
    return { address: c.ptr, byteLength: c.byteLength };
  }

  /** Multithreaded streaming read of a whole tensor (sum of its f32 values): the bandwidth baseline. */
  streamSum(t: Tensor): number {
    const s = this.check.f32(t, "streamSum", "tensor");
    return this.lib.hg_stream_sum(this.ctx, s.ptr, s.byteLength);
  }

  /** Diagnostics: runs one op on the pool and returns how many distinct OS threads ran it. */
  probeThreads(): number {
    return this.lib.hg_pool_probe(this.live_("probeThreads"));
  }

  // ---- elementwise and row ops ----------------------------------------------------------

  embedding(out: Tensor, table: Tensor, ids: Int32Array): void {
    const [o, tb] = this.check.embedding(out, table, ids);
    if (ids.length === 0) return;
    this.lib.hg_embedding(this.ctx, o.ptr, tb.ptr, DTYPE_CODE[tb.dtype], tb.cols, ids, ids.length);
  }

  matmul(out: Tensor, x: Tensor, w: Tensor, n: number, bias?: Tensor): void {
    const [o, xi, wt, b] = this.check.matmul(out, x, w, n, bias);
    if (n === 0) return;
    const m = wt.shape[0], k = wt.shape[1]; // not destructured: this runs per decode op
    this.lib.hg_matmul(this.ctx, o.ptr, xi.ptr, wt.ptr, DTYPE_CODE[wt.dtype], b ? b.ptr : null, b ? DTYPE_CODE[b.dtype] : 0, n, k, m);
  }

  rmsNorm(out: Tensor, x: Tensor, weight: Tensor, n: number, eps: number): void {
    const [o, xi, w] = this.check.rmsNorm(out, x, weight, n, eps);
    if (n === 0) return;
    if (!this.lib.hg_rmsnorm(this.ctx, o.ptr, xi.ptr, w.ptr, DTYPE_CODE[w.dtype], n, xi.cols, eps)) bad("rmsNorm: out of memory");
  }

  layerNorm(out: Tensor, x: Tensor, weight: Tensor, bias: Tensor, n: number, eps: number): void {
    const [o, xi, w, b] = this.check.layerNorm(out, x, weight, bias, n, eps);
    if (n === 0) return;
    const ok = this.lib.hg_layernorm(this.ctx, o.ptr, xi.ptr, w.ptr, DTYPE_CODE[w.dtype], b.ptr, DTYPE_CODE[b.dtype], n, xi.cols, eps);
    if (!ok) bad("layerNorm: out of memory");
  }

  rope(x: Tensor, n: number, positions: Int32Array, heads: number, headDim: number, cos: Tensor, sin: Tensor): void {
    const [xi, c, s] = this.check.rope(x, n, positions, heads, headDim, cos, sin);
    if (n === 0) return;
    this.lib.hg_rope(this.ctx, xi.ptr, n, xi.cols, positions, heads, headDim, c.ptr, s.ptr, c.cols);
  }

  siluMul(out: Tensor, gate: Tensor, up: Tensor, n: number): void {
    const o = this.check.f32(out, "siluMul", "out");
    const g = this.check.f32(gate, "siluMul", "gate");
    const u = this.check.f32(up, "siluMul", "up");
    const count = this.check.elementwise("siluMul", n, [o, "out"], [g, "gate"], [u, "up"]);
    if (count) this.lib.hg_silu_mul(this.ctx, o.ptr, g.ptr, u.ptr, count);
  }

  relu(x: Tensor, n: number): void {
    const xi = this.check.f32(x, "relu", "x");
    const count = this.check.elementwise("relu", n, [xi, "x"]);
    if (count) this.lib.hg_relu(this.ctx, xi.ptr, count);
  }

  gelu(x: Tensor, n: number): void {
    const xi = this.check.f32(x, "gelu", "x");
    const count = this.check.elementwise("gelu", n, [xi, "x"]);
    if (count) this.lib.hg_gelu(this.ctx, xi.ptr, count);
  }

  add(out: Tensor, a: Tensor, b: Tensor, n: number): void {
    const o = this.check.f32(out, "add", "out");
    const ai = this.check.f32(a, "add", "a");
    const bi = this.check.f32(b, "add", "b");
    const count = this.check.elementwise("add", n, [o, "out"], [ai, "a"], [bi, "b"]);
    if (count) this.lib.hg_add(this.ctx, o.ptr, ai.ptr, bi.ptr, count);
  }

  softmax(x: Tensor, rows: number, cols: number): void {
    const xi = this.check.softmax(x, rows, cols);
    if (rows === 0 || cols === 0) return;
    this.lib.hg_softmax(this.ctx, xi.ptr, rows, xi.cols, cols);
  }

  argmax(x: Tensor, row: number): number {
    const xi = this.check.argmax(x, row);
    return Number(this.lib.hg_argmax(this.ctx, xi.at(row * xi.cols), xi.cols));
  }

  // ---- attention stages -------------------------------------------------------------------

  attnLogits(logits: Tensor, outCol: number, q: Tensor, qRow: number, k: Tensor, start: number, count: number, scale: number): void {
    const [l, qi, kt, [heads, kvHeads, headDim, cap]] = this.check.attnLogits(logits, outCol, q, qRow, k, start, count);
    if (count === 0) return;
    const ok = this.lib.hg_attn_logits(this.ctx, l.at(outCol), l.cols, qi.at(qRow * qi.cols), kt.ptr, DTYPE_CODE[kt.dtype], heads, kvHeads, headDim, cap, start, null, count, scale);
    if (!ok) bad("attnLogits: out of memory"); // the packed query buffer
  }

  attnLogitsGather(logits: Tensor, outCol: number, q: Tensor, qRow: number, k: Tensor, slots: Int32Array, scale: number): void {
    const [l, qi, kt, [heads, kvHeads, headDim, cap]] = this.check.attnLogitsGather(logits, outCol, q, qRow, k, slots);
    const count = slots.length;
    if (count === 0) return;
    const ok = this.lib.hg_attn_logits(this.ctx, l.at(outCol), l.cols, qi.at(qRow * qi.cols), kt.ptr, DTYPE_CODE[kt.dtype], heads, kvHeads, headDim, cap, 0, slots, count, scale);
    if (!ok) bad("attnLogitsGather: out of memory");
  }

  attnAggregate(out: Tensor, outRow: number, probs: Tensor, probCol: number, v: Tensor, start: number, count: number, accumulate: boolean): void {
    const [o, p, vt, [heads, kvHeads, headDim, cap]] = this.check.attnAggregate(out, outRow, probs, probCol, v, start, count);
    const ok = this.lib.hg_attn_aggregate(this.ctx, o.at(outRow * o.cols), p.at(probCol), p.cols, vt.ptr, DTYPE_CODE[vt.dtype], heads, kvHeads, headDim, cap, start, null, count, accumulate ? 1 : 0);
    if (!ok) bad("attnAggregate: out of memory");
  }

  attnAggregateGather(out: Tensor, outRow: number, probs: Tensor, probCol: number, v: Tensor, slots: Int32Array, accumulate: boolean): void {
    const [o, p, vt, [heads, kvHeads, headDim, cap]] = this.check.attnAggregateGather(out, outRow, probs, probCol, v, slots);
    const count = slots.length;
    const ok = this.lib.hg_attn_aggregate(this.ctx, o.at(outRow * o.cols), p.at(probCol), p.cols, vt.ptr, DTYPE_CODE[vt.dtype], heads, kvHeads, headDim, cap, 0, count ? slots : null, count, accumulate ? 1 : 0);
    if (!ok) bad("attnAggregateGather: out of memory");
  }

  attnPartial(part: Tensor, q: Tensor, qRow: number, k: Tensor, v: Tensor, spans: Int32Array, scale: number): void {
    const [pt, qi, kt, vt, [heads, kvHeads, headDim, cap]] = this.check.attnPartial(part, q, qRow, k, v, spans);
    const ok = this.lib.hg_attn_partial(this.ctx, pt.ptr, qi.at(qRow * qi.cols), kt.ptr, vt.ptr, DTYPE_CODE[kt.dtype], heads, kvHeads, headDim, cap, spans.length ? spans : null, spans.length / 2, scale);
    if (!ok) bad("attnPartial: out of memory");
  }

  attnMerge(out: Tensor, outRow: number, part: Tensor, logits: Tensor, col: number, v: Tensor, start: number, count: number): void {
    const [o, pt, l, vt, [heads, kvHeads, headDim, cap]] = this.check.attnMerge(out, outRow, part, logits, col, v, start, count);
    const ok = this.lib.hg_attn_merge(this.ctx, o.at(outRow * o.cols), pt.ptr, l.at(col), l.cols, vt.ptr, DTYPE_CODE[vt.dtype], heads, kvHeads, headDim, cap, start, count);
    if (!ok) bad("attnMerge: out of memory");
  }
}

/** Creates a CpuBackend; options are validated with CpuBackendOptionsSchema. */
export function createCpuBackend(options: CpuBackendOptions = {}): CpuBackend {
  return new CpuBackend(options);
}
