/**
 * ReferenceBackend: the Backend contract in plain TypeScript. It is the readable
 * specification of every op and the oracle native backends are tested against, so it
 * favours clarity over speed: Float32Array storage (f16/bf16 tensors hold values rounded
 * to their dtype), f64 accumulation, and the full input validation every backend owes its
 * callers (foreign or freed tensors, out-of-range rows/ids/slots, shape mismatches).
 *
 * Row semantics (shared by all backends): an op reads a tensor as rows of its last
 * dimension; "rows(t)" is numel / lastDim. `n` rows must exist in every tensor the op
 * touches. Use `view` to see one buffer at another row width.
 */
import type { AttnMergeRow, AttnPartialRow, Backend, DType, KvAppendRow, Tensor } from "../backend.js";
import { ATTN_PARTIAL_MAX_SPANS, DTYPE_BYTES } from "../backend.js";
import { fail } from "../errors.js";
import { decodeToF32, roundArrayTo } from "../half-float.js";
import { SPEC_VERSION } from "../version.js";

interface Entry {
  data: Float32Array;
  /** The allocation a view aliases (itself for an owner). */
  root: Tensor;
  isView: boolean;
  freed: boolean;
}

const DTYPES: readonly DType[] = ["f32", "f16", "bf16"];

export class ReferenceBackend implements Backend {
  readonly spec = SPEC_VERSION;
  readonly name = "reference";
  readonly threads = 1;
  private readonly entries = new WeakMap<Tensor, Entry>();
  private readonly owners = new Set<Tensor>();
  private closed = false;

  /** Number of owning tensors not yet freed (tests use it to check nothing leaks). */
  liveTensors(): number {
    return this.owners.size;
  }

  // ---- memory -------------------------------------------------------------------------

  loadWeight(bytes: Uint8Array, dtype: DType, shape: readonly number[]): Tensor {
    this.checkOpen();
    checkDType("loadWeight", dtype);
    const numel = checkShape("loadWeight", shape);
    if (!(bytes instanceof Uint8Array)) fail("reference backend: loadWeight: bytes must be a Uint8Array");
    if (bytes.byteLength !== numel * DTYPE_BYTES[dtype]) {
      fail(`reference backend: loadWeight: ${bytes.byteLength} bytes for ${dtype} [${shape.join(", ")}], expected ${numel * DTYPE_BYTES[dtype]}`);
    }
    return this.own(dtype, shape, decodeToF32(bytes, dtype));
  }

  alloc(shape: readonly number[], dtype: DType = "f32"): Tensor {
    this.checkOpen();
    checkDType("alloc", dtype);
    return this.own(dtype, shape, new Float32Array(checkShape("alloc", shape)));
  }

  view(t: Tensor, offset: number, shape: readonly number[]): Tensor {
    const e = this.entry("view", t);
    const numel = checkShape("view", shape);
    checkIndex("view", "offset", offset, 0, e.data.length - numel);
    const v: Tensor = Object.freeze({ dtype: t.dtype, shape: Object.freeze([...shape]), backend: this.name });
    this.entries.set(v, { data: e.data.subarray(offset, offset + numel), root: e.root, isView: true, freed: false });
    return v;
  }

  write(t: Tensor, src: Float32Array, offset = 0): void {
    const e = this.entry("write", t);
    if (!Number.isInteger(offset) || offset < 0 || offset + src.length > e.data.length) {
      fail(`reference backend: write: ${src.length} values at offset ${offset} exceed the tensor's ${e.data.length} elements`);
    }
    const part = e.data.subarray(offset, offset + src.length);
    part.set(src);
    roundArrayTo(t.dtype, part);
  }

  read(t: Tensor, offset = 0, count?: number): Float32Array {
    const e = this.entry("read", t);
    checkIndex("read", "offset", offset, 0, e.data.length);
    const n = count ?? e.data.length - offset;
    checkIndex("read", "count", n, 0, e.data.length - offset);
    return e.data.slice(offset, offset + n);
  }

