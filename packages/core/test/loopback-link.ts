/**
 * A stand-in for a device backend's host link on two ReferenceBackends: "device" tensors live
 * in one, "host" memory is tensors of the other or plain Float32Arrays, named by fake
 * addresses. Device → host copies take a snapshot at once but land only at fence(), as a real
 * copy stream's would be visible only after the host waits: code that reads host memory
 * without fencing sees stale data and the tests fail. f32 data only.
 */
import {
  BackendCpuStage, ReferenceBackend, type HostCopy, type HostRegion, type HostTransfers, type Tensor,
} from "../src/index.js";

type Target = { kind: "array"; data: () => Float32Array } | { kind: "tensor"; t: () => Tensor };

export class AddressBook {
  private next = 0x10000;
  private readonly targets = new Map<number, Target>();

  add(target: Target, bytes: number): HostRegion {
    const address = this.next;
    this.next += Math.ceil((bytes + 1) / 4096) * 4096;
    this.targets.set(address, target);
    return { address, byteLength: bytes };
  }

  get(region: HostRegion): Target {
    const t = this.targets.get(region.address);
    if (!t) throw new Error(`no host memory at ${region.address}`);
    return t;
  }
}

/** The host backend: a ReferenceBackend whose tensors have (fake) host regions. */
export class HostReference extends ReferenceBackend {
  private readonly regions = new Map<Tensor, HostRegion>();
  constructor(readonly book: AddressBook) {
    super();
  }
  hostRegion(t: Tensor): HostRegion {
    let r = this.regions.get(t);
    if (!r) {
      r = this.book.add({ kind: "tensor", t: () => t }, t.shape.reduce((a, b) => a * b, 1) * 4);
      this.regions.set(t, r);
    }
    return r;
  }
}

/** BackendCpuStage with host staging regions (the native stage's buffers, faked). */
export class StagedBackendCpuStage extends BackendCpuStage {
  private staging: { query: HostRegion; logits: HostRegion; values: HostRegion; keys: HostRegion | null }[] = [];
  constructor(backend: ReferenceBackend, private readonly book: AddressBook) {
    super(backend);
  }
  hostStaging(slot: 0 | 1) {
    if (!this.staging[slot]) {
      const q = this.query(slot), logits = this.output(slot).logits;
      this.staging[slot] = {
        query: this.book.add({ kind: "array", data: () => q }, q.length * 4),
        logits: this.book.add({ kind: "array", data: () => logits }, logits.length * 4),
        // the view of the last gather (its width changes with kmax); bytes: the whole store
        values: this.book.add({ kind: "tensor", t: () => this.output(slot).values }, 2 ** 30),
        keys: this.book.add({ kind: "tensor", t: () => this.output(slot).keys ?? this.output(slot).values }, 2 ** 30),
      };
    }
    return this.staging[slot];
  }
}

export class LoopbackLink implements HostTransfers {
  readonly pinned = new Set<number>();
  readonly log: string[] = [];
  private pending: (() => void)[] = [];
  private landed = 0;
  closed = false;

  constructor(private readonly device: ReferenceBackend, private readonly host: ReferenceBackend, private readonly book: AddressBook) {}

  pin(r: HostRegion): void {
    if (this.pinned.has(r.address)) throw new Error("pinned twice");
    this.pinned.add(r.address);
  }
  unpin(r: HostRegion): void {
    if (!this.pinned.delete(r.address)) throw new Error("unpin of a region not pinned");
  }

  toHost(copies: readonly HostCopy[]): void {
    this.log.push(`toHost ${copies.length}`);
    for (const c of copies) {
      const rows = this.rows(c, c.tensorPitch, (off, n) => this.device.read(c.tensor, off, n));
      this.pending.push(() => this.put(c.host, c.hostOffset, c.hostPitch, rows));
    }
  }

  toDevice(copies: readonly HostCopy[]): void {
    this.log.push(`toDevice ${copies.length}`);
    for (const c of copies) {
      const src = this.book.get(c.host);
      const rows: Float32Array[] = [];
      for (let r = 0; r < c.rows; r++) {
        const off = (c.hostOffset + r * (c.hostPitch ?? c.width)) / 4, n = c.width / 4;
        rows.push(src.kind === "array" ? src.data().slice(off, off + n) : this.host.read(src.t(), off, n));
      }
      rows.forEach((row, r) => this.device.write(c.tensor, row, (c.tensorOffset + r * (c.tensorPitch ?? c.width)) / 4));
    }
  }

  fence(): void {
    for (const f of this.pending) f();
    this.landed += this.pending.length;
    this.pending = [];
  }

  /** Device → host copies issued so far, landed or not. */
  protected get issued(): number {
    return this.landed + this.pending.length;
  }

  /** Lands the copies issued before the `through`-th (a signal after them was reached). */
  protected landThrough(through: number): void {
    while (this.landed < through && this.pending.length > 0) {
      this.pending.shift()!();
      this.landed++;
    }
  }

  mark(): void {}

  times() {
    return { gpuMs: 1, txMs: 0.5 };
  }

  close(): void {
    this.closed = true;
  }

  [Symbol.dispose](): void {
    this.close();
  }

  private rows(c: HostCopy, pitch: number | undefined, read: (off: number, n: number) => Float32Array): Float32Array[] {
    const out: Float32Array[] = [];
    for (let r = 0; r < c.rows; r++) out.push(read((c.tensorOffset + r * (pitch ?? c.width)) / 4, c.width / 4));
    return out;
  }

  private put(region: HostRegion, offset: number, pitch: number | undefined, rows: Float32Array[]): void {
    const dst = this.book.get(region);
    rows.forEach((row, r) => {
      const off = (offset + r * (pitch ?? row.length * 4)) / 4;
      if (dst.kind === "array") dst.data().set(row, off);
      else this.host.write(dst.t(), row, off);
    });
  }
}
