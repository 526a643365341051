/**
 * Continuous batching for `hybridgen serve`: one loop over core's BatchDecoder. Each turn runs
 * one decode step for every decoding request (one forward pass), then at most one prefill chunk
 * of the oldest prefilling request, so a long prompt holds running decodes back by one chunk at
 * most; then it yields to the event loop (HTTP I/O, disconnects, signals). A request joins a free
 * slot between turns — with hybrid attention the slot's sequence is renewed on a store that the
 * ledger placed on the tiers left — and leaves when it ends or its client goes, giving back its
 * slot, its store and the store's disk files. Per request the tokens are those of `hybridgen
 * generate` alone: its own Sampler (seed), stop strings (TokenText) and token budget.
 *
 * Admission is by each request's bytes: its slot is renewed on a sequence of its own context
 * (prompt + max_tokens), admitted when those device bytes fit what the running requests left
 * (DeviceLedger) and, past the window, its store fits the tiers left (StoreLedger); otherwise it
 * waits, the requests behind it too. When it leaves, the slot goes back to an idle sequence and
 * its bytes to the ledgers — unless the queue's head fits the sequence it leaves (a context at
 * most a quarter shorter): then the head takes that sequence as it is (its window, and with hybrid
 * attention its store, already allocated and pinned), reset by its first prefill chunk, and
 * nothing is renewed. A left sequence nobody takes by the next admission goes back as before.
 * With preallocate() every slot's sequence is made once, at the model's context, and kept.
 */
import { HybridgenError, Sampler, TokenText, type BatchDecoder, type FinishReason, type KvStoreAllocator, type SamplingOptionsInput, type Tokenizer } from "@hybridgen/core";
import type { DeviceLedger } from "./device-ledger.js";
import { type HybridStats } from "@hybridgen/runtime";
import type { ServeMetrics } from "./metrics.js";
import type { StepCost } from "./step-cost.js";
import type { PlacedSlotStore, StoreLedger } from "./store-ledger.js";

export interface ServeJob {
  /** Prompt token ids: not empty, and with maxTokens within the context (the HTTP layer checks). */
  readonly ids: readonly number[];
  readonly maxTokens: number;
  readonly sampling: SamplingOptionsInput;
  readonly stop: readonly string[];
  /** performance.now() when the request arrived (TTFT). */
  readonly arrivedMs: number;
  /** A generated token's text, one call a token ("" while it is held back: part of a character, a possible stop string, or a token without text). */
  onText(text: string): void;
  /** The end: "abort" when cancelled (client gone, shutdown). */
  onFinish(r: { readonly finish: FinishReason; readonly text: string; readonly promptTokens: number; readonly completionTokens: number; readonly error?: string }): void;
}

export interface JobHandle {
  /** Ends the request at the next turn (a disconnect); its slot and store go back. */
  cancel(): void;
}

/** The queue is at its bound: HTTP 429. */
export class QueueFull extends Error {}

interface Running {
  readonly job: ServeJob;
  /** Its place in the queue, taken again if its prefill runs out of device memory. */
  readonly queued: Queued;
  readonly slot: number;
  readonly sampler: Sampler;
  readonly text: TokenText;
  readonly all: Int32Array;
  readonly store: PlacedSlotStore | null;
  /** Device bytes the request holds (DeviceLedger). */
  readonly deviceBytes: number;
  /** Prompt positions prefilled so far (all of them once decoding). */
  prefilled: number;
  tokens: number;
  next: number;
  finish: FinishReason | null;
  lastTokenMs: number;
}

interface Queued {
  readonly job: ServeJob;
  cancelled: boolean;
}

/** A left request's sequence kept in its (free) slot for the queue's head, with what it holds. */
interface Kept {
  readonly store: PlacedSlotStore | null;
  readonly deviceBytes: number;
}

