/**
 * CudaHostLink: core's HostTransfers on native/host_copy.cu — page-locked host regions (mapped
 * into the device's address space where the device allows), 2-D copies on the backend's copy
 * stream ordered against the compute stream by events, the event timeline that gives the hybrid
 * scheduler T_gpu and T_tx, rows gathered by the device straight from mapped regions
 * (native/host_gather.cu), and the stage hand-off on the device: the device waits for the CPU
 * stage's signal word, then reads the stage's output from mapped host memory when it runs
 * (native/mapped_ops.cu), and rows fetched ahead on a side stream (rowFetch, native/row_fetch.cu).
 * Every host and device range is checked here before an address reaches C.
 */
import type { Pointer } from "bun:ffi";
import { HybridgenError, SPEC_VERSION, type HandOffRow, type KeepRow, type RescoreRow, type SignalledSend, type HostCopy, type HostTransferCapabilities, type HostRegion, type HostSignal, type HostTransfers, type RowFetch, type RowFetchGather, type RowFetchRow, type RowGather, type Tensor } from "@hybridgen/spec";
import { MAX_HOST_INTS, type CudaNative } from "./native-backend.js";
import type { CudaTensor } from "./cuda-tensor.js";

const P = (address: number) => address as Pointer;
const FIELDS = 6; // dst, src, width, rows, dst pitch, src pitch (native hg_link_copy)
/** How long the device waits for a stage signal before it gives up (setWaitTimeout changes it). */
export const DEFAULT_WAIT_TIMEOUT_MS = 10_000;
const MAX_WAIT_TIMEOUT_MS = 3_600_000;
const INT32_MAX = 0x7fffffff;
/** The kernels' dtype codes (DT_F32, DT_F16, DT_BF16). */
const DTYPE_CODES = { f32: 0, f16: 1, bf16: 2 } as const;
/** The most rows one handOffRows, rescoreRows or keepRows call takes (native). */
const MAX_HAND_OFF_ROWS = 4096;

function bad(message: string): never {
  throw new HybridgenError(message, "EBADARG");
}

const isCount = (v: unknown): v is number => typeof v === "number" && Number.isSafeInteger(v) && v >= 0;

/** What the link needs of its backend (kept narrow so tests can stand in for it). */
export interface HostLinkOwner {
  readonly lib: CudaNative;
  readonly ctx: Pointer;
  /** Throws unless `t` is a live tensor of the owning backend. */
  own(t: Tensor, op: string): CudaTensor;
  /** Throws a HybridgenError for a non-zero native status. */
  ok(op: string, rc: number): void;
  allocBytes(bytes: number, op: string): CudaTensor;
  release(t: CudaTensor): void;
}

export class CudaHostLink implements HostTransfers {
  readonly spec = SPEC_VERSION;
  /** Every optional op is native here. */
  readonly capabilities: HostTransferCapabilities = { signalledSend: true, gathersRows: true, handOff: true, rowFetch: true, bandwidth: true, keepRows: true };
  private link: Pointer | null;
  /** The pinned blocks in ascending address order: a region's block by binary search (a batch pins ~70 regions a sequence, looked up a few times a row a layer). */
  private readonly pinned: PinnedBlock[] = [];
  private readonly pageable = new Set<number>(); // pin() found their pages pinned already
  private desc = new Float64Array(FIELDS * 64);
  private readonly timesOut = new Float64Array(6);
  private readonly signalOut = new Float64Array(3);
  private readonly gaveUpOut = new Float64Array(2);
  /** The link's stage word (host and device address), known once stageSignal() handed it out. */
  private stageWord: { address: number; device: number } | null = null;
  /** The row fetches made and not yet closed (the link closes them first). */
  private readonly fetches = new Set<CudaRowFetch>();
  private timeoutMs = DEFAULT_WAIT_TIMEOUT_MS;

  constructor(private readonly owner: HostLinkOwner) {
    const l = owner.lib.hg_link_create(owner.ctx);
    if (!l) throw new HybridgenError("CUDA host link: could not create its events", "ECUDA");
    this.link = l as Pointer;
  }

  private live(op: string): Pointer {
    if (!this.link) bad(`${op}: the host link is closed`);
    return this.link;
  }

  pin(region: HostRegion): void {
    this.live("pin");
    checkRegion(region, "pin");
    const at = this.firstAbove(region.address);
    if (this.pinned[at - 1]?.address === region.address || this.pageable.has(region.address)) bad(`pin: host region at 0x${region.address.toString(16)} is already pinned`);
    if (region.byteLength === 0) return;
    const rc = this.owner.lib.hg_host_pin(P(region.address), region.byteLength);
    if (rc === -1) {
      this.pageable.add(region.address); // not a page-owning block (see hg_host_pin): copies stay correct, synchronous
      return;
    }
    this.owner.ok("pin (cudaHostRegister)", rc);
    const dev = new Float64Array(1);
    const device = this.owner.lib.hg_host_device_ptr(P(region.address), dev) === 0 && dev[0] > 0 ? dev[0] : null;
    this.pinned.splice(at, 0, { address: region.address, bytes: region.byteLength, device });
  }

