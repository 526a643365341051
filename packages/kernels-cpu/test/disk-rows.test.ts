import { mkdtempSync, readdirSync, rmSync, truncateSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { indexWant, type CpuStageJob, type Selection, type StoreSegment, type Tensor } from "@hybridgen/spec";
import type { Pointer } from "bun:ffi";
import { createCpuBackend, NativeCpuStage, probeFileReadLatency, TieredStore, type CpuBackend } from "../src/index.js";
import { tierNative } from "../src/tier-native.js";
import { randn, rng, SEED } from "./helpers.js";

// Rows of 36 f32 (144 bytes) do not divide a page: rows straddle the segment edges.
const PAGE = 4096, heads = 4, kvHeads = 2, headDim = 36, cap = 1000;
const ROW = headDim * 4, BYTES = kvHeads * cap * ROW, REGION = Math.ceil(BYTES / PAGE) * PAGE;
// Each region: memory, then two files (the edges at pages 10 and 30 fall inside rows of KV head 0).
const E1 = 10 * PAGE, E2 = 30 * PAGE;
const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

function segments(dir: string): StoreSegment[][] {
  const file = (offset: number, bytes: number): StoreSegment => ({ offset, bytes, mode: "file", tier: "file:x", nodes: [], dir });
  return [[{ offset: 0, bytes: E1, mode: "local", tier: "node0", nodes: [] }, file(E1, E2 - E1), file(E2, REGION - E2)]];
}

/** A store of K and V half on disk, and the same rows in plain memory. */
function stores(be: CpuBackend) {
  const dir = mkdtempSync(join(tmpdir(), "hg-rows-"));
  dirs.push(dir);
  const tiered = new TieredStore({ regionBytes: REGION, pageBytes: PAGE, k: segments(dir), v: segments(dir) });
  const r = rng(91), k = randn(r, kvHeads * cap * headDim), v = randn(r, kvHeads * cap * headDim);
  const K = tiered.alloc(be, "k", 0, [kvHeads, cap, headDim], "f32"), V = tiered.alloc(be, "v", 0, [kvHeads, cap, headDim], "f32");
  const k0 = be.alloc([kvHeads, cap, headDim]), v0 = be.alloc([kvHeads, cap, headDim]);
  for (const [t, x] of [[K, k], [V, v], [k0, k], [v0, v]] as const) be.write(t, x);
  return { tiered, K, V, k0, v0 };
}

/** The slot of the row holding byte `off` of a region (head g = off / (cap·ROW)). */
const slotAt = (off: number) => Math.floor((off % (cap * ROW)) / ROW);

function rowBytes(be: CpuBackend, stage: NativeCpuStage, slot: 0 | 1): [Float32Array, Float32Array | null] {
  const o = stage.output(slot), n = kvHeads * o.kmax * headDim;
  return [be.read(o.values, 0, n), o.keys ? be.read(o.keys, 0, n) : null];
}

const same = (a: Float32Array, b: Float32Array) => Buffer.compare(Buffer.from(a.buffer, a.byteOffset, a.byteLength), Buffer.from(b.buffer, b.byteOffset, b.byteLength)) === 0;

describe(`disk-tier rows read with explicit reads (seed ${SEED})`, () => {
  it("selected and top-K jobs on a store half in files equal the same rows from memory: segment edges, adjacent rows, K rows, cold cache", () => {
    using be = createCpuBackend({ threads: 2 });
    const s = stores(be);
    const before = tierNative().hg_tier_registered_files();
    // Head 0: a run of 12 adjacent rows inside file 1, the rows across both edges, a memory row; head 1: scattered rows.
    const edge1 = slotAt(E1), edge2 = slotAt(E2);
    expect(edge1 * ROW < E1 && (edge1 + 1) * ROW > E1).toBe(true); // the row straddles memory → file
    expect(edge2 * ROW < E2 && (edge2 + 1) * ROW > E2).toBe(true); // and file → file
    const run = Array.from({ length: 12 }, (_, i) => edge1 + 5 + i);
    const head0 = Int32Array.from([3, edge1, ...run, edge2].sort((a, b) => a - b));
    const head1 = Int32Array.from([0, 17, 400, 401, 777, 999]);
    const selection: Selection = { kind: "perKvHead", ids: [head0, head1] };
    const r = rng(3), q = randn(r, heads * headDim);
    for (const readDepth of [0, 1, 4]) {
      using stage = new NativeCpuStage(be, { threads: 2, readDepth });
      using ref = new NativeCpuStage(be, { threads: 2, readDepth });
      for (const st of [stage, ref]) st.prepare({ heads, kvHeads, headDim, storeCapacity: cap, dtype: "f32", stageKeys: true });
      const jobs: [string, (k: Tensor, v: Tensor) => CpuStageJob][] = [
        ["selected", (k, v) => ({ slot: 1, k, v, offloaded: cap, kmax: 20, scale: 0.2, work: { kind: "selected", selection }, keys: true })],
        ["top-K", (k, v) => ({ slot: 0, k, v, offloaded: cap, kmax: 64, scale: 0.2, work: { kind: "topk", budget: 64, shared: false } })],
        ["all", (k, v) => ({ slot: 0, k, v, offloaded: cap, kmax: cap, scale: 0.2, work: { kind: "topk", budget: cap, shared: true } })],
      ];
      for (const cold of [false, true]) {
        for (const [what, job] of jobs) {
          const label = `depth ${readDepth} ${what}${cold ? " cold" : ""}`;
          if (cold) {
            s.tiered.dropFileCache();
            expect(s.tiered.cachedFileBytes(), label).toBeLessThan(REGION); // most of both files' pages left the page cache
          }
          const j = job(s.K, s.V);
          for (const [st, jj] of [[stage, j], [ref, job(s.k0, s.v0)]] as const) {
            st.query(j.slot).set(q);
            st.submit(jj);
            st.wait();
          }
          expect(Array.from(stage.output(j.slot).ids), label).toEqual(Array.from(ref.output(j.slot).ids));
          const [v1, k1] = rowBytes(be, stage, j.slot), [v2, k2] = rowBytes(be, ref, j.slot);
          expect(same(v1, v2), `${label}: V rows`).toBe(true);
          if (j.keys) expect(same(k1!, k2!), `${label}: K rows`).toBe(true);
          const reads = stage.lastReads();
          if (readDepth === 0) expect(reads.reads, label).toBe(0);
          if (readDepth > 0 && what === "selected") {
            // Head 0's 12 adjacent rows are one read; the straddling rows split at the edges: rows in files
            // of head 0: edge1 (its file part), the run, edge2 (two files); head 1: 400 and 401 are one read.
            const inFile = (g: number, id: number) => (g * cap + id + 1) * ROW > E1;
            const fileRows1 = Array.from(head1).filter((id) => inFile(1, id)).length - 1;
            expect(reads.reads, label).toBe(2 * (1 + 1 + 2) + 2 * fileRows1); // V and K
          }
          if (readDepth > 0 && what === "all") expect(reads.bytes, label).toBe(BYTES - E1); // every V row's file bytes, once
        }
      }
    }
    for (const t of [s.K, s.V, s.k0, s.v0]) be.free(t);
    s.tiered.release();
    expect(tierNative().hg_tier_registered_files()).toBe(before - 4);
  });

  it("a read that fails (the file cut short under the store) is a one-line error naming the file; the stage goes on", () => {
    using be = createCpuBackend({ threads: 2 });
    for (const readDepth of [1, 4]) {
      const s = stores(be);
      const vFile = s.tiered.files.find((f) => /-v0\.bin$/.test(f))!; // V's first file: [E1, E2) of the region
      truncateSync(vFile, 0); // never touch that mapping again: a page fault there is SIGBUS
      using stage = new NativeCpuStage(be, { threads: 2, readDepth });
      stage.prepare({ heads, kvHeads, headDim, storeCapacity: cap, dtype: "f32" });
      const job = (v: Tensor, ids: number[]): CpuStageJob => ({
        slot: 0, k: s.k0, v, offloaded: cap, kmax: ids.length, scale: 0.2, work: { kind: "selected", selection: { kind: "shared", ids: Int32Array.from(ids) } },
      });
      stage.submit(job(s.V, [1, 300, 301, 500]));
      const esc = vFile.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
      expect(() => stage.wait()).toThrow(new RegExp(`^disk tier: reading \\d+ bytes at offset \\d+ of ${esc} failed: the file ends before it$`));
      stage.submit(job(s.v0, [1, 2])); // the next job runs as usual
      stage.wait();
      expect(stage.output(0).counts[0]).toBe(2);
      for (const t of [s.K, s.V, s.k0, s.v0]) be.free(t);
      s.tiered.release();
    }
  });

  it("the page index's job on a store with V in files reads exactly the pages it picked, cold cache (whole pages and a partial one)", () => {
    // 16 rows of 64 f32 are one 4 KiB page: an index page is one page of the file, KV head g's page p its page g·64 + p.
    // K stays in memory, as the disk tier's layouts keep it (only a K spill moves it, through its own mapping).
    const d = 64, P = 16, pages = 64, capacity = P * pages, kv = 2, group = 2, region = kv * capacity * d * 4;
    const dir = mkdtempSync(join(tmpdir(), "hg-rows-"));
    dirs.push(dir);
    using be = createCpuBackend({ threads: 2 });
    const memory = (): StoreSegment[][] => [[{ offset: 0, bytes: region, mode: "local", tier: "node0", nodes: [] }]];
    const files = (): StoreSegment[][] => [[{ offset: 0, bytes: region, mode: "file", tier: "file:x", nodes: [], dir }]];
    using tiered = new TieredStore({ regionBytes: region, pageBytes: PAGE, k: memory(), v: files() });
    const r = rng(92), K = tiered.alloc(be, "k", 0, [kv, capacity, d], "f32"), V = tiered.alloc(be, "v", 0, [kv, capacity, d], "f32");
    be.write(K, randn(r, kv * capacity * d));
    be.write(V, randn(r, kv * capacity * d));
    const resident = () => {
      const at = be.address(V), out = new Set<number>();
      for (let p = 0; p < region / PAGE; p++) if (Number(tierNative().hg_tier_resident((at + p * PAGE) as Pointer, PAGE)) > 0) out.add(p);
      return out;
    };
    // Explicit reads (depth 4): reading the rows through the mapping instead (depth 0) brings in the pages around each.
    using stage = new NativeCpuStage(be, { threads: 2, readDepth: 4 });
    stage.prepare({ heads: kv * group, kvHeads: kv, headDim: d, storeCapacity: capacity, dtype: "f32", stageKeys: true });
    // Best first, as the device sends them: the list takes whole pages while they fit, then the best rows of the next one.
    const chosen = [[40, 3, 11, 10, 57, 22], [0, 63, 20, 5, 31, 9]];
    for (const budget of [4 * P, 4 * P + 5]) {
      const want = indexWant(budget, capacity, P), label = `budget ${budget}`;
      tiered.dropFileCache();
      const before = resident();
      stage.query(0).set(randn(r, kv * group * d));
      stage.chosenPages(0).set(chosen.flatMap((c) => c.slice(0, want)));
      stage.submit({ slot: 0, k: K, v: V, offloaded: capacity, kmax: budget, scale: 0.125, keys: true, work: { kind: "index", budget, form: "int8", pageSize: P, superPages: 4, chosen: true } });
      stage.wait();
      const out = stage.output(0), listed = new Set<number>();
      for (let g = 0; g < kv; g++) {
        expect(out.counts[g], label).toBe(budget);
        for (let i = 0; i < budget; i++) listed.add(g * pages + Math.floor(out.ids[g * out.kmax + i]! / P));
      }
      // The list's pages are the picks the budget reaches (the last one partly when it does not divide).
      expect([...listed].sort((a, b) => a - b), label).toEqual(chosen.flatMap((c, g) => c.slice(0, Math.ceil(budget / P)).map((p) => g * pages + p)).sort((a, b) => a - b));
      const after = resident(), read = [...after].filter((p) => !before.has(p));
      expect(read.length, `${label}: the cache was dropped`).toBeGreaterThan(0);
      for (const p of read) expect(listed.has(p), `${label}: page ${p} read but not picked`).toBe(true);
      for (const p of listed) expect(after.has(p), `${label}: page ${p} picked, not read`).toBe(true);
      expect(stage.lastReads().bytes, label).toBe(kv * budget * d * 4); // the listed V rows, each once
    }
    be.free(K);
    be.free(V);
  });

  it("the latency probe: random 4 KiB reads at depth 1 and deeper are positive, its file is gone; bad input is one line", () => {
    const dir = mkdtempSync(join(tmpdir(), "hg-rows-"));
    dirs.push(dir);
    const [one, deep] = probeFileReadLatency(dir, [{ threads: 1, depth: 1 }, { threads: 2, depth: 4 }], 4 * 2 ** 20, 64);
    expect(one).toBeGreaterThan(0);
    expect(deep).toBeGreaterThan(0);
    expect(readdirSync(dir)).toEqual([]);
    expect(() => probeFileReadLatency(dir, [{ threads: 0, depth: 1 }])).toThrow(/^disk probe: threads and depth must be integers in \[1, 256\], got 0 × 1$/);
    expect(() => probeFileReadLatency("/nonexistent-hg-dir", [{ threads: 1, depth: 1 }])).toThrow(/^disk probe: random reads of a file in \/nonexistent-hg-dir failed: ENOENT$/);
  });
});