export interface SchedulerOptions {
  /** The decoder's slots requests may take (hybrid attention leaves slot 0, the model's own sequence, idle: it is never renewed). */
  readonly slots: readonly number[];
  readonly queueLimit: number;
  /** Prompt positions prefilled per turn. */
  readonly chunk: number;
  readonly maxContext: number;
  readonly eos: readonly number[];
  /** KV bytes a position takes (K and V of every layer), for the window gauge. */
  readonly bytesPerToken: number;
  /** Hybrid attention: stores placed by the planner; a slot is renewed on its request's store. */
  readonly ledger: StoreLedger | null;
  /** Device-memory admission (a device, or the CPU backend under --gpu-mem); absent: the slots alone bound the batch. */
  readonly device?: DeviceLedger | null;
  /** Positions of an idle slot's sequence: the decoder's slots start there and go back there when their request leaves (default maxContext). */
  readonly idleContext?: number;
  /** Hands the next renewed sequence its store (the storeAllocator function reads it); null takes it back. */
  readonly nextStore?: (a: KvStoreAllocator | null) => void;
  /** Drops released sequences' attentions (createBatchHybridAttention's prune). */
  readonly prune?: () => void;
  /** An engine error, one line (the server logs it). */
  readonly onError?: (message: string) => void;
  /** What each decode step reads and each prefill chunk computes (the metrics' bytes and FLOPs); absent: not counted. */
  readonly cost?: StepCost;
  /** A request's slot is vacated: its hybrid attention's stats line (HybridStats.summary(), the server logs it; hybrid steps only). */
  readonly onHybridStats?: (slot: number, summary: string) => void;
}

const turn = () => new Promise<void>((resolve) => setImmediate(resolve));
/** The backend refused memory (the CPU backend's cap, or the CUDA arena). */
const outOfMemory = (e: unknown): boolean => (e as { code?: string }).code === "ENOMEM" || /out of (device )?memory/i.test(e instanceof Error ? e.message : "");
const oneLine = (e: unknown): string => (e instanceof Error ? e.message : String(e)).replace(/\s*\n\s*/g, " ");

export class ServeScheduler {
  private readonly queue: Queued[] = [];
  private readonly active: Running[] = [];
  private readonly free: number[];
  private readonly eos: Set<number>;
  private readonly picks: Int32Array;
  private readonly seen = new WeakSet<object>();
  /** Slots whose sequence was released and not yet made anew (a renewal failed). */
  private readonly stale = new Set<number>();
  /** Positions of each renewable slot's sequence now. */
  private readonly slotContext = new Map<number, number>();
  /** Free slots whose left request's sequence waits for the queue's head (kept(): the head fits it). */
  private readonly kept = new Map<number, Kept>();
  /** preallocate(): every slot's sequence is the model's context, made at load and kept for good. */
  private preallocated = false;
  /** A sequence could not be made for lack of device memory: admission waits for a request to leave. */
  private blocked = false;
  private readonly idleContext: number;
  private wake: (() => void) | null = null;
  private looping: Promise<void> | null = null;
  private stopping = false;

  constructor(
    private readonly dec: BatchDecoder,
    private readonly tokenizer: Tokenizer,
    private readonly vocabSize: number,
    private readonly metrics: ServeMetrics,
    private readonly o: SchedulerOptions,
  ) {
    this.free = [...o.slots].reverse(); // the lowest slot first
    this.idleContext = o.idleContext ?? o.maxContext;
    for (const slot of o.slots) if (slot !== 0) this.slotContext.set(slot, this.idleContext);
    this.eos = new Set(o.eos);
    this.picks = new Int32Array(dec.capacity);
    metrics.slots.set(o.slots.length);
    if (o.device) metrics.deviceBudget.set(o.device.budgetBytes);
  }

  /** Why a request of `context` positions can never be admitted, even with nothing running (one line), or null. */
  refusal(context: number): string | null {
    const seq = this.sequenceContext(context);
    return this.o.device?.refusal(seq) ?? (this.o.ledger?.needsStore(context) ? this.o.ledger.refusal(seq) : null);
  }

