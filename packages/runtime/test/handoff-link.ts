/**
 * Stand-ins for the stage hand-off on the device (HostTransfers' awaitSignal … padColumnsAt and a
 * CpuStage with a queue): the link's device ops run when the device would (now, or at the end of a
 * recorded segment) and read the stage's output at that moment; a stage raises a job's done by
 * writing its value into the signal's word, and the device goes on once the word has reached the
 * value it waits for. A stage runs a queued job only when the device waits for its done signal (or
 * at wait()), as late as a real one may, unless it is eager (as early as a real one may: at submit,
 * once its query has been sent). So a missing wait, a job queued out of order, a slot rewritten
 * before the device read it, or a word that another stage's job raises changes the logits or throws.
 * With the rowFetch option the link also fetches rows ahead on a side stream (StandInRowFetch).
 */
import type { CpuStageJob, CpuStageOutput, HandOffRow, KeepRow, RescoreRow, SignalledSend, HostCopy, HostRegion, HostSignal, HostTransferCapabilities, ReferenceBackend, RowFetch, RowFetchGather, RowFetchRow, RowGather, Tensor } from "@hybridgen/core";
import { keptColumns } from "@hybridgen/spec";
import { type AddressBook, StagedBackendCpuStage } from "@hybridgen/core/testing";
import { CheckedLink, type Recorder } from "./recorder.js";

export interface HandoffLinkOptions {
  /** Offer HostTransfers.rowFetch (a StandInRowFetch per call); off by default, so the layer gathers on the compute stream. */
  readonly rowFetch?: boolean;
}

