/**
 * The Quest kernel's page summaries in the CPU stage: per store K tensor, the per-page, per-channel
 * min and max of its rows (min [kvHeads, pageCapacity, headDim] bf16, then max), in native memory
 * of their own (a FoldedRegions'). bf16 rounded outward (min toward −∞, max toward +∞; core's
 * summarizePages): the bounds read half f32's bytes and still bound every q·k.
 */

/** Pages per KV head and bytes of the summaries of `capacity` rows in pages of `pageSize`. */
export function pageSummaryShape(kvHeads: number, capacity: number, headDim: number, pageSize: number): { pageCapacity: number; bytes: number } {
  const pageCapacity = Math.ceil(capacity / pageSize);
  return { pageCapacity, bytes: 2 * kvHeads * pageCapacity * headDim * 2 };
}