  /**
   * Before any request: every slot but slot 0 gets a sequence of the model's context (with hybrid
   * attention its store placed on the tiers and, on a device, pinned) that it keeps between
   * requests, so no admission renews a sequence or pins a store; what they hold is held while
   * idle. Throws one line when they do not all fit the device memory or the tiers.
   */
  preallocate(): void {
    if (this.active.length + this.queue.length > 0 || this.preallocated) throw new HybridgenError("preallocate: only once, before any request");
    const context = this.o.maxContext, slots = this.o.slots.filter((s) => s !== 0), device = this.o.device ?? null, ledger = this.o.ledger;
    const mib = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;
    for (const [i, slot] of slots.entries()) {
      const need = device ? device.need(context) : 0;
      if (device && !device.fits(need)) {
        throw new HybridgenError(`--preallocate: ${slots.length} sequences of the model's context need ${mib(slots.length * need)} of device memory, ${mib(device.budgetBytes)} is left beside the model (${i} fit): lower --max-batch or --context`);
      }
      const store = ledger?.needsStore(context) ? ledger.place(context) : null;
      if (ledger?.needsStore(context) && !store) {
        throw new HybridgenError(`--preallocate: the KV tiers hold the stores of ${i} of ${slots.length} sequences of the model's context (${mib(ledger.storeBytes)} each): lower --max-batch or --context, or add --kv-disk DIR`);
      }
      const before = device?.memory.free() ?? 0;
      try {
        this.renew(slot, store?.allocator ?? ledger?.idle() ?? null, context);
      } catch (e) {
        if (store) {
          store.allocator.release();
          ledger!.release(store);
        }
        throw e;
      }
      const held = device ? Math.max(need, before - device.memory.free()) : 0;
      if (held > 0) device!.hold(held);
      this.kept.set(slot, { store, deviceBytes: held });
    }
    this.preallocated = true;
    this.gauges();
  }

  /** Positions of the sequence a request of `context` positions runs in: its own; with hybrid attention at least one past the window (its attention offloads). */
  sequenceContext(context: number): number {
    return Math.min(this.o.maxContext, this.o.ledger ? Math.max(context, this.o.ledger.window + 1) : context);
  }

  get running(): number {
    return this.active.length;
  }

  get waiting(): number {
    return this.queue.length;
  }

  get shuttingDown(): boolean {
    return this.stopping;
  }

  /** Queues a request; throws QueueFull at the bound. */
  submit(job: ServeJob): JobHandle {
    if (this.stopping) throw new QueueFull("the server is shutting down");
    if (this.queue.length >= this.o.queueLimit) throw new QueueFull(`the queue is full (${this.o.queueLimit} requests waiting); retry later`);
    const q: Queued = { job, cancelled: false };
    this.queue.push(q);
    this.gauges();
    this.kick();
    return {
      cancel: () => {
        q.cancelled = true;
        const r = this.active.find((a) => a.job === job);
        if (r && !r.finish) r.finish = "abort";
        this.kick();
      },
    };
  }

  /** Refuses new requests and cancels the queued ones (shutdown); running ones go on. */
  cancelQueued(): void {
    this.stopping = true;
    for (const q of this.queue) q.cancelled = true;
    this.kick();
  }

  /** Cancels every request (queued and running) and waits for the loop to end. */
  async stop(): Promise<void> {
    this.stopping = true;
    for (const q of this.queue) q.cancelled = true;
    for (const r of this.active) r.finish ??= "abort";
    this.kick();
    await this.looping;
  }

  /** Resolves when nothing is queued or running. */
  async idle(): Promise<void> {
    while (this.looping) await this.looping;
  }

  private kick(): void {
    if (this.wake) {
      const w = this.wake;
      this.wake = null;
      w();
    }
    // Started on the next turn: submit() returns before any work (and any callback) runs.
    this.looping ??= turn().then(() => this.loop());
  }

  private async loop(): Promise<void> {
    for (;;) {
      try {
        this.retire();
        this.admit(); // after retire(): the slots (and sequences) left since the last turn go to the queue first
        if (this.active.length === 0 && this.queue.length === 0) {
          this.gauges();
          this.looping = null; // now, not a microtask later: a submit() in between starts a new loop
          return;
        }
        if (this.active.length === 0) {
          // The queue's head waits for room nothing running will give back: cannot happen (one store fits the empty tiers), but never spin.
          await new Promise<void>((resolve) => (this.wake = resolve));
          continue;
        }
        this.decodeStep();
        this.prefill();
        this.retire();
        this.gauges();
      } catch (e) {
        this.fail(e);
      }
      await turn();
    }
  }