  copyRows(dst: Tensor, dstRow: number, src: Tensor, srcRow: number, count: number): void {
    const d = this.entry("copyRows", dst);
    const s = this.entry("copyRows", src);
    const width = lastDim(dst);
    if (lastDim(src) !== width) fail(`reference backend: copyRows: row widths differ (dst ${width}, src ${lastDim(src)})`);
    if (src.dtype !== dst.dtype && src.dtype !== "f32") fail(`reference backend: copyRows: cannot copy ${src.dtype} rows into ${dst.dtype}`);
    checkIndex("copyRows", "count", count, 0, Infinity);
    checkIndex("copyRows", "dstRow", dstRow, 0, rows(dst) - count);
    checkIndex("copyRows", "srcRow", srcRow, 0, rows(src) - count);
    // TypedArray.set clones an overlapping source first, so this behaves like memmove.
    const part = d.data.subarray(dstRow * width, (dstRow + count) * width);
    part.set(s.data.subarray(srcRow * width, (srcRow + count) * width));
    if (src.dtype !== dst.dtype) roundArrayTo(dst.dtype, part);
  }

  free(t: Tensor): void {
    const e = this.entries.get(t);
    if (!e) fail(`reference backend: free: tensor does not belong to this backend (it is from "${t?.backend}")`);
    if (e.freed) fail("reference backend: free: tensor already freed (double free)");
    e.freed = true;
    if (!e.isView) this.owners.delete(t);
  }

  close(): void {
    for (const t of this.owners) this.entries.get(t)!.freed = true;
    this.owners.clear();
    this.closed = true;
  }

  [Symbol.dispose](): void {
    this.close();
  }

  // ---- elementwise and row ops ----------------------------------------------------------

