/**
 * The floor of a hybrid decode step: the bytes each side must move at least, over the bandwidth
 * measured in the same run. Device: weights + the window's K/V + the staged rows it reads, over
 * the HBM rate; CPU: what the selector reads of the host store + the rows it gathers, over the
 * host's read rate; link: what crosses PCIe (query down; V rows, and K rows or logits, up),
 * over the pinned copy rate. The three sides overlap in the ideal pipeline, so the step's floor
 * is the largest of them.
 */
import { llamaBf16Sizes } from "./models.js";

export interface ModelBytes {
  layers: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  /** Weight bytes one decode step reads. */
  weightBytes: number;
  /** Bytes of one element of the KV cache (bf16: 2). */
  kvElem: number;
}

/** A Llama-layout config.json's step bytes with bf16 weights and KV (models.ts's sizes). */
export function llamaModelBytes(json: Record<string, unknown>): ModelBytes {
  const { layers, heads, kvHeads, hd, weightBytes } = llamaBf16Sizes(json);
  return { layers, heads, kvHeads, headDim: hd, weightBytes, kvElem: 2 };
}

export type FloorSelector = "topk" | "streaming" | "quest" | "infinigen" | "all" | "index";

export interface StepShape {
  /** Tokens in the device window (sinks + ring). */
  window: number;
  /** Offloaded tokens in the host store. */
  offloaded: number;
  /** Tokens per KV head attended from the store (K). */
  k: number;
  timing: "post" | "pre";
  logits: "exact" | "speculative" | "verified";
  /** verified: q̃ chooses candidates·K tokens, the device scores them. */
  candidates: number;
  selector: FloorSelector;
  /** Quest's (and the index's) page size, InfiniGen's channel count. */
  pageSize?: number;
  channels?: number;
  /** The page index's form and where it is ranked (the device reads its page level; the host its pages and super-pages). */
  index?: { form: "int8" | "int4"; onDevice: boolean; superPages?: number };
  /** verified: keep·K of the candidates kept once scored, only their V rows gathered (HybridOptions.keep; absent: every candidate's). */
  keep?: number;
}

export interface Bandwidths {
  /** Device memory read rate, bytes/s (a D2D copy's read + write rate: what a read-only step can use). */
  hbm: number;
  /** Host memory read rate of the stage's threads, bytes/s. */
  hostRead: number;
  /** Pinned host → device copy rate, bytes/s. */
  h2d: number;
}

export interface StepBytes {
  device: number;
  cpu: number;
  link: number;
}

/** Bytes per step on each side (every layer). */
export function stepBytes(m: ModelBytes, s: StepShape): StepBytes {
  const row = m.kvHeads * m.headDim * m.kvElem; // one token's K (or V) over the KV heads of a layer
  const width = s.logits === "verified" && s.selector !== "all" ? Math.min(s.offloaded, s.k * s.candidates) : Math.min(s.offloaded, s.k);
  const rescored = s.logits === "verified";
  // The CPU: what the selector reads to choose, then the gathered rows.
  let choose: number;
  let indexBytes = 0; // a device index's page level, read by the device's ranking
  if (s.timing === "post" || s.selector === "topk" || s.selector === "all") choose = s.offloaded * row;
  else if (s.selector === "quest") {
    const page = s.pageSize ?? 16;
    choose = Math.ceil(s.offloaded / page) * m.kvHeads * m.headDim * 2 * 2 + page * row; // bf16 min/max per page (kernels-cpu page-summaries), one partial page
  } else if (s.selector === "infinigen") choose = s.offloaded * m.kvHeads * (s.channels ?? 8) * 4; // packed f32 channels
  else if (s.selector === "index") {
    const page = s.pageSize ?? 16, x = s.index ?? { form: "int8", onDevice: false };
    indexBytes = Math.ceil(s.offloaded / page) * m.kvHeads * ((x.form === "int8" ? 2 : 1) * m.headDim + 4);
    // The stage scores the one page that does not fit the list whole; on the host it reads every page's (and super-page's) summary first.
    choose = page * row + (x.onDevice ? 0 : Math.ceil(indexBytes * (1 + 1 / (x.superPages ?? 16))));
    if (!x.onDevice) indexBytes = 0;
  } else choose = 0; // streaming: positions only
  // V rows: the kept ones where verified layers keep fewer than their candidates.
  const vWidth = rescored && s.keep !== undefined && s.keep < s.candidates ? Math.min(s.offloaded, s.k * s.keep) : width;
  const gathered = vWidth * row + (rescored ? width * row : 0);
  const cpu = m.layers * (choose + gathered);
  // The link: the query down, the selected rows up (V, and K for verified or f32 logits otherwise).
  const up = vWidth * row + (rescored ? width * row : m.heads * width * 4);
  const link = m.layers * (m.heads * m.headDim * 4 + up);
  // The device: weights, the window's K and V, the staged rows it reads.
  const device = m.weightBytes + m.layers * (2 * s.window * row + vWidth * row + (rescored ? width * row : 0) + indexBytes);
  return { device, cpu, link };
}

export interface StepFloor {
  deviceMs: number;
  cpuMs: number;
  linkMs: number;
  /** The largest of the three: the sides overlap in the ideal pipeline. */
  floorMs: number;
}

export function stepFloor(b: StepBytes, bw: Bandwidths): StepFloor {
  const deviceMs = (b.device / bw.hbm) * 1e3, cpuMs = (b.cpu / bw.hostRead) * 1e3, linkMs = (b.link / bw.h2d) * 1e3;
  return { deviceMs, cpuMs, linkMs, floorMs: Math.max(deviceMs, cpuMs, linkMs) };
}

/** Full attention on the device: weights + the whole context's K and V over the HBM rate. */
export function fullFloorMs(m: ModelBytes, context: number, hbm: number): number {
  return ((m.weightBytes + m.layers * 2 * context * m.kvHeads * m.headDim * m.kvElem) / hbm) * 1e3;
}
