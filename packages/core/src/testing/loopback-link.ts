/**
 * A stand-in for a device backend's host link on two ReferenceBackends: "device" tensors live
 * in one, "host" memory is tensors of the other or plain Float32Arrays, named by fake
 * addresses. Device → host copies take a snapshot at once but land only at fence(), as a real
 * copy stream's would be visible only after the host waits: code that reads host memory
 * without fencing sees stale data and the tests fail. f32 data only.
 */
import { NO_HOST_CAPABILITIES, type CpuStageJob, type HostCopy, type HostRegion, type HostSignal, type HostTransferCapabilities, type HostTransfers, type SignalledSend, type Tensor } from "@hybridgen/spec";
import { BackendCpuStage, ReferenceBackend } from "@hybridgen/spec/kit";

type Target = { kind: "array"; data: () => Float32Array } | { kind: "tensor"; t: () => Tensor } | { kind: "ints"; data: () => Int32Array };

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
      const q = this.queryBuffer(slot), logits = this.output(slot).logits;
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
  closed = false;

  constructor(protected readonly device: ReferenceBackend, protected readonly host: ReferenceBackend, protected readonly book: AddressBook) {}

  /** The copies alone; each subclass names what it adds. */
  get capabilities(): HostTransferCapabilities {
    return NO_HOST_CAPABILITIES;
  }

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
    for (const c of copies) this.copyUp(c);
  }

  /** One host → device copy, now. */
  protected copyUp(c: HostCopy): void {
    const src = this.book.get(c.host);
    if (src.kind === "ints") throw new Error("the stand-in copies f32 data only");
    const rows: Float32Array[] = [];
    for (let r = 0; r < c.rows; r++) {
      const off = (c.hostOffset + r * (c.hostPitch ?? c.width)) / 4, n = c.width / 4;
      rows.push(src.kind === "array" ? src.data().slice(off, off + n) : this.host.read(src.t(), off, n));
    }
    rows.forEach((row, r) => this.device.write(c.tensor, row, (c.tensorOffset + r * (c.tensorPitch ?? c.width)) / 4));
  }

  fence(): void {
    for (const f of this.pending) f();
    this.pending = [];
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
    if (dst.kind === "ints") throw new Error("the stand-in copies f32 data only");
    rows.forEach((row, r) => {
      const off = (offset + r * (pitch ?? row.length * 4)) / 4;
      if (dst.kind === "array") dst.data().set(row, off);
      else this.host.write(dst.t(), row, off);
    });
  }
}

/**
 * The loopback link with signalled sends (HostTransfers.sendSignalled) when `signals`: a send
 * runs as a device op (through `schedule`, e.g. deferred to the end of a recorded segment) and
 * its bytes land in host memory only when a stage waits for its signal — as late as a device
 * may deliver them. A signal waited for before its send ran would hang on a device: it throws.
 */
export class SignallingLink extends LoopbackLink {
  private readonly sends: { write: (() => void) | null }[] = [];
  private landed = 0;
  constructor(private readonly dev: ReferenceBackend, host: ReferenceBackend, private readonly addresses: AddressBook,
    private readonly signals: boolean, protected readonly schedule: (op: () => void) => void = (op) => op()) {
    super(dev, host, addresses);
  }
  override get capabilities(): HostTransferCapabilities {
    return { ...NO_HOST_CAPABILITIES, signalledSend: true };
  }
  /** Only the signalled path asks (for the stage's query buffers): true when sends are on. */
  mapped(): boolean {
    return this.signals;
  }
  sendSignalled(dst: HostRegion, src: Tensor, bytes: number): HostSignal {
    const target = this.addresses.get(dst), send: { write: (() => void) | null } = { write: null };
    if (target.kind !== "array") throw new Error("the stand-in sends to staging arrays only");
    this.sends.push(send);
    this.schedule(() => {
      const row = this.dev.read(src, 0, bytes / 4);
      send.write = () => target.data().set(row);
    });
    return { address: 64, value: this.sends.length };
  }
  /** The sends as one device op with one signal: every row lands when a stage waits for it. */
  sendSignalledRows(sends: readonly SignalledSend[]): HostSignal {
    const targets = sends.map((x) => {
      const t = this.addresses.get(x.dst);
      if (t.kind !== "array") throw new Error("the stand-in sends to staging arrays only");
      return t;
    });
    const send: { write: (() => void) | null } = { write: null };
    this.sends.push(send);
    this.schedule(() => {
      const rows = sends.map((x) => this.dev.read(x.src, 0, x.bytes / 4));
      send.write = () => rows.forEach((r, i) => targets[i]!.data().set(r));
    });
    return { address: 64, value: this.sends.length };
  }
  /** Whether the send of signal `value` has run on the device (a stage waiting for it would go on). */
  sent(value: number): boolean {
    return this.sends[value - 1]?.write != null;
  }
  /** A stage waits for signal `value`: the sends up to it land. */
  land(value: number): void {
    for (; this.landed < value; this.landed++) {
      const write = this.sends[this.landed]!.write;
      if (!write) throw new Error(`signal ${this.landed + 1} was waited for before its send ran: the stage would wait forever`);
      write();
    }
  }
}

/** A staged stage that waits for signals: a job with `ready` runs at wait(), once its signal has landed. */
export class WaitingStage extends StagedBackendCpuStage {
  readonly waitsForSignal = true;
  signalledJobs = 0;
  private held: CpuStageJob | null = null;
  constructor(backend: ReferenceBackend, book: AddressBook, private readonly link: SignallingLink) {
    super(backend, book);
  }
  override submit(job: CpuStageJob): void {
    if (!job.ready) return super.submit(job);
    this.signalledJobs++;
    this.held = job;
  }
  override wait(): number {
    const job = this.held;
    if (job) {
      this.held = null;
      this.link.land(job.ready!.value);
      super.submit({ ...job, ready: undefined });
    }
    return super.wait();
  }
}
