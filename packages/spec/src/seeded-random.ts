/**
 * The one seeded PRNG of the tests, benches and device checks: mulberry32 (32-bit state,
 * one add and two multiplies a draw). Small and fast rather than strong: it exists so a
 * failing random input can be rebuilt from its seed. Not the Sampler's stream (Xoshiro128).
 */

/** Uniform values in [0, 1) from a 32-bit seed; the same seed gives the same sequence. */
export function seededRandom(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
