/** Test helpers of the engine tests: a seeded PRNG and random arrays. */

/** mulberry32: tiny, seedable, good enough for test data. */
export function makeRng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Uniform values in [-scale, scale), never all zero. */
export function randomArray(rng: () => number, n: number, scale = 1): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = (rng() * 2 - 1) * scale;
  return a;
}

export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) throw new Error(`length ${a.length} vs ${b.length}`);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

/** The seed of a test: fixed for reproducible CI, HYBRIDGEN_TEST_SEED=n draws fresh inputs. */
export function testSeed(base: number): number {
  const env = process.env.HYBRIDGEN_TEST_SEED;
  return env ? (Number(env) ^ base) >>> 0 : base;
}
