/** log-softmax of a logits row in float64: the KL measures' one definition (KLs of near-equal distributions want the wide values). */
export function logSoftmax64(l: Float32Array): Float64Array {
  let m = -Infinity;
  for (const v of l) m = Math.max(m, v);
  let z = 0;
  for (const v of l) z += Math.exp(v - m);
  const lz = m + Math.log(z);
  return Float64Array.from(l, (v) => v - lz);
}

/** logSoftmax64 rounded to float32 (each value rounded once, as if computed in place). */
export function logSoftmax(l: Float32Array): Float32Array {
  return Float32Array.from(logSoftmax64(l));
}
