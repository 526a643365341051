/** The counters every offloading decode attention keeps (hybrid and the AoG/AoC baselines), defined once so their stats lines count alike. */
export class OffloadCounters {
  /** Decode steps that ran with some tokens offloaded. */
  steps = 0;
  /** Layer-steps of those. */
  layerSteps = 0;
  /** Offloaded tokens per layer at the last step. */
  offloaded = 0;

  /** `x` per counted step (0 before any). */
  perStep(x: number): number {
    return this.steps ? x / this.steps : 0;
  }

  /** `x` per counted layer-step (0 before any). */
  perLayerStep(x: number): number {
    return this.layerSteps ? x / this.layerSteps : 0;
  }

  /** Zeroes the step counts (a subclass's reset() adds its own fields). */
  protected resetCounts(): void {
    this.steps = this.layerSteps = this.offloaded = 0;
  }
}