  unpin(region: HostRegion): void {
    if (!this.link) return; // close() unpinned everything
    checkRegion(region, "unpin");
    if (region.byteLength === 0) return;
    if (this.pageable.delete(region.address)) return;
    const i = this.firstAbove(region.address) - 1;
    if (this.pinned[i]?.address !== region.address) bad(`unpin: host region at 0x${region.address.toString(16)} is not pinned`);
    this.pinned.splice(i, 1);
    this.owner.ok("unpin (cudaHostUnregister)", this.owner.lib.hg_host_unpin(P(region.address)));
  }

  /** Regions pinned, and regions pin() left pageable (smaller than 2 MiB or not page-aligned). */
  pinCounts(): { pinned: number; pageable: number } {
    return { pinned: this.pinned.length, pageable: this.pageable.size };
  }

  /** Whether `region` lies inside a pinned region (copies from pageable memory would be synchronous). */
  isPinned(region: HostRegion): boolean {
    return this.pinnedBlock(region) !== null;
  }

  /** HostTransfers.mapped: `region` lies inside a pinned region the device maps. */
  mapped(region: HostRegion): boolean {
    return this.deviceAddress(region) !== null;
  }

  /** HostTransfers.gatherRows on the compute stream (recordable); every range is checked first. */
  gatherRows(dst: Tensor, src: HostRegion, rows: RowGather, ids: Int32Array, counts: Int32Array): void {
    const op = "gatherRows";
    this.live(op);
    const { groups, kmax } = checkGatherShape(rows, op);
    if (!(ids instanceof Int32Array) || ids.length < groups * kmax) bad(`${op}: ids must be an Int32Array of at least ${groups} × ${kmax}`);
    if (!(counts instanceof Int32Array) || counts.length < groups) bad(`${op}: counts must be an Int32Array of at least ${groups}`);
    if (groups * (kmax + 1) > MAX_HOST_INTS) bad(`${op}: ${groups} × ${kmax} ids exceed the backend's limit of ${MAX_HOST_INTS} in one call`);
    const { d, at } = this.gatherRanges(dst, src, rows, op);
    this.owner.ok(op, this.owner.lib.hg_cu_gather_rows(this.owner.ctx, P(d.addr), P(at), counts, ids, groups, kmax, rows.cap, rows.rowBytes));
  }

  /**
   * HostTransfers.gatherRowsAt: gatherRows with the [counts (groups) | ids (groups × kmax)] int32
   * table read by the device from the mapped region `table` when the op runs (recordable).
   */
  gatherRowsAt(dst: Tensor, src: HostRegion, rows: RowGather, table: HostRegion): void {
    const op = "gatherRowsAt";
    this.live(op);
    const { groups, kmax } = checkGatherShape(rows, op);
    const tableAt = this.mappedTable(table, groups * (1 + kmax), `${groups} × (1 + ${kmax}) ints`, op);
    const { d, at } = this.gatherRanges(dst, src, rows, op);
    this.owner.ok(op, this.owner.lib.hg_cu_gather_rows_at(this.owner.ctx, P(d.addr), P(at), P(tableAt), groups, kmax, rows.cap, rows.rowBytes));
  }

  /**
   * HostTransfers.padColumnsAt: columns [col + counts[h / group], col + kmax) of row h of the f32
   * scores [heads, width] become −∞, counts (clamped to [0, kmax]) read by the device from the
   * mapped `table` when the op runs (recordable).
   */
  padColumnsAt(scores: Tensor, col: number, kmax: number, group: number, table: HostRegion): void {
    const op = "padColumnsAt";
    this.live(op);
    const s = this.owner.own(scores, op);
    if (s.dtype !== "f32" || s.shape.length !== 2) bad(`${op}: scores must be an f32 [heads, width] tensor, got ${s}`);
    const [heads, width] = s.shape;
    if (!isCount(col)) bad(`${op}: col must be a non-negative integer, got ${col}`);
    if (!(isCount(kmax) && kmax > 0 && isCount(group) && group > 0)) bad(`${op}: kmax and group must be positive integers, got ${kmax} and ${group}`);
    if (col + kmax > width) bad(`${op}: columns [${col}, ${col + kmax}) exceed the scores' width ${width}`);
    if (heads % group !== 0) bad(`${op}: ${heads} heads are not a whole number of groups of ${group}`);
    if (heads > INT32_MAX || width > INT32_MAX) bad(`${op}: ${s} exceeds the kernels' 32-bit index range`);
    const groups = heads / group;
    const tableAt = this.mappedTable(table, groups, `${groups} counts`, op);
    this.owner.ok(op, this.owner.lib.hg_cu_pad_columns(this.owner.ctx, P(s.addr), P(tableAt), heads, width, col, kmax, group));
  }

