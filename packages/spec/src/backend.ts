/**
 * The Backend contract: every op a forward pass needs, on backend-owned tensors.
 *
 * Activations are always f32; weights may be f32, f16 or bf16. Tensors are row-major and
 * opaque to callers (a CPU backend holds a pointer, a CUDA backend a device address).
 * Ops take an explicit row count `n` so one buffer sized for a prefill block also serves a
 * single decode token. The attention ops are split into the stages hybrid attention needs:
 * logits over a *span or set* of cached tokens written at a column offset (so segments
 * concatenate in position order), one softmax over the concatenated row, and aggregation
 * of the matching V rows (accumulating, so segments can be summed one after another).
 */
import type { SpecVersion } from "./version.js";
export type DType = "f32" | "f16" | "bf16";

export const DTYPE_BYTES: Readonly<Record<DType, number>> = { f32: 4, f16: 2, bf16: 2 };

/**
 * A page index's page level as a device holds it (Backend.indexRank), page-major so the pages a
 * step folds in are one contiguous range: codes [pageCapacity, kvHeads, codeBytes] from byte 0,
 * then f32 scales [pageCapacity, kvHeads] from byte `scalesOffset`.
 */
export interface DeviceIndexShape {
  /** 1 int8, 2 int4 (PAGE_INDEX_FORM_CODE). */
  readonly form: number;
  readonly kvHeads: number;
  /** Query heads per KV head. */
  readonly group: number;
  readonly headDim: number;
  readonly pageCapacity: number;
  readonly scalesOffset: number;
}

/** One index of Backend.indexRankRows: indexRank's arguments but the shape. */
export interface IndexRankRow {
  readonly out: Tensor;
  readonly outOffset: number;
  readonly index: Tensor;
  readonly q: Tensor;
  readonly count: number;
  readonly want: number;
  readonly scratch: Tensor;
}

/** Spans one Backend.attnPartial call takes (a window is sinks and at most two ring runs). */
export const ATTN_PARTIAL_MAX_SPANS = 4;

/** What Backend.matvec fuses around y = h·wᵀ (+ bias) for one row. */
export interface MatvecFusion {
  readonly bias?: Tensor;
  /** h = rmsNorm(x) with this weight (x's width elements) and normEps, instead of h = x. */
  readonly normWeight?: Tensor;
  readonly normEps?: number;
  /** w (and bias) hold [gate; up], 2m rows: result[j] = silu(y[j]) · y[m + j], j < m. */
  readonly siluMul?: boolean;
  /** out += result (a residual add) instead of out = result. */
  readonly accumulate?: boolean;
}

export interface Tensor {
  readonly dtype: DType;
  /** Row-major shape; the last dimension is contiguous. */
  readonly shape: readonly number[];
  /** Name of the backend that owns it; passing it to another backend is an error. */
  readonly backend: string;
}

/** Host memory another object owns (a CPU tensor, a CPU stage's staging buffer), by address. */
export interface HostRegion {
  readonly address: number;
  readonly byteLength: number;
}

/**
 * One 2-D copy between host memory and a device tensor: `rows` rows of `width` bytes, row r
 * at byte hostOffset + r·hostPitch of the region and tensorOffset + r·tensorPitch of the
 * tensor (pitches may be omitted when rows is 1).
 */
export interface HostCopy {
  readonly host: HostRegion;
  readonly hostOffset: number;
  readonly tensor: Tensor;
  readonly tensorOffset: number;
  readonly width: number;
  readonly rows: number;
  readonly hostPitch?: number;
  readonly tensorPitch?: number;
}

/**
 * What a host link offers beyond the copies every link makes: one record the link declares and
 * the engine reads once (hostCapabilities checks it against the methods) when it picks how rows
 * reach the device; no caller probes for optional methods.
 */
