/**
 * NativeCpuStage: core's CpuStage on libhgcpu's stage (native/cpu_stage.c). submit() queues the
 * job for the stage's own coordinator thread (and its helper pool) and returns at once, so JS
 * drives the device stage meanwhile; wait() blocks until every queued job is done. Staged V rows
 * land directly in a CpuBackend tensor (the "pinned" buffer the device reads), in the store's dtype.
 *
 * Queued jobs (up to queueDepth) run in order, each writing its slot's outputs when it runs, so
 * layers l and l + 2 may queue for the same slot ("quest" and "streaming" jobs choose their ids on the
 * stage's coordinator when they run). A "selected" job is the exception: JS writes its ids at submit,
 * so it cannot be queued behind another job (submit fails; wait() first). A "score"
 * job, gather() and allLogits() need an idle stage for the JS selection between them; such a job's
 * done is raised by gather() (or by the stage when the score job fails).
 */
import { dlopen, FFIType, ptr as addressOf, toArrayBuffer, type Pointer } from "bun:ffi";
import { SPEC_VERSION, checkStageJob, fail, selectionForKvHead, type CpuStage, type CpuStageJob, type CpuStageOutput, type CpuStageShape, type CpuStageSplit, type CpuStageStaging, type DType, type HostSignal, PAGE_INDEX_FORM_CODE, pageIndexLayout, type OffloadedKeys, type Selection, type SelectorPrimitives, type Tensor } from "@hybridgen/spec";
import { z } from "zod";
import type { CpuBackend } from "./cpu-backend.js";
import { chooseIsa, isaCode } from "./features.js";
import { nativeLibraryPath, openNativeSymbols } from "./native.js";
import { nativeSelectorPrimitives } from "./selector-primitives.js";
import { storeKeys } from "./store-keys.js";
import { KeySketches, SCORING_CODE, ScoringSchema, type Scoring } from "./key-scoring.js";
import { pageSummaryShape } from "./page-summaries.js";
import { checkStageJobLayout, STAGE_FLAGS, STAGE_JOB_FIELDS, StageJobRecord, type NativeJobLayout, type StageJobField } from "./stage-job-layout.js";
import { FoldedRegions } from "./tensor-regions.js";
import { allocSlot, closeSlot, slotStaging, type NativeBuf, type StageSlot } from "./stage-slots.js";
import { CpuTensor } from "./tensor.js";

const { ptr, i32, i64, i64_fast, u64, void: none } = FFIType;
const symbols = {
  hg_stage_create_lanes: { args: [i32, i32, i32], returns: ptr },
  hg_stage_destroy: { args: [ptr], returns: none },
  hg_stage_threads: { args: [ptr], returns: i32 },
  hg_stage_submit: { args: [ptr, ptr], returns: i32 },
  hg_stage_submit_group: { args: [ptr, ptr, i32], returns: i32 },
  hg_stage_group_counts: { args: [ptr, ptr], returns: none },
  hg_stage_run: { args: [ptr, ptr], returns: i64_fast },
  hg_stage_wait_lane: { args: [ptr, i32], returns: i64_fast },
  hg_stage_cancel_lane: { args: [ptr, i32], returns: none },
  hg_stage_queue_depth: { args: [ptr], returns: i32 },
  hg_stage_last_ns: { args: [ptr], returns: i64_fast },
  hg_stage_set_idle_spin: { args: [ptr, i64], returns: none },
  hg_stage_set_ready_timeout: { args: [ptr, i64], returns: none },
  hg_stage_last_split: { args: [ptr, ptr], returns: none },
  hg_stage_error: { args: [ptr, ptr, i64], returns: none },
  hg_stage_set_read_depth: { args: [ptr, i32], returns: none },
  hg_stage_last_reads: { args: [ptr, ptr], returns: none },
  hg_stage_job_size: { args: [], returns: i64_fast },
  hg_stage_job_offset: { args: [ptr], returns: i64_fast },
  hg_stage_job_flag: { args: [ptr], returns: i64_fast },
  hg_alloc: { args: [u64], returns: ptr },
  hg_free: { args: [ptr, u64], returns: none },
} as const;
type StageLib = ReturnType<typeof dlopen<typeof symbols>>["symbols"];
let lib: StageLib | undefined;
function stageLib(): StageLib {
  if (lib) return lib;
  const opened = openNativeSymbols(symbols);
  checkStageJobLayout(jobLayoutOf(opened), nativeLibraryPath());
  lib = opened;
  return lib;
}