  /** A fresh sequence of `context` positions in `slot` on `store` (BatchDecoder.renew; the storeAllocator function hands it over); marked stale until it succeeds. */
  private renew(slot: number, store: KvStoreAllocator | null, context: number): void {
    this.stale.add(slot);
    this.o.nextStore?.(store);
    const t0 = performance.now();
    try {
      this.dec.renew(slot, { maxContext: context });
    } finally {
      this.o.nextStore?.(null); // never handed to a later sequence, whatever failed
      this.metrics.renewSeconds.observe((performance.now() - t0) / 1000); // the loop's time outside steps and chunks
    }
    this.stale.delete(slot);
    this.slotContext.set(slot, context);
    this.o.prune?.();
  }

  /** `r`'s slot back to an idle sequence (its store's memory and files freed now), its bytes back to the ledgers. */
  private vacate(r: Running): void {
    if (this.preallocated && r.slot !== 0) return this.keep(r);
    this.logStats(r.slot);
    this.giveBack(r.slot, r.store, r.deviceBytes);
    this.blocked = false;
    this.free.push(r.slot);
  }

  /** The left request's hybrid stats line; the stats start again for the slot's next request. */
  private logStats(slot: number): void {
    const stats = this.hybridStats(slot);
    if (stats && stats.steps > 0) this.o.onHybridStats?.(slot, stats.summary());
    stats?.reset();
  }

  /** `slot`'s sequence back to an idle one (its store's memory and files freed now), `store` and `deviceBytes` back to the ledgers. */
  private giveBack(slot: number, store: PlacedSlotStore | null, deviceBytes: number): void {
    if (slot !== 0 && (store || this.slotContext.get(slot) !== this.idleContext)) {
      try {
        this.renew(slot, this.o.ledger?.idle() ?? null, this.idleContext);
      } catch (e) {
        this.o.onError?.(oneLine(e)); // the old sequence is released already; the slot's next request renews it
      }
    }
    if (store) this.o.ledger!.release(store);
    if (deviceBytes > 0) this.o.device!.release(deviceBytes);
  }

  /** The first queued request not cancelled. */
  private head(): Queued | undefined {
    return this.queue.find((q) => !q.cancelled);
  }

  /** Whether a request of `context` positions may take the sequence `slot` holds as it is: long enough, at most a quarter longer, with a store if it needs one. */
  private fits(slot: number, store: PlacedSlotStore | null, context: number): boolean {
    if (slot === 0 || this.stale.has(slot)) return false;
    const have = this.slotContext.get(slot)!, seq = this.sequenceContext(context);
    // A preallocated sequence serves any request: it is never given back for a smaller one.
    return seq <= have && (this.preallocated || 4 * have <= 5 * seq) && (store !== null || !(this.o.ledger?.needsStore(context) ?? false));
  }

  /** `r` left: its sequence stays in its slot for the queue's head when that fits it (its bytes held for it), else goes back. */
  private leave(r: Running): void {
    const head = this.stopping ? undefined : this.head();
    if (!this.preallocated && (!head || !this.fits(r.slot, r.store, head.job.ids.length + head.job.maxTokens))) {
      this.vacate(r);
      return;
    }
    this.keep(r);
  }

  /** `r`'s sequence stays in its (now free) slot with its store and device bytes. */
  private keep(r: Running): void {
    this.logStats(r.slot);
    this.kept.set(r.slot, { store: r.store, deviceBytes: r.deviceBytes });
    this.blocked = false;
    this.free.push(r.slot);
  }

  /** Every kept sequence goes back (nobody it fits is next), but preallocated ones. */
  private releaseKept(): void {
    if (this.preallocated) return;
    for (const [slot, k] of this.kept) {
      this.kept.delete(slot);
      this.giveBack(slot, k.store, k.deviceBytes);
    }
  }

