/**
 * PrefillCalibrator: calibrates hybrid attention from the prompt itself. On a prompt's last
 * prefill block it samples the last rows (a few KV heads each), and per layer scores them over
 * every earlier position twice — with the true query q and with the speculative q̃ projected from
 * the previous layer's input, as the decode steps will — to measure q̃'s recall of the true top-K
 * and the attention mass K tokens capture (calibration.ts). The work is bounded: the samples a
 * layer shrink as the context and the model grow (CALIBRATION_BUDGET), to no fewer than 1.
 */
import type { Tensor } from "@hybridgen/spec";
import type { Attention, PrefillObserver, QueryProjector } from "@hybridgen/core";
import { fail } from "@hybridgen/spec";
import {
  calibrationGrid, calibrationSumsTs, decideCalibration, LayerCalibration, sampleSumsLength, type CalibrationResult, type CalibrationSums,
} from "./calibration.js";

/** Token visits (offloaded tokens × query heads of a sample, summed over samples and layers) a calibration makes at most. */
export const CALIBRATION_BUDGET = 4 * 1024 * 1024;
/** Bounds on the (row, KV head) samples per layer. */
const MIN_SAMPLES = 1, MAX_SAMPLES = 32;
/** KV heads sampled per row (rotating over the rows, so every head is seen). */
const KV_PER_ROW = 2;

export interface PrefillCalibratorOptions {
  readonly massTarget: number;
  /** Verified logits' candidate multiplier (1: q̃ chooses K tokens). */
  readonly candidates: number;
  /** Layers that select with the true query whatever the calibration finds ("all": exact logits); absent: the calibration chooses them. */
  readonly exact?: readonly number[] | "all";
  /** A layer's K is at most this share of the offloaded tokens, of √(CAP_REFERENCE·offloaded) past CAP_REFERENCE (default DEFAULT_MAX_SHARE; see layerKCap). */
  readonly maxShare?: number;
  /** (row, KV head) samples per layer (default: from CALIBRATION_BUDGET, within 8 … 32). */
  readonly samples?: number;
  /** Computes the samples' sums (default: calibrationSumsTs on the driving thread; the runtime passes kernels-cpu's native one). */
  readonly sums?: CalibrationSums;
  /** Called at the end of each calibrated prompt. */
  readonly onResult: (r: CalibrationResult) => void;
}

interface Sampled {
  /** Block row, and the KV heads it samples. */
  readonly row: number;
  readonly kvHeads: readonly number[];
  readonly to: number;
  /** Samples of the layer before this row's. */
  readonly first: number;
}

export class PrefillCalibrator implements PrefillObserver, Disposable {
  private readonly layers: number;
  private readonly heads: number;
  private readonly kvHeads: number;
  private readonly group: number;
  private readonly qDim: number;
  /** q̃ rows of the next layer, by layer parity ([rows, heads·headDim]). */
  private spec: (Tensor | null)[] = [null, null];
  private scores: Tensor | null = null;
  private specScores: Tensor | null = null;
  /** Every sampled group's rows of every layer, read back once at blockEnd. */
  private stash: Tensor | null = null;
  private sampled: Sampled[] = [];
  private samplesPerLayer = 0;
  private acc: LayerCalibration[] = [];
  private ms = 0;
  private closed = false;
  last: CalibrationResult | null = null;
  /** What the last prompt's decision is made from besides the sums. */
  private decided: { offloaded: number; tokens: number; samples: number } | null = null;

  constructor(
    private readonly attention: Attention,
    private readonly projector: QueryProjector,
    private readonly o: PrefillCalibratorOptions,
  ) {
    const c = attention.cache;
    if (c.storeCapacity === 0) fail("prefill calibration: the KV window holds the whole context (nothing is offloaded)");
    this.layers = c.layers;
    ({ heads: this.heads, kvHeads: this.kvHeads } = attention.layout);
    this.group = this.heads / this.kvHeads;
    this.qDim = this.heads * attention.layout.headDim;
  }

  /** Shows `attention`'s prompts' last blocks to a new calibrator. */
  static attach(attention: Attention, projector: QueryProjector, o: PrefillCalibratorOptions): PrefillCalibrator {
    const p = new PrefillCalibrator(attention, projector, o);
    attention.setPrefillObserver(p);
    return p;
  }

  blockInput(layer: number, x: Tensor, n: number, pos0: number): void {
    const t0 = performance.now();
    if (layer === 0) this.begin(n, pos0);
    const next = layer + 1;
    if (this.sampled.length > 0 && next < this.layers) {
      const be = this.attention.backend, hidden = x.shape[x.shape.length - 1]!, out = this.spec[next & 1]!;
      this.sampled.forEach((s, r) => {
        this.projector.projectQuery(next, be.view(x, s.row * hidden, [1, hidden]), pos0 + s.row, be.view(out, r * this.qDim, [1, this.qDim]));
      });
    }
    this.ms += performance.now() - t0;
  }