/** The checked loopback link with signalled sends, device row gathers and the hand-off ops (and rowFetch, with the option). */
export class HandoffLink extends CheckedLink {
  /** The stages whose jobs the device may wait for (each QueuedStage joins at construction). */
  readonly stages: QueuedStage[] = [];
  /** Every RowFetch rowFetch() handed out, in order. */
  readonly rowFetches: StandInRowFetch[] = [];
  awaited = 0;
  /** Only with the rowFetch option (and so in capabilities). */
  rowFetch?: () => RowFetch;
  /** The signal words in host memory: address → the value last written there. */
  private readonly words = new Map<number, number>();
  constructor(device: ReferenceBackend, host: ReferenceBackend, book: AddressBook, rec: Recorder | null, options: HandoffLinkOptions = {}) {
    super(device, host, book, rec, true);
    if (options.rowFetch) {
      this.rowFetch = () => {
        const f = new StandInRowFetch(this, (op) => this.schedule(op));
        this.rowFetches.push(f);
        return f;
      };
    }
  }
  override get capabilities(): HostTransferCapabilities {
    return { signalledSend: true, gathersRows: true, handOff: true, rowFetch: this.rowFetch !== undefined, bandwidth: false, keepRows: true };
  }
  /** fetch() calls and ready() ops run, over every RowFetch handed out. */
  get fetches(): number {
    return this.rowFetches.reduce((n, f) => n + f.fetches, 0);
  }
  get readies(): number {
    return this.rowFetches.reduce((n, f) => n + f.readies, 0);
  }
  /** A query sent may let a side-stream fetch's job run: the fetches go on right after the send, in device order. */
  override sendSignalled(dst: HostRegion, src: Tensor, bytes: number): HostSignal {
    const signal = super.sendSignalled(dst, src, bytes);
    if (this.rowFetches.length > 0) this.schedule(() => this.pumpFetches());
    return signal;
  }
  override sendSignalledRows(sends: readonly SignalledSend[]): HostSignal {
    const signal = super.sendSignalledRows(sends);
    if (this.rowFetches.length > 0) this.schedule(() => this.pumpFetches());
    return signal;
  }
  override close(): void {
    for (const f of this.rowFetches) f.close();
    super.close();
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
  /** A stage raises a job's done: the value goes into the word, whatever it held; a side-stream fetch waiting for it runs now. */
  raise(signal: HostSignal): void {
    this.words.set(signal.address, signal.value);
    this.pumpFetches();
  }
  reached(signal: HostSignal): boolean {
    return (((this.words.get(signal.address) ?? 0) - signal.value) | 0) >= 0;
  }
  readMapped(copy: HostCopy): void {
    this.schedule(() => this.copyUp(copy));
  }
  gatherRowsAt(dst: Tensor, src: HostRegion, g: RowGather, table: HostRegion): void {
    this.schedule(() => this.gatherAt(dst, src, g, table));
  }
  /** gatherRowsAt's work, now: the ids and counts as the table holds them at this moment. */
  gatherAt(dst: Tensor, src: HostRegion, g: RowGather, table: HostRegion): void {
    const t = this.ints(table);
    this.gather(dst, src, g, t.subarray(g.groups), t.subarray(0, g.groups));
  }
  /** handOffRows calls (each a layer of a batched step). */
  handOffCalls = 0;
  /** Every row's wait (each counted in awaited), then every row's read and gathers, in device order. */
  handOffRows(rows: readonly HandOffRow[]): void {
    this.handOffCalls++;
    for (const r of rows) this.awaitSignal(r.done);
    for (const r of rows) {
      if (r.logits) this.readMapped(r.logits);
      for (const g of r.gathers) this.gatherRowsAt(g.dst, g.src, g.rows, g.table);
    }
  }
  /** rescoreRows calls (each a layer of a batched step's verified rows). */
  rescoreCalls = 0;
  /** Each row's attnLogits on the device, then its padColumnsAt, in device order. */
  rescoreRows(rows: readonly RescoreRow[]): void {
    this.rescoreCalls++;
    for (const r of rows) {
      const heads = r.scores.shape[0]!, group = heads / r.keys.shape[0]!;
      this.schedule(() => this.device.attnLogits(r.scores, r.col, r.q, 0, r.keys, 0, r.kmax, r.scale));
      this.padColumnsAt(r.scores, r.col, r.kmax, group, r.table);
    }
  }
  /** keepRows calls (a layer's, of a batched step or of one sequence). */
  keepCalls = 0;
  /** Each row's kept candidates (keptColumns, from its scores and table as they are when the op runs): the rest's logits −∞, the kept V rows gathered, zero rows elsewhere. */
  keepRows(rows: readonly KeepRow[]): void {
    this.keepCalls++;
    for (const r of rows) {
      this.schedule(() => {
        const t = this.ints(r.table), { groups, kmax } = r.rows, width = r.scores.shape[1]!, heads = r.scores.shape[0]!;
        const scores = this.device.read(r.scores, 0, heads * width), counts = t.subarray(0, groups), ids = t.subarray(groups);
        const kept = keptColumns(scores, width, r.col, r.group, kmax, counts, r.keep);
        for (let h = 0; h < heads; h++) {
          const g = Math.floor(h / r.group);
          for (let j = 0; j < kmax; j++) if (!kept[g * kmax + j]) scores[h * width + r.col + j] = -Infinity;
        }
        this.device.write(r.scores, scores, 0);
        const keptIds = ids.map((id, i) => (kept[i] ? id : -1)), all = new Int32Array(groups).fill(kmax);
        this.gather(r.values, r.src, r.rows, keptIds, all);
      });
    }
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

  /** The link's one side stream: every RowFetch's fetches, in call order (as the native link's stream). */
  readonly sideStream: QueuedFetch[] = [];
  private pumping = false;

  /** Runs the side stream's fetches, in order, while the first one's done is reached (or a queued job can raise it now). */
  pumpFetches(): void {
    if (this.pumping) return;
    this.pumping = true;
    try {
      while (this.sideStream.length > 0) {
        const f = this.sideStream[0]!;
        if (!this.reached(f.done)) for (const st of this.stages) if (st.canRunFor(f.done)) st.runFor(f.done);
        if (!this.reached(f.done)) return;
        this.sideStream.shift();
        for (const g of f.gathers) this.gatherAt(g.dst, g.src, g.rows, g.table);
        f.ran();
      }
    } finally {
      this.pumping = false;
    }
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

/** One slot of a StandInRowFetch, counted in issue order (calls) and device order (ops run). */
interface FetchSlot {
  fetchesCalled: number;
  /** The fetches whose gathers have run (the side stream runs them in call order). */
  fetchesRun: number;
  /** The fetch the last ready() run took (0: none yet). */
  taken: number;
  readiesIssued: number;
  readiesRun: number;
  /** fetchesCalled when the ready still waiting to launch was issued. */
  readyIssuedAt: number;
  releasesIssued: number;
  releasesRun: number;
  /** A ready() has run and no release() since: the compute stream reads the slot's rows. */
  held: boolean;
}

interface QueuedFetch {
  readonly slot: 0 | 1;
  readonly owner: StandInRowFetch;
  /** Marks it run in its RowFetch's slot. */
  readonly ran: () => void;
  /** Its number among the slot's fetches (from 1). */
  readonly n: number;
  readonly done: HostSignal;
  readonly gathers: readonly RowFetchGather[];
}

/**
 * RowFetch on the HandoffLink: fetch() joins the link's one side stream (never recorded, shared by
 * every RowFetch of the link, as the native link's), whose fetches run in call order, each as soon
 * as it may — its done reached (a queued job raising it runs for it, as for awaitSignal, once its
 * query was sent) — gathering from the table and host rows as they are then;
 * ready() and release() are device ops (now, or at the end of a recorded segment). A fetch waits
 * only for the releases launched before it, so one issued while the slot is still in use (a ready
 * run, or a release recorded but not launched) would refill rows the compute stream reads: it
 * throws. A ready whose fetch cannot have run (a done no job raises) would hang, and a ready with
 * no fresh fetch waits for nothing: both throw.
 */
export class StandInRowFetch implements RowFetch {
  fetches = 0;
  readies = 0;
  releases = 0;
  /** Fetches whose rows no ready() took before the slot's next fetch (a step that failed part way). */
  superseded = 0;
  closed = false;
  private readonly slots: FetchSlot[] = [0, 1].map(() => ({
    fetchesCalled: 0, fetchesRun: 0, taken: 0, readiesIssued: 0, readiesRun: 0, readyIssuedAt: 0, releasesIssued: 0, releasesRun: 0, held: false,
  }));

  constructor(private readonly link: HandoffLink, private readonly schedule: (op: () => void) => void) {}

  fetch(slot: 0 | 1, done: HostSignal, gathers: readonly RowFetchGather[]): void {
    this.fetchRows(slot, [{ done, gathers }]);
  }

  /** Every row's done, then every row's gathers, as one fetch of the slot (its rows' entries run in order on the side stream; the last one marks it run). */
  fetchRows(slot: 0 | 1, rows: readonly RowFetchRow[]): void {
    this.check("fetch");
    if (rows.length === 0) throw new Error(`fetchRows(${slot}) of no rows`);
    const s = this.slots[slot]!;
    if (s.releasesIssued > s.releasesRun) {
      throw new Error(`fetch(${slot}) while a release(${slot}) is recorded in a segment not launched yet: the fetch waits only for releases launched before it, so it could refill the rows that segment still reads`);
    }
    if (s.held) throw new Error(`fetch(${slot}) while slot ${slot} is in use (a ready(${slot}) ran, no release(${slot}) since): it would refill the rows under the compute stream (or, were it to wait for that release, the next ready(${slot}) would wait forever)`);
    if (s.readiesIssued > s.readiesRun && s.readyIssuedAt === s.fetchesCalled && s.fetchesCalled > s.taken) {
      throw new Error(`fetch(${slot}) before the ready(${slot}) recorded for the slot's previous fetch launched: that ready would take this fetch's rows instead`);
    }
    if (s.fetchesCalled > s.taken && s.fetchesCalled > 0) this.superseded++;
    this.fetches++;
    const n = ++s.fetchesCalled;
    rows.forEach((r, i) => this.link.sideStream.push({ slot, n, done: r.done, gathers: r.gathers.slice(), owner: this, ran: i === rows.length - 1 ? () => (s.fetchesRun = n) : () => {} }));
    this.link.pumpFetches();
  }

  ready(slot: 0 | 1): void {
    this.check("ready");
    const s = this.slots[slot]!;
    s.readiesIssued++;
    s.readyIssuedAt = s.fetchesCalled;
    this.schedule(() => {
      s.readiesRun++;
      const n = s.fetchesCalled; // the last fetch called before this op launched (ran)
      if (n === 0) throw new Error(`ready(${slot}) with no fetch(${slot}) ever issued: it waits for nothing`);
      if (n === s.taken) throw new Error(`ready(${slot}) with no fetch(${slot}) since the last ready(${slot}): it would take rows already consumed`);
      this.link.pumpFetches();
      if (s.fetchesRun < n) {
        const head = this.link.sideStream[0]!;
        throw new Error(`ready(${slot}) waits for fetch ${n} of slot ${slot}, and the side stream waits for value ${head.done.value} at 0x${head.done.address.toString(16)} (fetch ${head.n} of slot ${head.slot}), which no queued job whose query was sent raises: it would hang`);
      }
      s.taken = n;
      s.held = true;
      this.readies++;
    });
  }

  release(slot: 0 | 1): void {
    this.check("release");
    const s = this.slots[slot]!;
    s.releasesIssued++;
    this.schedule(() => {
      if (!s.held) throw new Error(`release(${slot}) without a ready(${slot}) before it: nothing to release`);
      s.held = false;
      s.releasesRun++;
      this.releases++;
      this.link.pumpFetches();
    });
  }

  /** Waits for the side stream: a fetch still waiting for its done would hang. */
  close(): void {
    if (this.closed) return;
    this.link.pumpFetches();
    this.closed = true;
    const f = this.link.sideStream.find((q) => q.owner === this);
    if (f) throw new Error(`RowFetch.close() waits for fetch ${f.n} of slot ${f.slot}, whose done (value ${f.done.value}) no queued job raises: it would hang`);
  }

  [Symbol.dispose](): void {
    this.close();
  }

  private check(what: string): void {
    if (this.closed) throw new Error(`RowFetch.${what}() after close()`);
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
  /** Whether runFor(signal) would run: a queued job raises it and it and the jobs before it have had their queries sent. */
  canRunFor(signal: HostSignal): boolean {
    const i = this.queue.findIndex((j) => j.done?.address === signal.address && j.done.value === signal.value);
    return i >= 0 && this.queue.slice(0, i + 1).every((j) => !j.ready || this.link.sent(j.ready.value));
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