  /**
   * HostTransfers.readMapped: a kernel on the compute stream copies the rows from mapped host
   * memory into the tensor when it runs (recordable). Width, offsets, pitches and both addresses
   * must be multiples of 4 bytes.
   */
  readMapped(copy: HostCopy): void {
    const op = "readMapped";
    this.live(op);
    const r = this.mappedRead(copy, op);
    if (r.rows === 0 || r.width === 0) return;
    this.owner.ok(op, this.owner.lib.hg_cu_read_mapped(this.owner.ctx, P(r.dev), P(r.src), r.width, r.rows, r.dstPitch, r.srcPitch));
  }

  /** readMapped's checks: the device addresses of both ends (src mapped) and the pitches the kernel takes. */
  private mappedRead(copy: HostCopy, op: string): { dev: number; src: number; width: number; rows: number; dstPitch: number; srcPitch: number } {
    if (!copy || typeof copy !== "object") bad(`${op}: a HostCopy is needed`);
    const { t, hp, tp } = this.checkCopy(copy, op, "");
    const { rows, width } = copy;
    const host = copy.host.address + copy.hostOffset, dev = t.addr + copy.tensorOffset;
    const pitches = rows > 1 ? [hp, tp] : [];
    if ([width, host, dev, ...pitches].some((v) => v % 4 !== 0)) bad(`${op}: width, pitches and both start addresses must be multiples of 4 bytes (width ${width}, pitches ${hp}/${tp}, host 0x${host.toString(16)}, tensor offset ${copy.tensorOffset})`);
    if ([width, rows, ...pitches].some((v) => v > INT32_MAX)) bad(`${op}: width, rows and pitches must be 32-bit integers`);
    const at = this.deviceAddress(copy.host);
    if (at === null) bad(`${op}: host region at 0x${copy.host.address.toString(16)} is not pinned memory the device maps`);
    return { dev, src: at + copy.hostOffset, width, rows, dstPitch: rows > 1 ? tp : width, srcPitch: rows > 1 ? hp : width };
  }

  /**
   * HostTransfers.handOffRows: every row's wait, then every row's logits read and row gathers, as
   * one op (native/hand_off_rows.cu); each row's parts checked as awaitSignal, readMapped and
   * gatherRowsAt check theirs.
   */
  handOffRows(rows: readonly HandOffRow[]): void {
    const op = "handOffRows";
    const link = this.live(op);
    if (!Array.isArray(rows) || rows.length === 0 || rows.length > MAX_HAND_OFF_ROWS) bad(`${op}: 1 to ${MAX_HAND_OFF_ROWS} rows are needed`);
    let m = 0;
    for (const [i, r] of rows.entries()) {
      if (!r || typeof r !== "object" || !Array.isArray(r.gathers) || r.gathers.length > 8) bad(`${op}: row ${i} needs done, logits and 0 to 8 gathers`);
      m += r.gathers.length;
    }
    const desc = new Float64Array(8 * rows.length), gathers = new Float64Array(7 * Math.max(1, m));
    let k = 0;
    rows.forEach((r, i) => {
      const which = `${op}: row ${i}`;
      desc[8 * i] = this.signalWord(r.done, which);
      desc[8 * i + 1] = r.done.value;
      if (r.logits) {
        const c = this.mappedRead(r.logits, which);
        if (c.rows > 0 && c.width > 0) desc.set([c.dev, c.src, c.width, c.rows, c.dstPitch, c.srcPitch], 8 * i + 2);
      }
      for (const g of r.gathers) {
        const { groups, kmax, cap, rowBytes } = checkGatherShape(g.rows, which);
        const tableAt = this.mappedTable(g.table, groups * (1 + kmax), `${groups} × (1 + ${kmax}) ints`, which);
        const { d, at } = this.gatherRanges(g.dst, g.src, g.rows, which);
        gathers.set([d.addr, at, tableAt, groups, kmax, cap, rowBytes], 7 * k++);
      }
    });
    this.owner.ok(`${op} (a device that cannot map host memory has no signal word)`, this.owner.lib.hg_link_hand_off_rows(link, desc, rows.length, gathers, m));
  }

  /**
   * HostTransfers.stageSignal: the next value (modulo 2³²) for the link's stage word, which lies
   * in mapped host memory on its own cache line; the CPU stage writes the value there.
   */
  stageSignal(): HostSignal {
    const op = "stageSignal";
    const link = this.live(op);
    this.owner.ok(`${op} (a device that cannot map host memory has no signal word)`, this.owner.lib.hg_link_stage_signal(link, this.signalOut));
    this.stageWord = { address: this.signalOut[1], device: this.signalOut[2] };
    return { address: this.signalOut[1], value: this.signalOut[0] };
  }

  /**
   * HostTransfers.awaitSignal: on the compute stream (recordable), the device waits until the
   * word reaches the signal's value (modulo 2³²). The word is the link's stage word or any
   * aligned word of a pinned region the device maps. Past the wait timeout (setWaitTimeout) the
   * device gives up, later waits return at once, and the next fence() or times() throws.
   */
  awaitSignal(signal: HostSignal): void {
    const op = "awaitSignal";
    const link = this.live(op);
    const word = this.signalWord(signal, op);
    this.owner.ok(`${op} (a device that cannot map host memory has no signal word)`, this.owner.lib.hg_link_await_signal(link, P(word), signal.value));
  }

