/**
 * The checks a native backend owes its callers before an address reaches native code:
 * the tensor is this backend instance's and alive, its dtype is allowed, shapes agree, row
 * counts, ids, positions, slots and offsets are in range. Each failure is a one-line
 * HybridgenError (code EBADARG) naming the op and the problem. Every method checks one
 * Backend call and returns the backend's own tensors (and derived sizes) for the FFI call.
 *
 * ReferenceBackend keeps its own validation: it is the readable specification, and its
 * messages are worded for its storage (element ranges rather than addresses).
 */
import { ATTN_PARTIAL_MAX_SPANS, DTYPE_BYTES, type DType, type MatvecFusion, type Tensor } from "../backend.js";
import { HybridgenError } from "../errors.js";
import type { NativeTensor } from "../native-tensor.js";

export function badArgument(message: string): never {
  throw new HybridgenError(message, "EBADARG");
}

/** A non-negative integer. */
export function isIndex(v: number): boolean {
  return Number.isInteger(v) && v >= 0;
}

/** Element count of a shape, checked to be non-empty with positive integer dimensions. */
export function shapeNumel(shape: readonly number[], op: string): number {
  if (!Array.isArray(shape) || shape.length === 0) badArgument(`${op}: shape must be a non-empty array`);
  let numel = 1;
  for (const d of shape) {
    if (!Number.isInteger(d) || d < 1) badArgument(`${op}: shape [${shape.join(", ")}] has a dimension that is not a positive integer`);
    numel *= d;
  }
  if (!Number.isSafeInteger(numel)) badArgument(`${op}: shape [${shape.join(", ")}] is too large`);
  return numel;
}

export function checkDType(dtype: DType, op: string): void {
  if (!Object.hasOwn(DTYPE_BYTES, dtype)) badArgument(`${op}: unknown dtype '${dtype}' (f32, f16 or bf16)`);
}

export interface BackendChecksOptions<T extends NativeTensor> {
  /** The backend's name as tensors carry it ("cpu"): "… not this cpu backend". */
  readonly name: string;
  /** The backend's class name: "… belongs to another CpuBackend instance". */
  readonly className: string;
  /** The backend's tensor class (instanceof tells its tensors from others). */
  readonly tensorClass: abstract new (...args: never[]) => T;
  /** The backend instance: tensors name it as their owner. */
  readonly owner: object;
  /** Throws when the backend cannot take calls (closed, or its device is lost). */
  readonly usable: (op: string) => void;
  /** Index of the first slot outside [0, cap), or -1: lets a backend scan long lists natively. */
  readonly findBadSlot?: (slots: Int32Array, cap: number) => number;
}

/** [heads, kvHeads, headDim, cap] of an attention call. */
export type AttentionDims = [heads: number, kvHeads: number, headDim: number, cap: number];

export class BackendChecks<T extends NativeTensor> {
  constructor(private readonly o: BackendChecksOptions<T>) {}

  // ---- tensors ----------------------------------------------------------------------------

  /** The backend tensor behind `t`, checked to belong to this usable backend and be alive. */
  own(t: Tensor, op: string, what: string): T {
    this.o.usable(op);
    if (!(t instanceof this.o.tensorClass)) {
      badArgument(`${op}: ${what} belongs to backend '${(t as Tensor | undefined)?.backend ?? typeof t}', not this ${this.o.name} backend`);
    }
    if (t.owner !== this.o.owner) badArgument(`${op}: ${what} belongs to another ${this.o.className} instance`);
    if (t.dead) badArgument(`${op}: ${what} was freed${t.freed ? "" : " (its base tensor was)"}`);
    return t;
  }

  f32(t: Tensor, op: string, what: string): T {
    const c = this.own(t, op, what);
    if (c.dtype !== "f32") badArgument(`${op}: ${what} must be f32, got ${c.dtype}`);
    return c;
  }

  rowsAtLeast(t: T, n: number, op: string, what: string): void {
    if (!isIndex(n)) badArgument(`${op}: row count ${n} is not a non-negative integer`);
    if (n > t.rows) badArgument(`${op}: ${what} ${t} has ${t.rows} rows, ${n} requested`);
  }

  // ---- memory -----------------------------------------------------------------------------