  embedding(out: Tensor, table: Tensor, ids: Int32Array): void {
    const o = this.entry("embedding", out, "f32");
    const tb = this.entry("embedding", table);
    const width = lastDim(table);
    sameWidth("embedding", "out", out, width);
    checkRows("embedding", "out", out, ids.length);
    const vocab = rows(table);
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i];
      if (id < 0 || id >= vocab) fail(`reference backend: embedding: token id ${id} out of range [0, ${vocab})`);
      o.data.set(tb.data.subarray(id * width, (id + 1) * width), i * width);
    }
  }

  matmul(out: Tensor, x: Tensor, w: Tensor, n: number, bias?: Tensor): void {
    const o = this.entry("matmul", out, "f32");
    const xe = this.entry("matmul", x, "f32");
    const we = this.entry("matmul", w);
    if (w.shape.length !== 2) fail(`reference backend: matmul: w must be 2-D [m, k], got [${w.shape.join(", ")}]`);
    const [m, k] = w.shape;
    sameWidth("matmul", "x", x, k);
    sameWidth("matmul", "out", out, m);
    checkRows("matmul", "x", x, n);
    checkRows("matmul", "out", out, n);
    let b: Float32Array | null = null;
    if (bias) {
      b = this.entry("matmul", bias).data;
      if (b.length !== m) fail(`reference backend: matmul: bias has ${b.length} values, expected ${m}`);
    }
    const xd = xe.data, wd = we.data, od = o.data;
    for (let i = 0; i < n; i++) {
      for (let j = 0; j < m; j++) {
        let acc = b ? b[j] : 0;
        for (let c = 0; c < k; c++) acc += xd[i * k + c] * wd[j * k + c];
        od[i * m + j] = acc;
      }
    }
  }

  rmsNorm(out: Tensor, x: Tensor, weight: Tensor, n: number, eps: number): void {
    const { o, xd, wd, d } = this.normArgs("rmsNorm", out, x, weight, n);
    for (let i = 0; i < n; i++) {
      let ss = 0;
      for (let c = 0; c < d; c++) ss += xd[i * d + c] * xd[i * d + c];
      const r = 1 / Math.sqrt(ss / d + eps);
      for (let c = 0; c < d; c++) o[i * d + c] = xd[i * d + c] * r * wd[c];
    }
  }

  layerNorm(out: Tensor, x: Tensor, weight: Tensor, bias: Tensor, n: number, eps: number): void {
    const { o, xd, wd, d } = this.normArgs("layerNorm", out, x, weight, n);
    const bd = this.entry("layerNorm", bias).data;
    if (bd.length !== d) fail(`reference backend: layerNorm: bias has ${bd.length} values, expected ${d}`);
    for (let i = 0; i < n; i++) {
      let mean = 0;
      for (let c = 0; c < d; c++) mean += xd[i * d + c];
      mean /= d;
      let v = 0;
      for (let c = 0; c < d; c++) v += (xd[i * d + c] - mean) ** 2;
      const r = 1 / Math.sqrt(v / d + eps);
      for (let c = 0; c < d; c++) o[i * d + c] = (xd[i * d + c] - mean) * r * wd[c] + bd[c];
    }
  }

  rope(x: Tensor, n: number, positions: Int32Array, heads: number, headDim: number, cos: Tensor, sin: Tensor): void {
    const xd = this.entry("rope", x, "f32").data;
    const cd = this.entry("rope", cos).data;
    const sd = this.entry("rope", sin).data;
    checkIndex("rope", "heads", heads, 1, Infinity);
    checkIndex("rope", "headDim", headDim, 1, Infinity);
    const width = heads * headDim;
    sameWidth("rope", "x", x, width);
    checkRows("rope", "x", x, n);
    if (cos.shape.length !== 2 || cos.shape.join() !== sin.shape.join()) {
      fail(`reference backend: rope: cos and sin must both be [maxPos, rot/2], got [${cos.shape.join(", ")}] and [${sin.shape.join(", ")}]`);
    }
    const [maxPos, half] = cos.shape;
    if (2 * half > headDim) fail(`reference backend: rope: rotary width ${2 * half} exceeds headDim ${headDim}`);
    if (positions.length < n) fail(`reference backend: rope: ${positions.length} positions for ${n} rows`);
    for (let i = 0; i < n; i++) {
      const p = positions[i];
      if (p < 0 || p >= maxPos) fail(`reference backend: rope: position ${p} out of range [0, ${maxPos})`);
      for (let h = 0; h < heads; h++) {
        const base = i * width + h * headDim;
        for (let j = 0; j < half; j++) {
          const a = xd[base + j], b = xd[base + j + half];
          const c = cd[p * half + j], s = sd[p * half + j];
          xd[base + j] = a * c - b * s;
          xd[base + j + half] = a * s + b * c;
        }
      }
    }
  }

  siluMul(out: Tensor, gate: Tensor, up: Tensor, n: number): void {
    const [o, g, u] = this.sameShapeRows("siluMul", n, out, gate, up);
    for (let i = 0; i < o.length; i++) o[i] = (g[i] / (1 + Math.exp(-g[i]))) * u[i];
  }

  relu(x: Tensor, n: number): void {
    const [xd] = this.sameShapeRows("relu", n, x);
    for (let i = 0; i < xd.length; i++) if (xd[i] < 0) xd[i] = 0;
  }

  gelu(x: Tensor, n: number): void {
    const [xd] = this.sameShapeRows("gelu", n, x);
    for (let i = 0; i < xd.length; i++) xd[i] = 0.5 * xd[i] * (1 + erf(xd[i] / Math.SQRT2));
  }

  add(out: Tensor, a: Tensor, b: Tensor, n: number): void {
    const [o, ad, bd] = this.sameShapeRows("add", n, out, a, b);
    for (let i = 0; i < o.length; i++) o[i] = ad[i] + bd[i];
  }

  softmax(x: Tensor, rowCount: number, cols: number): void {
    const xd = this.entry("softmax", x, "f32").data;
    const width = lastDim(x);
    checkRows("softmax", "x", x, rowCount);
    checkIndex("softmax", "cols", cols, 1, width);
    for (let r = 0; r < rowCount; r++) {
      const row = xd.subarray(r * width, r * width + cols);
      let max = -Infinity;
      for (let j = 0; j < cols; j++) if (row[j] > max) max = row[j];
      const e = new Float64Array(cols);
      let sum = 0;
      for (let j = 0; j < cols; j++) sum += e[j] = Math.exp(row[j] - max);
      for (let j = 0; j < cols; j++) row[j] = e[j] / sum;
    }
  }

  argmax(x: Tensor, row: number): number {
    const xd = this.entry("argmax", x, "f32").data;
    const width = lastDim(x);
    checkIndex("argmax", "row", row, 0, rows(x) - 1);
    let best = 0;
    for (let j = 1; j < width; j++) if (xd[row * width + j] > xd[row * width + best]) best = j;
    return best;
  }

  // Greedy decode fed on the device: here the "device" is host memory, so the pick is done at once.
  private feed = 0;
  private readonly fedSlots = [0, 0];

  argmaxToFeed(x: Tensor, row: number, slot: number): void {
    if (slot !== 0 && slot !== 1) fail(`reference backend: argmaxToFeed: slot must be 0 or 1, got ${slot}`);
    this.feed = this.argmax(x, row);
    this.fedSlots[slot] = this.feed;
  }

  embeddingFromFeed(out: Tensor, table: Tensor): void {
    this.embedding(out, table, Int32Array.of(this.feed));
  }

  feedResult(slot: number): number {
    if (slot !== 0 && slot !== 1) fail(`reference backend: feedResult: slot must be 0 or 1, got ${slot}`);
    return this.fedSlots[slot];
  }

  // ---- attention stages -------------------------------------------------------------------

  attnLogits(logits: Tensor, outCol: number, q: Tensor, qRow: number, k: Tensor, start: number, count: number, scale: number): void {
    const a = this.attnArgs("attnLogits", logits, q, k, outCol, count);
    checkIndex("attnLogits", "qRow", qRow, 0, rows(q) - 1);
    checkIndex("attnLogits", "start", start, 0, a.cap - count);
    this.logitsRows(a, qRow, outCol, count, (j) => start + j, scale);
  }

  attnLogitsGather(logits: Tensor, outCol: number, q: Tensor, qRow: number, k: Tensor, slots: Int32Array, scale: number): void {
    const a = this.attnArgs("attnLogitsGather", logits, q, k, outCol, slots.length);
    checkIndex("attnLogitsGather", "qRow", qRow, 0, rows(q) - 1);
    checkSlots("attnLogitsGather", slots, a.cap);
    this.logitsRows(a, qRow, outCol, slots.length, (j) => slots[j], scale);
  }

  attnAggregate(out: Tensor, outRow: number, probs: Tensor, probCol: number, v: Tensor, start: number, count: number, accumulate: boolean): void {
    const a = this.attnArgs("attnAggregate", probs, out, v, probCol, count);
    checkIndex("attnAggregate", "outRow", outRow, 0, rows(out) - 1);
    checkIndex("attnAggregate", "start", start, 0, a.cap - count);
    this.aggregateRows(a, outRow, probCol, count, (j) => start + j, accumulate);
  }

  attnAggregateGather(out: Tensor, outRow: number, probs: Tensor, probCol: number, v: Tensor, slots: Int32Array, accumulate: boolean): void {
    const a = this.attnArgs("attnAggregateGather", probs, out, v, probCol, slots.length);
    checkIndex("attnAggregateGather", "outRow", outRow, 0, rows(out) - 1);
    checkSlots("attnAggregateGather", slots, a.cap);
    this.aggregateRows(a, outRow, probCol, slots.length, (j) => slots[j], accumulate);
  }

  attnPartial(part: Tensor, q: Tensor, qRow: number, k: Tensor, v: Tensor, spans: Int32Array, scale: number): void {
    const op = "attnPartial";
    const pd = this.entry(op, part, "f32").data, qd = this.entry(op, q, "f32").data;
    const kd = this.entry(op, k).data, vd = this.entry(op, v).data;
    if (k.shape.length !== 3 || v.shape.join() !== k.shape.join() || v.dtype !== k.dtype) fail(`reference backend: ${op}: K and V must be 3-D [kvHeads, capacity, headDim] of one shape and dtype`);
    const [kvHeads, cap, headDim] = k.shape;
    const heads = lastDim(q) / headDim;
    if (!Number.isInteger(heads) || heads % kvHeads !== 0) fail(`reference backend: ${op}: q rows have ${lastDim(q)} values, not a multiple of ${kvHeads} KV heads x headDim ${headDim}`);
    checkIndex(op, "qRow", qRow, 0, rows(q) - 1);
    if (lastDim(part) !== headDim + 2 || rows(part) < heads) fail(`reference backend: ${op}: part must be [${heads}, ${headDim + 2}]`);
    if (!(spans instanceof Int32Array) || spans.length % 2 !== 0 || spans.length > 2 * ATTN_PARTIAL_MAX_SPANS) fail(`reference backend: ${op}: spans must be start, count pairs (at most ${ATTN_PARTIAL_MAX_SPANS})`);
    const slots: number[] = [];
    for (let s = 0; s < spans.length; s += 2) {
      checkIndex(op, "span count", spans[s + 1], 0, cap);
      checkIndex(op, "span start", spans[s], 0, cap - spans[s + 1]);
      for (let j = 0; j < spans[s + 1]; j++) slots.push(spans[s] + j);
    }
    const group = heads / kvHeads, logits = new Float64Array(slots.length), acc = new Float64Array(headDim);
    for (let h = 0; h < heads; h++) {
      const g = Math.floor(h / group), qBase = qRow * heads * headDim + h * headDim;
      let m = -Infinity;
      slots.forEach((slot, j) => {
        let dot = 0;
        for (let c = 0; c < headDim; c++) dot += qd[qBase + c] * kd[(g * cap + slot) * headDim + c];
        logits[j] = scale * dot;
        m = Math.max(m, logits[j]);
      });
      let l = 0;
      acc.fill(0);
      slots.forEach((slot, j) => {
        const p = Math.exp(logits[j] - m);
        l += p;
        for (let c = 0; c < headDim; c++) acc[c] += p * vd[(g * cap + slot) * headDim + c];
      });
      const row = pd.subarray(h * (headDim + 2), (h + 1) * (headDim + 2));
      for (let c = 0; c < headDim; c++) row[c] = l > 0 ? acc[c] / l : 0;
      row[headDim] = m;
      row[headDim + 1] = l;
    }
  }

  /** Backend.attnPartialRows: each row's attnPartial, in order (the definition a batched kernel meets). */
  attnPartialRows(rows: readonly AttnPartialRow[]): void {
    if (!Array.isArray(rows) || rows.length === 0) fail("reference backend: attnPartialRows: 1 row or more is needed");
    for (const r of rows) this.attnPartial(r.part, r.q, r.qRow, r.k, r.v, r.spans, r.scale);
  }

  /** Backend.appendKvRows: each row's copyRows of every KV head's new K and V row, in order. */
  appendKvRows(rows: readonly KvAppendRow[]): void {
    if (!Array.isArray(rows) || rows.length === 0) fail("reference backend: appendKvRows: 1 row or more is needed");
    for (const r of rows) {
      if (r.kNew.dtype !== "f32" || r.vNew.dtype !== "f32") fail("reference backend: appendKvRows: the new K and V rows must be f32");
      const [kvHeads, cap] = r.k.shape;
      if (r.k.shape.length !== 3 || r.v.shape.length !== 3 || r.v.shape[0] !== kvHeads || r.v.shape[1] !== cap) fail("reference backend: appendKvRows: the windows must be [kvHeads, cap, headDim]");
      checkIndex("appendKvRows", "slot", r.slot, 0, cap! - 1);
      for (let g = 0; g < kvHeads!; g++) {
        this.copyRows(r.k, g * cap! + r.slot, r.kNew, g, 1);
        this.copyRows(r.v, g * cap! + r.slot, r.vNew, g, 1);
      }
    }
  }

  /** Backend.attnMergeRows: each row's attnMerge, in order (the definition a batched kernel meets). */
  attnMergeRows(rows: readonly AttnMergeRow[]): void {
    if (!Array.isArray(rows) || rows.length === 0) fail("reference backend: attnMergeRows: 1 row or more is needed");
    for (const r of rows) this.attnMerge(r.out, r.outRow, r.part, r.logits, r.col, r.v, r.start, r.count);
  }

  attnMerge(out: Tensor, outRow: number, part: Tensor, logits: Tensor, col: number, v: Tensor, start: number, count: number): void {
    const op = "attnMerge";
    const a = this.attnArgs(op, logits, out, v, col, count);
    checkIndex(op, "outRow", outRow, 0, rows(out) - 1);
    checkIndex(op, "start", start, 0, a.cap - count);
    const pd = this.entry(op, part, "f32").data, { heads, headDim, group, cap, width, table, act, cache } = a;
    if (lastDim(part) !== headDim + 2 || rows(part) < heads) fail(`reference backend: ${op}: part must be [${heads}, ${headDim + 2}]`);
    const acc = new Float64Array(headDim);
    for (let h = 0; h < heads; h++) {
      const g = Math.floor(h / group), pr = h * (headDim + 2), mw = pd[pr + headDim], lw = pd[pr + headDim + 1];
      let m = lw > 0 ? mw : -Infinity;
      for (let j = 0; j < count; j++) m = Math.max(m, table[h * width + col + j]);
      const oBase = outRow * heads * headDim + h * headDim;
      if (m === -Infinity) {
        act.fill(0, oBase, oBase + headDim);
        continue;
      }
      const sw = lw > 0 ? lw * Math.exp(mw - m) : 0;
      let den = sw;
      for (let c = 0; c < headDim; c++) acc[c] = sw * pd[pr + c];
      for (let j = 0; j < count; j++) {
        const p = Math.exp(table[h * width + col + j] - m);
        den += p;
        for (let c = 0; c < headDim; c++) acc[c] += p * cache[(g * cap + start + j) * headDim + c];
      }
      for (let c = 0; c < headDim; c++) act[oBase + c] = acc[c] / den;
    }
  }

  // ---- internals ----------------------------------------------------------------------------

  private logitsRows(a: AttnArgs, qRow: number, outCol: number, count: number, slot: (j: number) => number, scale: number): void {
    const { heads, headDim, group, cap, width, table, act, cache } = a;
    for (let h = 0; h < heads; h++) {
      const qBase = qRow * heads * headDim + h * headDim;
      const kvHead = Math.floor(h / group);
      for (let j = 0; j < count; j++) {
        const kBase = (kvHead * cap + slot(j)) * headDim;
        let dot = 0;
        for (let c = 0; c < headDim; c++) dot += act[qBase + c] * cache[kBase + c];
        table[h * width + outCol + j] = scale * dot;
      }
    }
  }

  private aggregateRows(a: AttnArgs, outRow: number, probCol: number, count: number, slot: (j: number) => number, accumulate: boolean): void {
    const { heads, headDim, group, cap, width, table, act, cache } = a;
    const acc = new Float64Array(headDim);
    for (let h = 0; h < heads; h++) {
      const kvHead = Math.floor(h / group);
      acc.fill(0);
      for (let j = 0; j < count; j++) {
        const p = table[h * width + probCol + j];
        const vBase = (kvHead * cap + slot(j)) * headDim;
        for (let c = 0; c < headDim; c++) acc[c] += p * cache[vBase + c];
      }
      const oBase = outRow * heads * headDim + h * headDim;
      for (let c = 0; c < headDim; c++) act[oBase + c] = accumulate ? act[oBase + c] + acc[c] : acc[c];
    }
  }

  /** Shared checks of the attention stages: `table` is logits/probs [heads, width], `act`
   * the q input or the output (rows of heads × headDim), `cache` K or V [kvHeads, cap, headDim]. */
  private attnArgs(op: string, table: Tensor, act: Tensor, cache: Tensor, col: number, count: number): AttnArgs {
    const te = this.entry(op, table, "f32");
    const ae = this.entry(op, act, "f32");
    const ce = this.entry(op, cache);
    if (table.shape.length !== 2) fail(`reference backend: ${op}: logits/probs must be 2-D [heads, width], got [${table.shape.join(", ")}]`);
    if (cache.shape.length !== 3) fail(`reference backend: ${op}: K/V must be 3-D [kvHeads, capacity, headDim], got [${cache.shape.join(", ")}]`);
    const [heads, width] = table.shape;
    const [kvHeads, cap, headDim] = cache.shape;
    if (heads % kvHeads !== 0) fail(`reference backend: ${op}: ${heads} heads is not a multiple of ${kvHeads} KV heads`);
    sameWidth(op, "q/out", act, heads * headDim);
    checkIndex(op, "count", count, 0, Infinity);
    checkIndex(op, "column", col, 0, width - count);
    return { heads, headDim, group: heads / kvHeads, cap, width, table: te.data, act: ae.data, cache: ce.data };
  }

  private normArgs(op: string, out: Tensor, x: Tensor, weight: Tensor, n: number) {
    const o = this.entry(op, out, "f32").data;
    const xd = this.entry(op, x, "f32").data;
    const wd = this.entry(op, weight).data;
    const d = wd.length;
    sameWidth(op, "x", x, d);
    sameWidth(op, "out", out, d);
    checkRows(op, "x", x, n);
    checkRows(op, "out", out, n);
    return { o, xd, wd, d };
  }

  /** Elementwise ops: every tensor has the same row width and at least n rows; returns the
   * first n rows of each. */
  private sameShapeRows(op: string, n: number, ...ts: Tensor[]): Float32Array[] {
    const width = lastDim(ts[0]);
    return ts.map((t) => {
      const e = this.entry(op, t, "f32");
      sameWidth(op, "operand", t, width);
      checkRows(op, "operand", t, n);
      return e.data.subarray(0, n * width);
    });
  }

  private own(dtype: DType, shape: readonly number[], data: Float32Array): Tensor {
    const t: Tensor = Object.freeze({ dtype, shape: Object.freeze([...shape]), backend: this.name });
    this.entries.set(t, { data, root: t, isView: false, freed: false });
    this.owners.add(t);
    return t;
  }

  private entry(op: string, t: Tensor, dtype?: DType): Entry {
    this.checkOpen();
    const e = t ? this.entries.get(t) : undefined;
    if (!e) fail(`reference backend: ${op}: tensor does not belong to this backend (it is from "${t?.backend}")`);
    if (e.freed || this.entries.get(e.root)!.freed) fail(`reference backend: ${op}: tensor used after free`);
    if (dtype && t.dtype !== dtype) fail(`reference backend: ${op}: expected a ${dtype} tensor, got ${t.dtype}`);
    return e;
  }

  private checkOpen(): void {
    if (this.closed) fail("reference backend: used after close()");
  }
}

