/**
 * What the transports over a host link share (staged, mapped, handed off): the query's way to the
 * stage (a signalled send inside the recorded segment where the link and stage allow, else a copy
 * the host fences), the host store's catch-up before a step, the device's event times, and the
 * recorded segments. On a backend that records decode steps (Backend.beginStep/endStep: CUDA
 * graphs), the device work between two host interactions — a layer's softmax and A·V, the rest of
 * the layer, the next layer's projections up to the query's send — is recorded as one segment per
 * layer and replayed as a graph, instead of a launch per op. A row of a batched step records
 * nothing: the backend records one segment at a time, and a row's would take in the other rows' work.
 */
import type { Attention, DecodeBatchStep } from "@hybridgen/core";
import type { HostSignal, Tensor } from "@hybridgen/spec";
import type { StepPlan } from "../step-plan.js";
import type { TransportChoice } from "./choose-transport.js";
import { transportNote } from "./choose-transport.js";
import type { DeviceStaging } from "./device-staging.js";
import { PendingSends, SendBatch } from "./send-batch.js";
import type { StepDriver, StepTimes, StepTransport, TransportName } from "./step-transport.js";

let transports = 0; // segment keys differ between hybrid attentions (their recorded ops differ)

export abstract class DeviceTransport implements StepTransport {
  abstract readonly name: TransportName;
  readonly note: string;
  readonly rowPaths: TransportChoice["rowPaths"];
  /** This step is a row of a batched step (nothing is recorded). */
  protected batch = false;
  /** The batched step it is a row of (null: a step of its own). */
  protected batchStep: DecodeBatchStep | null = null;
  private segmentOpen = false;
  /** A layer whose stage submission waits until the device work before it has been issued (-1: none). */
  private deferred = -1;
  /** Per layer: the signal of its query's send (the job waits for it; undefined: fenced), or the batch's group it joined. */
  private readySignals: (HostSignal | PendingSends | undefined)[] = [];
  private discardTimes = true;
  private readonly segmentKeys: string[];

  constructor(protected readonly step: StepDriver, protected readonly d: DeviceStaging, protected readonly attention: Attention, protected readonly choice: TransportChoice) {
    this.note = transportNote(choice);
    this.rowPaths = choice.rowPaths;
    const id = transports++;
    this.segmentKeys = Array.from({ length: step.layers }, (_, l) => `hybrid-${id}-${l}`);
  }

  newSequence(): void {
    this.discardTimes = true;
  }

  startStep(batch: DecodeBatchStep | null): void {
    this.flush();
    this.batch = batch !== null;
    this.batchStep = batch;
    this.deferred = -1;
    this.readySignals = [];
  }

  syncStore(): void {
    if (this.discardTimes) this.d.times(); // the device's first timed step drops what prefill recorded
    this.discardTimes = false;
    this.d.pause();
    this.attention.cache.syncHostStore(); // the evictions' rows are in host memory
    this.d.resume();
  }

  planned(_plan: StepPlan, rows: number): boolean {
    this.d.reserve(rows); // the gathered-row buffers hold this step's widest selection
    return false;
  }

  /** Signalled inside the open segment where it can be, else the segment ends and the host fences the copy (a JS pre-QKᵀ selector reads it on this thread). */
  sendQuery(layer: number, q: Tensor, bytes?: number): void {
    const hostReads = this.step.plan().work === "pre";
    if (hostReads || !this.choice.signals) {
      this.closeSegment();
      this.submitDeferred();
    }
    const slot = (layer & 1) as 0 | 1, signalled = this.choice.signals && !hostReads;
    // A batch row's send joins the layer's group: one op for every row's (SendBatch).
    if (signalled && this.batchStep) this.readySignals[layer] = SendBatch.of(this.d.link).join(this.batchStep, layer, this.d.querySend(slot, q, bytes));
    else this.readySignals[layer] = this.d.queryToHost(slot, q, signalled, bytes);
  }

  jobLink(layer: number): { ready?: HostSignal; deviceGather: boolean } {
    const r = this.readySignals[layer];
    return { ready: this.d.beforeSubmit(r instanceof PendingSends ? r.signal() : r), deviceGather: false };
  }

  abstract attend(layer: number, q: Tensor, out: Tensor): void;

  flush(): void {
    this.closeSegment();
  }

  /** CUDA events: compute-stream busy time, copy-stream time (a batched step's, once for all its rows). */
  stepTimes(batch: DecodeBatchStep | null): StepTimes {
    this.d.pause();
    return batch ? (batch.times ??= this.d.times()) : this.d.times();
  }

  close(): void {
    this.d.close();
  }

  [Symbol.dispose](): void {
    this.close();
  }

  /** Records the device ops from here to the next host interaction as layer's segment. */
  protected openSegment(layer: number): void {
    if (!this.choice.records || this.batch) return; // other rows' device work would land in this segment
    this.attention.backend.beginStep!(this.segmentKeys[layer]!);
    this.segmentOpen = true;
  }

  /** Runs the recorded segment (a graph replay): before anything that talks to the host. The side stream's work in it is joined first (a capture refuses an unjoined stream). */
  protected closeSegment(): void {
    if (!this.segmentOpen) return;
    this.segmentOpen = false;
    this.attention.backend.joinSide?.();
    this.attention.backend.endStep!();
  }

  /**
   * A device-ranked layer's ranking and its query's signalled send on the backend's side stream,
   * joined where the open segment ends (at once outside one): beside the layer before's projections
   * and window attention instead of in line. In line where the send is not signalled inside the
   * segment (a host-read query, a batch row's group send) or the backend has no side stream.
   */
  sendRanked(layer: number, rank: () => void, q: Tensor, bytes: number): void {
    const be = this.attention.backend;
    if (!be.beginSide || !be.endSide || !be.joinSide || !this.choice.signals || this.batchStep || this.step.plan().work === "pre") {
      rank();
      return this.sendQuery(layer, q, bytes);
    }
    be.beginSide();
    try {
      rank();
      this.sendQuery(layer, q, bytes);
    } finally {
      be.endSide();
    }
    if (!this.segmentOpen) be.joinSide(); // eager ops: nothing records the join later
  }

  /** The host is about to block on the CPU stage: what is issued runs first, and the link's times leave the wait out. */
  protected collect(layer: number): void {
    this.closeSegment();
    this.submitDeferred();
    this.d.pause();
    this.step.collect(layer);
    this.d.resume();
  }

  /**
   * After layer's stage is collected. A JS pre-QKᵀ selection runs on this thread: the next layer is
   * submitted when the layer after it sends its q̃, so the selection overlaps the device work issued
   * up to then. A stage kernel's job (top-K, Quest) starts at once: it runs on the stage's threads.
   */
  protected submitAfter(layer: number): void {
    const s = this.step;
    if (s.plan().work === "pre" && layer + 2 < s.layers && s.ahead[layer + 1] && s.ahead[layer + 2]) this.deferred = layer + 1;
    else s.submitNext(layer);
  }

  private submitDeferred(): void {
    if (this.deferred < 0) return;
    const layer = this.deferred;
    this.deferred = -1;
    this.step.submit(layer);
  }
}