  /**
   * HostTransfers.rescoreRows: every row's verified logits and its padding as one kernel
   * (native/hand_off_rows.cu); each row's tensors, columns and table checked as attnLogits and
   * padColumnsAt check theirs, the rows of one shape (heads, KV heads, head dim, K dtype).
   */
  rescoreRows(rows: readonly RescoreRow[]): void {
    const op = "rescoreRows";
    const link = this.live(op);
    if (!Array.isArray(rows) || rows.length === 0 || rows.length > MAX_HAND_OFF_ROWS) bad(`${op}: 1 to ${MAX_HAND_OFF_ROWS} rows are needed`);
    const desc = new Float64Array(8 * rows.length);
    let shape: { heads: number; kvHeads: number; headDim: number; dtype: string } | null = null;
    rows.forEach((r, i) => {
      const which = `${op}: row ${i}`;
      if (!r || typeof r !== "object") bad(`${which}: a RescoreRow is needed`);
      const s = this.owner.own(r.scores, which), q = this.owner.own(r.q, which), k = this.owner.own(r.keys, which);
      if (s.dtype !== "f32" || s.shape.length !== 2) bad(`${which}: scores must be an f32 [heads, width] tensor, got ${s}`);
      if (k.shape.length !== 3) bad(`${which}: keys must be [kvHeads, cap, headDim], got ${k}`);
      const [heads, width] = s.shape as [number, number], [kvHeads, cap, headDim] = k.shape as [number, number, number];
      if (heads % kvHeads !== 0) bad(`${which}: ${heads} heads are not a whole number of groups of ${kvHeads} KV heads`);
      if (q.dtype !== "f32" || q.numel < heads * headDim) bad(`${which}: q must hold ${heads} × ${headDim} f32, got ${q}`);
      if (!(isCount(r.col) && isCount(r.kmax) && r.kmax > 0)) bad(`${which}: col and kmax must be integers (kmax positive), got ${r.col} and ${r.kmax}`);
      if (r.kmax > cap) bad(`${which}: ${r.kmax} rows a KV head exceed the keys' ${cap}`);
      if (r.col + r.kmax > width) bad(`${which}: columns [${r.col}, ${r.col + r.kmax}) exceed the scores' width ${width}`);
      if (!Number.isFinite(r.scale)) bad(`${which}: scale ${r.scale} is not finite`);
      if ([heads * width, kvHeads * cap * headDim].some((v) => v > INT32_MAX)) bad(`${which}: the tensors exceed the kernels' 32-bit index range`);
      shape ??= { heads, kvHeads, headDim, dtype: k.dtype };
      if (heads !== shape.heads || kvHeads !== shape.kvHeads || headDim !== shape.headDim || k.dtype !== shape.dtype) {
        bad(`${which}: ${heads} heads, ${kvHeads} KV heads, head dim ${headDim}, K ${k.dtype}: not row 0's ${shape.heads}, ${shape.kvHeads}, ${shape.headDim}, ${shape.dtype}`);
      }
      const tableAt = this.mappedTable(r.table, kvHeads, `${kvHeads} counts`, which);
      desc.set([s.addr + r.col * 4, width, q.addr, k.addr, cap, r.kmax, tableAt, r.scale], 8 * i);
    });
    const x = shape!;
    this.owner.ok(op, this.owner.lib.hg_link_rescore_rows(link, desc, rows.length, DTYPE_CODES[x.dtype as keyof typeof DTYPE_CODES], x.heads, x.kvHeads, x.headDim));
  }

  /**
   * HostTransfers.keepRows: every row's kept candidates as one kernel (native/hand_off_rows.cu);
   * each row's scores and columns checked as padColumnsAt checks them (the group's heads a KV head
   * of the table), its V rows as gatherRowsAt checks its gather.
   */
  keepRows(rows: readonly KeepRow[]): void {
    const op = "keepRows";
    const link = this.live(op);
    if (!Array.isArray(rows) || rows.length === 0 || rows.length > MAX_HAND_OFF_ROWS) bad(`${op}: 1 to ${MAX_HAND_OFF_ROWS} rows are needed`);
    const desc = new Float64Array(11 * rows.length);
    rows.forEach((r, i) => {
      const which = `${op}: row ${i}`;
      if (!r || typeof r !== "object") bad(`${which}: a KeepRow is needed`);
      const s = this.owner.own(r.scores, which);
      if (s.dtype !== "f32" || s.shape.length !== 2) bad(`${which}: scores must be an f32 [heads, width] tensor, got ${s}`);
      const [heads, width] = s.shape as [number, number];
      const { groups, kmax, cap, rowBytes } = checkGatherShape(r.rows, which);
      if (!(isCount(r.col) && isCount(r.keep) && r.keep > 0 && isCount(r.group) && r.group > 0)) bad(`${which}: col must be a non-negative integer, keep and group positive ones, got ${r.col}, ${r.keep} and ${r.group}`);
      if (groups * r.group !== heads) bad(`${which}: ${groups} KV heads of ${r.group} query heads are not the scores' ${heads}`);
      if (r.col + kmax > width) bad(`${which}: columns [${r.col}, ${r.col + kmax}) exceed the scores' width ${width}`);
      if (heads * width > INT32_MAX) bad(`${which}: ${s} exceeds the kernels' 32-bit index range`);
      const tableAt = this.mappedTable(r.table, groups * (1 + kmax), `${groups} × (1 + ${kmax}) ints`, which);
      const { d, at } = this.gatherRanges(r.values, r.src, r.rows, which);
      desc.set([s.addr + r.col * 4, width, r.keep, d.addr, at, tableAt, groups, kmax, cap, rowBytes, r.group], 11 * i);
    });
    this.owner.ok(op, this.owner.lib.hg_link_keep_rows(link, desc, rows.length));
  }