export interface HostTransferCapabilities {
  /** sendSignalled(), sendSignalledRows() (and mapped()): the query crosses on the compute stream and raises a word the CPU stage waits for. */
  readonly signalledSend: boolean;
  /** mapped() and gatherRows(): the device gathers rows from pinned host memory mapped into its address space. */
  readonly gathersRows: boolean;
  /** mapped(), awaitSignal(), readMapped(), gatherRowsAt(), padColumnsAt(), handOffRows(), rescoreRows(): the device, not the host, waits for the CPU stage. */
  readonly handOff: boolean;
  /** rowFetch(): a layer's rows fetched ahead on a side stream. */
  readonly rowFetch: boolean;
  /** bandwidth(): the link measures its pinned copy bandwidth. */
  readonly bandwidth: boolean;
  /** keepRows() (with the hand-off ops): of a verified layer's scored candidates the device keeps the best and gathers only their V rows. */
  readonly keepRows: boolean;
}

/**
 * The overlap machinery of a device backend (paper §4.2): page-locked host memory, a copy
 * stream beside the compute stream, events that order the two, and timing from those events.
 * The hybrid runtime moves evicted K/V rows to host memory, and the CPU stage's logits and V
 * rows to the device, through it; a CPU backend has none (its "device" memory is host memory).
 * The optional methods exist where `capabilities` says so; callers branch on the record.
 */
export interface HostTransfers extends Disposable {
  /** The spec version the link was written for (SPEC_VERSION). */
  readonly spec?: SpecVersion;
  /** What the link offers beyond the copies below. */
  readonly capabilities: HostTransferCapabilities;
  /** Page-locks a region so copies with it run asynchronously (DMA); unpin() before it is freed. */
  pin(region: HostRegion): void;
  unpin(region: HostRegion): void;
  /**
   * Device → host on the copy stream, after every op queued so far; later ops of the compute
   * stream wait for it (so the source may be reused at once). The host reads the region only
   * after fence().
   */
  toHost(copies: readonly HostCopy[]): void;
  /**
   * Host → device on the copy stream; later compute ops wait for it. Double buffering: it waits
   * only for the compute ops queued before the previous toDevice() call, so a destination may be
   * rewritten every second call while the compute stream still reads the other one.
   */
  toDevice(copies: readonly HostCopy[]): void;
  /** The host waits for every copy issued so far (then host regions may be read or rewritten). */
  fence(): void;
  /**
   * Optional: the first `bytes` of `src` into the mapped host region `dst` on the compute stream
   * (the side stream between Backend.beginSide and endSide), in order with the ops before it there
   * (a recorded step records it), then the device writes the
   * returned `value` into the 32-bit word at host `address` — what another host thread waits
   * for instead of the caller fencing (values increase by one per call, modulo 2³²).
   */
  sendSignalled?(dst: HostRegion, src: Tensor, bytes: number): HostSignal;
  /** Optional (with sendSignalled): a batched step's sends as one op, then one value into the word for all of them (the next value, as sendSignalled hands out). */
  sendSignalledRows?(sends: readonly SignalledSend[]): HostSignal;
  /** "resume": the host queues device work again; "pause": it is about to block (a read, the CPU stage). */
  mark(kind: "resume" | "pause"): void;
  /**
   * Waits for the device, then returns the times since the last call: gpuMs = compute-stream
   * busy time between resume and pause marks (less its waits on copies), txMs = copy-stream
   * time of the transfers; waitMs (with the hand-off ops) = the compute stream's time in awaitSignal;
   * on a backend that records decode steps, segmentMs = the compute stream's time inside the recorded
   * segments (gpuMs less it: the device idle between them) and hostWaitMs = the host's time blocked at a
   * segment's start for the device.
   */
  times(): { gpuMs: number; txMs: number; waitMs?: number; segmentMs?: number; hostWaitMs?: number };
  /** Pinned copy bandwidth in bytes/s over `bytes` (host → device, device → host). */
  bandwidth?(bytes: number, iters: number): { h2d: number; d2h: number };
  /** Optional: whether the device reads `region` in place (pinned host memory mapped into its address space), as gatherRows does. */
  mapped?(region: HostRegion): boolean;
  /**
   * Optional: the device gathers rows of a mapped host region laid out [groups, cap, rowBytes]
   * into `dst`, packed [groups, kmax, rowBytes]: row i of group g is source row ids[g·kmax + i]
   * for i < counts[g], a zero row after (and for an id outside [0, cap)). Queued on the compute
   * stream after the ops before it (a recorded step records it); ids and counts are read during the call.
   */
  gatherRows?(dst: Tensor, src: HostRegion, rows: RowGather, ids: Int32Array, counts: Int32Array): void;