  blockQueries(layer: number, q: Tensor, _n: number, pos0: number): void {
    if (this.sampled.length === 0) return;
    const t0 = performance.now();
    const a = this.attention, be = a.backend, stash = this.stash!;
    const spec = layer === 0 ? null : this.spec[layer & 1]!;
    // Device work only (logits, a softmax, row copies into the stash): nothing is read back before
    // blockEnd, so a device backend keeps running the prefill's layers ahead of the host.
    this.sampled.forEach((s, r) => {
      const pos = pos0 + s.row;
      a.rowLogits(layer, q, s.row, pos, this.scores!);
      if (spec) a.rowLogits(layer, spec, r, pos, this.specScores!);
      s.kvHeads.forEach((g, i) => {
        const at = this.stashRow(layer, r, i);
        be.copyRows(stash, at, this.scores!, g * this.group, this.group);
        if (spec) be.copyRows(stash, at + this.group, this.specScores!, g * this.group, this.group);
      });
      be.softmax(this.scores!, this.heads, pos + 1);
      s.kvHeads.forEach((g, i) => be.copyRows(stash, this.stashRow(layer, r, i) + 2 * this.group, this.scores!, g * this.group, this.group));
    });
    this.ms += performance.now() - t0;
  }

  blockEnd(pos0: number, n: number): void {
    if (this.sampled.length === 0) return;
    const t0 = performance.now();
    const from = this.attention.cache.storeStart, width = this.stash!.shape[1]!, G = this.group;
    const data = this.attention.backend.read(this.stash!);
    // Every (layer, row, KV head) sample in stash order: its three groups of rows and its offloaded range.
    const fields: number[] = [];
    for (let l = 0; l < this.layers; l++) {
      this.sampled.forEach((s, r) => s.kvHeads.forEach((_, i) => {
        const at = this.stashRow(l, r, i);
        fields.push(at, l === 0 ? -1 : at + G, at + 2 * G, from, s.to);
      }));
    }
    const grid = this.acc[0]!.grid, len = sampleSumsLength(grid.length);
    const sums = (this.o.sums ?? calibrationSumsTs)({ data, width, group: G, samples: Int32Array.from(fields), grid, candidates: this.o.candidates });
    for (let i = 0; i < fields.length / 5; i++) this.acc[Math.floor(i / this.samplesPerLayer)]!.accumulate(sums, i * len);
    const offloaded = Math.max(...this.sampled.map((s) => s.to)) - from;
    const samples = this.acc[0]!.samples;
    this.sampled = [];
    this.release();
    this.ms += performance.now() - t0;
    this.decided = { offloaded, tokens: pos0 + n, samples };
    this.last = this.decide(this.o.maxShare);
    this.o.onResult(this.last);
  }

  /** The last prompt's decision under a cap on a layer's K (maxShare of the offloaded tokens; absent: the options'), from the same sums: one prefill compares caps. */
  decide(maxShare = this.o.maxShare): CalibrationResult {
    if (!this.decided) fail("prefill calibration: no prompt has been calibrated yet");
    return decideCalibration(this.acc, {
      massTarget: this.o.massTarget, ...this.decided, ms: this.ms, ...(this.o.exact === undefined ? {} : { exact: this.o.exact }),
      ...(maxShare === undefined ? {} : { maxShare }),
    });
  }

  /** The stash's first row of (layer, sampled row r, its i-th KV head): q's logits, q̃'s, q's probabilities, a group of rows each. */
  private stashRow(layer: number, r: number, i: number): number {
    return (layer * this.samplesPerLayer + this.sampled[r]!.first + i) * 3 * this.group;
  }

  /** Chooses the sampled rows (the block's last ones with offloaded tokens) and allocates their buffers. */
  private begin(n: number, pos0: number): void {
    this.ms = 0;
    this.release();
    const c = this.attention.cache, from = c.storeStart, ring = c.gpuKvBudget - c.sinkTokens;
    const total = pos0 + n;
    const budget = this.o.samples ?? Math.max(MIN_SAMPLES, Math.min(MAX_SAMPLES, Math.floor(CALIBRATION_BUDGET / (this.group * total * this.layers))));
    const perRow = Math.min(this.kvHeads, KV_PER_ROW);
    const sampled: Sampled[] = [];
    let taken = 0;
    for (let row = n - 1; row >= 0 && taken < budget; row--) {
      const to = pos0 + row + 1 - ring;
      if (to - from < 1) break;
      const k = Math.min(perRow, budget - taken);
      const kvHeads = Array.from({ length: k }, (_, i) => (sampled.length * perRow + i) % this.kvHeads);
      sampled.push({ row, kvHeads, to, first: taken });
      taken += k;
    }
    if (sampled.length === 0) return;
    const be = this.attention.backend;
    this.sampled = sampled;
    this.spec = [be.alloc([sampled.length, this.qDim]), be.alloc([sampled.length, this.qDim])];
    this.scores = be.alloc([this.heads, total]);
    this.specScores = be.alloc([this.heads, total]);
    this.samplesPerLayer = taken;
    this.stash = be.alloc([this.layers * taken * 3 * this.group, total]);
    const grid = calibrationGrid(Math.max(...sampled.map((s) => s.to)) - from);
    this.acc = Array.from({ length: this.layers }, () => new LayerCalibration(grid, this.o.candidates));
  }

  private release(): void {
    const be = this.attention.backend;
    for (const t of [...this.spec, this.scores, this.specScores, this.stash]) if (t) be.free(t);
    this.spec = [null, null];
    this.scores = this.specScores = this.stash = null;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.attention.prefillObserver === this) this.attention.setPrefillObserver(null);
    this.release();
  }

  [Symbol.dispose](): void {
    this.close();
  }
}