  /** HostTransfers.rowFetch: a new pair of slots whose gathers run on the link's side stream (closed with the link at the latest). */
  rowFetch(): RowFetch {
    const op = "rowFetch";
    const link = this.live(op);
    const f = this.owner.lib.hg_fetch_create(link);
    if (!f) throw new HybridgenError(`${op}: could not make its events and side stream (or the device cannot map the link's signal words)`, "ECUDA");
    const fetch = new CudaRowFetch(f as Pointer, this.owner, (signal, gathers, o) => this.fetchArgs(signal, gathers, o), (closed) => this.fetches.delete(closed));
    this.fetches.add(fetch);
    return fetch;
  }

  /** Its RowFetch's fetch() checks: the signal's word and each gather's ranges, as device addresses [word, 7 doubles a gather]. */
  private fetchArgs(signal: HostSignal, gathers: readonly RowFetchGather[], op: string): FetchArgs {
    this.live(op);
    const word = this.signalWord(signal, op);
    if (!Array.isArray(gathers) || gathers.length === 0 || gathers.length > 8) bad(`${op}: 1 to 8 gathers are needed`);
    const desc = new Float64Array(gathers.length * 7);
    gathers.forEach((g, i) => {
      const { groups, kmax, cap, rowBytes } = checkGatherShape(g.rows, op);
      const tableAt = this.mappedTable(g.table, groups * (1 + kmax), `${groups} × (1 + ${kmax}) ints`, op);
      const { d, at } = this.gatherRanges(g.dst, g.src, g.rows, op);
      desc.set([d.addr, at, tableAt, groups, kmax, cap, rowBytes], i * 7);
    });
    return { word, desc };
  }

  /** The device address of a signal's word (the link's stage word or a word of mapped pinned memory), its value checked. */
  private signalWord(signal: HostSignal, op: string): number {
    if (!signal || !isCount(signal.address) || signal.address === 0 || signal.address % 4 !== 0) bad(`${op}: a signal needs a non-null, 4-byte aligned word address`);
    if (!(isCount(signal.value) && signal.value <= 0xffffffff)) bad(`${op}: a signal value must be an integer in [0, 2³²), got ${signal.value}`);
    const own = this.stageWord;
    const word = own !== null && own.address === signal.address ? own.device : this.deviceAddress({ address: signal.address, byteLength: 4 });
    if (word === null) bad(`${op}: the word at 0x${signal.address.toString(16)} is neither the link's stage word nor in pinned memory the device maps`);
    return word;
  }

  /** How long (ms) a device wait for a stage signal lasts before it gives up; waits that start later use it. */
  setWaitTimeout(ms: number): void {
    const link = this.live("setWaitTimeout");
    if (!(typeof ms === "number" && Number.isFinite(ms) && ms > 0 && ms <= MAX_WAIT_TIMEOUT_MS)) bad(`setWaitTimeout: ms must be a number in (0, ${MAX_WAIT_TIMEOUT_MS}], got ${ms}`);
    this.owner.ok("setWaitTimeout (a device that cannot map host memory has no signal word)", this.owner.lib.hg_link_set_timeout(link, ms));
    this.timeoutMs = ms;
  }

  get waitTimeoutMs(): number {
    return this.timeoutMs;
  }

  toHost(copies: readonly HostCopy[]): void {
    this.copy(0, copies, "toHost");
  }

  toDevice(copies: readonly HostCopy[]): void {
    this.copy(1, copies, "toDevice");
  }

  fence(): void {
    const link = this.live("fence");
    this.owner.ok("fence (a host copy)", this.owner.lib.hg_link_fence(link));
    this.stageWaitCheck(link);
  }

  /** HostTransfers.sendSignalled on the compute stream, or the side stream inside beginSide…endSide (recordable); every range is checked first. */
  sendSignalled(dst: HostRegion, src: Tensor, bytes: number): HostSignal {
    const op = "sendSignalled";
    const link = this.live(op);
    const t = this.owner.own(src, op);
    checkRegion(dst, op);
    if (!(isCount(bytes) && bytes >= 16 && bytes % 16 === 0)) bad(`${op}: bytes must be a positive multiple of 16, got ${bytes}`);
    if (bytes > t.byteLength) bad(`${op}: ${bytes} bytes exceed ${t}'s ${t.byteLength}`);
    if (bytes > dst.byteLength) bad(`${op}: ${bytes} bytes exceed the host region's ${dst.byteLength}`);
    const at = this.deviceAddress(dst);
    if (at === null) bad(`${op}: host region at 0x${dst.address.toString(16)} is not pinned memory the device maps`);
    this.owner.ok(`${op} (a device that cannot map host memory has no signal word)`, this.owner.lib.hg_link_send_signalled(link, P(t.addr), P(at), bytes, this.signalOut));
    return { address: this.signalOut[1], value: this.signalOut[0] };
  }