  // ---- the stage hand-off on the device (all seven or none): the device, not the host, waits for
  // the CPU stage and reads its output where it lies, so the host issues a whole step without blocking.
  /**
   * Optional: a new signal for another host thread (the CPU stage) to raise by writing `value`
   * into the 32-bit word at `address` (mapped host memory the device polls); values increase by
   * one per call, modulo 2³². One word a link: hybrid attention raises its jobs' done in a word of
   * each sequence's own instead (DeviceStaging), as a batch's stages would race on a shared one.
   */
  stageSignal?(): HostSignal;
  /**
   * Optional: on the compute stream, recordable: the device waits until the word of `signal`
   * (from stageSignal, or any 4-byte-aligned word of pinned host memory the device maps) reaches
   * its value (modulo 2³²). A wait that lasts past the link's timeout
   * gives up (later waits too, at once), and the next fence() or times() throws, naming it.
   * times().gpuMs leaves the time spent waiting out.
   */
  awaitSignal?(signal: HostSignal): void;
  /** Optional: a HostCopy from a mapped host region into the tensor, read by the device when the op runs (compute stream, recordable). */
  readMapped?(copy: HostCopy): void;
  /**
   * Optional: gatherRows with the ids and counts read by the device when the op runs, from the
   * mapped host region `table` laid out as int32 [counts (groups) | ids (groups × kmax)].
   */
  gatherRowsAt?(dst: Tensor, src: HostRegion, rows: RowGather, table: HostRegion): void;
  /**
   * Optional: f32 scores [heads, scores.shape[1]]: columns [col + counts[h / group], col + kmax)
   * of head h become −∞, counts read by the device when the op runs from `table` (as gatherRowsAt's,
   * groups = heads / group) (compute stream, recordable).
   */
  padColumnsAt?(scores: Tensor, col: number, kmax: number, group: number, table: HostRegion): void;
  /**
   * Optional: the hand-offs of a batched step's rows in one op (compute stream, recordable): the
   * device waits until every row's `done` is reached (as awaitSignal), then runs every row's
   * `logits` copy (as readMapped) and its gathers (as gatherRowsAt). A batch's layer issues this
   * once where each row's own hand-off would be a wait, a copy and a gather or two.
   */
  handOffRows?(rows: readonly HandOffRow[]): void;
  /**
   * Optional: a batched step's verified logits in one op (compute stream, recordable): each row as
   * its own Backend.attnLogits of q over the gathered K rows, then padColumnsAt with its table, would
   * write them (the same values).
   */
  rescoreRows?(rows: readonly RescoreRow[]): void;
  /**
   * Optional: verified rows whose V rows come up only for the candidates kept (compute stream,
   * recordable; after the rows' verified logits are written). Per row and KV head g, with n = its
   * count in `table` clamped to [0, kmax]: column j < n scores the largest of its group's logits
   * (heads g·group … g·group + group − 1 of `scores` from `col`); the `keep` best of them (all n
   * where n ≤ keep; ties to the lower column) are kept. Every other of its kmax columns on the group's
   * heads becomes −∞, and `values` [kvHeads, ≥ kmax, headDim] gets the kept columns' rows of `src` by the
   * table's ids (as gatherRowsAt reads them) and zero rows elsewhere.
   */
  keepRows?(rows: readonly KeepRow[]): void;
  /**
   * Optional (with the hand-off ops): a new pair of row slots filled ahead on a stream of their own
   * (RowFetch), so a layer's selected rows cross the link while the compute stream still runs the
   * layer before. One per user: a batch's sequences each take their own.
   */
  rowFetch?(): RowFetch;
}

/**
 * Rows fetched ahead (HostTransfers.rowFetch): two slots whose gathers run on a side stream. The
 * compute stream says when a slot's rows are needed (ready) and when they are consumed (release);
 * the side stream waits for the CPU stage's done signal itself, so the host never blocks.
 */