  /** An engine error (a bug, or memory refused mid-step): every running request ends with it (HTTP 500 or an error event); the server goes on. */
  private fail(e: unknown): void {
    const message = `internal error: ${oneLine(e)}`;
    this.o.onError?.(message);
    for (const r of this.active.splice(0)) {
      this.vacate(r);
      this.metrics.finished.inc(1, { reason: "error" });
      this.finish(r.job, { finish: "abort", text: r.text.text, promptTokens: r.all.length, completionTokens: r.tokens, error: message });
    }
    this.gauges();
  }

  /**
   * Free slots take queued requests in order; a request whose sequence does not fit the device
   * memory left, or whose store does not fit the tiers left, waits (and so do those behind it).
   * A kept sequence the head fits is taken as it is; any other goes back before the head renews
   * a slot (its bytes may be what the head needs), and every one left over goes back at the end.
   */
  private admit(): void {
    try {
      this.admitQueued();
    } finally {
      this.releaseKept();
    }
  }

  private admitQueued(): void {
    while (this.queue.length > 0) {
      const q = this.queue[0]!;
      if (q.cancelled) {
        this.queue.shift();
        this.end(q.job, "abort", "", 0);
        continue;
      }
      if (this.free.length === 0 || this.blocked) return;
      const job = q.job;
      const context = job.ids.length + job.maxTokens;
      const reuse = [...this.kept].find(([slot, k]) => this.fits(slot, k.store, context));
      if (reuse) {
        const [slot, k] = reuse;
        this.kept.delete(slot);
        this.free.splice(this.free.indexOf(slot), 1);
        this.queue.shift();
        this.metrics.reused.inc();
        this.start(q, slot, k.store, k.deviceBytes);
        continue;
      }
      this.releaseKept();
      const seq = this.sequenceContext(context);
      const slot = this.free[this.free.length - 1]!;
      // Slot 0 (the model's own sequence, full attention) holds the model's context since load; another is renewed on the request's.
      const needsStore = this.o.ledger?.needsStore(context) ?? false;
      const renews = slot !== 0 && (needsStore || this.stale.has(slot) || this.slotContext.get(slot) !== seq);
      const device = renews ? this.o.device ?? null : null;
      const need = device ? device.need(seq) : 0;
      if (device && !device.fits(need)) {
        if (this.active.length > 0) return; // the running requests' bytes come back as they leave
        this.queue.shift();
        this.refuse(job, `this request cannot be served: ${device.refusal(seq) ?? "its sequence does not fit the device memory left"}`);
        continue;
      }
      let store: PlacedSlotStore | null = null;
      let held = 0;
      try {
        if (needsStore) {
          store = this.o.ledger!.place(seq);
          if (!store) return;
        }
        if (renews) {
          const before = device?.memory.free() ?? 0;
          this.renew(slot, store?.allocator ?? this.o.ledger?.idle() ?? null, seq);
          if (device) held = Math.max(need, before - device.memory.free());
        }
        this.queue.shift();
        this.free.pop();
      } catch (e) {
        if (store) {
          store.allocator.release(); // a store the cache never took (release is idempotent: one it took is released already)
          this.o.ledger!.release(store);
        }
        // Device memory refused while others run: the request waits for one of them to leave.
        if (outOfMemory(e) && this.active.length > 0) {
          this.blocked = true;
          return;
        }
        // The sequence or its store could not be made (memory or a disk file refused): this request fails, the others go on.
        if (this.queue[0] === q) this.queue.shift();
        const message = oneLine(e);
        this.o.onError?.(message);
        this.refuse(job, message);
        continue;
      }
      if (held > 0) device!.hold(held);
      this.start(q, slot, store, held);
    }
  }

  /** `q` runs in `slot` (its sequence ready: renewed, or kept from the request before), holding `store` and `deviceBytes`. */
  private start(q: Queued, slot: number, store: PlacedSlotStore | null, deviceBytes: number): void {
    const job = q.job;
    const sampler = new Sampler(this.vocabSize, job.sampling);
    sampler.observeAll(job.ids);
    this.active.push({
      job, queued: q, slot, sampler, store, deviceBytes, text: new TokenText(this.tokenizer, job.stop, job.ids[job.ids.length - 1]!), all: Int32Array.from(job.ids),
      prefilled: 0, tokens: 0, next: -1, finish: null, lastTokenMs: 0,
    });
    this.metrics.promptTokens.inc(job.ids.length);
  }

