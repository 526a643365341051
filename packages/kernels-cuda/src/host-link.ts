/**
 * CudaHostLink: core's HostTransfers on native/host_copy.cu — page-locked host regions (mapped
 * into the device's address space where the device allows), 2-D copies on the backend's copy
 * stream ordered against the compute stream by events, the event timeline that gives the hybrid
 * scheduler T_gpu and T_tx, and rows gathered by the device straight from mapped regions
 * (native/host_gather.cu). Every host and device range is checked here before an address reaches C.
 */
import type { Pointer } from "bun:ffi";
import { HybridgenError, type HostCopy, type HostRegion, type HostSignal, type HostTransfers, type RowGather, type Tensor } from "@hybridgen/core";
import { MAX_HOST_INTS, type CudaNative } from "./native-backend.js";
import type { CudaTensor } from "./cuda-tensor.js";

const P = (address: number) => address as Pointer;
const FIELDS = 6; // dst, src, width, rows, dst pitch, src pitch (native hg_link_copy)

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
  private link: Pointer | null;
  private readonly pinned = new Map<number, number>(); // address → bytes
  private readonly deviceAt = new Map<number, number>(); // pinned address → its device address (mapped regions)
  private readonly pageable = new Set<number>(); // pin() found their pages pinned already
  private desc = new Float64Array(FIELDS * 64);
  private readonly timesOut = new Float64Array(3);
  private readonly signalOut = new Float64Array(2);

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
    if (this.pinned.has(region.address) || this.pageable.has(region.address)) bad(`pin: host region at 0x${region.address.toString(16)} is already pinned`);
    if (region.byteLength === 0) return;
    const rc = this.owner.lib.hg_host_pin(P(region.address), region.byteLength);
    if (rc === -1) {
      this.pageable.add(region.address); // not a page-owning block (see hg_host_pin): copies stay correct, synchronous
      return;
    }
    this.owner.ok("pin (cudaHostRegister)", rc);
    this.pinned.set(region.address, region.byteLength);
    const at = new Float64Array(1);
    if (this.owner.lib.hg_host_device_ptr(P(region.address), at) === 0 && at[0] > 0) this.deviceAt.set(region.address, at[0]);
  }

  unpin(region: HostRegion): void {
    if (!this.link) return; // close() unpinned everything
    checkRegion(region, "unpin");
    if (region.byteLength === 0) return;
    if (this.pageable.delete(region.address)) return;
    if (!this.pinned.delete(region.address)) bad(`unpin: host region at 0x${region.address.toString(16)} is not pinned`);
    this.deviceAt.delete(region.address);
    this.owner.ok("unpin (cudaHostUnregister)", this.owner.lib.hg_host_unpin(P(region.address)));
  }

  /** Regions pinned, and regions pin() left pageable (smaller than 2 MiB or not page-aligned). */
  pinCounts(): { pinned: number; pageable: number } {
    return { pinned: this.pinned.size, pageable: this.pageable.size };
  }

  /** Whether `region` lies inside a pinned region (copies from pageable memory would be synchronous). */
  isPinned(region: HostRegion): boolean {
    for (const [a, n] of this.pinned) if (region.address >= a && region.address + region.byteLength <= a + n) return true;
    return false;
  }

  /** HostTransfers.mapped: `region` lies inside a pinned region the device maps. */
  mapped(region: HostRegion): boolean {
    return this.deviceAddress(region) !== null;
  }

  /** HostTransfers.gatherRows on the compute stream (recordable); every range is checked first. */
  gatherRows(dst: Tensor, src: HostRegion, rows: RowGather, ids: Int32Array, counts: Int32Array): void {
    const op = "gatherRows";
    this.live(op);
    const d = this.owner.own(dst, op);
    checkRegion(src, op);
    const { groups, cap, rowBytes, kmax } = rows;
    if (![groups, cap, rowBytes, kmax].every((v) => isCount(v) && v > 0 && v <= 0x7fffffff)) bad(`${op}: groups, cap, rowBytes and kmax must be positive 32-bit integers`);
    if (rowBytes % 16 !== 0) bad(`${op}: a row of ${rowBytes} bytes is not a whole number of 16-byte pieces`);
    if (kmax > cap) bad(`${op}: ${kmax} rows a group from a region of ${cap}`);
    if (!(ids instanceof Int32Array) || ids.length < groups * kmax) bad(`${op}: ids must be an Int32Array of at least ${groups} × ${kmax}`);
    if (!(counts instanceof Int32Array) || counts.length < groups) bad(`${op}: counts must be an Int32Array of at least ${groups}`);
    if (groups * (kmax + 1) > MAX_HOST_INTS) bad(`${op}: ${groups} × ${kmax} ids exceed the backend's limit of ${MAX_HOST_INTS} in one call`);
    if (groups * cap * rowBytes > src.byteLength) bad(`${op}: ${groups} × ${cap} rows of ${rowBytes} bytes exceed the host region's ${src.byteLength}`);
    if (groups * kmax * rowBytes > d.byteLength) bad(`${op}: ${groups} × ${kmax} rows of ${rowBytes} bytes exceed ${d}'s ${d.byteLength}`);
    const at = this.deviceAddress(src);
    if (at === null) bad(`${op}: host region at 0x${src.address.toString(16)} is not pinned memory the device maps`);
    this.owner.ok(op, this.owner.lib.hg_cu_gather_rows(this.owner.ctx, P(d.addr), P(at), counts, ids, groups, kmax, cap, rowBytes));
  }

  toHost(copies: readonly HostCopy[]): void {
    this.copy(0, copies, "toHost");
  }

  toDevice(copies: readonly HostCopy[]): void {
    this.copy(1, copies, "toDevice");
  }

  fence(): void {
    this.owner.ok("fence (a host copy)", this.owner.lib.hg_link_fence(this.live("fence")));
  }

  /** HostTransfers.sendSignalled on the compute stream (recordable); every range is checked first. */
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

  mark(kind: "resume" | "pause"): void {
    if (kind !== "resume" && kind !== "pause") bad(`mark: kind must be resume or pause, got ${String(kind)}`);
    this.owner.ok(`mark(${kind})`, this.owner.lib.hg_link_mark(this.live("mark"), kind === "pause" ? 1 : 0));
  }

  times(): { gpuMs: number; txMs: number } {
    this.owner.ok("times (an op queued earlier)", this.owner.lib.hg_link_times(this.live("times"), this.timesOut));
    return { gpuMs: this.timesOut[0], txMs: this.timesOut[1] };
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
    for (const a of this.pinned.keys()) this.owner.lib.hg_host_unpin(P(a));
    this.pinned.clear();
    this.deviceAt.clear();
    this.pageable.clear();
    this.owner.lib.hg_link_destroy(this.link);
    this.link = null;
  }

  [Symbol.dispose](): void {
    this.close();
  }

  /** The device address of `region` when it lies inside a pinned, mapped region (else null). */
  private deviceAddress(region: HostRegion): number | null {
    for (const [a, n] of this.pinned) {
      if (region.address >= a && region.address + region.byteLength <= a + n) {
        const d = this.deviceAt.get(a);
        return d === undefined ? null : d + (region.address - a);
      }
    }
    return null;
  }

  private copy(dir: 0 | 1, copies: readonly HostCopy[], op: string): void {
    const link = this.live(op);
    if (!Array.isArray(copies)) bad(`${op}: copies must be an array`);
    if (copies.length > 0x7fffffff) bad(`${op}: too many copies`);
    if (this.desc.length < copies.length * FIELDS) this.desc = new Float64Array(copies.length * FIELDS * 2);
    const d = this.desc;
    for (let i = 0; i < copies.length; i++) {
      const c = copies[i];
      const t = this.owner.own(c.tensor, op);
      checkRegion(c.host, op);
      const rows = c.rows, width = c.width;
      if (!(isCount(rows) && isCount(width))) bad(`${op}: copy ${i}: rows and width must be non-negative integers`);
      const hp = c.hostPitch ?? width, tp = c.tensorPitch ?? width;
      if (!(isCount(hp) && isCount(tp) && isCount(c.hostOffset) && isCount(c.tensorOffset))) bad(`${op}: copy ${i}: offsets and pitches must be non-negative integers`);
      if (rows > 1 && (hp < width || tp < width)) bad(`${op}: copy ${i}: pitches (${hp}, ${tp}) are smaller than the row width ${width}`);
      const span = (pitch: number) => (rows === 0 || width === 0 ? 0 : (rows - 1) * pitch + width);
      if (c.hostOffset + span(hp) > c.host.byteLength) bad(`${op}: copy ${i}: host bytes [${c.hostOffset}, ${c.hostOffset + span(hp)}) exceed the region's ${c.host.byteLength}`);
      if (c.tensorOffset + span(tp) > t.byteLength) bad(`${op}: copy ${i}: tensor bytes [${c.tensorOffset}, ${c.tensorOffset + span(tp)}) exceed ${t}'s ${t.byteLength}`);
      const host = c.host.address + c.hostOffset, dev = t.addr + c.tensorOffset;
      const o = i * FIELDS;
      d[o] = dir === 0 ? host : dev;
      d[o + 1] = dir === 0 ? dev : host;
      d[o + 2] = width;
      d[o + 3] = rows;
      d[o + 4] = dir === 0 ? hp : tp;
      d[o + 5] = dir === 0 ? tp : hp;
    }
    const rc = this.owner.lib.hg_link_copy(link, dir, d, copies.length);
    if (rc !== 0) this.owner.ok(`${op} (${this.diagnostics().firstError})`, rc);
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

function checkRegion(r: HostRegion, op: string): void {
  if (!r || !isCount(r.address) || !isCount(r.byteLength) || (r.address === 0 && r.byteLength > 0)) {
    bad(`${op}: a host region needs a non-null address and a byte length (non-negative integers)`);
  }
}
