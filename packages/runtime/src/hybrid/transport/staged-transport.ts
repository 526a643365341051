/**
 * The staged transport: the CPU stage copies the selected V (and K) rows into its pinned buffers
 * and the copy stream uploads them with the selected logits, which land straight in the slot's
 * score rows. For file-backed tiers, pageable memory and devices that cannot gather rows from host
 * memory (chooseRowPath says why on the stats line).
 */
import type { Tensor, CpuStageOutput } from "@hybridgen/spec";
import { DeviceTransport } from "./device-transport.js";
import type { TransportName } from "./step-transport.js";

export class StagedTransport extends DeviceTransport {
  readonly name: TransportName = "staged";

  attend(layer: number, q: Tensor, out: Tensor): void {
    const s = this.step, d = this.d, slot = (layer & 1) as 0 | 1, scores = d.scores[slot]!;
    const kmax = s.layerKmax(layer);
    s.merge.scoreWindow(layer, q, scores, kmax);
    // The segment (from the last layer's A·V to this window's share) runs before the host blocks.
    this.collect(layer);
    this.submitAfter(layer);
    const outp = s.stage.output(slot), rescore = s.rescore[layer]!;
    const up = kmax > 0 ? d.upload(slot, kmax, rescore, this.stagedRows(layer)) : null;
    const keep = up ? s.layerKeep(layer) : 0, onDevice = keep > 0 && this.keepsOnDevice(layer);
    // Verified logits of a short list get −∞ written by the host, as do the dropped candidates the host keeps: that layer's segment starts after them.
    let hostWrites = keep > 0 && !onDevice;
    for (let g = 0; rescore && up !== null && g < s.layout.kvHeads; g++) hostWrites ||= outp.counts[g]! < kmax;
    if (!hostWrites) this.openSegment(layer);
    if (up) this.gatherRows(layer, slot, rescore, outp, onDevice);
    if (rescore && up) s.merge.verifiedLogits(scores, d.col, q, up.keys, outp.counts, kmax);
    if (onDevice) d.link.keepRows!([d.keepRow(layer, slot, keep, s.layout.groupSize)]);
    else if (keep > 0) s.merge.keepColumns(scores, d.col, outp.counts, kmax, keep);
    if (hostWrites) this.openSegment(layer);
    s.merge.softmaxAggregate(layer, scores, d.col, outp, up ? up.values : null, kmax, out);
  }

  /** Whether the stage's copies of `layer`'s rows come up (else the device gathers them: gatherRows). */
  protected stagedRows(_layer: number): boolean {
    return true;
  }

  /** Inside the layer's segment: rows the device gathers itself (none here; `keeps`: K rows alone, the kept V rows come with keepRows). */
  protected gatherRows(_layer: number, _slot: 0 | 1, _keys: boolean, _outp: CpuStageOutput, _keeps: boolean): void {}

  /**
   * Whether a verified layer that keeps some candidates keeps them on the device (keepRows: only the kept V rows come up); else
   * every candidate's rows came up and the host makes the dropped ones −∞ (StepMerge.keepColumns: what keepRows writes).
   */
  protected keepsOnDevice(_layer: number): boolean {
    return false;
  }
}
