import { OffloadCounters } from "../offload-counters.js";

/** Counters of a baseline decode attention (AoG, AoC), for bench tables and --json. */
export class BaselineStats extends OffloadCounters {
  /** Wall time from beginStep to endStep, summed (ms). */
  stepMs = 0;
  /** Host ↔ device bytes the method moves for attention (AoG: K and V rows; AoC: q, partial output, logits). */
  bytesMoved = 0;
  /** AoC: time in the CPU's attention over the offloaded rows, summed (ms). */
  cpuMs = 0;
  /** AoC: layer steps whose reference logit (the argmax's value) was off and that were scored again. */
  refMisses = 0;
  /** AoC: layer steps that found each head's maximum logit by a scan (after a miss). */
  maxScans = 0;

  summary(name: string): string {
    return `${name}: ${this.steps} steps, ${this.offloaded} offloaded, ${(this.perStep(this.bytesMoved) / 1e6).toFixed(2)} MB moved/step` +
      (this.cpuMs ? `, CPU attention ${this.perStep(this.cpuMs).toFixed(2)} ms/step, ${this.maxScans} max scans and ${this.refMisses} misses in ${this.layerSteps} layer steps` : "");
  }
}
