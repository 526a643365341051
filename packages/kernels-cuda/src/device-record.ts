import { HybridgenError } from "@hybridgen/spec";

export interface CudaDevice {
  readonly index: number;
  readonly name: string;
  readonly major: number;
  readonly minor: number;
  /** "9.0" */
  readonly computeCapability: string;
  readonly totalMemoryBytes: number;
  readonly multiprocessors: number;
  /** "0000:19:00.0", or "" when the driver does not say. */
  readonly pciBusId: string;
}

/** Parses native/probe.cu's "name\tmajor\tminor\ttotalMem\tSMs\tpciBusId" record. */
export function parseDeviceRecord(index: number, record: string): CudaDevice {
  const f = record.split("\t");
  const num = (i: number) => Number(f[i]);
  if (f.length !== 6 || !f[0] || ![1, 2, 3, 4].every((i) => Number.isFinite(num(i)) && num(i) >= 0)) {
    throw new HybridgenError(`CUDA device ${index}: unreadable device record ${JSON.stringify(record)}`);
  }
  return {
    index,
    name: f[0],
    major: num(1),
    minor: num(2),
    computeCapability: `${num(1)}.${num(2)}`,
    totalMemoryBytes: num(3),
    multiprocessors: num(4),
    pciBusId: f[5] ?? "",
  };
}

/** 13000 → "13.0" (CUDA's version encoding: 1000·major + 10·minor). */
export function formatCudaVersion(v: number): string {
  return `${Math.floor(v / 1000)}.${Math.floor((v % 1000) / 10)}`;
}
