/**
 * A hybrid step's accounting: the host's clock through the step (its waits for the CPU stage, the
 * stage's JS work, host copies, the stage's busy time and phases), and at the step's end the
 * scheduler's inputs — T_gpu, T_cpu, T_tx and the wait — from the transport's device times where it
 * has them, else from the host's wall time, added to the stats.
 */
import type { StepTimings, CpuStage } from "@hybridgen/spec";
import type { HybridStats } from "./hybrid-stats.js";
import type { StepPlan } from "./step-plan.js";
import type { StepTimes } from "./transport/step-transport.js";

export class StepAccount {
  private start = 0;
  /** The host's waits for the stage, the stage's JS work (selectors, gathers), host copies, the stage's busy time (ms). */
  private wait = 0;
  private js = 0;
  private tx = 0;
  private cpu = 0;
  /** The step's CPU-stage phases: score, top-K, gather, hand-offs (ms). */
  private readonly split = [0, 0, 0, 0];

  constructor(private readonly stats: HybridStats, private readonly stage: CpuStage) {}

  begin(): void {
    this.start = performance.now();
    this.wait = this.js = this.tx = this.cpu = 0;
    this.split.fill(0);
  }

  /** The host waits for every job submitted since the last wait (collect, or a handed-off step's end). */
  waitForStage(): void {
    const t0 = performance.now();
    this.cpu += this.stage.wait();
    this.wait += performance.now() - t0;
    const split = this.stage.lastSplit?.();
    if (!split) return;
    const st = this.stats, s = this.split;
    st.cpuScoreMs += split.scoreMs;
    st.cpuSelectMs += split.selectMs;
    st.cpuGatherMs += split.gatherMs;
    st.handoffMs += split.handoffMs;
    s[0] += split.scoreMs;
    s[1] += split.selectMs;
    s[2] += split.gatherMs;
    s[3] += split.handoffMs;
  }

  /** JS work of the stage since t0 (a selector, a gather after it). */
  jsSince(t0: number): void {
    this.js += performance.now() - t0;
  }

  addTx(ms: number): void {
    this.tx += ms;
  }

  /**
   * The step's end, after the device ran it: its timings for the scheduler, recorded in the stats.
   * `deviceTimes`: the transport's (null: the host's wall less its waits, JS work and copies), read
   * after the host's own part of the step is timed, since reading them waits for the device;
   * `handedOff`: the device, not the host, waited for the stage (times.waitMs).
   */
  finish(plan: StepPlan, deviceTimes: () => StepTimes, handedOff: boolean, o: { step: number; k: number; layers: number; indexSyncMs?: number }): StepTimings {
    const wall = performance.now() - this.start, issueMs = Math.max(0, wall - this.wait);
    const times = deviceTimes();
    const device = times ? times.gpuMs : Math.max(0, wall - this.wait - this.js - this.tx);
    if (times) this.tx = times.txMs;
    const held = times && handedOff ? times.waitMs ?? 0 : this.wait; // what the CPU stage held the step up by
    const st = this.stats;
    st.steps++;
    if (handedOff) st.handedOffSteps++;
    st.offloaded = plan.offloaded;
    st.cpuStageMs += this.cpu;
    st.cpuJsMs += this.js;
    st.waitMs += held;
    st.issueMs += issueMs;
    st.deviceMs += device;
    st.txMs += this.tx;
    const timings: StepTimings = {
      step: o.step, tGpuMs: device, tCpuMs: this.cpu + this.js, tTxMs: this.tx, tWaitMs: held,
      k: o.k, timing: plan.timing, offloaded: plan.offloaded, layers: o.layers,
    };
    // the scheduler's inputs per step (stats trace, --json), and what the stats line's median step reads
    const segments = times?.segmentMs === undefined ? undefined : { segmentMs: times.segmentMs, hostWaitMs: times.hostWaitMs ?? 0 };
    st.record(timings, performance.now() - this.start, { issueMs, split: this.stage.lastSplit ? this.split : undefined, indexSyncMs: o.indexSyncMs, segments });
    return timings;
  }
}