  /** Returns the byte count `bytes` must have (and has). */
  loadWeight(bytes: Uint8Array, dtype: DType, shape: readonly number[]): number {
    this.o.usable("loadWeight");
    checkDType(dtype, "loadWeight");
    const numel = shapeNumel(shape, "loadWeight");
    if (!(bytes instanceof Uint8Array)) badArgument("loadWeight: bytes must be a Uint8Array");
    const need = numel * DTYPE_BYTES[dtype];
    if (bytes.byteLength !== need) badArgument(`loadWeight: ${dtype}[${shape.join("x")}] needs ${need} bytes, got ${bytes.byteLength}`);
    return need;
  }

  /** Returns the element count. */
  alloc(shape: readonly number[], dtype: DType): number {
    this.o.usable("alloc");
    checkDType(dtype, "alloc");
    return shapeNumel(shape, "alloc");
  }

  write(t: Tensor, src: Float32Array, offset: number): T {
    const d = this.own(t, "write", "tensor");
    if (!(src instanceof Float32Array)) badArgument("write: src must be a Float32Array");
    if (!isIndex(offset) || offset + src.length > d.numel) {
      badArgument(`write: ${src.length} values at offset ${offset} do not fit in ${d} (${d.numel} elements)`);
    }
    return d;
  }

  /** Returns the tensor and the element count to read. */
  read(t: Tensor, offset: number, count: number | undefined): [T, number] {
    const s = this.own(t, "read", "tensor");
    const n = count ?? s.numel - offset;
    if (!isIndex(offset) || !isIndex(n) || offset + n > s.numel) {
      badArgument(`read: ${n} values at offset ${offset} are outside ${s} (${s.numel} elements)`);
    }
    return [s, n];
  }

  copyRows(dst: Tensor, dstRow: number, src: Tensor, srcRow: number, count: number): [T, T] {
    const d = this.own(dst, "copyRows", "dst");
    const s = this.own(src, "copyRows", "src");
    if (d.cols !== s.cols) badArgument(`copyRows: row widths differ (dst ${d} has ${d.cols}, src ${s} has ${s.cols})`);
    if (d.dtype !== s.dtype && s.dtype !== "f32") badArgument(`copyRows: cannot convert ${s.dtype} rows to ${d.dtype} (same dtype or f32 source)`);
    if (!isIndex(count) || !isIndex(dstRow) || !isIndex(srcRow)) badArgument("copyRows: rows and count must be non-negative integers");
    if (dstRow + count > d.rows) badArgument(`copyRows: dst rows ${dstRow}..${dstRow + count} exceed ${d.rows} rows of ${d}`);
    if (srcRow + count > s.rows) badArgument(`copyRows: src rows ${srcRow}..${srcRow + count} exceed ${s.rows} rows of ${s}`);
    return [d, s];
  }

  /** Returns the viewed tensor and the view's element count. */
  view(t: Tensor, offset: number, shape: readonly number[]): [T, number] {
    const b = this.own(t, "view", "tensor");
    const numel = shapeNumel(shape, "view");
    if (!isIndex(offset) || offset + numel > b.numel) {
      badArgument(`view: ${numel} elements at offset ${offset} are outside ${b} (${b.numel} elements)`);
    }
    return [b, numel];
  }

  free(t: Tensor): T {
    if (t instanceof this.o.tensorClass && t.owner === this.o.owner && t.freed) badArgument(`free: tensor ${t} was already freed`);
    return this.own(t, "free", "tensor");
  }

  // ---- elementwise and row ops ----------------------------------------------------------

