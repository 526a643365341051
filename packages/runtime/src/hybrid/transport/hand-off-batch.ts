/**
 * The hand-offs of a batched step's rows as one device op a layer: each row's handed-off layer
 * joins with its HandOffRow (and its window's partial) before any row attends (prepareAttend), and
 * the first row to attend issues every joined row's window partial in one Backend.attnPartialRows,
 * then their hand-offs in one HostTransfers.handOffRows call — a wait for every row's stage,
 * then one launch of every row's logits read and row gathers, where each row's own would be a wait,
 * a read and a gather or two; then every verified row's logits as one HostTransfers.rescoreRows, and
 * the kept candidates' V rows of the rows that keep some as one HostTransfers.keepRows. The
 * rows' merges go as one op too, once the last row's is in.
 * One per link (HandOffBatch.of): a link runs one batched step at a time.
 */
import type { DecodeBatchStep } from "@hybridgen/core";
import { type AttnMergeRow, type AttnPartialRow, type Backend, type HandOffRow, type RowFetch, type RowFetchRow, type HostTransfers, type KeepRow, type RescoreRow, fail } from "@hybridgen/spec";
import { StepMark, perOwner } from "../step-scope.js";

export class HandOffBatch {
  private readonly mark = new StepMark();
  private layer = -1;
  private readonly rows: HandOffRow[] = [];
  /** The joined rows' verified logits (rows that score their K rows themselves). */
  private readonly rescores: RescoreRow[] = [];
  /** The joined rows' kept candidates (rows that keep some of their verified candidates). */
  private readonly keeps: KeepRow[] = [];
  /** The joined rows' window partials (rows whose window's logits are not materialised). */
  private readonly partials: AttnPartialRow[] = [];
  /** Rows fetched ahead for the whole batch on the link's side stream (null: the link fetches no batch; the hand-offs gather). */
  private readonly fetcher: RowFetch | null;
  /** The next layer's rows of the rows that attended so far, fetched as one once the last row's merge is issued. */
  private readonly nextFetch: RowFetchRow[] = [];
  /** The layer of this step whose rows the batch's fetch brings (−1: none). */
  private fetchedLayer = -1;
  private issued = false;
  /** The joined rows' merges so far (null: a row that merged on its own). */
  private readonly merges: (AttnMergeRow | null)[] = [];
  /** handOffRows calls made (a test counts them: one a layer a step), and merges and window partials made for the whole batch at once. */
  calls = 0;
  mergeCalls = 0;
  partialCalls = 0;
  /** Batched fetches issued (one a layer after the first of each batched step, where the link fetches ahead). */
  fetchCalls = 0;

  /** The link's. */
  static readonly of = perOwner((link: HostTransfers) => new HandOffBatch(link));

  private constructor(private readonly link: HostTransfers) {
    if (!link.handOffRows) fail("hybrid attention: the host link hands off no batch of rows (handOffRows)");
    const f = link.rowFetch?.() ?? null;
    this.fetcher = f?.fetchRows ? f : null;
    if (f && !this.fetcher) f.close();
  }

  /** Whether the batch fetches its rows' next layer ahead (joinFetch). */
  get fetchesAhead(): boolean {
    return this.fetcher !== null;
  }

  /**
   * A row's next layer (`layer` + 1) fetched ahead with the batch's, after it attended `layer`: one
   * fetchRows on the side stream once every row's merge of `layer` is issued (the slot it fills was
   * released by the layer before's segment, which has launched).
   */
  joinFetch(step: DecodeBatchStep, layer: number, row: RowFetchRow): void {
    if (!this.current(step, layer) || !this.issued || !this.fetcher) fail(`hybrid attention: a row fetched layer ${layer + 1} ahead outside layer ${layer}'s batched hand-off`);
    this.nextFetch.push(row);
  }

  /** A row's hand-off of `layer` in `step` (its current serial); a new step or layer starts a new batch. */
  join(step: DecodeBatchStep, layer: number, row: HandOffRow, rescore: RescoreRow | null, keep: KeepRow | null = null, partial: AttnPartialRow | null = null): void {
    if (!this.current(step, layer)) {
      // A new step: no fetch of the last one's is pending (its last layer fetches nothing).
      if (this.mark.moveTo(step)) this.fetchedLayer = -1;
      this.layer = layer;
      this.rows.length = 0;
      this.rescores.length = 0;
      this.keeps.length = 0;
      this.partials.length = 0;
      this.merges.length = 0;
      this.nextFetch.length = 0;
      this.issued = false;
    }
    if (this.issued) fail(`hybrid attention: a row joined layer ${layer}'s batched hand-off after it was issued`);
    this.rows.push(row);
    if (rescore) this.rescores.push(rescore);
    if (keep) this.keeps.push(keep);
    if (partial) this.partials.push(partial);
  }

  /** Every joined row's window partial and hand-off of `layer`, on the first call of the layer; later calls find it issued. */
  issue(backend: Backend, step: DecodeBatchStep, layer: number): void {
    if (!this.current(step, layer)) fail(`hybrid attention: layer ${layer}'s batched hand-off was never prepared`);
    if (this.issued) return;
    this.issued = true;
    this.calls++;
    if (this.partials.length > 0) {
      this.partialCalls++;
      if (backend.attnPartialRows) backend.attnPartialRows(this.partials);
      else for (const p of this.partials) backend.attnPartial!(p.part, p.q, p.qRow, p.k, p.v, p.spans, p.scale);
    }
    // Rows fetched ahead at the layer before: the compute stream waits for them (their hand-offs gather none).
    if (this.fetchedLayer === layer) this.fetcher!.ready((layer & 1) as 0 | 1);
    this.link.handOffRows!(this.rows);
    if (this.rescores.length > 0) this.link.rescoreRows!(this.rescores);
    if (this.keeps.length > 0) this.link.keepRows!(this.keeps);
  }

  /**
   * A joined row's merge of `layer` (after its verified logits; null: it merged on its own): the
   * last row's goes with every row's as one Backend.attnMergeRows (each row's attnMerge where the
   * backend has none), before anything reads the rows' outputs; then the fetched rows' slot is
   * released and the rows' next layer is fetched (joinFetch).
   */
  merge(backend: Backend, step: DecodeBatchStep, layer: number, row: AttnMergeRow | null): void {
    if (!this.current(step, layer) || !this.issued) fail(`hybrid attention: layer ${layer}'s merge before its batched hand-off`);
    this.merges.push(row);
    if (this.merges.length < this.rows.length) return;
    const rows = this.merges.filter((m): m is AttnMergeRow => m !== null);
    this.merges.length = 0;
    if (rows.length > 0) {
      this.mergeCalls++;
      if (backend.attnMergeRows) backend.attnMergeRows(rows);
      else for (const m of rows) backend.attnMerge!(m.out, m.outRow, m.part, m.logits, m.col, m.v, m.start, m.count);
    }
    // The fetched rows are consumed: their slot may be refilled; then the rows' next layer goes on the side stream.
    if (this.fetchedLayer === layer) this.fetcher!.release((layer & 1) as 0 | 1);
    if (this.nextFetch.length > 0) {
      this.fetcher!.fetchRows!(((layer + 1) & 1) as 0 | 1, this.nextFetch);
      this.fetchedLayer = layer + 1;
      this.fetchCalls++;
      this.nextFetch.length = 0;
    }
  }

  private current(step: DecodeBatchStep, layer: number): boolean {
    return this.mark.holds(step) && layer === this.layer;
  }
}
