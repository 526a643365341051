/**
 * CpuBackend: the Backend contract on top of libhgcpu through bun:ffi.
 * Every call is validated here (ownership, liveness, dtype, shapes, ranges) before any
 * pointer reaches C, so bad input is a HybridgenError and never a wild memory access.
 */
import { ptr as addressOf, type Pointer } from "bun:ffi";
import { DTYPE_BYTES, HybridgenError, type Backend, type DType, type Tensor } from "@hybridgen/core";
import { native, type NativeLib } from "./native.js";
import { chooseIsa, isaCode, type Isa } from "./features.js";
import { CpuBackendOptionsSchema, type CpuBackendOptions } from "./options.js";
import { CpuTensor } from "./tensor.js";

const DTYPE_CODE: Readonly<Record<DType, number>> = { f32: 0, f16: 1, bf16: 2 };
const F32 = 0;

function bad(message: string): never {
  throw new HybridgenError(message, "EBADARG");
}

function isIndex(v: number): boolean {
  return Number.isInteger(v) && v >= 0;
}

export class CpuBackend implements Backend {
  readonly name = "cpu";
  readonly threads: number;
  readonly isa: Isa;
  private ctx: Pointer;
  private isClosed = false;
  private readonly lib: NativeLib;
  private readonly live = new Set<CpuTensor>();

