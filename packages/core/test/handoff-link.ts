/**
 * Stand-ins for the stage hand-off on the device (HostTransfers' awaitSignal … padColumnsAt and a
 * CpuStage with a queue): the link's device ops run when the device would (now, or at the end of a
 * recorded segment) and read the stage's output at that moment; a stage raises a job's done by
 * writing its value into the signal's word, and the device goes on once the word has reached the
 * value it waits for. A stage runs a queued job only when the device waits for its done signal (or
 * at wait()), as late as a real one may, unless it is eager (as early as a real one may: at submit,
 * once its query has been sent). So a missing wait, a job queued out of order, a slot rewritten
 * before the device read it, or a word that another stage's job raises changes the logits or throws.
 */
import type { CpuStageJob, CpuStageOutput, HostCopy, HostRegion, HostSignal, ReferenceBackend, RowGather, Tensor } from "../src/index.js";
import { type AddressBook, StagedBackendCpuStage } from "./loopback-link.js";
import { CheckedLink, type Recorder } from "./recorder.js";

/** The checked loopback link with signalled sends, device row gathers and the hand-off ops. */
export class HandoffLink extends CheckedLink {
  /** The stages whose jobs the device may wait for (each QueuedStage joins at construction). */
  readonly stages: QueuedStage[] = [];
  awaited = 0;
  /** The signal words in host memory: address → the value last written there. */
  private readonly words = new Map<number, number>();
  constructor(device: ReferenceBackend, host: ReferenceBackend, book: AddressBook, rec: Recorder | null) {
    super(device, host, book, rec, true);
  }
  gatherRows(dst: Tensor, src: HostRegion, g: RowGather, ids: Int32Array, counts: Int32Array): void {
    const i = ids.slice(), c = counts.slice(); // read during the call
    this.schedule(() => this.gather(dst, src, g, i, c));
  }
  /** The device polls the word until it reaches the value (modulo 2³²); a job still queued for it runs now. */
  awaitSignal(signal: HostSignal): void {
    this.schedule(() => {
      this.awaited++;
      if (!this.reached(signal)) for (const s of this.stages) s.runFor(signal);
      if (!this.reached(signal)) throw new Error(`the device waits for value ${signal.value} at 0x${signal.address.toString(16)}, which no queued job raises: it would hang`);
    });
  }
  /** A stage raises a job's done: the value goes into the word, whatever it held. */
  raise(signal: HostSignal): void {
    this.words.set(signal.address, signal.value);
  }
  private reached(signal: HostSignal): boolean {
    return (((this.words.get(signal.address) ?? 0) - signal.value) | 0) >= 0;
  }
  readMapped(copy: HostCopy): void {
    this.schedule(() => this.copyUp(copy));
  }
  gatherRowsAt(dst: Tensor, src: HostRegion, g: RowGather, table: HostRegion): void {
    this.schedule(() => {
      const t = this.ints(table);
      this.gather(dst, src, g, t.subarray(g.groups), t.subarray(0, g.groups));
    });
  }
  padColumnsAt(scores: Tensor, col: number, kmax: number, group: number, table: HostRegion): void {
    this.schedule(() => {
      const t = this.ints(table), width = scores.shape[1]!;
      for (let h = 0; h < scores.shape[0]!; h++) {
        const n = Math.max(0, Math.min(kmax, t[Math.floor(h / group)]!));
        if (n < kmax) this.device.write(scores, new Float32Array(kmax - n).fill(-Infinity), h * width + col + n);
      }
    });
  }

  private ints(region: HostRegion): Int32Array {
    const t = this.book.get(region);
    if (t.kind !== "ints") throw new Error("a table that is not int32 host memory");
    return t.data();
  }

  /** dst[g, i] = src[g, ids[g · kmax + i]] for i < counts[g], zero rows after (f32 rows). */
  private gather(dst: Tensor, src: HostRegion, g: RowGather, ids: Int32Array, counts: Int32Array): void {
    const t = this.book.get(src);
    if (t.kind !== "tensor") throw new Error("a row gather from memory that is not a host tensor");
    const n = g.rowBytes / 4;
    for (let h = 0; h < g.groups; h++) {
      for (let i = 0; i < g.kmax; i++) {
        const id = i < counts[h]! ? ids[h * g.kmax + i]! : -1;
        const row = id >= 0 && id < g.cap ? this.host.read(t.t(), (h * g.cap + id) * n, n) : new Float32Array(n);
        this.device.write(dst, row, (h * g.kmax + i) * n);
      }
    }
  }
}