function jobLayoutOf(l: StageLib): NativeJobLayout {
  const cName = (name: string) => Buffer.from(`${name}\0`);
  return {
    size: Number(l.hg_stage_job_size()),
    offset: (f) => Number(l.hg_stage_job_offset(cName(f))),
    flag: (f) => Number(l.hg_stage_job_flag(cName(f))),
  };
}

/** What the loaded library says of hg_stage_job (its size, offsets and flags), checked against the JS declaration. */
export function nativeStageJobLayout(): NativeJobLayout {
  return jobLayoutOf(stageLib());
}

/** Disk-tier reads in flight per stage thread: enough to hide a read's latency without flooding the disk's queue. */
export const DEFAULT_READ_DEPTH = 8;

export const NativeCpuStageOptionsSchema = z.object({
  /** Threads of the stage: one coordinator plus threads − 1 helpers (default 1). */
  threads: z.number().int().min(1).max(256).default(1),
  /** How long the idle stage thread spins for the next job (and wait() for the job's end)
   * before sleeping, in µs. Worth it only with cores to spare; 0 (default): sleep at once. */
  idleSpinUs: z.number().int().min(0).max(1_000_000).default(0),
  /** How long a job waits for the device's signal that its query has landed before it fails, in ms. */
  readyTimeoutMs: z.number().int().min(1).max(600_000).default(10_000),
  /** Top-K jobs: score compressed copies of the K rows first (int8, int4), then rescore the best
   * rescoreFactor·K candidates from the full rows; "full" (default) scores the full rows only. */
  scoring: ScoringSchema.default("full"),
  /** Candidates per selected token that the compressed scores pass on to the full rows. */
  rescoreFactor: z.number().int().min(1).max(64).default(4),
  /** Selected rows in files of the disk tier (a TieredStore's): explicit reads, this many in flight per
   * stage thread (io_uring where the kernel allows it; 1: pread), adjacent rows one read; 0 reads them
   * through the file mapping instead (a synchronous page fault a row). */
  readDepth: z.number().int().min(0).max(256).default(DEFAULT_READ_DEPTH),
}).strict();
export type NativeCpuStageOptions = z.input<typeof NativeCpuStageOptionsSchema>;

const DTYPE_CODE: Readonly<Record<DType, number>> = { f32: 0, f16: 1, bf16: 2 };
const { SCORE, TOPK, SELECTED, GATHER, SHARED, KEYS, QUEST, NO_ROWS, DONE_IF_FAILED, STREAM, INDEX, CHOSEN } = STAGE_FLAGS;

export class NativeCpuStage implements CpuStage {
  readonly spec = SPEC_VERSION;
  readonly name = "native";
  readonly concurrent = true;
  readonly waitsForSignal = true;
  readonly takesChosenPages = true;
  /** Native primitives on the stage's pool while it runs no job (a pre-QKᵀ selector runs between jobs), in the
   * stage's ISA: a selector's select() then equals the stage's kernel of it bit for bit (Quest). */
  readonly primitives: SelectorPrimitives;
  readonly threads: number;
  /** How top-K jobs score (options.scoring) and the candidates per selected token. */
  readonly scoring: Scoring;
  readonly rescoreFactor: number;
  /** Disk-tier reads in flight per stage thread (options.readDepth). */
  readonly readDepth: number;
  /** Jobs submit() takes before a wait() (the native queue's capacity). */
  readonly queueDepth: number;
  private sketches: KeySketches | null = null;
  private readonly pages = new FoldedRegions("Quest page summaries");
  private readonly indexes = new FoldedRegions("the page index");
  private readonly lib: StageLib;
  private handle: Pointer | null;
  private readonly group: NativeStageGroup;
  private readonly lane: number;
  private shape: CpuStageShape | null = null;
  private readonly bufs: NativeBuf[] = [];
  private slots: StageSlot[] = [];
  private all: NativeBuf | null = null;
  private rows: Float32Array[] = [];
  private readonly job = new StageJobRecord();
  private readonly jobPtr: Pointer;
  private readonly split = new Float64Array(6);
  private pending = 0; // jobs submitted since the last wait()
  private pendingKeys: CpuTensor[] = []; // stores whose compressed copies or page summaries those jobs extend