  /** A request ends unserved with `message` (HTTP 500 or an error event). */
  private refuse(job: ServeJob, message: string): void {
    this.metrics.finished.inc(1, { reason: "error" });
    this.finish(job, { finish: "abort", text: "", promptTokens: job.ids.length, completionTokens: 0, error: message });
  }

  /** One forward pass for every decoding request, then each picks its token. */
  private decodeStep(): void {
    const rows = this.active.filter((r) => !r.finish && r.prefilled === r.all.length);
    if (rows.length === 0) return;
    const slots = rows.map((r) => r.slot);
    const selectedBefore = slots.map((s) => this.hybridStats(s)?.sumK ?? 0);
    const t0 = performance.now();
    this.dec.step(slots, Int32Array.from(rows, (r) => r.next));
    if (rows.some((r) => r.sampler.greedy)) this.dec.argmaxSlots(slots, this.picks);
    const picks = rows.map((r, i) => (r.sampler.greedy ? this.picks[i]! : r.sampler.sample(this.dec.logits(r.slot))));
    this.metrics.stepSeconds.observe((performance.now() - t0) / 1000);
    rows.forEach((r, i) => this.accept(r, picks[i]!));
    this.metrics.steps.inc();
    this.metrics.batchSize.set(rows.length);
    this.metrics.batchSizes.observe(rows.length);
    this.hybridMetrics(slots);
    if (this.o.cost) {
      const read = this.o.cost.decode(slots.map((s, i) => {
        const c = this.dec.sequence(s).cache;
        return { resident: c.length - c.storeCount, selectedRows: (this.hybridStats(s)?.sumK ?? 0) - selectedBefore[i]! };
      }));
      this.metrics.decodeBytes.inc(read.device, { where: "device" });
      this.metrics.decodeBytes.inc(read.link, { where: "link" });
    }
  }

  /**
   * One chunk of the oldest prefilling request. A chunk refused device memory (buffers a prefill
   * makes as it goes, beyond what admission reserved) sends that request, which has streamed
   * nothing yet, back to the queue's head to wait for a running request to leave; alone, it fails.
   */
  private prefill(): void {
    const r = this.active.find((a) => !a.finish && a.prefilled < a.all.length);
    if (!r) return;
    try {
      this.prefillChunk(r);
    } catch (e) {
      if (!outOfMemory(e)) throw e;
      this.active.splice(this.active.indexOf(r), 1);
      this.vacate(r);
      if (this.active.length === 0) {
        const message = `this request cannot be served: its prefill ran out of device memory with nothing else running (${oneLine(e)})`;
        this.o.onError?.(message);
        this.refuse(r.job, message);
        return;
      }
      this.queue.unshift(r.queued);
      this.blocked = true;
    }
  }

  /** One chunk of `r`'s prompt; its first token once the prompt is in. */
  private prefillChunk(r: Running): void {
    const end = Math.min(r.all.length, r.prefilled + this.o.chunk);
    const offloaded = this.dec.sequence(r.slot).cache.storeCount;
    const t0 = performance.now();
    this.dec.prefill(r.slot, r.all.subarray(r.prefilled, end), r.prefilled);
    this.metrics.chunkSeconds.observe((performance.now() - t0) / 1000);
    if (this.o.cost) {
      this.metrics.prefillFlops.inc(this.o.cost.prefillFlops(r.prefilled, end));
      this.metrics.prefillLinkBytes.inc(this.o.cost.prefillLinkBytes(offloaded));
    }
    r.prefilled = end;
    this.metrics.prefillChunks.inc();
    if (end === r.all.length) this.accept(r, r.sampler.greedy ? this.dec.argmax(r.slot) : r.sampler.sample(this.dec.logits(r.slot)));
  }

