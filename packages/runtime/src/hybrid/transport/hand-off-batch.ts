/**
 * The hand-offs of a batched step's rows as one device op a layer: each row's handed-off layer
 * joins with its HandOffRow before any row attends (prepareAttend), and the first row to attend
 * issues every joined row's in one HostTransfers.handOffRows call — a wait for every row's stage,
 * then one launch of every row's logits read and row gathers, where each row's own would be a wait,
 * a read and a gather or two. One per link (HandOffBatch.of): a link runs one batched step at a time.
 */
import type { DecodeBatchStep } from "@hybridgen/core";
import { type HandOffRow, type HostTransfers, fail } from "@hybridgen/spec";

const perLink = new WeakMap<HostTransfers, HandOffBatch>();

export class HandOffBatch {
  private step: DecodeBatchStep | null = null;
  private serial = -1;
  private layer = -1;
  private readonly rows: HandOffRow[] = [];
  private issued = false;
  /** handOffRows calls made (a test counts them: one a layer a step). */
  calls = 0;

  /** The link's. */
  static of(link: HostTransfers): HandOffBatch {
    let b = perLink.get(link);
    if (!b) perLink.set(link, (b = new HandOffBatch(link)));
    return b;
  }

  private constructor(private readonly link: HostTransfers) {
    if (!link.handOffRows) fail("hybrid attention: the host link hands off no batch of rows (handOffRows)");
  }

  /** A row's hand-off of `layer` in `step` (its current serial); a new step or layer starts a new batch. */
  join(step: DecodeBatchStep, layer: number, row: HandOffRow): void {
    if (!this.current(step, layer)) {
      this.step = step;
      this.serial = step.serial;
      this.layer = layer;
      this.rows.length = 0;
      this.issued = false;
    }
    if (this.issued) fail(`hybrid attention: a row joined layer ${layer}'s batched hand-off after it was issued`);
    this.rows.push(row);
  }

  /** Every joined row's hand-off of `layer`, on the first call of the layer; later calls find it issued. */
  issue(step: DecodeBatchStep, layer: number): void {
    if (!this.current(step, layer)) fail(`hybrid attention: layer ${layer}'s batched hand-off was never prepared`);
    if (this.issued) return;
    this.issued = true;
    this.calls++;
    this.link.handOffRows!(this.rows);
  }

  private current(step: DecodeBatchStep, layer: number): boolean {
    return step === this.step && step.serial === this.serial && layer === this.layer;
  }
}