  /**
   * `group`: the native stage of a batch this stage takes a lane of (its threads, spin, ready timeout
   * and read depth are the group's; options holds the scoring); without one the stage has its own.
   */
  constructor(private readonly backend: CpuBackend, options: NativeCpuStageOptions = {}, group?: NativeStageGroup) {
    const parsed = NativeCpuStageOptionsSchema.safeParse(options);
    if (!parsed.success) fail(`NativeCpuStage options: ${parsed.error.issues[0].path.join(".") || "options"}: ${parsed.error.issues[0].message}`);
    if (group) {
      const set = (["threads", "idleSpinUs", "readyTimeoutMs", "readDepth"] as const).find((k) => options[k] !== undefined);
      if (set) fail(`NativeCpuStage options: ${set} belongs to the stage group the stage shares (set it there)`);
    }
    this.lib = stageLib();
    const { threads, idleSpinUs, readyTimeoutMs, readDepth } = parsed.data;
    this.group = group ?? new NativeStageGroup(backend, { threads, idleSpinUs, readyTimeoutMs, readDepth }, 1);
    this.lane = this.group.attach();
    this.handle = this.group.handle;
    this.primitives = nativeSelectorPrimitives(chooseIsa(backend.isa), () => this.handle);
    this.threads = this.group.threads;
    this.scoring = parsed.data.scoring;
    this.rescoreFactor = parsed.data.rescoreFactor;
    this.readDepth = this.group.readDepth;
    this.queueDepth = this.lib.hg_stage_queue_depth(this.handle);
    this.jobPtr = addressOf(this.job.bytes);
  }

  /** Jobs deferred by a batch's stages go to the shared native stage as one group (a no-op for a stage of its own). */
  flush(): void {
    this.group.flush();
  }

  prepare(shape: CpuStageShape): void {
    if (this.shape) fail("cpu stage: prepare() called twice");
    this.live();
    const { heads, kvHeads, headDim, storeCapacity: cap } = shape;
    if (this.scoring !== "full") this.sketches = new KeySketches(this.scoring, kvHeads, cap, headDim);
    this.shape = shape;
    this.all = this.alloc(heads * cap * 4);
    const allF = new Float32Array(toArrayBuffer(this.all.p, 0, this.all.bytes));
    this.rows = Array.from({ length: heads }, (_, h) => allF.subarray(h * cap, (h + 1) * cap));
    for (let s = 0; s < 2; s++) this.slots.push(allocSlot(this.backend, shape, (bytes) => this.alloc(bytes)));
  }

  query(slot: 0 | 1): Float32Array {
    return this.slot(slot).query;
  }

  chosenPages(slot: 0 | 1): Int32Array {
    return this.slot(slot).chosen;
  }

