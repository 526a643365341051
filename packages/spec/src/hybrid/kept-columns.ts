/**
 * The candidates a verified layer keeps (HostTransfers.keepRows): per KV head, the `keep` best of
 * its n scored columns by the largest logit of its group's heads, ties to the lower column. The
 * definition every link's keepRows meets (the CUDA kernel, the test stand-ins).
 */

/**
 * A mask [kvHeads × kmax] of the kept columns: `scores` f32 [kvHeads·group, width] from column
 * `col`, counts[g] clamped to [0, kmax] the scored columns of KV head g.
 */
export function keptColumns(scores: Float32Array, width: number, col: number, group: number, kmax: number, counts: Int32Array, keep: number): Uint8Array {
  const kvHeads = counts.length, kept = new Uint8Array(kvHeads * kmax);
  for (let g = 0; g < kvHeads; g++) {
    const n = Math.max(0, Math.min(kmax, counts[g]!));
    const best = new Float32Array(n);
    for (let j = 0; j < n; j++) {
      let m = -Infinity;
      for (let h = g * group; h < (g + 1) * group; h++) m = Math.max(m, scores[h * width + col + j]!);
      best[j] = m;
    }
    const order = Array.from({ length: n }, (_, j) => j).sort((a, b) => (best[a]! > best[b]! ? -1 : best[a]! < best[b]! ? 1 : a - b));
    for (const j of order.slice(0, Math.min(keep, n))) kept[g * kmax + j] = 1;
  }
  return kept;
}
