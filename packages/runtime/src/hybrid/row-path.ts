/**
 * Where a device backend gets a hybrid step's selected V (and, for verified logits, K) rows —
 * one pure decision per layer from what the device can do and where the layer's store lives, as
 * llama.cpp picks a kernel from the device and the shape:
 *   "mapped"  the device gathers the rows itself from the host store (pinned memory mapped into
 *             its address space) by the ids the CPU stage chose: no CPU copy, no staging DMA;
 *   "staged"  the CPU stage copies the rows into its pinned buffers and the copy stream uploads them.
 * The mapped gather reads 16-byte pieces near the link's rate from a few hundred rows up and
 * beats the CPU copy + DMA at every K measured (kernels-cuda README, gatherBench), so it is the
 * choice wherever it can run; the staged path stays for file-backed tiers, pageable memory and
 * devices without the gather.
 */
import { z } from "zod";

export const RowPathRequestSchema = z.enum(["auto", "mapped", "staged"]);
export type RowPathRequest = z.infer<typeof RowPathRequestSchema>;
export type RowPath = "mapped" | "staged";

export interface RowPathInput {
  /** HybridOptions.rowPath: "auto" takes mapped wherever it can run. */
  readonly request: RowPathRequest;
  /** The device can gather rows from mapped host memory (HostTransfers.gatherRows and mapped). */
  readonly deviceGathers: boolean;
  /** Every store region the layer's rows come from (V, and K on a verified layer) is pinned and mapped. */
  readonly mapped: boolean;
  /** Bytes of one row (headDim × the store dtype's bytes): the gather moves 16-byte pieces. */
  readonly rowBytes: number;
}

export interface RowPathChoice {
  readonly path: RowPath;
  /** Why, in a few words (a forced "mapped" that cannot run fails with it). */
  readonly reason: string;
}

export function chooseRowPath(i: RowPathInput): RowPathChoice {
  if (i.request === "staged") return { path: "staged", reason: "staged rows asked for" };
  const blocker = !i.deviceGathers
    ? "the device backend cannot gather rows from host memory"
    : !i.mapped
      ? "the store's rows are not in pinned host memory the device maps (a file-backed tier, or memory left pageable)"
      : i.rowBytes % 16 !== 0
        ? `a row of ${i.rowBytes} bytes is not a whole number of 16-byte pieces`
        : null;
  return blocker ? { path: "staged", reason: blocker } : { path: "mapped", reason: "the store is pinned and mapped" };
}

/**
 * Rows per KV head the device's gathered-row buffers need for a step whose scheduler K is `k`:
 * the widest layer's selection — K, or candidates·K where the device verifies (`candidates` 1
 * otherwise) — never more than the store; a selector that ignores K takes the whole store.
 */
export function selectionRows(o: { storeCapacity: number; usesBudget: boolean; k: number; candidates: number }): number {
  if (!o.usesBudget) return o.storeCapacity;
  return Math.max(1, Math.min(o.storeCapacity, o.k * o.candidates));
}

/** The buffers' new width when a step needs `need` rows and they hold `rows`: at least doubled, so a rising K regrows them rarely. */
export function grownRows(rows: number, need: number, storeCapacity: number): number {
  if (need <= rows) return rows;
  return Math.min(storeCapacity, Math.max(need, 2 * rows));
}