  submit(job: CpuStageJob): void {
    this.live();
    if (this.pending >= this.queueDepth) fail(`cpu stage: submit() past the queue depth of ${this.queueDepth} jobs (wait() first)`);
    const w = job.work;
    let flags: number;
    if (w.kind === "score") flags = SCORE | DONE_IF_FAILED; // its done waits for gather()
    else if (w.kind === "topk") flags = SCORE | TOPK | GATHER | (w.shared ? SHARED : 0);
    else if (w.kind === "quest") flags = QUEST | SELECTED | GATHER;
    else if (w.kind === "index") flags = INDEX | SELECTED | GATHER | (w.chosen ? CHOSEN : 0);
    else if (w.kind === "streaming") flags = STREAM | SELECTED | GATHER; // the coordinator writes its ids when it runs
    else {
      if (this.pending > 0) fail("cpu stage: a selected job cannot be queued behind another (wait() first)");
      this.writeIds(job, w.selection);
      flags = SELECTED | GATHER;
    }
    const extended = this.fill(job, flags | this.rowFlags(job), w.kind === "topk" || w.kind === "quest" || w.kind === "streaming" || w.kind === "index" ? w.budget : 0);
    if (this.group.lanes > 1) {
      this.group.defer(this.lane, this.job.bytes);
    } else if (this.lib.hg_stage_submit(this.handle!, this.jobPtr) !== 0) {
      if (extended) this.forgetDerived(extended);
      fail("cpu stage: the native queue is full");
    }
    this.pending++;
    if (extended) this.pendingKeys.push(extended);
  }

  /** Waits for every job since the last wait(); their summed busy ms. */
  wait(): number {
    if (this.pending === 0) fail("cpu stage: wait() without a submitted job");
    const keys = this.pendingKeys;
    this.pending = 0;
    this.pendingKeys = [];
    if (this.group.holds(this.lane)) this.group.flush();
    const rc = Number(this.lib.hg_stage_wait_lane(this.handle!, this.lane));
    if (rc !== 0) for (const k of keys) this.forgetDerived(k); // a failed job may not have extended them
    this.check(rc);
    return Number(this.lib.hg_stage_last_ns(this.handle!)) / 1e6;
  }

  /** Jobs not started yet fail and one waiting for its ready signal stops (each raises its done); the next wait() throws. */
  cancel(): void {
    if (!this.handle || this.pending === 0) return;
    if (this.group.holds(this.lane)) this.group.flush(); // a deferred job fails like a queued one, raising its done
    this.lib.hg_stage_cancel_lane(this.handle, this.lane);
  }

  /** The store's K as selectors read it: a view of the tensor's memory (no copy). */
  offloadedKeys(k: Tensor): OffloadedKeys {
    this.ready();
    return storeKeys(this.store(k, "K"));
  }

  /** The phases of the last wait()'s jobs, summed (a gather() run afterwards replaces them). A top-K
   * job takes each token's group max while scoring, so that lands in scoreMs; selectMs is the
   * selection over the group-max rows. */
  lastSplit(): CpuStageSplit {
    this.lib.hg_stage_last_split(this.live(), addressOf(this.split));
    const ms = (i: number) => this.split[i] / 1e6;
    return { scoreMs: ms(0) + ms(1), selectMs: ms(2), gatherMs: ms(3), handoffMs: ms(4) + ms(5) };
  }

  /** The last wait()'s jobs' reads of disk-tier rows (summed): reads issued (adjacent rows are one) and their bytes. */
  lastReads(): { reads: number; bytes: number } {
    const out = new BigInt64Array(2);
    this.lib.hg_stage_last_reads(this.live(), addressOf(out));
    return { reads: Number(out[0]), bytes: Number(out[1]) };
  }

  allLogits(): readonly Float32Array[] {
    if (this.pending > 0) fail("cpu stage: allLogits() while jobs are pending (wait() first)");
    return this.rows;
  }

  gather(job: CpuStageJob, selection: Selection): void {
    if (this.pending > 0) fail("cpu stage: gather() while a job is running (wait() first)");
    this.writeIds(job, selection);
    this.fill(job, GATHER | this.rowFlags(job), 0);
    this.check(Number(this.lib.hg_stage_run(this.handle!, this.jobPtr)));
  }

  output(slot: 0 | 1): CpuStageOutput {
    this.ready();
    const s = this.slot(slot);
    return {
      kmax: s.values.kmax, logits: s.logits, values: s.values.output(), keys: s.keysStaged && s.keys ? s.keys.output() : null, ids: s.idsView, counts: s.countsView,
    };
  }

