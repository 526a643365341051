import { describe, expect, it } from "vitest";
import { bf16BitsToF32, f32ToBf16BitsOutward } from "../src/index.js";
import { offloadedKeys, pageBounds, pageSummaries, summarizePages } from "../src/contracts/selector-primitives.js";
import { seededRandom } from "../src/index.js";

const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);
const fromBits = (b: number) => { u32[0] = b >>> 0; return f32[0]!; };

/** The next bf16 above (toward +∞) bits b, by walking the bit patterns (independent of the rounding code). */
function bf16Up(b: number): number {
  if (b === 0x8000) return 0x0001;
  return b & 0x8000 ? b - 1 : b + 1;
}

/** The next bf16 below (toward −∞) bits b. */
function bf16Down(b: number): number {
  if (b === 0x0000) return 0x8001;
  return b & 0x8000 ? b + 1 : b - 1;
}

describe("bf16 page summaries, rounded outward", () => {
  it("f32ToBf16BitsOutward: exact values stay, inexact ones move away from the value's side of 0, at every boundary", () => {
    const MAX = fromBits(0x7f7fffff), TINY = fromBits(1);
    // value, toward −∞, toward +∞
    const cases: [number, number, number][] = [
      [1, 0x3f80, 0x3f80], [-1, 0xbf80, 0xbf80], [0, 0x0000, 0x0000], [-0, 0x8000, 0x8000],
      [-0.15625, 0xbe20, 0xbe20], [1 + 2 ** -7, 0x3f81, 0x3f81], // exact in bf16
      [1 + 2 ** -8, 0x3f80, 0x3f81], [-(1 + 2 ** -8), 0xbf81, 0xbf80], // a half ulp: not to nearest, outward
      [fromBits(0x3f800001), 0x3f80, 0x3f81], [fromBits(0xbf800001), 0xbf81, 0xbf80], // just past an exact value
      [fromBits(0x3f7fffff), 0x3f7f, 0x3f80], [fromBits(0xbf7fffff), 0xbf80, 0xbf7f], // just short of 1: a carry into the exponent
      [fromBits(0x7f7f0000), 0x7f7f, 0x7f7f], [MAX, 0x7f7f, 0x7f80], [-MAX, 0xff80, 0xff7f], // the largest finite → ±∞ outward
      [Infinity, 0x7f80, 0x7f80], [-Infinity, 0xff80, 0xff80],
      [TINY, 0x0000, 0x0001], [-TINY, 0x8001, 0x8000], [fromBits(0x00800000), 0x0080, 0x0080], // subnormal, smallest normal
      [NaN, 0x7fc0, 0x7fc0],
    ];
    for (const [v, down, up] of cases) {
      expect([f32ToBf16BitsOutward(v, false), f32ToBf16BitsOutward(v, true)], `${v}`).toEqual([down, up]);
    }
  });

  it("on random f32 values: the tightest bf16 at or below (above) the value", () => {
    const r = seededRandom(7);
    for (let i = 0; i < 20000; i++) {
      const v = fromBits(Math.floor(r() * 2 ** 32));
      if (!Number.isFinite(v)) continue;
      const lo = f32ToBf16BitsOutward(v, false), hi = f32ToBf16BitsOutward(v, true);
      expect(bf16BitsToF32(lo) <= v && bf16BitsToF32(bf16Up(lo)) > v, `down ${v}`).toBe(true);
      expect(bf16BitsToF32(hi) >= v && bf16BitsToF32(bf16Down(hi)) < v, `up ${v}`).toBe(true);
    }
  });

  it("summarizePages keeps each page's tightest outward bf16 min and max, folded in steps or at once, and pageBounds bounds q·k", () => {
    const r = seededRandom(9), kvHeads = 2, d = 6, cap = 40, page = 5;
    const special = [1, -1, 0, -0, 1 + 2 ** -8, -(1 + 2 ** -8), fromBits(0x3f7fffff), fromBits(0xbf7fffff), fromBits(1), -fromBits(1)];
    const data = Float32Array.from({ length: kvHeads * cap * d }, (_, i) => (i % 3 === 0 ? special[Math.floor(r() * special.length)]! : (r() * 2 - 1) * 3));
    const keys = offloadedKeys("f32", kvHeads, cap, d, data);
    const once = pageSummaries(kvHeads, d, cap, page), steps = pageSummaries(kvHeads, d, cap, page);
    summarizePages(keys, 0, 37, once);
    for (let at = 0; at < 37;) {
      const to = Math.min(37, at + 1 + Math.floor(r() * 7));
      summarizePages(keys, at, to, steps);
      at = to;
    }
    expect(steps.min).toEqual(once.min);
    expect(steps.max).toEqual(once.max);
    for (let g = 0; g < kvHeads; g++) {
      for (let p = 0; p < Math.ceil(37 / page); p++) {
        for (let c = 0; c < d; c++) {
          let lo = Infinity, hi = -Infinity;
          for (let s = p * page; s < Math.min(37, (p + 1) * page); s++) {
            const v = data[(g * cap + s) * d + c]!;
            lo = Math.min(lo, v);
            hi = Math.max(hi, v);
          }
          const at = (g * once.pageCapacity + p) * d + c, mn = once.min[at]!, mx = once.max[at]!;
          expect(bf16BitsToF32(mn) <= lo && bf16BitsToF32(bf16Up(mn)) > lo, `min g${g} p${p} c${c}`).toBe(true);
          expect(bf16BitsToF32(mx) >= hi && bf16BitsToF32(bf16Down(mx)) < hi, `max g${g} p${p} c${c}`).toBe(true);
        }
      }
    }
    const q = Float32Array.from({ length: kvHeads * 2 * d }, () => r() * 2 - 1), count = Math.ceil(37 / page);
    const bounds = pageBounds(q, 2, once, count);
    for (let h = 0; h < kvHeads * 2; h++) {
      const g = h >> 1;
      for (let s = 0; s < 37; s++) {
        let dot = 0;
        for (let c = 0; c < d; c++) dot += q[h * d + c]! * data[(g * cap + s) * d + c]!;
        expect(dot, `head ${h} slot ${s}`).toBeLessThanOrEqual(bounds[g * count + Math.floor(s / page)]! + 1e-5);
      }
    }
  });
});