  /** Takes `r`'s next token (EOS, stop string, budget, context), as generate() does. */
  private accept(r: Running, id: number): void {
    const now = performance.now();
    if (r.tokens === 0) this.metrics.ttft.observe((now - r.job.arrivedMs) / 1000);
    else this.metrics.tpot.observe((now - r.lastTokenMs) / 1000);
    r.lastTokenMs = now;
    if (this.eos.has(id)) {
      r.finish = "eos";
      const rest = r.text.flush();
      if (rest) this.emit(r.job, rest);
      return;
    }
    const index = r.tokens++;
    r.sampler.observe(id);
    this.metrics.generated.inc();
    const P = r.all.length;
    const last = index + 1 >= r.job.maxTokens || P + index >= this.o.maxContext;
    const { release, stopped } = r.text.push(id, last);
    this.emit(r.job, release); // a chunk a token, so clients time every token
    if (stopped) r.finish = "stop";
    else if (last) r.finish = index + 1 >= r.job.maxTokens ? "length" : "context";
    r.next = id;
  }

  /** Finished and cancelled requests leave: their slot, store and its files go back. */
  private retire(): void {
    for (let i = this.active.length - 1; i >= 0; i--) {
      const r = this.active[i]!;
      if (!r.finish) continue;
      this.active.splice(i, 1);
      this.leave(r); // the sequence goes now (its memory and its store's files freed at once), unless the queue's head takes it
      if (r.finish === "abort") {
        const rest = r.text.flush();
        if (rest) this.emit(r.job, rest);
      }
      this.metrics.e2e.observe((performance.now() - r.job.arrivedMs) / 1000);
      this.end(r.job, r.finish, r.text.text, r.tokens);
    }
  }

  private end(job: ServeJob, finish: FinishReason, text: string, tokens: number): void {
    this.metrics.finished.inc(1, { reason: finish === "abort" ? "cancelled" : finish === "length" || finish === "context" ? "length" : "stop" });
    this.finish(job, { finish, text, promptTokens: job.ids.length, completionTokens: tokens });
  }

  /** A consumer's callback that throws is its own failure, never the loop's (which serves everyone). */
  private emit(job: ServeJob, text: string): void {
    try {
      job.onText(text);
    } catch (e) {
      this.o.onError?.(`a response failed: ${oneLine(e)}`);
    }
  }

  private finish(job: ServeJob, r: Parameters<ServeJob["onFinish"]>[0]): void {
    try {
      job.onFinish(r);
    } catch (e) {
      this.o.onError?.(`a response failed: ${oneLine(e)}`);
    }
  }

  private gauges(): void {
    this.metrics.running.set(this.active.length);
    this.metrics.queued.set(this.queue.length);
    let resident = 0;
    for (const r of this.active) {
      const c = this.dec.sequence(r.slot).cache;
      resident += c.length - c.storeCount;
    }
    this.metrics.kvBytes.set(resident * this.o.bytesPerToken, { tier: "window" });
    if (this.o.ledger) for (const [tier, bytes] of this.o.ledger.reservedByTier()) this.metrics.kvBytes.set(bytes, { tier });
    if (this.o.device) this.metrics.deviceReserved.set(this.o.device.reserved);
  }

  /** The hybrid attention's stats of `slot`'s sequence (null: full attention). */
  private hybridStats(slot: number): HybridStats | null {
    return (this.dec.sequence(slot).attention.decodeAttention as { stats?: HybridStats } | null)?.stats ?? null;
  }

  /** K, timing and CPU-stage time of each hybrid sequence's step just run. */
  private hybridMetrics(slots: readonly number[]): void {
    let sumK = 0, n = 0;
    for (const slot of slots) {
      const stats = this.hybridStats(slot);
      const rec = stats?.trace[stats.trace.length - 1];
      if (!rec || this.seen.has(rec)) continue;
      this.seen.add(rec);
      sumK += rec.k;
      n++;
      this.metrics.hybridSteps.inc(1, { timing: rec.timing });
      this.metrics.cpuStage.observe(rec.tCpuMs / 1000);
      this.metrics.cpuStageTotal.inc(rec.tCpuMs / 1000);
    }
    if (n > 0) this.metrics.hybridK.set(sumK / n);
  }
}
