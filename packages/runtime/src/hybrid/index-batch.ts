/**
 * The page indexes of a batched step's sequences ranked together: every sequence (a HybridAttention
 * with its DeviceIndex) that ranks a layer ahead on the device joins the step, and the first of them
 * to send that layer's query ranks every joined sequence's pages in one Backend.indexRankRows call —
 * one launch a layer for the whole batch, where each sequence's own ranking would be one launch each
 * (each a few tens of µs of the kernel's fixed cost, in series). The queries are the batch's (one
 * batched q̃ projection), so every row's exists when the first asks. A backend without
 * indexRankRows ranks the rows one by one in the same place. One per backend (IndexBatch.of): the
 * sequences of a batch attach one by one, and a backend runs one batched step at a time.
 */
import type { DecodeBatchStep } from "@hybridgen/core";
import { type Backend, type DeviceIndexShape, type IndexRankRow } from "@hybridgen/spec";
import type { RankedQuery } from "./device-index.js";
import { StepMark, perOwner } from "./step-scope.js";

/** A sequence of the batch as the ranking sees it. */
export interface IndexBatchMember {
  /** Layer's ranking arguments with this step's query (copied into the output already); null ranks nothing (no page wanted). */
  indexRow(layer: number): { readonly row: IndexRankRow | null; readonly ranked: RankedQuery } | null;
}

const sameShape = (a: DeviceIndexShape, b: DeviceIndexShape) =>
  a.form === b.form && a.kvHeads === b.kvHeads && a.group === b.group && a.headDim === b.headDim && a.pageCapacity === b.pageCapacity && a.scalesOffset === b.scalesOffset;


export class IndexBatch {
  private readonly mark = new StepMark();
  private shape: DeviceIndexShape | null = null;
  private readonly members: IndexBatchMember[] = [];
  /** Per layer of this step: each joined member's ranking (undefined: not ranked yet). */
  private ranked: (Map<IndexBatchMember, RankedQuery> | undefined)[] = [];
  /** Backend calls that ranked rows (a test counts them: one a layer a step). */
  calls = 0;

  /** The backend's. */
  static readonly of = perOwner((backend: Backend) => new IndexBatch(backend));

  private constructor(private readonly backend: Backend) {}

  /** `m` ranks on the device in `step` (its current serial); false where its index's shape differs from the step's first (it ranks alone). */
  join(step: DecodeBatchStep, m: IndexBatchMember, shape: DeviceIndexShape): boolean {
    if (this.mark.moveTo(step)) {
      this.members.length = 0;
      this.ranked = [];
      this.shape = shape;
    }
    if (!sameShape(this.shape!, shape)) return false;
    this.members.push(m);
    return true;
  }

  /** Member m's ranking of `layer` in `step`, every member's ranked at once on the first ask; null where m's is not among them (it ranks alone). */
  rank(step: DecodeBatchStep, layer: number, m: IndexBatchMember): RankedQuery | null {
    if (!this.mark.holds(step)) return null;
    let done = this.ranked[layer];
    if (!done) {
      done = new Map();
      const rows: IndexRankRow[] = [];
      for (const x of this.members) {
        const r = x.indexRow(layer);
        if (!r) continue;
        done.set(x, r.ranked);
        if (r.row) rows.push(r.row);
      }
      this.rankRows(rows);
      this.ranked[layer] = done;
    }
    return done.get(m) ?? null;
  }

  private rankRows(rows: readonly IndexRankRow[]): void {
    if (rows.length === 0) return;
    const be = this.backend;
    this.calls++;
    if (be.indexRankRows) return be.indexRankRows(rows, this.shape!);
    for (const r of rows) be.indexRank!(r.out, r.outOffset, r.index, this.shape!, r.q, r.count, r.want, r.scratch);
  }
}