interface AttnArgs {
  heads: number;
  headDim: number;
  group: number;
  cap: number;
  width: number;
  table: Float32Array;
  act: Float32Array;
  cache: Float32Array;
}

function lastDim(t: Tensor): number {
  return t.shape[t.shape.length - 1];
}

function rows(t: Tensor): number {
  let n = 1;
  for (let i = 0; i < t.shape.length - 1; i++) n *= t.shape[i];
  return n;
}

function checkDType(op: string, dtype: DType): void {
  if (!DTYPES.includes(dtype)) fail(`reference backend: ${op}: unknown dtype ${String(dtype)}`);
}

function checkShape(op: string, shape: readonly number[]): number {
  if (!Array.isArray(shape) || shape.length === 0) fail(`reference backend: ${op}: shape must be a non-empty array`);
  let n = 1;
  for (const d of shape) {
    if (!Number.isInteger(d) || d < 1) fail(`reference backend: ${op}: bad shape [${shape.join(", ")}] (dimensions must be positive integers)`);
    n *= d;
  }
  return n;
}

function checkIndex(op: string, what: string, v: number, min: number, max: number): void {
  if (!Number.isInteger(v) || v < min || v > max) fail(`reference backend: ${op}: ${what} ${v} out of range [${min}, ${max}]`);
}