  /** The slot's blocks; `table` is int32 [counts (kvHeads) | ids (kvHeads × kmax)] for the last job's kmax. */
  hostStaging(slot: 0 | 1): CpuStageStaging {
    this.ready();
    return slotStaging(this.slot(slot));
  }

  /** Pending jobs are cancelled (the running one ends first). */
  close(): void {
    if (!this.handle) return;
    if (this.pending > 0) {
      if (this.group.holds(this.lane)) this.group.flush();
      this.lib.hg_stage_cancel_lane(this.handle, this.lane);
      this.lib.hg_stage_wait_lane(this.handle, this.lane);
    }
    this.pending = 0;
    this.pendingKeys = [];
    this.handle = null;
    this.group.detach(this.lane);
    for (const s of this.slots) closeSlot(s);
    this.slots = [];
    this.sketches?.close();
    this.sketches = null;
    this.pages.close();
    this.indexes.close();
    for (const b of this.bufs) this.lib.hg_free(b.p, b.bytes);
    this.bufs.length = 0;
    this.rows = [];
  }

  [Symbol.dispose](): void {
    this.close();
  }

  // ---- internals ----------------------------------------------------------------------------

  /**
   * Validates the job, then writes hg_stage_job; every pointer it holds is checked here. Returns the
   * store K whose compressed copy or page summaries the job extends, if any.
   */
  private fill(job: CpuStageJob, flags: number, budget: number): CpuTensor | null {
    const shape = this.ready();
    checkStageJob(job, shape);
    checkSignal(job.done, "done");
    const k = this.store(job.k, "K"), v = this.store(job.v, "V");
    const s = this.slot(job.slot), set = (f: StageJobField, x: number) => this.job.set(f, x);
    s.values.kmax = job.kmax;
    if (s.keys) s.keys.kmax = job.kmax;
    s.keysStaged = job.keys === true;
    set("flags", flags);
    set("q", s.q.p);
    set("k", k.ptr); set("ktype", DTYPE_CODE[k.dtype]); set("kcap", shape.storeCapacity);
    set("v", v.ptr); set("vtype", DTYPE_CODE[v.dtype]); set("vcap", shape.storeCapacity);
    set("n", job.offloaded);
    set("heads", shape.heads); set("kv_heads", shape.kvHeads); set("head_dim", shape.headDim);
    set("all_logits", this.all!.p); set("lstride", shape.storeCapacity);
    set("ids", s.idsAddress); set("counts", s.table.p);
    set("kmax", job.kmax); set("budget", budget);
    set("sel_logits", s.sel.p); set("vstage", s.values.store.ptr); set("kstage", s.keys ? s.keys.store.ptr : 0);
    set("scale", job.scale);
    set("ready", job.ready?.address ?? 0); set("ready_value", job.ready?.value ?? 0);
    set("done", job.done?.address ?? 0); set("done_value", job.done?.value ?? 0);
    set("sinks", job.work.kind === "streaming" && (flags & STREAM) !== 0 ? job.work.sinks : 0);
    let extended: CpuTensor | null = null;
    const sk = this.sketches;
    if (sk && job.work.kind === "topk" && (flags & GATHER) !== 0 && (flags & TOPK) !== 0) {
      const { address, from } = sk.region(k, job.offloaded, job.storeEpoch);
      set("kq", address); set("kq_form", SCORING_CODE[sk.scoring]); set("kq_from", from);
      set("cand", Math.min(job.offloaded, budget * this.rescoreFactor));
      extended = k;
    } else {
      set("kq", 0); set("kq_form", 0); set("kq_from", 0); set("cand", 0);
    }
    if (job.work.kind === "quest" && (flags & QUEST) !== 0) {
      const { pageCapacity, bytes } = pageSummaryShape(shape.kvHeads, shape.storeCapacity, shape.headDim, job.work.pageSize);
      const { address, from } = this.pages.region(k, job.offloaded, String(job.work.pageSize), bytes, job.storeEpoch);
      set("pages", address); set("page_size", job.work.pageSize); set("page_cap", pageCapacity); set("pages_from", from);
      extended = k;
    } else if (job.work.kind === "index" && (flags & CHOSEN) !== 0) {
      const w = job.work, layout = pageIndexLayout(shape.kvHeads, shape.headDim, shape.storeCapacity, w.pageSize, w.superPages, w.form);
      set("pages", 0); set("page_size", w.pageSize); set("page_cap", layout.pageCapacity); set("pages_from", job.offloaded);
    } else if (job.work.kind === "index" && (flags & INDEX) !== 0) {
      const w = job.work, layout = pageIndexLayout(shape.kvHeads, shape.headDim, shape.storeCapacity, w.pageSize, w.superPages, w.form);
      const { address, from } = this.indexes.region(k, job.offloaded, `${w.form}/${w.pageSize}/${w.superPages}`, layout.bytes, job.storeEpoch);
      set("pages", address); set("page_size", w.pageSize); set("page_cap", layout.pageCapacity); set("pages_from", from);
      extended = k;
    } else {
      set("pages", 0); set("page_size", 0); set("page_cap", 0); set("pages_from", 0);
    }
    set("index_form", job.work.kind === "index" ? PAGE_INDEX_FORM_CODE[job.work.form] : 0);
    set("super_pages", job.work.kind === "index" ? job.work.superPages : 0);
    set("lane", this.lane);
    return extended;
  }

