import { z } from "zod";
import { ISAS } from "./features.js";

/** Options of createCpuBackend. */
export const CpuBackendOptionsSchema = z
  .object({
    /** Threads used by ops, the calling thread included (default: all online CPUs). */
    threads: z.number().int().min(1).max(256).optional(),
    /** Kernel set; default $HYBRIDGEN_ISA, else the best the CPU supports. */
    isa: z.enum(ISAS).optional(),
    /** Cap on the "device" memory (weights and allocations; allocHost is outside it), so the CPU backend stands in for a smaller GPU. */
    memoryCapBytes: z.number().int().positive().optional(),
  })
  .strict();

export type CpuBackendOptions = z.input<typeof CpuBackendOptionsSchema>;
