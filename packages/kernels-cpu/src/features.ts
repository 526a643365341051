/** What the CPU supports and which kernel set (ISA) a backend would run. */
import { fail } from "@hybridgen/spec";
import { native } from "./native.js";

export const ISAS = ["generic", "avx2", "avx512"] as const;
export type Isa = (typeof ISAS)[number];

export interface CpuFeatures {
  /** AVX2 + FMA + F16C usable (CPU and OS). */
  avx2: boolean;
  /** AVX-512 F/BW/VL/DQ usable. */
  avx512: boolean;
  /** AVX-512 BF16 present (reported; the kernels widen bf16 with shifts and do not need it). */
  avx512bf16: boolean;
  /** Best ISA the CPU supports. */
  best: Isa;
  /** ISA a backend created without an `isa` option uses (HYBRIDGEN_ISA, else `best`). */
  chosen: Isa;
  /** Online logical CPUs: the default thread count. */
  cpus: number;
}

export function isaCode(isa: Isa): number {
  return ISAS.indexOf(isa);
}

export function cpuFeatures(): CpuFeatures {
  const lib = native();
  const bits = lib.hg_cpu_features();
  const best = ISAS[lib.hg_best_isa()] ?? "generic";
  return {
    avx2: (bits & 1) !== 0,
    avx512: (bits & 2) !== 0,
    avx512bf16: (bits & 4) !== 0,
    best,
    chosen: chooseIsa(undefined),
    cpus: lib.hg_online_cpus(),
  };
}

/** The ISA to use: the explicit option, else $HYBRIDGEN_ISA, else the best supported. */
export function chooseIsa(requested: Isa | undefined): Isa {
  const lib = native();
  const bits = lib.hg_cpu_features();
  let isa = requested;
  if (!isa) {
    const env = process.env.HYBRIDGEN_ISA;
    if (env) {
      if (!(ISAS as readonly string[]).includes(env)) fail(`HYBRIDGEN_ISA=${env} is not one of ${ISAS.join("|")}`);
      isa = env as Isa;
    }
  }
  if (!isa) return ISAS[lib.hg_best_isa()] ?? "generic";
  if (isa === "avx2" && !(bits & 1)) fail("kernels-cpu: ISA avx2 requested but this CPU lacks AVX2/FMA/F16C");
  if (isa === "avx512" && !(bits & 2)) fail("kernels-cpu: ISA avx512 requested but this CPU lacks AVX-512 F/BW/VL/DQ");
  return isa;
}