  /** The next job of `k` makes its compressed copy and page summaries afresh. */
  private forgetDerived(k: CpuTensor): void {
    this.sketches?.forget(k);
    this.pages.forget(k);
    this.indexes.forget(k);
  }

  /** K rows staged too (verified logits); none copied at all when the device gathers them from the mapped store. */
  private rowFlags(job: CpuStageJob): number {
    return (job.keys ? KEYS : 0) | (job.deviceGather ? NO_ROWS : 0);
  }

  /** Bytes of the compressed K copies (0 with full scoring). */
  get sketchBytes(): number {
    return this.sketches?.bytes ?? 0;
  }

  /** Copies a JS selection into the slot's id lists (length checked against the width). */
  private writeIds(job: CpuStageJob, selection: Selection): void {
    const { kvHeads } = this.ready();
    const s = this.slot(job.slot), kmax = job.kmax;
    if (!(Number.isInteger(kmax) && kmax >= 0 && kmax <= this.shape!.storeCapacity)) fail(`cpu stage: width ${kmax} out of range [0, ${this.shape!.storeCapacity}]`);
    if (selection.kind === "perKvHead" && selection.ids.length !== kvHeads) fail(`cpu stage: selection has ${selection.ids.length} lists, expected ${kvHeads}`);
    for (let g = 0; g < kvHeads; g++) {
      const ids = selectionForKvHead(selection, g);
      if (ids.length > kmax) fail(`cpu stage: KV head ${g} selected ${ids.length} tokens, more than the step's width ${kmax}`);
      // The C side checks again; here it names the culprit before anything is submitted.
      for (let i = 0; i < ids.length; i++) {
        const id = ids[i];
        if (!(id >= 0 && id < job.offloaded) || (i > 0 && id <= ids[i - 1])) {
          fail(`cpu stage: KV head ${g} selected slot ${id}, out of range [0, ${job.offloaded}) or not strictly ascending`);
        }
      }
      s.idsView.set(ids, g * kmax);
      s.countsView[g] = ids.length;
    }
  }

  private check(rc: number): void {
    if (rc === 0) return;
    if (rc === -1) fail("cpu stage: no job was submitted");
    if (rc === -2) fail("cpu stage: out of memory for scratch (top-K, or the queue of disk-tier reads)");
    if (rc === 1) {
      const buf = new Uint8Array(1024);
      this.lib.hg_stage_error(this.handle!, buf, buf.length);
      fail(new TextDecoder().decode(buf.subarray(0, buf.indexOf(0))));
    }
    fail(`cpu stage: selected id at list index ${-rc - 3} is out of range or not strictly ascending`);
  }