export interface QueuedStageOptions {
  /** Jobs submit() takes before a wait() (64 by default). */
  readonly depth?: number;
  /** Every job's last KV head comes out one short (TrimmingStage's lists). */
  readonly trim?: boolean;
  /** Runs a job as soon as it may (its query sent and the jobs before it run), not when the device waits for it. */
  readonly eager?: boolean;
  /** The job at this index (from 0, in the order the jobs run) fails: its done is raised, the jobs after it
   * until the next wait() are skipped (their done raised too), and that wait() throws. */
  readonly failAt?: number;
}

/**
 * A staged stage with a queue: submit() only queues; a job runs when the device waits for its done
 * signal (HandoffLink.awaitSignal), after its query lands, or at wait(); an eager stage runs it at
 * submit once its query has been sent. A job without a done signal (a step not handed off) runs alone, at wait().
 */
export class QueuedStage extends StagedBackendCpuStage {
  readonly waitsForSignal = true;
  readonly queueDepth: number;
  /** The most jobs queued at once, and wait() calls. */
  mostQueued = 0;
  waits = 0;
  private queue: CpuStageJob[] = [];
  private busy = 0;
  private started = 0;
  private failure: Error | null = null;
  private tables: HostRegion[] = [];
  constructor(backend: ReferenceBackend, private readonly addresses: AddressBook, private readonly link: HandoffLink, private readonly o: QueuedStageOptions = {}) {
    super(backend, addresses);
    this.queueDepth = o.depth ?? 64;
    link.stages.push(this);
  }
  override hostStaging(slot: 0 | 1) {
    const base = super.hostStaging(slot);
    if (!this.tables[slot]) {
      this.tables[slot] = this.addresses.add({
        kind: "ints",
        data: () => {
          const o = this.output(slot), kv = o.counts.length, t = new Int32Array(kv + o.ids.length);
          t.set(o.counts);
          t.set(o.ids, kv);
          return t;
        },
      }, 2 ** 20);
    }
    return { ...base, table: this.tables[slot]! };
  }
  override submit(job: CpuStageJob): void {
    if (!job.done && this.queue.length > 0) throw new Error("a job without a done signal queued behind another");
    if (this.queue.length >= this.queueDepth) throw new Error("the queue is full");
    this.queue.push(job);
    this.mostQueued = Math.max(this.mostQueued, this.queue.length);
    while (this.o.eager && this.queue.length > 0 && this.queue[0]!.done && (!this.queue[0]!.ready || this.link.sent(this.queue[0]!.ready.value))) this.runNext();
  }
  /** The device waits for `signal`: when one of this stage's queued jobs raises it, the jobs up to it run, in order. */
  runFor(signal: HostSignal): void {
    const i = this.queue.findIndex((j) => j.done?.address === signal.address && j.done.value === signal.value);
    for (let n = 0; n <= i; n++) this.runNext();
  }
  override wait(): number {
    this.waits++;
    while (this.queue.length > 0) this.runNext();
    const failure = this.failure, busy = this.busy;
    this.failure = null;
    this.busy = 0;
    if (failure) throw failure;
    return busy;
  }
  cancel(): void {
    for (const job of this.queue) if (job.done) this.link.raise(job.done);
    this.queue = [];
  }
  private runNext(): void {
    const job = this.queue.shift()!, n = this.started++;
    if (job.ready) this.link.land(job.ready.value);
    if (n === this.o.failAt) this.failure = new Error(`stage job ${n} failed`);
    if (!this.failure) {
      super.submit({ ...job, ready: undefined, done: undefined });
      this.busy += super.wait();
      if (this.o.trim) trimLastKvHead(this.output(job.slot), job.kmax);
    }
    if (job.done) this.link.raise(job.done);
  }
}

/** A stage whose last KV head's lists come out one short (padded as the contract says), as a kernel may leave them. */
export class TrimmingStage extends StagedBackendCpuStage {
  override submit(job: CpuStageJob): void {
    super.submit(job);
    trimLastKvHead(this.output(job.slot), job.kmax);
  }
}

/** Drops the last id of the last KV head's list: its count one less, its id 0, its logits −∞. */
function trimLastKvHead(o: CpuStageOutput, kmax: number): void {
  const kv = o.counts.length, g = kv - 1, n = o.counts[g]!, group = o.logits.length / o.ids.length; // buffers [heads, cap] and [kvHeads, cap]
  if (n < 2) return;
  o.counts[g] = n - 1;
  o.ids[g * kmax + n - 1] = 0;
  for (let h = g * group; h < (g + 1) * group; h++) o.logits[h * kmax + n - 1] = -Infinity;
}
