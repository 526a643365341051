/** `--workload NxC` and `--gpu-mem SIZE` of `hybridgen bench`: parsed strictly, a bad value a one-line error naming it. */
import { MAX_BATCH } from "@hybridgen/core";
import { parseSize } from "../kv-tier-options.js";
import { usage } from "./flag-values.js";

export interface Workload {
  /** Sequences decoded in all. */
  readonly sequences: number;
  /** Context tokens of each sequence (prefilled before its decode). */
  readonly context: number;
}

/** "8x131072": 8 sequences of 131072 tokens; at most MAX_BATCH sequences (one batched step holds them all). */
export function parseWorkload(raw: string | undefined): Workload | undefined {
  if (raw === undefined) return undefined;
  const m = /^\s*(\d+)\s*[xX×]\s*(\d+)\s*$/.exec(raw);
  if (!m) throw usage(`invalid value for --workload: ${JSON.stringify(raw)} is not NxC (N sequences of C tokens, e.g. 8x131072)`);
  const sequences = Number(m[1]), context = Number(m[2]);
  if (sequences < 1) throw usage(`invalid value for --workload: ${JSON.stringify(raw)} has ${sequences} sequences (at least 1)`);
  if (context < 2) throw usage(`invalid value for --workload: ${JSON.stringify(raw)} has ${context}-token sequences (at least 2)`);
  if (sequences > MAX_BATCH) throw usage(`invalid value for --workload: ${JSON.stringify(raw)} has ${sequences} sequences; one batched step holds at most ${MAX_BATCH}`);
  return { sequences, context };
}

/** --gpu-mem's bytes (K, M, G or T suffixes), at least 1 MiB. */
export function parseGpuMem(raw: string | undefined): number | undefined {
  if (raw === undefined) return undefined;
  const bytes = parseSize(raw, "--gpu-mem");
  if (bytes < 2 ** 20) throw usage(`invalid value for --gpu-mem: ${JSON.stringify(raw)} is ${bytes} bytes (at least 1 MiB)`);
  return bytes;
}

/** --issue-ms / --stage-ms: a host cost in ms a row a layer (a hybrid run's stats line gives them), a number ≥ 0. */
/** --gather-gbs: the rate (GB/s) at which the device gathers rows from pinned host memory, measured, in (0, 10000]. */
export function parseGatherGBs(raw: string | undefined): number | undefined {
  if (raw === undefined) return undefined;
  const t = raw.trim(), v = Number(t);
  if (t === "" || !Number.isFinite(v) || v <= 0 || v > 10_000) throw usage(`invalid value for --gather-gbs: ${JSON.stringify(raw)} is not a rate in GB/s in (0, 10000]`);
  return v;
}

export function parseRowLayerMs(flag: string, raw: string | undefined): number | undefined {
  if (raw === undefined) return undefined;
  const t = raw.trim(), v = Number(t);
  if (t === "" || !Number.isFinite(v) || v < 0 || v > 1000) throw usage(`invalid value for --${flag}: ${JSON.stringify(raw)} is not a number of ms in [0, 1000]`);
  return v;
}
