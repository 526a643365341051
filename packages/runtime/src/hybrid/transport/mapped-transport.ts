/**
 * The mapped transport: the device gathers a layer's selected V (and K) rows itself from the host
 * store — pinned memory mapped into its address space — by the ids the stage chose, inside the
 * layer's recorded segment; the stage writes only ids, counts and logits (no CPU copy, no staging
 * DMA). A layer whose store the device does not map (a file-backed tier, pageable memory) stays
 * staged, as the staged transport does it. A verified layer that keeps some candidates gathers their K
 * rows, scores them, then keeps its best on the device and brings up only their V rows (keepRows,
 * where the link has it and maps the stage's tables; else the host drops the rest, as staged).
 */
import type { CpuStageOutput } from "@hybridgen/spec";
import { StagedTransport } from "./staged-transport.js";
import type { TransportName } from "./step-transport.js";

export class MappedTransport extends StagedTransport {
  override readonly name: TransportName = "mapped";
  /** The link keeps candidates' rows (keepRows) by the stage's tables, which it maps. */
  private readonly keepRows = this.d.link.keepRows !== undefined && this.d.tablesMapped();

  override jobLink(layer: number): ReturnType<StagedTransport["jobLink"]> {
    return { ...super.jobLink(layer), deviceGather: this.rowPaths[layer] === "mapped" };
  }

  protected override stagedRows(layer: number): boolean {
    return this.rowPaths[layer] !== "mapped";
  }

  protected override gatherRows(layer: number, slot: 0 | 1, keys: boolean, outp: CpuStageOutput, keeps: boolean): void {
    if (this.rowPaths[layer] === "mapped") this.d.gatherRows(layer, slot, keys, outp.ids, outp.counts, keeps);
  }

  /** A mapped layer keeps on the device where the link keeps rows by the stage's table in memory it maps. */
  protected override keepsOnDevice(layer: number): boolean {
    return this.rowPaths[layer] === "mapped" && this.keepRows;
  }
}
