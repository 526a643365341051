/**
 * How far Quest's choice moves with bf16 page summaries rounded outward (core's summarizePages)
 * against f32 summaries (defined here): the share
 * of the f32 selection's ids the bf16 one keeps, per KV head, on random keys at Llama-3.1-8B's
 * heads (8 KV heads × 128, 32 query heads), pages of 16. Both run core's questSelection on the
 * reference primitives, so only the summaries' format differs.
 *   ./bun apps/bench/src/cpu/quest-recall.ts [--tokens 28704,126976] [--ks 256,1024] [--queries 4] [--dtypes f32,f16,bf16] [--data uniform,channels]
 * --data: "uniform" keys in [-1, 1); "channels" Gaussian keys with a log-normal scale and an offset
 * per channel (a few channels 8× larger), closer to a model's keys. A bf16 store holds only bf16
 * values, whose outward rounding is exact: its summaries and choice equal the f32 ones.
 */
import { offloadedKeys, questPages, questSelection, referencePrimitives, seededRandom, selectionForKvHead, type DType, type OffloadedKeys, type PageSummaries, type Selection, type SelectorPrimitives } from "@hybridgen/spec";

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1]! : dflt;
}
const tokens = arg("tokens", "28704,126976").split(",").map(Number);
const ks = arg("ks", "256,1024").split(",").map(Number);
const queries = Number(arg("queries", "4"));
const dtypes = arg("dtypes", "f32,f16,bf16").split(",") as DType[];
const datas = arg("data", "uniform,channels").split(",");
const KV = 8, G = 4, D = 128, PAGE = 16;

const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);
const bf16Nearest = (v: number) => { f32[0] = v; const x = u32[0]!; return ((x + 0x7fff + ((x >>> 16) & 1)) >>> 16) & 0xffff; };

/**
 * Rows [0, n) of keys in f32 page summaries of `page` rows, folded as core's summarizePages folded
 * them before bf16 (no rounding), as PageSummaries to hand f32Primitives' pageBounds.
 */
export function f32Pages(keys: OffloadedKeys, n: number, page: number): PageSummaries {
  const { kvHeads: KV, headDim: D } = keys;
  const pageCapacity = Math.ceil(keys.capacity / page), min = new Float32Array(KV * pageCapacity * D), max = new Float32Array(KV * pageCapacity * D);
  const P = referencePrimitives, scratch = offloadedKeys("f32", KV, keys.capacity, D);
  P.gatherChannels(keys, Int32Array.from({ length: KV * D }, (_, i) => i % D), 0, n, scratch); // every channel as f32
  const x = scratch.data as Float32Array;
  for (let g = 0; g < KV; g++) {
    for (let s = 0; s < n; s++) {
      const row = (g * keys.capacity + s) * D, at = (g * pageCapacity + Math.floor(s / page)) * D, fresh = s % page === 0;
      for (let c = 0; c < D; c++) {
        const v = x[row + c]!;
        if (fresh || v < min[at + c]!) min[at + c] = v;
        if (fresh || v > max[at + c]!) max[at + c] = v;
      }
    }
  }
  return { pageSize: page, kvHeads: KV, headDim: D, pageCapacity, min, max } as unknown as PageSummaries;
}

/** The reference primitives with pageBounds over f32Pages' summaries (the bound as it was). */
export const f32Primitives: SelectorPrimitives = {
  ...referencePrimitives,
  pageBounds(query, groupSize, pages, count, out) {
    const { kvHeads: KV, headDim: D, pageCapacity } = pages, min = pages.min as unknown as Float32Array, max = pages.max as unknown as Float32Array;
    const dst = out ?? new Float32Array(KV * count);
    for (let g = 0; g < KV; g++) {
      for (let p = 0; p < count; p++) {
        const s = (g * pageCapacity + p) * D;
        let best = -Infinity;
        for (let j = 0; j < groupSize; j++) {
          const q = (g * groupSize + j) * D;
          let sum = 0;
          for (let c = 0; c < D; c++) sum += Math.max(query[q + c]! * min[s + c]!, query[q + c]! * max[s + c]!);
          if (sum > best) best = sum;
        }
        dst[g * count + p] = best;
      }
    }
    return dst;
  },
};

/** Per KV head of selection `a`, the share of its ids `b` holds too. */
export function idsKept(a: Selection, b: Selection, kvHeads: number): number[] {
  return Array.from({ length: kvHeads }, (_, g) => {
    const x = selectionForKvHead(a, g), y = new Set(selectionForKvHead(b, g));
    let hit = 0;
    for (const id of x) if (y.has(id)) hit++;
    return x.length ? hit / x.length : 1;
  });
}

function keysOf(data: string, dtype: DType, n: number, r: () => number): OffloadedKeys {
  const gauss = () => Math.sqrt(-2 * Math.log(1 - r())) * Math.cos(2 * Math.PI * r());
  const scale = Float32Array.from({ length: KV * D }, (_, i) => Math.exp(0.5 * gauss()) * (i % 29 === 3 ? 8 : 1));
  const offset = Float32Array.from({ length: KV * D }, () => 0.5 * gauss());
  const values = new Float32Array(KV * n * D);
  for (let g = 0; g < KV; g++) {
    for (let s = 0; s < n; s++) {
      for (let c = 0; c < D; c++) {
        const i = (g * n + s) * D + c;
        values[i] = data === "uniform" ? r() * 2 - 1 : offset[g * D + c]! + scale[g * D + c]! * gauss();
      }
    }
  }
  if (dtype === "f32") return offloadedKeys("f32", KV, n, D, values);
  if (dtype === "f16") return offloadedKeys("f16", KV, n, D, new Uint16Array(new Float16Array(values).buffer));
  return offloadedKeys("bf16", KV, n, D, Uint16Array.from(values, bf16Nearest));
}

if (import.meta.main) {
  console.log(`Quest, pages of ${PAGE}, ${KV} KV heads × ${D}, group ${G}: share of the f32-summary selection's ids the bf16 (outward) selection keeps, ${queries} random queries`);
  console.log("| data | store | offloaded | K | ids kept (mean over queries × KV heads) | worst list | lists identical |");
  console.log("| --- | --- | ---: | ---: | ---: | ---: | ---: |");
  for (const data of datas) {
    for (const dtype of dtypes) {
      for (const n of tokens) {
        const r = seededRandom(n ^ 0x5eed);
        const keys = keysOf(data, dtype, n, r);
        const bf = questPages(referencePrimitives, { pages: null, summarized: 0 }, keys, n, PAGE);
        const old = f32Pages(keys, n, PAGE);
        for (const k of ks) {
          let kept = 0, lists = 0, same = 0, worst = 1;
          for (let t = 0; t < queries; t++) {
            const q = Float32Array.from({ length: KV * G * D }, () => r() * 2 - 1);
            const a = questSelection(f32Primitives, q, G, keys, old, n, k), b = questSelection(referencePrimitives, q, G, keys, bf, n, k);
            for (const share of idsKept(a, b, KV)) {
              kept += share;
              lists++;
              if (share === 1) same++;
              worst = Math.min(worst, share);
            }
          }
          console.log(`| ${data} | ${dtype} | ${n} | ${k} | ${(kept / lists).toFixed(4)} | ${worst.toFixed(4)} | ${same} / ${lists} |`);
        }
      }
    }
  }
}
