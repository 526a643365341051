/**
 * The mapped transport: the device gathers a layer's selected V (and K) rows itself from the host
 * store — pinned memory mapped into its address space — by the ids the stage chose, inside the
 * layer's recorded segment; the stage writes only ids, counts and logits (no CPU copy, no staging
 * DMA). A layer whose store the device does not map (a file-backed tier, pageable memory) stays
 * staged, as the staged transport does it.
 */
import type { CpuStageOutput } from "@hybridgen/spec";
import { StagedTransport } from "./staged-transport.js";
import type { TransportName } from "./step-transport.js";

export class MappedTransport extends StagedTransport {
  override readonly name: TransportName = "mapped";

  override jobLink(layer: number): ReturnType<StagedTransport["jobLink"]> {
    return { ...super.jobLink(layer), deviceGather: this.rowPaths[layer] === "mapped" };
  }

  protected override stagedRows(layer: number): boolean {
    return this.rowPaths[layer] !== "mapped";
  }

  protected override gatherRows(layer: number, slot: 0 | 1, keys: boolean, outp: CpuStageOutput): void {
    if (this.rowPaths[layer] === "mapped") this.d.gatherRows(layer, slot, keys, outp.ids, outp.counts);
  }
}