export interface RowFetch extends Disposable {
  /**
   * Queued now on the side stream (never recorded, even while a segment records): after the
   * compute stream has run the slot's last release() launched before this call, wait until `done`
   * is reached (as awaitSignal, its time not counted in times().waitMs), then run each gather as
   * gatherRowsAt would, in order.
   */
  fetch(slot: 0 | 1, done: HostSignal, gathers: readonly RowFetchGather[]): void;
  /**
   * Optional: a batched step's rows in one fetch, as fetch() of each row but waiting for every row's
   * `done` first, then running every row's gathers (a few launches for the whole batch); ready() then
   * waits for all of them.
   */
  fetchRows?(slot: 0 | 1, rows: readonly RowFetchRow[]): void;
  /** Compute stream, recordable: the ops after it wait for the slot's last fetch() called before it launches (a recorded segment's ops launch when it ends). */
  ready(slot: 0 | 1): void;
  /** Compute stream, recordable: the slot's rows are consumed once the ops before it have run; a fetch() after its launch may refill them. */
  release(slot: 0 | 1): void;
  /** Waits for the side stream and frees the slots' events (the link's close does too). */
  close(): void;
}

/** One row of RowFetch.fetchRows: its CPU-stage job's done signal and its gathers. */
export interface RowFetchRow {
  readonly done: HostSignal;
  readonly gathers: readonly RowFetchGather[];
}

/** One gather of a RowFetch.fetch: gatherRowsAt's arguments. */
export interface RowFetchGather {
  readonly dst: Tensor;
  readonly src: HostRegion;
  readonly rows: RowGather;
  readonly table: HostRegion;
}

/** One row of HostTransfers.handOffRows: what its own awaitSignal, readMapped and gatherRowsAt calls would take. */
export interface HandOffRow {
  readonly done: HostSignal;
  /** The stage's logits into the row's score rows (null: the device scores the row's K rows itself). */
  readonly logits: HostCopy | null;
  readonly gathers: readonly RowFetchGather[];
}

/** One row of HostTransfers.rescoreRows: attnLogits(scores, col, q, 0, keys, 0, kmax, scale), then padColumnsAt(scores, col, kmax, heads / kvHeads, table). */
export interface RescoreRow {
  readonly scores: Tensor;
  readonly col: number;
  /** Row 0: heads × headDim f32. */
  readonly q: Tensor;
  /** The gathered K rows [kvHeads, cap ≥ kmax, headDim]. */
  readonly keys: Tensor;
  readonly kmax: number;
  readonly scale: number;
  readonly table: HostRegion;
}

/** One row of HostTransfers.keepRows. */
export interface KeepRow {
  /** f32 [heads, width]: the row's verified logits from column `col` (kmax of them a head). */
  readonly scores: Tensor;
  readonly col: number;
  /** Query heads a KV head. */
  readonly group: number;
  /** Candidates kept a KV head (the rest's logits become −∞ and their V rows are not read). */
  readonly keep: number;
  /** The V rows' destination and source, as gatherRowsAt's (rows.kmax: the candidates a KV head). */
  readonly values: Tensor;
  readonly src: HostRegion;
  readonly rows: RowGather;
  /** int32 [counts | ids] in mapped host memory, as gatherRowsAt reads it. */
  readonly table: HostRegion;
}

/** One send of HostTransfers.sendSignalledRows: sendSignalled's arguments. */
export interface SignalledSend {
  readonly dst: HostRegion;
  readonly src: Tensor;
  readonly bytes: number;
}

/** A HostTransfers.sendSignalled: the word at `address` reaches `value` once the bytes have landed. */
export interface HostSignal {
  readonly address: number;
  readonly value: number;
}

/** The shape of a HostTransfers.gatherRows call. */
export interface RowGather {
  readonly groups: number;
  /** Rows per group in the source region. */
  readonly cap: number;
  readonly rowBytes: number;
  /** Rows per group gathered (the destination's width). */
  readonly kmax: number;
}