  constructor(options: CpuBackendOptions = {}) {
    const parsed = CpuBackendOptionsSchema.safeParse(options);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      bad(`CpuBackend options: ${issue.path.join(".") || "options"}: ${issue.message}`);
    }
    this.lib = native();
    this.isa = chooseIsa(parsed.data.isa);
    const ctx = this.lib.hg_create(parsed.data.threads ?? 0, isaCode(this.isa));
    if (!ctx) bad(`CpuBackend: could not create the ${this.isa} kernel context (out of memory?)`);
    this.ctx = ctx as Pointer;
    this.threads = this.lib.hg_ctx_threads(this.ctx);
  }

  // ---- validation -----------------------------------------------------------------------

  private live_(): Pointer {
    if (this.isClosed) bad("CpuBackend is closed");
    return this.ctx;
  }

  /** The CpuTensor behind `t`, checked to belong to this open backend and not be freed. */
  private own(t: Tensor, op: string, what: string): CpuTensor {
    if (this.isClosed) bad(`${op}: CpuBackend is closed`);
    if (!(t instanceof CpuTensor)) {
      bad(`${op}: ${what} belongs to backend '${(t as Tensor | undefined)?.backend ?? typeof t}', not this cpu backend`);
    }
    if (t.owner !== this) bad(`${op}: ${what} belongs to another CpuBackend instance`);
    if (t.dead) bad(`${op}: ${what} was freed${t.freed ? "" : " (its base tensor was)"}`);
    return t;
  }

  private f32(t: Tensor, op: string, what: string): CpuTensor {
    const c = this.own(t, op, what);
    if (c.dtype !== "f32") bad(`${op}: ${what} must be f32, got ${c.dtype}`);
    return c;
  }

  private rowsAtLeast(t: CpuTensor, n: number, op: string, what: string): void {
    if (!isIndex(n)) bad(`${op}: row count ${n} is not a non-negative integer`);
    if (n > t.rows) bad(`${op}: ${what} ${t} has ${t.rows} rows, ${n} requested`);
  }

  private static shapeOf(shape: readonly number[], op: string): number {
    if (!Array.isArray(shape) || shape.length === 0) bad(`${op}: shape must be a non-empty array`);
    let numel = 1;
    for (const d of shape) {
      if (!Number.isInteger(d) || d < 1) bad(`${op}: shape [${shape.join(", ")}] has a dimension that is not a positive integer`);
      numel *= d;
    }
    if (!Number.isSafeInteger(numel)) bad(`${op}: shape [${shape.join(", ")}] is too large`);
    return numel;
  }

  private static dtypeOk(dtype: DType, op: string): void {
    if (!(dtype in DTYPE_CODE)) bad(`${op}: unknown dtype '${dtype}' (f32, f16 or bf16)`);
  }

  // ---- memory ---------------------------------------------------------------------------

  loadWeight(bytes: Uint8Array, dtype: DType, shape: readonly number[]): Tensor {
    this.live_();
    CpuBackend.dtypeOk(dtype, "loadWeight");
    const numel = CpuBackend.shapeOf(shape, "loadWeight");
    if (!(bytes instanceof Uint8Array)) bad("loadWeight: bytes must be a Uint8Array");
    const need = numel * DTYPE_BYTES[dtype];
    if (bytes.byteLength !== need) {
      bad(`loadWeight: ${dtype}[${shape.join("x")}] needs ${need} bytes, got ${bytes.byteLength}`);
    }
    const address = addressOf(bytes);
    if (address % DTYPE_BYTES[dtype] === 0) {
      const t = new CpuTensor(this, dtype, [...shape], address, need, false, bytes);
      this.live.add(t);
      return t;
    }
    // Misaligned for its element type (e.g. an odd safetensors offset): copy once.
    const t = this.allocRaw([...shape], dtype, "loadWeight");
    this.lib.hg_convert(this.ctx, t.ptr, DTYPE_CODE[dtype], bytes, DTYPE_CODE[dtype], need / DTYPE_BYTES[dtype]);
    return t;
  }

  alloc(shape: readonly number[], dtype: DType = "f32"): Tensor {
    this.live_();
    CpuBackend.dtypeOk(dtype, "alloc");
    return this.allocRaw([...shape], dtype, "alloc");
  }

  private allocRaw(shape: number[], dtype: DType, op: string): CpuTensor {
    const numel = CpuBackend.shapeOf(shape, op);
    const bytes = numel * DTYPE_BYTES[dtype];
    const p = this.lib.hg_alloc(bytes);
    if (!p) bad(`${op}: out of memory allocating ${bytes} bytes for ${dtype}[${shape.join("x")}]`);
    const t = new CpuTensor(this, dtype, shape, p as Pointer, bytes, true);
    this.live.add(t);
    return t;
  }

  write(t: Tensor, src: Float32Array, offset = 0): void {
    const d = this.own(t, "write", "tensor");
    if (!(src instanceof Float32Array)) bad("write: src must be a Float32Array");
    if (!isIndex(offset) || offset + src.length > d.numel) {
      bad(`write: ${src.length} values at offset ${offset} do not fit in ${d} (${d.numel} elements)`);
    }
    if (src.length === 0) return;
    this.lib.hg_convert(this.ctx, d.at(offset), DTYPE_CODE[d.dtype], src, F32, src.length);
  }

  read(t: Tensor, offset = 0, count?: number): Float32Array {
    const s = this.own(t, "read", "tensor");
    const n = count ?? s.numel - offset;
    if (!isIndex(offset) || !isIndex(n) || offset + n > s.numel) {
      bad(`read: ${n} values at offset ${offset} are outside ${s} (${s.numel} elements)`);
    }
    const out = new Float32Array(n);
    if (n > 0) this.lib.hg_convert(this.ctx, out, F32, s.at(offset), DTYPE_CODE[s.dtype], n);
    return out;
  }

  copyRows(dst: Tensor, dstRow: number, src: Tensor, srcRow: number, count: number): void {
    const d = this.own(dst, "copyRows", "dst");
    const s = this.own(src, "copyRows", "src");
    if (d.cols !== s.cols) bad(`copyRows: row widths differ (dst ${d} has ${d.cols}, src ${s} has ${s.cols})`);
    if (d.dtype !== s.dtype && s.dtype !== "f32") bad(`copyRows: cannot convert ${s.dtype} rows to ${d.dtype} (same dtype or f32 source)`);
    if (!isIndex(count) || !isIndex(dstRow) || !isIndex(srcRow)) bad("copyRows: rows and count must be non-negative integers");
    if (dstRow + count > d.rows) bad(`copyRows: dst rows ${dstRow}..${dstRow + count} exceed ${d.rows} rows of ${d}`);
    if (srcRow + count > s.rows) bad(`copyRows: src rows ${srcRow}..${srcRow + count} exceed ${s.rows} rows of ${s}`);
    if (count === 0) return;
    this.lib.hg_convert(this.ctx, d.at(dstRow * d.cols), DTYPE_CODE[d.dtype], s.at(srcRow * s.cols), DTYPE_CODE[s.dtype], count * d.cols);
  }

  view(t: Tensor, offset: number, shape: readonly number[]): Tensor {
    const b = this.own(t, "view", "tensor");
    const numel = CpuBackend.shapeOf(shape, "view");
    if (!isIndex(offset) || offset + numel > b.numel) {
      bad(`view: ${numel} elements at offset ${offset} are outside ${b} (${b.numel} elements)`);
    }
    const root = b.base ?? b;
    // Not tracked in `live`: a view dies with its base (CpuTensor.dead), so an engine can make
    // views per step without anything to free; unreferenced handles are simply collected.
    return new CpuTensor(this, b.dtype, [...shape], b.at(offset), numel * b.elementBytes, false, undefined, root);
  }

  free(t: Tensor): void {
    if (t instanceof CpuTensor && t.owner === this && t.freed) bad(`free: tensor ${t} was already freed`);
    const c = this.own(t, "free", "tensor");
    this.release(c);
  }

  private release(t: CpuTensor): void {
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
    return this.own(t, "address", "tensor").ptr;
  }

  /** Multithreaded streaming read of a whole tensor (sum of its f32 values): the bandwidth baseline. */
  streamSum(t: Tensor): number {
    const s = this.f32(t, "streamSum", "tensor");
    return this.lib.hg_stream_sum(this.ctx, s.ptr, s.byteLength);
  }

  /** Diagnostics: runs one op on the pool and returns how many distinct OS threads ran it. */
  probeThreads(): number {
    return this.lib.hg_pool_probe(this.live_());
  }

  // ---- elementwise and row ops ----------------------------------------------------------

  embedding(out: Tensor, table: Tensor, ids: Int32Array): void {
    const o = this.f32(out, "embedding", "out");
    const tb = this.own(table, "embedding", "table");
    if (!(ids instanceof Int32Array)) bad("embedding: ids must be an Int32Array");
    if (tb.shape.length !== 2) bad(`embedding: table must be 2-D [vocab, dim], got ${tb}`);
    if (o.cols !== tb.cols) bad(`embedding: out rows have ${o.cols} values, table rows ${tb.cols}`);
    this.rowsAtLeast(o, ids.length, "embedding", "out");
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i];
      if (id < 0 || id >= tb.rows) bad(`embedding: id ${id} at position ${i} is outside the table's ${tb.rows} rows`);
    }
    if (ids.length === 0) return;
    this.lib.hg_embedding(this.ctx, o.ptr, tb.ptr, DTYPE_CODE[tb.dtype], tb.cols, ids, ids.length);
  }

  matmul(out: Tensor, x: Tensor, w: Tensor, n: number, bias?: Tensor): void {
    const o = this.f32(out, "matmul", "out");
    const xi = this.f32(x, "matmul", "x");
    const wt = this.own(w, "matmul", "w");
    if (wt.shape.length !== 2) bad(`matmul: w must be 2-D [m, k], got ${wt}`);
    const m = wt.shape[0];
    const k = wt.shape[1];
    if (xi.cols !== k) bad(`matmul: x rows have ${xi.cols} values but w ${wt} expects k=${k}`);
    if (o.cols !== m) bad(`matmul: out rows have ${o.cols} values but w ${wt} gives m=${m}`);
    this.rowsAtLeast(xi, n, "matmul", "x");
    this.rowsAtLeast(o, n, "matmul", "out");
    if (o.overlaps(xi, n, n)) bad("matmul: out must not overlap x");
    let bp: Pointer | null = null;
    let bt = 0;
    if (bias !== undefined) {
      const b = this.own(bias, "matmul", "bias");
      if (b.numel !== m) bad(`matmul: bias ${b} must have m=${m} elements`);
      bp = b.ptr;
      bt = DTYPE_CODE[b.dtype];
    }
    if (n === 0) return;
    this.lib.hg_matmul(this.ctx, o.ptr, xi.ptr, wt.ptr, DTYPE_CODE[wt.dtype], bp, bt, n, k, m);
  }

  rmsNorm(out: Tensor, x: Tensor, weight: Tensor, n: number, eps: number): void {
    const o = this.f32(out, "rmsNorm", "out");
    const xi = this.f32(x, "rmsNorm", "x");
    const w = this.own(weight, "rmsNorm", "weight");
    if (o.cols !== xi.cols) bad(`rmsNorm: out rows have ${o.cols} values, x rows ${xi.cols}`);
    if (w.numel !== xi.cols) bad(`rmsNorm: weight ${w} must have ${xi.cols} elements`);
    this.rowsAtLeast(xi, n, "rmsNorm", "x");
    this.rowsAtLeast(o, n, "rmsNorm", "out");
    if (!(eps >= 0)) bad(`rmsNorm: eps ${eps} must be >= 0`);
    if (n === 0) return;
    if (!this.lib.hg_rmsnorm(this.ctx, o.ptr, xi.ptr, w.ptr, DTYPE_CODE[w.dtype], n, xi.cols, eps)) bad("rmsNorm: out of memory");
  }

  layerNorm(out: Tensor, x: Tensor, weight: Tensor, bias: Tensor, n: number, eps: number): void {
    const o = this.f32(out, "layerNorm", "out");
    const xi = this.f32(x, "layerNorm", "x");
    const w = this.own(weight, "layerNorm", "weight");
    const b = this.own(bias, "layerNorm", "bias");
    if (o.cols !== xi.cols) bad(`layerNorm: out rows have ${o.cols} values, x rows ${xi.cols}`);
    if (w.numel !== xi.cols) bad(`layerNorm: weight ${w} must have ${xi.cols} elements`);
    if (b.numel !== xi.cols) bad(`layerNorm: bias ${b} must have ${xi.cols} elements`);
    this.rowsAtLeast(xi, n, "layerNorm", "x");
    this.rowsAtLeast(o, n, "layerNorm", "out");
    if (!(eps >= 0)) bad(`layerNorm: eps ${eps} must be >= 0`);
    if (n === 0) return;
    const ok = this.lib.hg_layernorm(this.ctx, o.ptr, xi.ptr, w.ptr, DTYPE_CODE[w.dtype], b.ptr, DTYPE_CODE[b.dtype], n, xi.cols, eps);
    if (!ok) bad("layerNorm: out of memory");
  }

  rope(x: Tensor, n: number, positions: Int32Array, heads: number, headDim: number, cos: Tensor, sin: Tensor): void {
    const xi = this.f32(x, "rope", "x");
    const c = this.f32(cos, "rope", "cos");
    const s = this.f32(sin, "rope", "sin");
    if (!(positions instanceof Int32Array)) bad("rope: positions must be an Int32Array");
    if (!isIndex(heads) || !isIndex(headDim) || heads * headDim !== xi.cols) {
      bad(`rope: x rows have ${xi.cols} values, not heads ${heads} x headDim ${headDim}`);
    }
    if (c.shape.length !== 2 || s.shape.length !== 2 || c.shape[0] !== s.shape[0] || c.cols !== s.cols) {
      bad(`rope: cos ${c} and sin ${s} must both be [maxPos, rot/2]`);
    }
    const half = c.cols;
    if (2 * half > headDim) bad(`rope: rotary width ${2 * half} exceeds headDim ${headDim}`);
    this.rowsAtLeast(xi, n, "rope", "x");
    if (positions.length < n) bad(`rope: ${positions.length} positions for ${n} rows`);
    for (let i = 0; i < n; i++) {
      const p = positions[i];
      if (p < 0 || p >= c.rows) bad(`rope: position ${p} of row ${i} is outside the tables' ${c.rows} positions`);
    }
    if (n === 0) return;
    this.lib.hg_rope(this.ctx, xi.ptr, n, xi.cols, positions, heads, headDim, c.ptr, s.ptr, half);
  }

  private sameRows(op: string, n: number, ...ts: [CpuTensor, string][]): number {
    const cols = ts[0][0].cols;
    for (const [t, what] of ts) {
      if (t.cols !== cols) bad(`${op}: ${what} rows have ${t.cols} values, expected ${cols}`);
      this.rowsAtLeast(t, n, op, what);
    }
    return n * cols;
  }

  siluMul(out: Tensor, gate: Tensor, up: Tensor, n: number): void {
    const o = this.f32(out, "siluMul", "out");
    const g = this.f32(gate, "siluMul", "gate");
    const u = this.f32(up, "siluMul", "up");
    const count = this.sameRows("siluMul", n, [o, "out"], [g, "gate"], [u, "up"]);
    if (count) this.lib.hg_silu_mul(this.ctx, o.ptr, g.ptr, u.ptr, count);
  }

  relu(x: Tensor, n: number): void {
    const xi = this.f32(x, "relu", "x");
    const count = this.sameRows("relu", n, [xi, "x"]);
    if (count) this.lib.hg_relu(this.ctx, xi.ptr, count);
  }

  gelu(x: Tensor, n: number): void {
    const xi = this.f32(x, "gelu", "x");
    const count = this.sameRows("gelu", n, [xi, "x"]);
    if (count) this.lib.hg_gelu(this.ctx, xi.ptr, count);
  }

  add(out: Tensor, a: Tensor, b: Tensor, n: number): void {
    const o = this.f32(out, "add", "out");
    const ai = this.f32(a, "add", "a");
    const bi = this.f32(b, "add", "b");
    const count = this.sameRows("add", n, [o, "out"], [ai, "a"], [bi, "b"]);
    if (count) this.lib.hg_add(this.ctx, o.ptr, ai.ptr, bi.ptr, count);
  }

  softmax(x: Tensor, rows: number, cols: number): void {
    const xi = this.f32(x, "softmax", "x");
    this.rowsAtLeast(xi, rows, "softmax", "x");
    if (!isIndex(cols) || cols > xi.cols) bad(`softmax: ${cols} columns requested, ${xi} has ${xi.cols}`);
    if (rows === 0 || cols === 0) return;
    this.lib.hg_softmax(this.ctx, xi.ptr, rows, xi.cols, cols);
  }

  argmax(x: Tensor, row: number): number {
    const xi = this.f32(x, "argmax", "x");
    if (!isIndex(row) || row >= xi.rows) bad(`argmax: row ${row} is outside ${xi} (${xi.rows} rows)`);
    return Number(this.lib.hg_argmax(this.ctx, xi.at(row * xi.cols), xi.cols));
  }

  // ---- attention stages -------------------------------------------------------------------

  /** Checks shared by the attention ops; returns [heads, kvHeads, headDim, cap, width]. */
  private attnShape(op: string, rowsT: CpuTensor, rowsWhat: string, row: number, wide: CpuTensor, wideWhat: string, col: number, count: number, kv: CpuTensor, kvWhat: string): [number, number, number, number] {
    if (wide.shape.length !== 2) bad(`${op}: ${wideWhat} must be 2-D [heads, width], got ${wide}`);
    if (kv.shape.length !== 3) bad(`${op}: ${kvWhat} must be 3-D [kvHeads, cap, headDim], got ${kv}`);
    const heads = wide.shape[0];
    const [kvHeads, cap, headDim] = kv.shape;
    if (heads % kvHeads !== 0) bad(`${op}: ${heads} query heads are not a multiple of ${kvHeads} KV heads`);
    if (rowsT.cols !== heads * headDim) {
      bad(`${op}: ${rowsWhat} rows have ${rowsT.cols} values, not heads ${heads} x headDim ${headDim}`);
    }
    if (!isIndex(row) || row >= rowsT.rows) bad(`${op}: ${rowsWhat} row ${row} is outside ${rowsT} (${rowsT.rows} rows)`);
    if (!isIndex(col) || col + count > wide.cols) bad(`${op}: columns ${col}..${col + count} exceed ${wideWhat} width ${wide.cols}`);
    return [heads, kvHeads, headDim, cap];
  }

  private checkSlots(op: string, slots: Int32Array, cap: number): void {
    if (!(slots instanceof Int32Array)) bad(`${op}: slots must be an Int32Array`);
    if (slots.length === 0) return;
    const badAt = Number(this.lib.hg_check_slots(slots, slots.length, cap));
    if (badAt >= 0) bad(`${op}: slot ${slots[badAt]} at index ${badAt} is outside the cache capacity ${cap}`);
  }

  private checkSpan(op: string, start: number, count: number, cap: number): void {
    if (!isIndex(start) || !isIndex(count)) bad(`${op}: start and count must be non-negative integers`);
    if (start + count > cap) bad(`${op}: tokens ${start}..${start + count} exceed the cache capacity ${cap}`);
  }

  attnLogits(logits: Tensor, outCol: number, q: Tensor, qRow: number, k: Tensor, start: number, count: number, scale: number): void {
    const l = this.f32(logits, "attnLogits", "logits");
    const qi = this.f32(q, "attnLogits", "q");
    const kt = this.own(k, "attnLogits", "k");
    if (!isIndex(count)) bad("attnLogits: count must be a non-negative integer");
    const [heads, kvHeads, headDim, cap] = this.attnShape("attnLogits", qi, "q", qRow, l, "logits", outCol, count, kt, "k");
    this.checkSpan("attnLogits", start, count, cap);
    if (count === 0) return;
    this.lib.hg_attn_logits(this.ctx, l.at(outCol), l.cols, qi.at(qRow * qi.cols), kt.ptr, DTYPE_CODE[kt.dtype], heads, kvHeads, headDim, cap, start, null, count, scale);
  }

  attnLogitsGather(logits: Tensor, outCol: number, q: Tensor, qRow: number, k: Tensor, slots: Int32Array, scale: number): void {
    const l = this.f32(logits, "attnLogitsGather", "logits");
    const qi = this.f32(q, "attnLogitsGather", "q");
    const kt = this.own(k, "attnLogitsGather", "k");
    if (!(slots instanceof Int32Array)) bad("attnLogitsGather: slots must be an Int32Array");
    const count = slots.length;
    const [heads, kvHeads, headDim, cap] = this.attnShape("attnLogitsGather", qi, "q", qRow, l, "logits", outCol, count, kt, "k");
    this.checkSlots("attnLogitsGather", slots, cap);
    if (count === 0) return;
    this.lib.hg_attn_logits(this.ctx, l.at(outCol), l.cols, qi.at(qRow * qi.cols), kt.ptr, DTYPE_CODE[kt.dtype], heads, kvHeads, headDim, cap, 0, slots, count, scale);
  }

  attnAggregate(out: Tensor, outRow: number, probs: Tensor, probCol: number, v: Tensor, start: number, count: number, accumulate: boolean): void {
    const o = this.f32(out, "attnAggregate", "out");
    const p = this.f32(probs, "attnAggregate", "probs");
    const vt = this.own(v, "attnAggregate", "v");
    if (!isIndex(count)) bad("attnAggregate: count must be a non-negative integer");
    const [heads, kvHeads, headDim, cap] = this.attnShape("attnAggregate", o, "out", outRow, p, "probs", probCol, count, vt, "v");
    this.checkSpan("attnAggregate", start, count, cap);
    if (o.overlaps(p, o.rows, p.rows)) bad("attnAggregate: out must not overlap probs");
    const ok = this.lib.hg_attn_aggregate(this.ctx, o.at(outRow * o.cols), p.at(probCol), p.cols, vt.ptr, DTYPE_CODE[vt.dtype], heads, kvHeads, headDim, cap, start, null, count, accumulate ? 1 : 0);
    if (!ok) bad("attnAggregate: out of memory");
  }

  attnAggregateGather(out: Tensor, outRow: number, probs: Tensor, probCol: number, v: Tensor, slots: Int32Array, accumulate: boolean): void {
    const o = this.f32(out, "attnAggregateGather", "out");
    const p = this.f32(probs, "attnAggregateGather", "probs");
    const vt = this.own(v, "attnAggregateGather", "v");
    if (!(slots instanceof Int32Array)) bad("attnAggregateGather: slots must be an Int32Array");
    const count = slots.length;
    const [heads, kvHeads, headDim, cap] = this.attnShape("attnAggregateGather", o, "out", outRow, p, "probs", probCol, count, vt, "v");
    this.checkSlots("attnAggregateGather", slots, cap);
    if (o.overlaps(p, o.rows, p.rows)) bad("attnAggregateGather: out must not overlap probs");
    const ok = this.lib.hg_attn_aggregate(this.ctx, o.at(outRow * o.cols), p.at(probCol), p.cols, vt.ptr, DTYPE_CODE[vt.dtype], heads, kvHeads, headDim, cap, 0, count ? slots : null, count, accumulate ? 1 : 0);
    if (!ok) bad("attnAggregateGather: out of memory");
  }
}

/** Creates a CpuBackend; options are validated with CpuBackendOptionsSchema. */
export function createCpuBackend(options: CpuBackendOptions = {}): CpuBackend {
  return new CpuBackend(options);
}