  /** HostTransfers.sendSignalledRows: every send checked as sendSignalled checks it, then one op (native hg_link_send_rows) and one value. */
  sendSignalledRows(sends: readonly SignalledSend[]): HostSignal {
    const op = "sendSignalledRows";
    const link = this.live(op);
    if (!Array.isArray(sends) || sends.length === 0 || sends.length > MAX_HAND_OFF_ROWS) bad(`${op}: 1 to ${MAX_HAND_OFF_ROWS} sends are needed`);
    const desc = new Float64Array(3 * sends.length);
    sends.forEach((x, i) => {
      const which = `${op}: send ${i}`;
      if (!x || typeof x !== "object") bad(`${which}: a SignalledSend is needed`);
      const t = this.owner.own(x.src, which);
      checkRegion(x.dst, which);
      const bytes = x.bytes;
      if (!(isCount(bytes) && bytes >= 16 && bytes % 16 === 0)) bad(`${which}: bytes must be a positive multiple of 16, got ${bytes}`);
      if (bytes > t.byteLength) bad(`${which}: ${bytes} bytes exceed ${t}'s ${t.byteLength}`);
      if (bytes > x.dst.byteLength) bad(`${which}: ${bytes} bytes exceed the host region's ${x.dst.byteLength}`);
      const at = this.deviceAddress(x.dst);
      if (at === null) bad(`${which}: host region at 0x${x.dst.address.toString(16)} is not pinned memory the device maps`);
      desc.set([t.addr, at, bytes], 3 * i);
    });
    this.owner.ok(`${op} (a device that cannot map host memory has no signal word)`, this.owner.lib.hg_link_send_rows(link, desc, sends.length, this.signalOut));
    return { address: this.signalOut[1], value: this.signalOut[0] };
  }

  mark(kind: "resume" | "pause"): void {
    if (kind !== "resume" && kind !== "pause") bad(`mark: kind must be resume or pause, got ${String(kind)}`);
    this.owner.ok(`mark(${kind})`, this.owner.lib.hg_link_mark(this.live("mark"), kind === "pause" ? 1 : 0));
  }

  /**
   * HostTransfers.times, and waitMs: the time the device's awaitSignal waits took (left out of gpuMs);
   * segmentMs: the compute stream's time inside recorded segments (their graphs); hostWaitMs: the
   * driving thread's time blocked at a segment's start until the device ran the one two before.
   */
  times(): { gpuMs: number; txMs: number; waitMs: number; segmentMs: number; hostWaitMs: number } {
    const link = this.live("times");
    this.owner.ok("times (an op queued earlier)", this.owner.lib.hg_link_times(link, this.timesOut));
    this.stageWaitCheck(link);
    const t = this.timesOut;
    return { gpuMs: t[0]!, txMs: t[1]!, waitMs: t[3]!, segmentMs: t[4]!, hostWaitMs: t[5]! };
  }

  /** Throws (once) when a device wait gave up since the last check; the flag is cleared, so later waits wait again. */
  private stageWaitCheck(link: Pointer): void {
    if (this.owner.lib.hg_link_gave_up(link, this.gaveUpOut) !== 1) return;
    const [value, held] = this.gaveUpOut;
    throw new HybridgenError(`the device gave up waiting for the CPU stage (signal value ${value}; the word held ${held})`, "ETIMEDOUT");
  }

  /** Pinned copy bandwidth on the copy stream (bytes/s each way), over a device block of `bytes`. */
  bandwidth(bytes = 256 * 2 ** 20, iters = 10): { h2d: number; d2h: number } {
    const link = this.live("bandwidth");
    if (!(isCount(bytes) && bytes > 0 && isCount(iters) && iters > 0)) bad(`bandwidth: bytes and iters must be positive integers`);
    const dev = this.owner.allocBytes(bytes, "bandwidth");
    try {
      const out = new Float64Array(2);
      this.owner.ok("bandwidth", this.owner.lib.hg_link_bandwidth(link, P(dev.addr), bytes, iters, out));
      return { h2d: out[0], d2h: out[1] };
    } finally {
      this.owner.release(dev);
    }
  }

  /** Unpins what is still pinned and frees the events. Idempotent. */
  close(): void {
    if (!this.link) return;
    for (const f of [...this.fetches]) f.close();
    for (const b of this.pinned) this.owner.lib.hg_host_unpin(P(b.address));
    this.pinned.length = 0;
    this.pageable.clear();
    this.owner.lib.hg_link_destroy(this.link);
    this.link = null;
    this.stageWord = null;
  }

  [Symbol.dispose](): void {
    this.close();
  }

