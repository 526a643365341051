import { spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { dummyModelFiles, loadModel, type StoreLayout, type Tensor } from "@hybridgen/core";
import { createCpuBackend, TieredStore } from "@hybridgen/kernels-cpu";
import { createHybridAttention, KSpill } from "../src/index.js";
import { openIn } from "./batch-helpers.js";
import { TINY_CONFIG } from "./tiny-model.js";

const PAGE = 4096;
const here = fileURLToPath(new URL(".", import.meta.url));
const dirs: string[] = [];
const tmp = () => {
  const d = mkdtempSync(join(tmpdir(), "hg-kspill-"));
  dirs.push(d);
  return d;
};
const backend = createCpuBackend({ threads: 1 });
afterAll(() => {
  backend.close();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});


/** /proc/self/maps lines mapping `path` (unlinked) at [lo, hi). */
const mappedAt = (path: string) =>
  readFileSync("/proc/self/maps", "utf8").split("\n").filter((l) => l.includes(path)).map((l) => l.split(" ")[0]!.split("-").map((x) => parseInt(x, 16)) as [number, number]);

/** A store of `layers` layers, K and V [2 KV heads, 256 slots, 32] f32 (8 pages a KV head), K in memory ("local"), `spillPages` of K to `dir`. */
function smallStore(dir: string, spillPages: number, layers = 2, kMode: "local" | "bind" = "local"): StoreLayout {
  const region = 2 * 256 * 32 * 4;
  const mem = (mode: "local" | "bind") => [{ offset: 0, bytes: region, tier: "node0", mode, nodes: mode === "bind" ? [0] : [] }];
  return {
    regionBytes: region, pageBytes: PAGE,
    k: Array.from({ length: layers }, () => mem(kMode)), v: Array.from({ length: layers }, () => mem("local")),
    kSpill: { unitBytes: PAGE, files: [{ tier: `file:${dir}`, dir, bytes: spillPages * PAGE }] },
  };
}

const rows = (seed: number, n: number) => Float32Array.from({ length: n }, (_, i) => Math.sin(seed * 1000 + i * 0.731) * 3);
const sync = () => {};

describe("KSpill: K pages to disk, coldest first", () => {
  it("spills the least recently selected units once K outgrows memory; they read back bit for bit through the mapping", () => {
    const dir = tmp();
    // 2 layers × 16 units of K; memory keeps 26, the file 6 (+1 unit of slack for a pass's rounding).
    using spill = new KSpill(new TieredStore(smallStore(dir, 6)));
    expect(spill.memory.limitBytes).toBe(26 * PAGE);
    expect(readdirSync(dir)).toEqual([]); // unlinked once open and reserved
    expect(openIn(dir)).toEqual([`${spill.spillFiles[0]!.path} (deleted)`]);
    expect(spill.spillFiles[0]).toMatchObject({ bytes: 7 * PAGE, usedBytes: 0 });
    const k: Tensor[] = [], v: Tensor[] = [], data: Float32Array[] = [];
    for (let l = 0; l < 2; l++) {
      k.push(spill.alloc(backend, "k", l, [2, 256, 32], "f32"));
      v.push(spill.alloc(backend, "v", l, [2, 256, 32], "f32"));
      data.push(rows(l + 1, 2 * 256 * 32));
      backend.write(k[l]!, data[l]!);
    }
    expect(spill.pinnable(k[0]!)).toBe(false);
    expect(spill.pinnable(v[0]!)).toBe(true);
    // Rows 0–63 arrive (units 0–1 of each KV head, 8 units in all), then 64–127: under the limit, nothing moves.
    spill.stored(64, sync);
    spill.stored(128, sync);
    expect(spill.memory.residentBytes).toBe(16 * PAGE);
    expect(spill.stats.units).toBe(0);
    // The stage gathers rows of layer 0's first unit (KV head 0) and layer 1's second unit of KV head 1 (the page index's picks: no read-ahead, as recent).
    spill.readAhead(v[0]!, Int32Array.of(3, 17, 0, 0), Int32Array.of(2, 0), 2, true);
    spill.readAhead(v[1]!, Int32Array.of(0, 0, 40, 0), Int32Array.of(0, 1), 2, false);
    // All 256 rows: 32 units touched, 6 over the limit. The coldest are the first rows' units no stage selected since.
    let passes = 0;
    spill.stored(256, () => passes++);
    expect(passes).toBe(1);
    const unit = (l: number, g: number, u: number) => [l, g * 8 * PAGE + u * PAGE] as const;
    const want = [unit(0, 0, 1), unit(0, 1, 0), unit(0, 1, 1), unit(1, 0, 0), unit(1, 0, 1), unit(1, 1, 0)];
    const spilled: (readonly [number, number])[] = [];
    for (let l = 0; l < 2; l++) for (let off = 0; off < 16 * PAGE; off += PAGE) if (spill.spilled(l, off)) spilled.push([l, off]);
    expect(spilled).toEqual(want);
    expect(spill.stats).toEqual({ passes: 1, units: 6, bytes: 6 * PAGE });
    expect(spill.memory.residentBytes).toBe(26 * PAGE);
    // Mapped from the spill file where they were; every row reads back as written, and a write to a spilled unit lands.
    const path = spill.spillFiles[0]!.path;
    const base = (l: number) => backend.hostRegion(k[l]!).address;
    const maps = mappedAt(path);
    for (const [l, off] of want) expect(maps.some(([lo, hi]) => lo <= base(l) + off && base(l) + off + PAGE <= hi)).toBe(true);
    for (let l = 0; l < 2; l++) expect(backend.read(k[l]!)).toEqual(data[l]);
    const fresh = rows(9, 32);
    backend.write(k[0]!, fresh, 32 * 32); // row 32 of KV head 0: a spilled unit
    expect(backend.read(k[0]!, 32 * 32, 32)).toEqual(fresh);
    spill.release();
    expect(openIn(dir)).toEqual([]);
    expect(mappedAt(path)).toEqual([]);
  });

  it("a unit with rows still to be written stays; a bound segment's first page stays for verify(); the limit is whole units", () => {
    const dir = tmp();
    // No memory for K at all: every complete unit goes as soon as it is written.
    using spill = new KSpill(new TieredStore(smallStore(dir, 32, 2, "bind")));
    const k = [0, 1].map((l) => {
      spill.alloc(backend, "v", l, [2, 256, 32], "f32");
      return spill.alloc(backend, "k", l, [2, 256, 32], "f32");
    });
    backend.write(k[0]!, rows(3, 2 * 256 * 32));
    spill.stored(40, sync); // rows 0–31 fill a unit a KV head; 32–39 half-fill the next
    // Unit 0 of each region is its bound segment's first page (kept); KV head 1's unit 0 (rows 0–31) is complete, the units of rows 32–63 are not.
    for (let l = 0; l < 2; l++) expect([0, 1, 8, 9].map((u) => spill.spilled(l, u * PAGE))).toEqual([false, false, true, false]);
    expect(spill.verify().every((c) => c.ok)).toBe(true);
    spill.stored(256, sync);
    expect(spill.memory.residentBytes).toBe(2 * PAGE); // the two kept units
    expect(spill.stats.units).toBe(30);
    expect(backend.read(k[0]!)).toEqual(rows(3, 2 * 256 * 32));
    expect(spill.verify().every((c) => c.ok)).toBe(true);
  });

  it("a reset regrows the store: rewritten rows arrive again, spilled units take the writes", () => {
    const dir = tmp();
    using spill = new KSpill(new TieredStore(smallStore(dir, 8, 1)));
    spill.alloc(backend, "v", 0, [2, 256, 32], "f32");
    const k = spill.alloc(backend, "k", 0, [2, 256, 32], "f32");
    backend.write(k, rows(4, 2 * 256 * 32));
    spill.stored(256, sync);
    expect(spill.stats.units).toBe(8);
    spill.stored(0, sync);
    const again = rows(5, 2 * 256 * 32);
    backend.write(k, again);
    spill.stored(256, sync);
    expect(spill.stats.units).toBe(8); // nothing new in memory: the spilled units stayed spilled
    expect(backend.read(k)).toEqual(again);
  });

  it("several spill files (file tiers) take a run in turn", () => {
    const a = tmp(), b = tmp();
    const layout: StoreLayout = { ...smallStore(a, 0, 1), kSpill: { unitBytes: PAGE, files: [{ tier: "a", dir: a, bytes: 3 * PAGE }, { tier: "b", dir: b, bytes: 3 * PAGE }] } };
    using spill = new KSpill(new TieredStore(layout));
    spill.alloc(backend, "v", 0, [2, 256, 32], "f32");
    const k = spill.alloc(backend, "k", 0, [2, 256, 32], "f32");
    const data = rows(6, 2 * 256 * 32);
    backend.write(k, data);
    spill.stored(256, sync); // 16 units, 10 may stay: units 0–5 (one run) go, 3 to each file
    expect(spill.spillFiles.map((f) => [f.bytes, f.usedBytes])).toEqual([[3 * PAGE, 3 * PAGE], [4 * PAGE, 3 * PAGE]]);
    expect([...Array(16).keys()].filter((u) => spill.spilled(0, u * PAGE))).toEqual([0, 1, 2, 3, 4, 5]);
    expect(spill.stats).toEqual({ passes: 1, units: 6, bytes: 6 * PAGE });
    const base = backend.hostRegion(k).address;
    expect(mappedAt(spill.spillFiles[0]!.path)).toEqual([[base, base + 3 * PAGE]]);
    expect(mappedAt(spill.spillFiles[1]!.path)).toEqual([[base + 3 * PAGE, base + 6 * PAGE]]);
    expect(backend.read(k)).toEqual(data);
  });

  it("errors are one line and leave nothing open: a missing directory, a file too large to reserve, a layout without kSpill", () => {
    const good = tmp();
    expect(() => new KSpill(new TieredStore({ ...smallStore(good, 4), kSpill: { unitBytes: PAGE, files: [{ tier: "a", dir: good, bytes: PAGE }, { tier: "b", dir: "/nonexistent-hg", bytes: PAGE }] } })))
      .toThrow(/^K spill: cannot create a file in \/nonexistent-hg: ENOENT$/);
    expect(openIn(good)).toEqual([]);
    expect(() => new KSpill(new TieredStore(smallStore(good, 2 ** 38)))).toThrow(new RegExp(`^K spill: cannot reserve \\d+ bytes in ${good}: (ENOSPC|EFBIG)$`));
    expect(openIn(good)).toEqual([]);
    expect(readdirSync(good)).toEqual([]);
    const { kSpill: _, ...plain } = smallStore(good, 4);
    expect(() => new KSpill(new TieredStore(plain))).toThrow("K spill: the store's layout keeps all of K in memory (no kSpill)");
  });

  it("a process killed with SIGKILL leaves no spill file (they are unlinked while open)", async () => {
    const dir = tmp();
    const script = `
      import { createCpuBackend, TieredStore } from "@hybridgen/kernels-cpu";
      import { KSpill } from "${join(here, "../src/index.ts")}";
      const be = createCpuBackend({ threads: 1 });
      const layout = ${JSON.stringify(smallStore(dir, 16, 1))};
      const s = new KSpill(new TieredStore(layout));
      s.alloc(be, "v", 0, [2, 256, 32], "f32");
      s.alloc(be, "k", 0, [2, 256, 32], "f32");
      s.stored(256, () => {});
      console.log("spilled", s.stats.units);
      setInterval(() => {}, 1000);`;
    const child = spawn(process.execPath, ["-e", script], { cwd: join(here, ".."), stdio: ["ignore", "pipe", "inherit"] });
    const line = await new Promise<string>((resolve) => child.stdout.once("data", (b: Buffer) => resolve(b.toString())));
    expect(line.trim()).toBe("spilled 16");
    const held = readdirSync(`/proc/${child.pid}/fd`).map((fd) => {
      try {
        return readlinkSync(`/proc/${child.pid}/fd/${fd}`);
      } catch {
        return "";
      }
    }).filter((l) => l.startsWith(`${dir}/`));
    expect(held).toHaveLength(1);
    expect(held[0]).toMatch(/\/hybridgen-kv-\d+-\d+-kspill\.bin \(deleted\)$/);
    child.kill("SIGKILL");
    await new Promise((resolve) => child.once("exit", resolve));
    expect(readdirSync(dir)).toEqual([]);
  });
});

describe("KSpill under hybrid attention", () => {
  it("a tiny model's logits with V on disk and half of K spilled page-wise equal the all-in-memory run's, bit for bit", async () => {
    const config = { ...TINY_CONFIG, max_position_embeddings: 1024 };
    const files = () => dummyModelFiles(config, "f32", 11, undefined, "tiny-1k");
    const prompt = Int32Array.from({ length: 700 }, (_, i) => (i * 37 + 11) % 256);
    const run = async (place?: (regionBytes: number, layers: number) => KSpill) => {
      using model = loadModel(files(), backend, { maxContext: 1024, gpuKvBudget: 32, sinkTokens: 4 });
      const c = model.cache;
      const store = place?.(c.kvHeads * c.storeCapacity * c.headDim * 4, c.layers);
      using ha = await createHybridAttention(model, backend, { scheduler: "fixed", selector: "topk", k: 16, ...(store ? { storeAllocator: store } : {}) });
      void ha;
      const out = [Array.from(model.forward(prompt, 0))];
      for (let s = 0; s < 8; s++) out.push(Array.from(model.forward(Int32Array.of((s * 29 + 3) % 256), 700 + s)));
      return { out, stats: store ? { ...store.stats, resident: store.memory.residentBytes, limit: store.memory.limitBytes } : null };
    };
    const plain = await run();
    const dir = tmp();
    let spill: KSpill | null = null;
    const spilled = await run((regionBytes, layers) => {
      const R = Math.ceil(regionBytes / PAGE) * PAGE;
      const layout: StoreLayout = {
        regionBytes: R, pageBytes: PAGE,
        k: Array.from({ length: layers }, () => [{ offset: 0, bytes: R, tier: "node0", mode: "local", nodes: [] }]),
        v: Array.from({ length: layers }, () => [{ offset: 0, bytes: R, tier: `file:${dir}`, mode: "file", nodes: [], dir }]),
        kSpill: { unitBytes: PAGE, files: [{ tier: `file:${dir}`, dir, bytes: Math.floor((layers * R) / 2 / PAGE) * PAGE }] },
      };
      spill = new KSpill(new TieredStore(layout));
      return spill;
    });
    expect(spilled.out).toEqual(plain.out);
    // The prompt's first rows went first; every decode step's scoring read the spilled units back.
    expect(spilled.stats!.units).toBeGreaterThanOrEqual(20);
    expect(spilled.stats!.passes).toBeGreaterThan(1);
    expect(spilled.stats!.resident).toBeLessThanOrEqual(spilled.stats!.limit);
    expect(readdirSync(dir)).toEqual([]);
    expect(openIn(dir)).toEqual([]); // the cache closed: store released, spill files closed
    expect(spill).not.toBeNull();
  });
});