/** One row of Backend.attnMergeRows: an attnMerge's arguments. */
export interface AttnMergeRow {
  readonly out: Tensor;
  readonly outRow: number;
  readonly part: Tensor;
  readonly logits: Tensor;
  readonly col: number;
  readonly v: Tensor;
  readonly start: number;
  readonly count: number;
}

/** One row of Backend.attnPartialRows: an attnPartial's arguments. */
export interface AttnPartialRow {
  readonly part: Tensor;
  readonly q: Tensor;
  readonly qRow: number;
  readonly k: Tensor;
  readonly v: Tensor;
  readonly spans: Int32Array;
  readonly scale: number;
}

/** One row of Backend.appendKvRows: a sequence's new K and V [kvHeads, headDim] (f32) and the window K and V [kvHeads, cap, headDim] they go to at `slot`. */
export interface KvAppendRow {
  readonly k: Tensor;
  readonly v: Tensor;
  readonly slot: number;
  readonly kNew: Tensor;
  readonly vNew: Tensor;
}

/** One row of Backend.attnDecodeBatch: where its new K/V row goes and the span it attends over. */
export interface BatchAttnRow {
  /** The row's K and V caches [kvHeads, cap, headDim]. */
  kCache: Tensor;
  vCache: Tensor;
  /** Cache slot the row's new K/V go to. */
  slot: number;
  /** The row attends over slots start .. start + firstPos (firstPos + 1 tokens). */
  start: number;
  firstPos: number;
}

export interface Backend extends Disposable {
  /** The spec version the backend was written for (SPEC_VERSION); absent: written before the field. */
  readonly spec?: SpecVersion;
  readonly name: string;
  /** Worker threads used by ops (1 for single-threaded backends). */
  readonly threads: number;

  // ---- memory -------------------------------------------------------------------------
  /**
   * Make a weight available to ops. `bytes` is little-endian data of `dtype` (often a view
   * of a memory-mapped file, which must then outlive the tensor); a CPU backend may use it
   * in place, a device backend copies it.
   */
  loadWeight(bytes: Uint8Array, dtype: DType, shape: readonly number[]): Tensor;
  /** A zero-filled tensor (activations, KV storage). Only f32 activations are used by ops
   * other than the attention ops, which also read f16/bf16 K and V storage. */
  alloc(shape: readonly number[], dtype?: DType): Tensor;
  /** Copy f32 values into `t` starting at element `offset` (converting to t.dtype). */
  write(t: Tensor, src: Float32Array, offset?: number): void;
  /** Copy `count` elements from element `offset` of `t` out as f32. */
  read(t: Tensor, offset?: number, count?: number): Float32Array;
  /** Copy `count` rows: dst[dstRow + i] = src[srcRow + i] (same row width; same or f32→any dtype). */
  copyRows(dst: Tensor, dstRow: number, src: Tensor, srcRow: number, count: number): void;
  /** Release a tensor allocated by `alloc` or `loadWeight`. Double free is an error. */
  free(t: Tensor): void;
  /**
   * A tensor aliasing `shape`-many contiguous elements of `t` from element `offset` (same
   * dtype, no copy). It lets one buffer serve several ops without strided access: the q, k
   * and v parts of a fused [q;k;v] matmul output, gate and up of a fused [gate;up] output,
   * the last row of a block, per-head rows [kvHeads, headDim] of a k output. Every op reads
   * a tensor's rows at its last dimension, so a view is how a buffer is seen at another row
   * width. free(view) releases only the handle; freeing `t` invalidates its views.
   */
  view(t: Tensor, offset: number, shape: readonly number[]): Tensor;