  /** The device address of `region` when it lies inside a pinned, mapped region (else null). */
  private deviceAddress(region: HostRegion): number | null {
    const b = this.pinnedBlock(region);
    return b === null || b.device === null ? null : b.device + (region.address - b.address);
  }

  /** The pinned block `region` lies inside (else null): pinned blocks never overlap (CUDA refuses it), so only the last one starting at or below it can hold it. */
  private pinnedBlock(region: HostRegion): PinnedBlock | null {
    const b = this.pinned[this.firstAbove(region.address) - 1];
    return b !== undefined && region.address + region.byteLength <= b.address + b.bytes ? b : null;
  }

  /** The index of the first pinned block that starts above `address`. */
  private firstAbove(address: number): number {
    let lo = 0, hi = this.pinned.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.pinned[mid]!.address <= address) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  private copy(dir: 0 | 1, copies: readonly HostCopy[], op: string): void {
    const link = this.live(op);
    if (!Array.isArray(copies)) bad(`${op}: copies must be an array`);
    if (copies.length > 0x7fffffff) bad(`${op}: too many copies`);
    if (this.desc.length < copies.length * FIELDS) this.desc = new Float64Array(copies.length * FIELDS * 2);
    const d = this.desc;
    for (let i = 0; i < copies.length; i++) {
      const c = copies[i];
      const { t, hp, tp } = this.checkCopy(c, op, `copy ${i}: `);
      const host = c.host.address + c.hostOffset, dev = t.addr + c.tensorOffset;
      const o = i * FIELDS;
      d[o] = dir === 0 ? host : dev;
      d[o + 1] = dir === 0 ? dev : host;
      d[o + 2] = c.width;
      d[o + 3] = c.rows;
      d[o + 4] = dir === 0 ? hp : tp;
      d[o + 5] = dir === 0 ? tp : hp;
    }
    const rc = this.owner.lib.hg_link_copy(link, dir, d, copies.length);
    if (rc !== 0) this.owner.ok(`${op} (${this.diagnostics().firstError})`, rc);
  }

  /** One HostCopy's checks: its tensor and host region, counts, pitches and both byte ranges. */
  private checkCopy(c: HostCopy, op: string, which: string): { t: CudaTensor; hp: number; tp: number } {
    const t = this.owner.own(c.tensor, op);
    checkRegion(c.host, op);
    const rows = c.rows, width = c.width;
    if (!(isCount(rows) && isCount(width))) bad(`${op}: ${which}rows and width must be non-negative integers`);
    const hp = c.hostPitch ?? width, tp = c.tensorPitch ?? width;
    if (!(isCount(hp) && isCount(tp) && isCount(c.hostOffset) && isCount(c.tensorOffset))) bad(`${op}: ${which}offsets and pitches must be non-negative integers`);
    if (rows > 1 && (hp < width || tp < width)) bad(`${op}: ${which}pitches (${hp}, ${tp}) are smaller than the row width ${width}`);
    const span = (pitch: number) => (rows === 0 || width === 0 ? 0 : (rows - 1) * pitch + width);
    if (c.hostOffset + span(hp) > c.host.byteLength) bad(`${op}: ${which}host bytes [${c.hostOffset}, ${c.hostOffset + span(hp)}) exceed the region's ${c.host.byteLength}`);
    if (c.tensorOffset + span(tp) > t.byteLength) bad(`${op}: ${which}tensor bytes [${c.tensorOffset}, ${c.tensorOffset + span(tp)}) exceed ${t}'s ${t.byteLength}`);
    return { t, hp, tp };
  }

  /** gatherRows(At)'s ranges: the source rows inside the host region, the packed rows inside dst, the region mapped. */
  private gatherRanges(dst: Tensor, src: HostRegion, rows: RowGather, op: string): { d: CudaTensor; at: number } {
    const d = this.owner.own(dst, op);
    checkRegion(src, op);
    const { groups, cap, rowBytes, kmax } = rows;
    if (groups * cap * rowBytes > src.byteLength) bad(`${op}: ${groups} × ${cap} rows of ${rowBytes} bytes exceed the host region's ${src.byteLength}`);
    if (groups * kmax * rowBytes > d.byteLength) bad(`${op}: ${groups} × ${kmax} rows of ${rowBytes} bytes exceed ${d}'s ${d.byteLength}`);
    const at = this.deviceAddress(src);
    if (at === null) bad(`${op}: host region at 0x${src.address.toString(16)} is not pinned memory the device maps`);
    return { d, at };
  }

  /** The device address of an int32 table of at least `ints` ints in mapped host memory (checked). */
  private mappedTable(table: HostRegion, ints: number, what: string, op: string): number {
    checkRegion(table, op);
    if (table.address % 4 !== 0) bad(`${op}: the table at 0x${table.address.toString(16)} is not 4-byte aligned`);
    if (table.byteLength < ints * 4) bad(`${op}: a table of ${what} needs ${ints * 4} bytes, the region has ${table.byteLength}`);
    const at = this.deviceAddress(table);
    if (at === null) bad(`${op}: the table at 0x${table.address.toString(16)} is not pinned memory the device maps`);
    return at;
  }

