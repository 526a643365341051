/**
 * A CPU stage that, once a layer's selected rows are gathered, tells the store's allocator
 * which slots they were (KvStoreAllocator.readAhead): with V in files of the disk tier, the
 * next layer's same slots are read ahead while this layer's attention runs — except after the
 * page index's jobs, whose own pages are the only reads (the stage gets each layer's a layer
 * early with q̃). Everything else is the wrapped stage's. With a queue of jobs, the store hears
 * the last job of each wait().
 */
import type {
  CpuStage, CpuStageJob, CpuStageOutput, CpuStageShape, CpuStageSplit, CpuStageStaging, KvStoreAllocator, OffloadedKeys, Selection, SelectorPrimitives, Tensor,
} from "@hybridgen/core";

type ReadAhead = NonNullable<KvStoreAllocator["readAhead"]>;

export class ReadAheadStage implements CpuStage {
  private last: CpuStageJob | null = null;

  constructor(private readonly inner: CpuStage, private readonly readAhead: ReadAhead) {}

  get name(): string {
    return this.inner.name;
  }
  get concurrent(): boolean {
    return this.inner.concurrent;
  }
  get waitsForSignal(): boolean | undefined {
    return this.inner.waitsForSignal;
  }
  get queueDepth(): number | undefined {
    return this.inner.queueDepth;
  }
  get takesChosenPages(): boolean | undefined {
    return this.inner.takesChosenPages;
  }
  get scoring(): string | undefined {
    return this.inner.scoring;
  }
  get rescoreFactor(): number | undefined {
    return this.inner.rescoreFactor;
  }
  get primitives(): SelectorPrimitives | undefined {
    return this.inner.primitives;
  }
  prepare(shape: CpuStageShape): void {
    this.inner.prepare(shape);
  }
  query(slot: 0 | 1): Float32Array {
    return this.inner.query(slot);
  }
  chosenPages(slot: 0 | 1): Int32Array {
    return this.inner.chosenPages!(slot);
  }
  submit(job: CpuStageJob): void {
    this.last = job;
    this.inner.submit(job);
  }
  wait(): number {
    const ms = this.inner.wait();
    const job = this.last;
    if (job && job.work.kind !== "score") this.tell(job); // "score" jobs gather later, in gather()
    return ms;
  }
  cancel(): void {
    this.inner.cancel?.();
  }
  allLogits(): readonly Float32Array[] {
    return this.inner.allLogits();
  }
  gather(job: CpuStageJob, selection: Selection): void {
    this.inner.gather(job, selection);
    this.tell(job);
  }
  output(slot: 0 | 1): CpuStageOutput {
    return this.inner.output(slot);
  }
  hostStaging(slot: 0 | 1): CpuStageStaging {
    return this.inner.hostStaging!(slot);
  }
  lastSplit(): CpuStageSplit {
    return this.inner.lastSplit!();
  }
  offloadedKeys(k: Tensor): OffloadedKeys {
    return this.inner.offloadedKeys!(k);
  }
  close(): void {
    this.inner.close();
  }
  [Symbol.dispose](): void {
    this.close();
  }

  private tell(job: CpuStageJob): void {
    const out = this.inner.output(job.slot);
    this.readAhead(job.v, out.ids, out.counts, out.kmax, job.work.kind !== "index");
  }
}
