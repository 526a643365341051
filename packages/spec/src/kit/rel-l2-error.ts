/**
 * ‖a − b‖ / ‖b‖ (L2 over the row; ‖a − b‖ when b is all zeros): the device checks' error measure.
 * Infinity for rows of different lengths or a non-finite difference, so a NaN always fails a bound.
 */
export function relL2Error(a: Float32Array, b: Float32Array): number {
  if (a.length !== b.length) return Infinity;
  let num = 0, den = 0;
  for (let i = 0; i < a.length; i++) {
    const d = a[i]! - b[i]!;
    num += d * d;
    den += b[i]! * b[i]!;
  }
  if (!Number.isFinite(num)) return Infinity;
  return den === 0 ? Math.sqrt(num) : Math.sqrt(num / den);
}