  /** The first failing call of a copy since creation (with its arguments), and how many 2-D
   * copies the driver refused and that ran row by row instead. */
  diagnostics(): { firstError: string; rowwise: number } {
    const buf = new Uint8Array(256), n = new Float64Array(1);
    this.owner.lib.hg_link_error(this.live("diagnostics"), buf, buf.length, n);
    const end = buf.indexOf(0);
    return { firstError: new TextDecoder().decode(buf.subarray(0, end < 0 ? buf.length : end)), rowwise: n[0] };
  }
}

/** A pinned host block: where it starts, its bytes, and its device address where the device maps it. */
interface PinnedBlock {
  readonly address: number;
  readonly bytes: number;
  readonly device: number | null;
}

/** A fetch's checked arguments: the signal word's device address, and 7 doubles a gather (hg_fetch_rows). */
interface FetchArgs {
  word: number;
  desc: Float64Array;
}

/** HostTransfers.rowFetch's slots (native HgFetch): the side stream's gathers, and the compute stream's ready/release events. */
class CudaRowFetch implements RowFetch {
  constructor(
    private handle: Pointer | null, private readonly owner: HostLinkOwner,
    private readonly args: (signal: HostSignal, gathers: readonly RowFetchGather[], op: string) => FetchArgs, private readonly onClose: (f: CudaRowFetch) => void,
  ) {}

  private live(op: string): Pointer {
    if (!this.handle) bad(`${op}: the row fetch is closed`);
    return this.handle;
  }

  fetch(slot: 0 | 1, done: HostSignal, gathers: readonly RowFetchGather[]): void {
    const op = "rowFetch.fetch", f = this.live(op);
    checkSlot(slot, op);
    const { word, desc } = this.args(done, gathers, op);
    this.owner.ok(op, this.owner.lib.hg_fetch_rows(f, slot, P(word), done.value, desc, gathers.length));
  }

  /** RowFetch.fetchRows: every row checked as fetch() checks it, then one native call (an await and a gather launch for the batch). */
  fetchRows(slot: 0 | 1, rows: readonly RowFetchRow[]): void {
    const op = "rowFetch.fetchRows", f = this.live(op);
    checkSlot(slot, op);
    if (!Array.isArray(rows) || rows.length === 0 || rows.length > 4096) bad(`${op}: 1 to 4096 rows are needed`);
    const waits = new Float64Array(2 * rows.length), descs: Float64Array[] = [];
    rows.forEach((r, i) => {
      const { word, desc } = this.args(r.done, r.gathers, `${op}: row ${i}`);
      waits[2 * i] = word;
      waits[2 * i + 1] = r.done.value;
      descs.push(desc);
    });
    const all = new Float64Array(descs.reduce((n, d) => n + d.length, 0));
    let at = 0;
    for (const d of descs) {
      all.set(d, at);
      at += d.length;
    }
    this.owner.ok(op, this.owner.lib.hg_fetch_rows_batch(f, slot, waits, rows.length, all, all.length / 7));
  }

  ready(slot: 0 | 1): void {
    const op = "rowFetch.ready";
    checkSlot(slot, op);
    this.owner.ok(op, this.owner.lib.hg_fetch_mark(this.live(op), slot, 0));
  }

  release(slot: 0 | 1): void {
    const op = "rowFetch.release";
    checkSlot(slot, op);
    this.owner.ok(op, this.owner.lib.hg_fetch_mark(this.live(op), slot, 1));
  }

  close(): void {
    if (!this.handle) return;
    this.owner.lib.hg_fetch_destroy(this.handle);
    this.handle = null;
    this.onClose(this);
  }

  [Symbol.dispose](): void {
    this.close();
  }
}

function checkSlot(slot: number, op: string): void {
  if (slot !== 0 && slot !== 1) bad(`${op}: slot must be 0 or 1, got ${slot}`);
}

/** gatherRows(At)'s shape: positive 32-bit counts, whole 16-byte pieces, kmax ≤ cap. */
function checkGatherShape(rows: RowGather, op: string): RowGather {
  const { groups, cap, rowBytes, kmax } = rows ?? ({} as RowGather);
  if (![groups, cap, rowBytes, kmax].every((v) => isCount(v) && v > 0 && v <= INT32_MAX)) bad(`${op}: groups, cap, rowBytes and kmax must be positive 32-bit integers`);
  if (rowBytes % 16 !== 0) bad(`${op}: a row of ${rowBytes} bytes is not a whole number of 16-byte pieces`);
  if (kmax > cap) bad(`${op}: ${kmax} rows a group from a region of ${cap}`);
  if (groups * kmax > INT32_MAX) bad(`${op}: ${groups} × ${kmax} rows exceed the kernels' 32-bit index range`);
  return rows;
}

function checkRegion(r: HostRegion, op: string): void {
  if (!r || !isCount(r.address) || !isCount(r.byteLength) || (r.address === 0 && r.byteLength > 0)) {
    bad(`${op}: a host region needs a non-null address and a byte length (non-negative integers)`);
  }
}