  // ---- elementwise and row ops (n = rows used) --------------------------------------------
  /** out[i, :] = table[ids[i], :] as f32. Ids are checked against the table's rows. */
  embedding(out: Tensor, table: Tensor, ids: Int32Array): void;
  /** out[n, m] = x[n, k] · w[m, k]ᵀ (+ bias[m]). w in f32/f16/bf16. */
  matmul(out: Tensor, x: Tensor, w: Tensor, n: number, bias?: Tensor): void;
  /** out = x / rms(x) * weight per row (eps inside the sqrt). out may alias x. */
  rmsNorm(out: Tensor, x: Tensor, weight: Tensor, n: number, eps: number): void;
  /** out = (x - mean) / sqrt(var + eps) * weight + bias per row. out may alias x. */
  layerNorm(out: Tensor, x: Tensor, weight: Tensor, bias: Tensor, n: number, eps: number): void;
  /**
   * Rotary embedding in place, half-split layout (HF "rotate_half"): for each row i and head,
   * pairs (j, j + rot/2) for j < rot/2 rotate by angle with cos/sin taken from row
   * positions[i] of `cos`/`sin` ([maxPos, rot/2]). Rows of x are heads × headDim.
   */
  rope(x: Tensor, n: number, positions: Int32Array, heads: number, headDim: number, cos: Tensor, sin: Tensor): void;
  /** out = silu(gate) * up. out may alias gate. */
  siluMul(out: Tensor, gate: Tensor, up: Tensor, n: number): void;
  /** In place. */
  relu(x: Tensor, n: number): void;
  /** In place, tanh approximation is NOT used: exact erf GELU. */
  gelu(x: Tensor, n: number): void;
  /** out = a + b. out may alias a or b. */
  add(out: Tensor, a: Tensor, b: Tensor, n: number): void;
  /** Row-wise softmax of the first `cols` columns of `rows` rows, in place. */
  softmax(x: Tensor, rows: number, cols: number): void;
  /** Index of the largest value in row `row` (first index on ties). */
  argmax(x: Tensor, row: number): number;

  // ---- attention stages -----------------------------------------------------------------
  /**
   * logits[h, outCol + j] = scale · q[qRow, h, :] · K[h / groupSize, start + j, :] for
   * query heads h and j < count. q rows are heads × headDim; K is [kvHeads, cap, headDim]
   * (f32/f16/bf16); logits is [heads, width].
   */
  attnLogits(logits: Tensor, outCol: number, q: Tensor, qRow: number, k: Tensor, start: number, count: number, scale: number): void;
  /** As attnLogits over explicit token slots: column outCol + j scores K slot slots[j]. */
  attnLogitsGather(logits: Tensor, outCol: number, q: Tensor, qRow: number, k: Tensor, slots: Int32Array, scale: number): void;
  /**
   * out[outRow, h, :] (+)= Σ_j probs[h, probCol + j] · V[h / groupSize, start + j, :].
   * `accumulate` false overwrites, true adds (segments summed one after another).
   */
  attnAggregate(out: Tensor, outRow: number, probs: Tensor, probCol: number, v: Tensor, start: number, count: number, accumulate: boolean): void;
  /** As attnAggregate over explicit V slots. */
  attnAggregateGather(out: Tensor, outRow: number, probs: Tensor, probCol: number, v: Tensor, slots: Int32Array, accumulate: boolean): void;