  embedding(out: Tensor, table: Tensor, ids: Int32Array): [T, T] {
    const o = this.f32(out, "embedding", "out");
    const tb = this.own(table, "embedding", "table");
    if (!(ids instanceof Int32Array)) badArgument("embedding: ids must be an Int32Array");
    if (tb.shape.length !== 2) badArgument(`embedding: table must be 2-D [vocab, dim], got ${tb}`);
    if (o.cols !== tb.cols) badArgument(`embedding: out rows have ${o.cols} values, table rows ${tb.cols}`);
    this.rowsAtLeast(o, ids.length, "embedding", "out");
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i];
      if (id < 0 || id >= tb.rows) badArgument(`embedding: id ${id} at position ${i} is outside the table's ${tb.rows} rows`);
    }
    return [o, tb];
  }

  /** Returns [out, x, w, bias or undefined]; w is [m, k]. */
  matmul(out: Tensor, x: Tensor, w: Tensor, n: number, bias?: Tensor): [T, T, T, T | undefined] {
    const o = this.f32(out, "matmul", "out");
    const xi = this.f32(x, "matmul", "x");
    const wt = this.own(w, "matmul", "w");
    if (wt.shape.length !== 2) badArgument(`matmul: w must be 2-D [m, k], got ${wt}`);
    const m = wt.shape[0], k = wt.shape[1];
    if (xi.cols !== k) badArgument(`matmul: x rows have ${xi.cols} values but w ${wt} expects k=${k}`);
    if (o.cols !== m) badArgument(`matmul: out rows have ${o.cols} values but w ${wt} gives m=${m}`);
    this.rowsAtLeast(xi, n, "matmul", "x");
    this.rowsAtLeast(o, n, "matmul", "out");
    if (o.overlaps(xi, n, n)) badArgument("matmul: out must not overlap x");
    let b: T | undefined;
    if (bias !== undefined) {
      b = this.own(bias, "matmul", "bias");
      if (b.numel !== m) badArgument(`matmul: bias ${b} must have m=${m} elements`);
    }
    return [o, xi, wt, b];
  }

  /** Backend.matvec: returns [out, x, w, bias, norm weight, m (result width), k]. */
  matvec(out: Tensor, x: Tensor, w: Tensor, f: MatvecFusion): [T, T, T, T | undefined, T | undefined, number, number] {
    const op = "matvec";
    const o = this.f32(out, op, "out");
    const xi = this.f32(x, op, "x");
    const wt = this.own(w, op, "w");
    if (wt.shape.length !== 2) badArgument(`${op}: w must be 2-D [m, k], got ${wt}`);
    const rows = wt.shape[0], k = wt.shape[1];
    if (f.siluMul && rows % 2 !== 0) badArgument(`${op}: siluMul needs w with an even row count ([gate; up]), got ${wt}`);
    const m = f.siluMul ? rows / 2 : rows;
    if (xi.cols !== k) badArgument(`${op}: x rows have ${xi.cols} values but w ${wt} expects k=${k}`);
    if (o.cols !== m) badArgument(`${op}: out rows have ${o.cols} values but the result has ${m}`);
    this.rowsAtLeast(xi, 1, op, "x");
    this.rowsAtLeast(o, 1, op, "out");
    if (o.overlaps(xi, 1, 1)) badArgument(`${op}: out must not overlap x`);
    let b: T | undefined, nw: T | undefined;
    if (f.bias !== undefined) {
      b = this.own(f.bias, op, "bias");
      if (b.numel !== rows) badArgument(`${op}: bias ${b} must have ${rows} elements`);
      if (o.overlaps(b, 1, b.rows)) badArgument(`${op}: out must not overlap bias`);
    }
    if (f.normWeight !== undefined) {
      nw = this.own(f.normWeight, op, "normWeight");
      if (nw.numel !== k) badArgument(`${op}: normWeight ${nw} must have ${k} elements`);
      if (!(typeof f.normEps === "number" && f.normEps >= 0)) badArgument(`${op}: normEps ${f.normEps} must be a number >= 0`);
    }
    return [o, xi, wt, b, nw, m, k];
  }

  rmsNorm(out: Tensor, x: Tensor, weight: Tensor, n: number, eps: number): [T, T, T] {
    const o = this.f32(out, "rmsNorm", "out");
    const xi = this.f32(x, "rmsNorm", "x");
    const w = this.own(weight, "rmsNorm", "weight");
    if (o.cols !== xi.cols) badArgument(`rmsNorm: out rows have ${o.cols} values, x rows ${xi.cols}`);
    if (w.numel !== xi.cols) badArgument(`rmsNorm: weight ${w} must have ${xi.cols} elements`);
    this.rowsAtLeast(xi, n, "rmsNorm", "x");
    this.rowsAtLeast(o, n, "rmsNorm", "out");
    if (!(eps >= 0)) badArgument(`rmsNorm: eps ${eps} must be >= 0`);
    return [o, xi, w];
  }

  layerNorm(out: Tensor, x: Tensor, weight: Tensor, bias: Tensor, n: number, eps: number): [T, T, T, T] {
    const o = this.f32(out, "layerNorm", "out");
    const xi = this.f32(x, "layerNorm", "x");
    const w = this.own(weight, "layerNorm", "weight");
    const b = this.own(bias, "layerNorm", "bias");
    if (o.cols !== xi.cols) badArgument(`layerNorm: out rows have ${o.cols} values, x rows ${xi.cols}`);
    if (w.numel !== xi.cols) badArgument(`layerNorm: weight ${w} must have ${xi.cols} elements`);
    if (b.numel !== xi.cols) badArgument(`layerNorm: bias ${b} must have ${xi.cols} elements`);
    this.rowsAtLeast(xi, n, "layerNorm", "x");
    this.rowsAtLeast(o, n, "layerNorm", "out");
    if (!(eps >= 0)) badArgument(`layerNorm: eps ${eps} must be >= 0`);
    return [o, xi, w, b];
  }

  /** Returns [x, cos, sin]; the rotary half-width is cos.cols. */
  rope(x: Tensor, n: number, positions: Int32Array, heads: number, headDim: number, cos: Tensor, sin: Tensor): [T, T, T] {
    const xi = this.f32(x, "rope", "x");
    const c = this.f32(cos, "rope", "cos");
    const s = this.f32(sin, "rope", "sin");
    if (!(positions instanceof Int32Array)) badArgument("rope: positions must be an Int32Array");
    if (!isIndex(heads) || !isIndex(headDim) || heads * headDim !== xi.cols) {
      badArgument(`rope: x rows have ${xi.cols} values, not heads ${heads} x headDim ${headDim}`);
    }
    if (c.shape.length !== 2 || s.shape.length !== 2 || c.shape[0] !== s.shape[0] || c.cols !== s.cols) {
      badArgument(`rope: cos ${c} and sin ${s} must both be [maxPos, rot/2]`);
    }
    if (2 * c.cols > headDim) badArgument(`rope: rotary width ${2 * c.cols} exceeds headDim ${headDim}`);
    this.rowsAtLeast(xi, n, "rope", "x");
    if (positions.length < n) badArgument(`rope: ${positions.length} positions for ${n} rows`);
    for (let i = 0; i < n; i++) {
      const p = positions[i];
      if (p < 0 || p >= c.rows) badArgument(`rope: position ${p} of row ${i} is outside the tables' ${c.rows} positions`);
    }
    return [xi, c, s];
  }

  /**
   * Elementwise ops: f32 operands (named as the op's parameters) with one row width and at
   * least n rows each. Returns the element count n · width.
   */
  elementwise(op: string, n: number, ...operands: [T, string][]): number {
    const cols = operands[0][0].cols;
    for (const [t, what] of operands) {
      if (t.cols !== cols) badArgument(`${op}: ${what} rows have ${t.cols} values, expected ${cols}`);
      this.rowsAtLeast(t, n, op, what);
    }
    return n * cols;
  }

  softmax(x: Tensor, rows: number, cols: number): T {
    const xi = this.f32(x, "softmax", "x");
    this.rowsAtLeast(xi, rows, "softmax", "x");
    if (!isIndex(cols) || cols > xi.cols) badArgument(`softmax: ${cols} columns requested, ${xi} has ${xi.cols}`);
    return xi;
  }

  argmax(x: Tensor, row: number): T {
    const xi = this.f32(x, "argmax", "x");
    if (!isIndex(row) || row >= xi.rows) badArgument(`argmax: row ${row} is outside ${xi} (${xi.rows} rows)`);
    return xi;
  }

  // ---- attention stages -------------------------------------------------------------------

  /** attnLogits over K tokens [start, start + count): returns [logits, q, k, dims]. */
  attnLogits(logits: Tensor, outCol: number, q: Tensor, qRow: number, k: Tensor, start: number, count: number): [T, T, T, AttentionDims] {
    const op = "attnLogits";
    const l = this.f32(logits, op, "logits");
    const qi = this.f32(q, op, "q");
    const kt = this.own(k, op, "k");
    if (!isIndex(count)) badArgument(`${op}: count must be a non-negative integer`);
    const dims = this.attnShape(op, qi, "q", qRow, l, "logits", outCol, count, kt, "k");
    this.span(op, start, count, dims[3]);
    return [l, qi, kt, dims];
  }

  /** attnLogits over K slots: returns [logits, q, k, dims]. */
  attnLogitsGather(logits: Tensor, outCol: number, q: Tensor, qRow: number, k: Tensor, slots: Int32Array): [T, T, T, AttentionDims] {
    const op = "attnLogitsGather";
    const l = this.f32(logits, op, "logits");
    const qi = this.f32(q, op, "q");
    const kt = this.own(k, op, "k");
    if (!(slots instanceof Int32Array)) badArgument(`${op}: slots must be an Int32Array`);
    const dims = this.attnShape(op, qi, "q", qRow, l, "logits", outCol, slots.length, kt, "k");
    this.slots(op, slots, dims[3]);
    return [l, qi, kt, dims];
  }

  /** attnAggregate over V tokens [start, start + count): returns [out, probs, v, dims]. */
  attnAggregate(out: Tensor, outRow: number, probs: Tensor, probCol: number, v: Tensor, start: number, count: number): [T, T, T, AttentionDims] {
    const op = "attnAggregate";
    const o = this.f32(out, op, "out");
    const p = this.f32(probs, op, "probs");
    const vt = this.own(v, op, "v");
    if (!isIndex(count)) badArgument(`${op}: count must be a non-negative integer`);
    const dims = this.attnShape(op, o, "out", outRow, p, "probs", probCol, count, vt, "v");
    this.span(op, start, count, dims[3]);
    if (o.overlaps(p, o.rows, p.rows)) badArgument(`${op}: out must not overlap probs`);
    return [o, p, vt, dims];
  }

  /** attnAggregate over V slots: returns [out, probs, v, dims]. */
  attnAggregateGather(out: Tensor, outRow: number, probs: Tensor, probCol: number, v: Tensor, slots: Int32Array): [T, T, T, AttentionDims] {
    const op = "attnAggregateGather";
    const o = this.f32(out, op, "out");
    const p = this.f32(probs, op, "probs");
    const vt = this.own(v, op, "v");
    if (!(slots instanceof Int32Array)) badArgument(`${op}: slots must be an Int32Array`);
    const dims = this.attnShape(op, o, "out", outRow, p, "probs", probCol, slots.length, vt, "v");
    this.slots(op, slots, dims[3]);
    if (o.overlaps(p, o.rows, p.rows)) badArgument(`${op}: out must not overlap probs`);
    return [o, p, vt, dims];
  }

  /** Backend.attnPartial: returns [part, q, k, v, dims]; spans are checked against the cache. */
  attnPartial(part: Tensor, q: Tensor, qRow: number, k: Tensor, v: Tensor, spans: Int32Array): [T, T, T, T, AttentionDims] {
    const op = "attnPartial";
    const pt = this.f32(part, op, "part");
    const qi = this.f32(q, op, "q");
    const kt = this.own(k, op, "k");
    const vt = this.own(v, op, "v");
    if (kt.shape.length !== 3) badArgument(`${op}: k must be 3-D [kvHeads, cap, headDim], got ${kt}`);
    if (vt.shape.length !== 3 || vt.shape.some((d, i) => d !== kt.shape[i]) || vt.dtype !== kt.dtype) badArgument(`${op}: v ${vt} must have the shape and dtype of k ${kt}`);
    const [kvHeads, cap, headDim] = kt.shape;
    if (qi.cols % headDim !== 0 || (qi.cols / headDim) % kvHeads !== 0) badArgument(`${op}: q rows have ${qi.cols} values, not a multiple of ${kvHeads} KV heads x headDim ${headDim}`);
    const heads = qi.cols / headDim;
    if (!isIndex(qRow) || qRow >= qi.rows) badArgument(`${op}: q row ${qRow} is outside ${qi} (${qi.rows} rows)`);
    this.partialShape(op, pt, heads, headDim);
    if (pt.overlaps(qi, heads, qi.rows)) badArgument(`${op}: part must not overlap q`);
    if (!(spans instanceof Int32Array) || spans.length % 2 !== 0 || spans.length > 2 * ATTN_PARTIAL_MAX_SPANS) {
      badArgument(`${op}: spans must be an Int32Array of start, count pairs (at most ${ATTN_PARTIAL_MAX_SPANS})`);
    }
    for (let s = 0; s < spans.length; s += 2) this.span(op, spans[s], spans[s + 1], cap);
    return [pt, qi, kt, vt, [heads, kvHeads, headDim, cap]];
  }

  /** Backend.attnMerge: returns [out, part, logits, v, dims]. */
  attnMerge(out: Tensor, outRow: number, part: Tensor, logits: Tensor, col: number, v: Tensor, start: number, count: number): [T, T, T, T, AttentionDims] {
    const op = "attnMerge";
    const o = this.f32(out, op, "out");
    const pt = this.f32(part, op, "part");
    const l = this.f32(logits, op, "logits");
    const vt = this.own(v, op, "v");
    if (!isIndex(count)) badArgument(`${op}: count must be a non-negative integer`);
    const dims = this.attnShape(op, o, "out", outRow, l, "logits", col, count, vt, "v");
    this.span(op, start, count, dims[3]);
    this.partialShape(op, pt, dims[0], dims[2]);
    if (o.overlaps(pt, o.rows, pt.rows) || o.overlaps(l, o.rows, l.rows)) badArgument(`${op}: out must not overlap part or logits`);
    return [o, pt, l, vt, dims];
  }

  /** A partial of attnPartial/attnMerge: [heads, headDim + 2] rows (more rows are left alone). */
  private partialShape(op: string, part: T, heads: number, headDim: number): void {
    if (part.cols !== headDim + 2 || part.rows < heads) badArgument(`${op}: part ${part} must be [${heads}, ${headDim + 2}] (heads, headDim + 2)`);
  }

  /**
   * `rowsT` holds rows of heads × headDim (q or out) of which row `row` is used; `wide` is
   * logits/probs [heads, width] with columns [col, col + count) used; `kv` is K or V
   * [kvHeads, cap, headDim].
   */
  private attnShape(op: string, rowsT: T, rowsWhat: string, row: number, wide: T, wideWhat: string, col: number, count: number, kv: T, kvWhat: string): AttentionDims {
    if (wide.shape.length !== 2) badArgument(`${op}: ${wideWhat} must be 2-D [heads, width], got ${wide}`);
    if (kv.shape.length !== 3) badArgument(`${op}: ${kvWhat} must be 3-D [kvHeads, cap, headDim], got ${kv}`);
    const heads = wide.shape[0];
    const [kvHeads, cap, headDim] = kv.shape;
    if (heads % kvHeads !== 0) badArgument(`${op}: ${heads} query heads are not a multiple of ${kvHeads} KV heads`);
    if (rowsT.cols !== heads * headDim) {
      badArgument(`${op}: ${rowsWhat} rows have ${rowsT.cols} values, not heads ${heads} x headDim ${headDim}`);
    }
    if (!isIndex(row) || row >= rowsT.rows) badArgument(`${op}: ${rowsWhat} row ${row} is outside ${rowsT} (${rowsT.rows} rows)`);
    if (!isIndex(col) || col + count > wide.cols) badArgument(`${op}: columns ${col}..${col + count} exceed ${wideWhat} width ${wide.cols}`);
    return [heads, kvHeads, headDim, cap];
  }

  private span(op: string, start: number, count: number, cap: number): void {
    if (!isIndex(start) || !isIndex(count)) badArgument(`${op}: start and count must be non-negative integers`);
    if (start + count > cap) badArgument(`${op}: tokens ${start}..${start + count} exceed the cache capacity ${cap}`);
  }

  private slots(op: string, slots: Int32Array, cap: number): void {
    if (slots.length === 0) return;
    const at = this.o.findBadSlot ? this.o.findBadSlot(slots, cap) : firstBadSlot(slots, cap);
    if (at >= 0) badArgument(`${op}: slot ${slots[at]} at index ${at} is outside the cache capacity ${cap}`);
  }
}

function firstBadSlot(slots: Int32Array, cap: number): number {
  for (let j = 0; j < slots.length; j++) if (slots[j] < 0 || slots[j] >= cap) return j;
  return -1;
}
