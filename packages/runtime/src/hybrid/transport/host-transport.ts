/**
 * The host transport: the backend reads the CPU stage's buffers itself (the CPU backend, where the
 * "device window" and the offloaded store are both in RAM). The query is read out of the backend
 * into the stage's buffer, the selected logits written into the concatenated row at the store's
 * column, and the staged V (and K) rows are tensors the backend reads in place; the step's times
 * are host wall times. Verified layers that keep some candidates make the rest −∞ here (the stage
 * staged every candidate's V row, which then weighs nothing).
 */
import type { Attention } from "@hybridgen/core";
import type { Tensor } from "@hybridgen/spec";
import type { StepDriver, StepTimes, StepTransport } from "./step-transport.js";

export class HostTransport implements StepTransport {
  readonly name = "host" as const;
  readonly rowPaths = [] as const;
  readonly note = "transport host";

  constructor(private readonly step: StepDriver, private readonly attention: Attention) {}

  newSequence(): void {}
  startStep(): void {}
  syncStore(): void {}
  flush(): void {}

  planned(): boolean {
    return false;
  }

  sendQuery(layer: number, q: Tensor, bytes?: number): void {
    const t0 = performance.now(), { heads, headDim } = this.step.layout, slot = (layer & 1) as 0 | 1, width = heads * headDim;
    const row = this.attention.backend.read(q, 0, Math.max(width, Math.ceil((bytes ?? 0) / 4)));
    this.step.stage.query(slot).set(row.subarray(0, width));
    if (row.length > width) this.step.stage.chosenPages!(slot).set(new Int32Array(row.buffer, row.byteOffset + width * 4, row.length - width));
    this.step.addTx(performance.now() - t0);
  }

  sendRanked(layer: number, rank: () => void, q: Tensor, bytes: number): void {
    rank();
    this.sendQuery(layer, q, bytes);
  }

  jobLink(): { deviceGather: boolean } {
    return { deviceGather: false };
  }

  attend(layer: number, q: Tensor, out: Tensor): void {
    const s = this.step, a = this.attention, be = a.backend, c = a.cache, heads = s.layout.heads, slot = (layer & 1) as 0 | 1;
    const kmax = s.layerKmax(layer), scores = a.scores, width = c.maxContext, S = c.storeStart;
    // The window's share while the CPU stage runs.
    s.merge.scoreWindow(layer, q, scores, kmax);
    s.collect(layer);
    s.submitNext(layer);
    const outp = s.stage.output(slot);
    if (s.rescore[layer]) {
      if (kmax > 0) s.merge.verifiedLogits(scores, S, q, outp.keys, outp.counts, kmax);
      const keep = s.layerKeep(layer);
      if (keep > 0) s.merge.keepColumns(scores, S, outp.counts, kmax, keep);
    } else {
      const t0 = performance.now();
      for (let h = 0; h < heads && kmax > 0; h++) be.write(scores, outp.logits.subarray(h * kmax, (h + 1) * kmax), h * width + S);
      s.addTx(performance.now() - t0);
    }
    s.merge.softmaxAggregate(layer, scores, S, outp, kmax > 0 ? outp.values : null, kmax, out);
  }

  stepTimes(): StepTimes {
    return null;
  }

  close(): void {}

  [Symbol.dispose](): void {
    this.close();
  }
}