  // ---- optional fast paths (core uses them when a backend has them) -------------------------
  /**
   * The ops until endStep() are one decode step of the kind `key` names (one key per model).
   * A backend may record them and run the step as a whole at endStep() (a GPU backend replays
   * a graph captured from an earlier step with the same launches); results must be as if every
   * op ran when called, and a read or write in between sees every op before it.
   */
  beginStep?(key: string): void;
  endStep?(): void;
  /**
   * Greedy decode fed on the device (all three or none). argmaxToFeed picks the argmax of row
   * `row` of x (first index on ties) into the backend's token feed and starts copying it to host
   * slot `slot` (0 or 1) without waiting. embeddingFromFeed embeds the token the feed holds when
   * the op runs, so the next step can be recorded and launched before the host knows the token.
   * feedResult(slot) waits for that slot's pick and returns it. Ops run in call order, as ever.
   */
  argmaxToFeed?(x: Tensor, row: number, slot: number): void;
  embeddingFromFeed?(out: Tensor, table: Tensor): void;
  feedResult?(slot: number): number;
  /**
   * Causal attention of a prefill block over one contiguous cached span, never materialising
   * the n × (firstPos + n) scores: for rows i < n of q (heads × headDim each),
   *   out[i, h, :] = Σ_{j ≤ firstPos + i} softmax_j(scale · q[i, h, :] · K[h / group, start + j, :]) · V[h / group, start + j, :]
   * with K, V [kvHeads, cap, headDim] (f32/f16/bf16) and slots start .. start + firstPos + n − 1.
   * Core also calls it for a full-attention decode step (n = 1) over a contiguous cache; a GPU
   * backend runs a split-K decode kernel there.
   */
  attnCausal?(out: Tensor, q: Tensor, n: number, k: Tensor, v: Tensor, start: number, firstPos: number, scale: number): void;
  /**
   * The attention half of a batched decode step (B = rows.length rows, each its own sequence)
   * in one call. For row i, with rows[i] = {kCache, vCache, slot, start, firstPos}:
   *   kCache[g, slot, :] = k[i, g·headDim ..], vCache[g, slot, :] = v[i, g·headDim ..]  (every KV head g)
   *   out[i, h, :] = Σ_{j ≤ firstPos} softmax_j(scale · q[i, h, :] · K[h / group, start + j, :]) · V[h / group, start + j, :]
   * q, out: [≥ B, heads·headDim] f32; k, v: [≥ B, kvHeads·headDim] f32; the caches [kvHeads, cap,
   * headDim] (one dtype for all rows, cap may differ), the new rows written before any row
   * attends. It equals, row by row, copyRows of each KV head then attnCausal(n = 1); a GPU
   * backend runs it as a few launches for all rows instead of 2·kvHeads + 1 calls a row.
   * Core's BatchRows.attend uses it when every row's cache is one contiguous span from position 0.
   */
  attnDecodeBatch?(out: Tensor, q: Tensor, k: Tensor, v: Tensor, rows: readonly BatchAttnRow[], scale: number): void;
  /**
   * One query row's attention over spans of a KV cache as a flash-decode *partial*, K and V read
   * once and no logits written. With ℓ_j = scale · q[qRow, h, :] · K[h / group, slot_j, :] over the
   * slots of every span (`spans`: pairs start, count, at most ATTN_PARTIAL_MAX_SPANS pairs), per
   * query head h of part [heads, headDim + 2] (f32):
   *   part[h, :headDim] = Σ_j e^(ℓ_j − m) · V[h / group, slot_j, :] / l   (the normalised output)
   *   part[h, headDim] = m = max_j ℓ_j,   part[h, headDim + 1] = l = Σ_j e^(ℓ_j − m)
   * No token at all: output 0, m = −∞, l = 0. attnMerge finishes it; both or neither exist.
   */
  attnPartial?(part: Tensor, q: Tensor, qRow: number, k: Tensor, v: Tensor, spans: Int32Array, scale: number): void;
  /**
   * Optional (with attnPartial): a batched step's window partials in one op, each row what its own
   * attnPartial would write (the same sums); the rows' K and V are of one shape and dtype.
   */
  attnPartialRows?(rows: readonly AttnPartialRow[]): void;
  /**
   * Optional: a batched step's K/V appends in one op, each row what copyRows of its KV heads' rows
   * would write: k[g, slot, :] = kNew[g, :] and v[g, slot, :] = vNew[g, :] for every KV head g (the
   * windows' dtype, rounded from f32); the rows' windows are of one shape and dtype.
   */
  appendKvRows?(rows: readonly KvAppendRow[]): void;
  /**
   * The page index's ranking on the device (contracts/page-index.ts; a device backend's, optional):
   * `index` holds an index's page level page-major (DeviceIndexShape); each KV head's best `want` of
   * its first `count` pages by bound with row 0 of q (heads·headDim f32) go to `out` from byte
   * `outOffset` as int32 [kvHeads, want], best first, ties to the lower page (f32 sums: a choice may
   * differ from indexPages' only between pages whose bounds tie within rounding). `scratch` holds
   * indexRankScratch() bytes.
   */
  indexRank?(out: Tensor, outOffset: number, index: Tensor, shape: DeviceIndexShape, q: Tensor, count: number, want: number, scratch: Tensor): void;
  /** Scratch bytes indexRank needs for the shape and want; 0: the backend does not rank that shape. */
  indexRankScratch?(shape: DeviceIndexShape, want: number): number;
  /**
   * indexRank of several indexes of one shape at once (a batched step's sequences: one launch for
   * all), each row as indexRank's arguments; every row's scratch holds indexRankScratch(shape, W)
   * bytes for W the rows' largest want.
   */
  indexRankRows?(rows: readonly IndexRankRow[], shape: DeviceIndexShape): void;
  /**
   * Optional, all three or none (recordable): the ops issued between beginSide() and endSide() —
   * only indexRank and HostTransfers.sendSignalled — run on a second stream that first waits for the
   * work queued before beginSide(), beside the ops queued after endSide(); joinSide() makes the later
   * ops wait for that stream (a no-op when nothing ran there since the last join). A recorded step
   * must join before it ends.
   */
  beginSide?(): void;
  endSide?(): void;
  joinSide?(): void;
  /**
   * Finishes a partial with more tokens whose logits are given: the columns [col, col + count) of
   * logits [heads, width] with V rows v[h / group, start + j, :] (v [kvHeads, cap, headDim]). out[outRow, h, :]
   * becomes exactly one softmax over the partial's tokens ∪ those columns applied to their V rows,
   * as softmax + attnAggregate over the materialised row would give; −∞ logits take no part.
   * count may be 0 (then out is the partial's output). Nothing attended at all: out is 0.
   */
  attnMerge?(out: Tensor, outRow: number, part: Tensor, logits: Tensor, col: number, v: Tensor, start: number, count: number): void;
  /**
   * Optional (with attnMerge): a batched step's merges in one op, each row what its own attnMerge
   * would write (the same sums); the rows' logits tensors are equally wide and their V of one dtype.
   */
  attnMergeRows?(rows: readonly AttnMergeRow[]): void;
  /**
   * A batched step's matmul whose weight rows go to 1–3 outputs, optionally added to them:
   *   outs[j][r, :] (+)= x[r] · w[o_j .. o_j + m_j)ᵀ (+ bias[o_j .. o_j + m_j))   for rows r < n
   * with m_j = outs[j]'s columns, o_j = m_0 + … + m_{j−1}, Σ m_j = w's rows and bias [Σ m_j].
   * It is a fused [q; k; v] or [gate; up] weight into separate outputs in one launch, or o / down
   * with the residual add in the epilogue (`accumulate`). Outputs must not overlap x, bias or each
   * other. Returns false, having done nothing, when the backend has no fast kernel for the case
   * (dtype, n, alignment, a switch); the caller then runs matmul (and add) as before.
   */
  matmulSplit?(outs: readonly Tensor[], x: Tensor, w: Tensor, n: number, bias: Tensor | undefined, accumulate: boolean): boolean;
  /**
   * out[i] = argmax(x, i) for rows i < n (the index argmax returns: the first of equal maxima), in
   * one call: a batched step's greedy picks without n round trips to a device.
   */
  argmaxRows?(x: Tensor, n: number, out: Int32Array): void;
  /**
   * Row 0 only (decode): out[0, :m] = result, or += result with `accumulate`, where
   *   h = f.normWeight ? rmsNorm(x[0], f.normWeight, f.normEps) : x[0];  y = h·wᵀ (+ f.bias)
   *   result = f.siluMul ? silu(y[:m]) · y[m:] : y
   * out has m columns (w has m rows, or 2m with siluMul) and must not overlap x. It lets a
   * GPU backend fuse the norm, the residual add and SiLU·up into the GEMV (fewer launches,
   * no round trips of h); the norm step is one matmul's read of x, not a separate kernel.
   */
  matvec?(out: Tensor, x: Tensor, w: Tensor, f: MatvecFusion): void;
  /**
   * A device backend's host link (copy stream, pinned memory, event timing); made on first
   * call and owned by the backend (closed with it). Absent on host backends.
   */
  hostTransfers?(): HostTransfers;
  /** A host backend: the memory of tensor `t` (for a device backend's copies). Absent on device backends. */
  hostRegion?(t: Tensor): HostRegion;
}