  private store(t: Tensor, what: string): CpuTensor {
    if (!(t instanceof CpuTensor) || t.owner !== this.backend) fail(`cpu stage: store ${what} is not a tensor of this CpuBackend`);
    if (t.dead) fail(`cpu stage: store ${what} was freed`);
    if (t.dtype !== this.shape!.dtype) fail(`cpu stage: store ${what} is ${t.dtype}, the stage was prepared for ${this.shape!.dtype}`);
    return t;
  }

  private alloc(bytes: number): NativeBuf {
    const p = this.lib.hg_alloc(bytes);
    if (!p) fail(`cpu stage: could not allocate ${bytes} bytes`);
    const b = { p: p as Pointer, bytes };
    this.bufs.push(b);
    return b;
  }

  private slot(i: 0 | 1): StageSlot {
    const s = this.slots[i];
    if (!s) fail(this.handle ? `cpu stage: slot ${i} does not exist (call prepare() first)` : "cpu stage used after close()");
    return s;
  }

  private live(): Pointer {
    if (!this.handle) fail("cpu stage used after close()");
    return this.handle;
  }

  private ready(): CpuStageShape {
    this.live();
    if (!this.shape) fail("cpu stage: prepare() was not called");
    return this.shape;
  }
}

const GroupOptionsSchema = NativeCpuStageOptionsSchema.pick({ threads: true, idleSpinUs: true, readyTimeoutMs: true, readDepth: true });
export type NativeStageGroupOptions = z.input<typeof GroupOptionsSchema>;

/** The most stages a group takes at once (HG_STAGE_LANES in native/cpu_stage.h). */
export const STAGE_GROUP_LANES = 64;

/**
 * One native stage (a coordinator and one pool of threads) that the sequences of a batch share, each
 * NativeCpuStage a lane of it: a lane's jobs run in order and its wait waits for them only. A batch's
 * stages defer their jobs here, and flush() sends what they deferred as one group, one job a lane,
 * that runs as one op over the pool — each job on one thread, each raising its own done as it ends —
 * where a stage each would run B coordinators on ⌊threads/B⌋ threads each. A group goes by itself
 * once every lane of the current step (join) has a job in it — every attached lane where no step was
 * joined —; a lane's wait() sends it too. The native stage is made at the first attach and goes with
 * the last detach.
 */
export class NativeStageGroup {
  readonly threads: number;
  readonly readDepth: number;
  readonly lanes: number;
  private readonly lib: StageLib;
  private readonly isa: number;
  private readonly options: z.output<typeof GroupOptionsSchema>;
  private current: Pointer | null = null;
  private readonly free: number[] = [];
  private attached = 0;
  private readonly words = STAGE_JOB_FIELDS.length;
  private readonly deferred: BigInt64Array;
  private readonly held: boolean[];
  private count = 0;
  /** The step whose lanes joined (null: a step of one lane, or none yet), its serial, and how many lanes joined it. */
  private step: object | null = null;
  private stepSerial = -1;
  private stepLanes = 0;

  constructor(backend: CpuBackend, options: NativeStageGroupOptions = {}, lanes: number = STAGE_GROUP_LANES) {
    const parsed = GroupOptionsSchema.safeParse(options);
    if (!parsed.success) fail(`NativeStageGroup options: ${parsed.error.issues[0].path.join(".") || "options"}: ${parsed.error.issues[0].message}`);
    if (!(Number.isInteger(lanes) && lanes >= 1 && lanes <= STAGE_GROUP_LANES)) fail(`NativeStageGroup: ${lanes} lanes, a group has 1..${STAGE_GROUP_LANES}`);
    this.lib = stageLib();
    this.isa = isaCode(chooseIsa(backend.isa));
    this.options = parsed.data;
    this.lanes = lanes;
    this.readDepth = parsed.data.readDepth;
    for (let l = lanes - 1; l >= 0; l--) this.free.push(l);
    this.deferred = new BigInt64Array(lanes * this.words);
    this.held = new Array(lanes).fill(false);
    const h = this.open();
    this.threads = this.lib.hg_stage_threads(h);
  }