function checkRows(op: string, what: string, t: Tensor, n: number): void {
  if (!Number.isInteger(n) || n < 0 || n > rows(t)) fail(`reference backend: ${op}: ${n} rows requested but ${what} has ${rows(t)}`);
}

function sameWidth(op: string, what: string, t: Tensor, width: number): void {
  if (lastDim(t) !== width) fail(`reference backend: ${op}: ${what} rows have ${lastDim(t)} values, expected ${width}`);
}

function checkSlots(op: string, slots: Int32Array, cap: number): void {
  for (let j = 0; j < slots.length; j++) {
    if (slots[j] < 0 || slots[j] >= cap) fail(`reference backend: ${op}: slot ${slots[j]} out of range [0, ${cap})`);
  }
}

/** erf to ~1e-15: Taylor series near 0, continued fraction for erfc further out. */
export function erf(x: number): number {
  const ax = Math.abs(x);
  if (ax < 2.5) {
    let term = ax, sum = ax;
    for (let n = 1; n < 60; n++) {
      term *= (-ax * ax) / n;
      sum += term / (2 * n + 1);
      if (Math.abs(term) < 1e-17 * Math.abs(sum)) break;
    }
    return Math.sign(x) * sum * (2 / Math.sqrt(Math.PI));
  }
  let t = ax;
  for (let k = 60; k >= 1; k--) t = ax + k / 2 / t;
  const erfc = Math.exp(-ax * ax) / Math.sqrt(Math.PI) / t;
  return Math.sign(x) * (1 - erfc);
}

