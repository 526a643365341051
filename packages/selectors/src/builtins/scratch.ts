/** A reusable Float32Array per (layer, sequence), grown geometrically as the store grows. */
export interface Scratch {
  buf: Float32Array;
}

export function newScratch(): Scratch {
  return { buf: new Float32Array(0) };
}

export function scratchView(s: Scratch, length: number): Float32Array {
  if (s.buf.length < length) s.buf = new Float32Array(Math.max(length, Math.ceil(s.buf.length * 1.5), 1024));
  return s.buf.subarray(0, length);
}