  /** The native stage while a lane is attached (null before the first, after the last). */
  get handle(): Pointer | null {
    return this.current;
  }

  /** Groups of two jobs or more the open native stage ran: at once (a job a thread) and one after another over the whole pool (heavy jobs). */
  groupCounts(): { atOnce: number; inTurn: number } {
    if (!this.current) return { atOnce: 0, inTurn: 0 };
    const out = new BigInt64Array(2);
    this.lib.hg_stage_group_counts(this.current, addressOf(out));
    return { atOnce: Number(out[0]), inTurn: Number(out[1]) };
  }

  /** A free lane for a new stage (the native stage made if none is open). */
  attach(): number {
    const lane = this.free.pop();
    if (lane === undefined) fail(`cpu stage group: all ${this.lanes} lanes are taken (close a sequence's stage first)`);
    this.open();
    this.attached++;
    return lane;
  }

  /** A stage closed (its jobs ended): its lane is free; the last one closes the native stage. */
  detach(lane: number): void {
    this.held[lane] = false;
    this.free.push(lane);
    if (--this.attached > 0 || !this.current) return;
    this.step = null;
    this.stepLanes = 0;
    this.lib.hg_stage_destroy(this.current);
    this.current = null;
  }

  /** Whether `lane` has a job waiting for the next group. */
  holds(lane: number): boolean {
    return this.held[lane] === true;
  }

  /** Jobs deferred and not yet sent. */
  get waiting(): number {
    return this.count;
  }

  /**
   * A lane takes part in `step` (a batched step, told apart by its serial; null: a step of its own):
   * groups go by themselves once the step's lanes have a job each, so lanes attached but idle in this
   * step (a server's free slots) never keep a job waiting for a flush no caller makes.
   */
  join(step: { readonly serial: number } | null): void {
    if (step === null || step !== this.step || step.serial !== this.stepSerial) {
      this.flush(); // the step before's jobs never wait on the new step's count
      this.step = step;
      this.stepSerial = step?.serial ?? -1;
      this.stepLanes = 0;
    }
    this.stepLanes++;
  }

  /** The lane's job (its hg_stage_job words) joins the next group; a lane's second job sends the group first. */
  defer(lane: number, job: BigInt64Array): void {
    if (this.held[lane]) this.flush();
    this.deferred.set(job, this.count * this.words);
    this.held[lane] = true;
    const lanes = this.stepLanes > 0 ? Math.min(this.stepLanes, this.attached) : this.attached;
    if (++this.count >= lanes) this.flush();
  }

  /** The deferred jobs to the native stage, as one group. */
  flush(): void {
    if (this.count === 0) return;
    const n = this.count;
    this.count = 0;
    this.held.fill(false);
    const rc = this.lib.hg_stage_submit_group(this.current!, addressOf(this.deferred), n);
    if (rc !== 0) fail(`cpu stage group: the native stage refused a group of ${n} jobs (${rc === -1 ? "its queue is full" : "a lane out of range"})`);
  }

  private open(): Pointer {
    if (this.current) return this.current;
    const o = this.options, h = this.lib.hg_stage_create_lanes(o.threads, this.isa, this.lanes);
    if (!h) fail("NativeCpuStage: could not create the stage threads");
    const p = h as Pointer;
    this.lib.hg_stage_set_idle_spin(p, o.idleSpinUs * 1000);
    this.lib.hg_stage_set_ready_timeout(p, o.readyTimeoutMs * 1_000_000);
    this.lib.hg_stage_set_read_depth(p, o.readDepth);
    this.current = p;
    return p;
  }
}

/** A ready/done signal: a 4-byte-aligned host address and a 32-bit value. */
function checkSignal(x: HostSignal | undefined, what: string): void {
  if (x !== undefined && !(Number.isSafeInteger(x.address) && x.address > 0 && x.address % 4 === 0 && Number.isInteger(x.value) && x.value >= 0 && x.value <= 0xffffffff)) {
    fail(`cpu stage: ${what} must be a 4-byte-aligned host address and a 32-bit value`);
  }
}
