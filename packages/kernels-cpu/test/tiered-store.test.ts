import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { HybridgenError, type StoreLayout, type StoreSegment } from "@hybridgen/spec";
import { KvCache } from "@hybridgen/core";
import { createCpuBackend, liveDiskFiles, probeFileReadBandwidth, probeMemoryReadBandwidth, sweepStaleDiskFiles, TieredStore } from "../src/index.js";

const PAGE = 4096;
const heads = 2, cap = 4096, headDim = 64; // 2 MiB per f32 region: 512 pages
const REGION = heads * cap * headDim * 4;
const dirs: string[] = [];
const tmp = () => {
  const d = mkdtempSync(join(tmpdir(), "hg-disk-"));
  dirs.push(d);
  return d;
};
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

const seg = (offset: number, bytes: number, mode: StoreSegment["mode"], extra: Partial<StoreSegment> = {}): StoreSegment => ({
  offset, bytes, mode, tier: mode === "file" ? "file:x" : "node0", nodes: mode === "file" || mode === "local" ? [] : [0], ...extra,
});
const layoutOf = (k: StoreSegment[][], v: StoreSegment[][] = k): StoreLayout => ({ regionBytes: REGION, pageBytes: PAGE, k, v });

/** Bitwise equality, without vitest's element-by-element diff of half a million floats. */
function same(a: Float32Array, b: Float32Array): boolean {
  return a.length === b.length && Buffer.compare(Buffer.from(a.buffer, a.byteOffset, a.byteLength), Buffer.from(b.buffer, b.byteOffset, b.byteLength)) === 0;
}

function pattern(n: number, salt: number): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = ((i * 2654435761 + salt) % 1000003) / 1000003 - 0.5;
  return a;
}

describe("TieredStore: NUMA binding applied and read back", () => {
  for (const mode of ["bind", "preferred", "interleave"] as const) {
    it(`${mode} on node 0: the kernel reports the policy, and every written page is on node 0`, () => {
      using be = createCpuBackend({ threads: 1 });
      using store = new TieredStore(layoutOf([[seg(0, REGION, mode)]]));
      const k = store.alloc(be, "k", 0, [heads, cap, headDim], "f32");
      const data = pattern(heads * cap * headDim, 1);
      be.write(k, data);
      expect(same(be.read(k), data)).toBe(true);
      const [check] = store.verify(64);
      expect(check).toMatchObject({ pool: "k", layer: 0, mode, policy: mode, policyNodes: [0], ok: true });
      expect(check!.pageNodes).toEqual({ 0: 64 });
      expect(store.pinnable(k)).toBe(true);
      be.free(k);
    });
  }

  it("local leaves the default policy; a bad node is a one-line mbind error", () => {
    using be = createCpuBackend({ threads: 1 });
    using local = new TieredStore(layoutOf([[seg(0, REGION, "local")]]));
    local.alloc(be, "k", 0, [heads, cap, headDim], "f32");
    expect(local.verify()[0]).toMatchObject({ policy: "default", ok: true });
    using bad = new TieredStore(layoutOf([[seg(0, REGION, "bind", { nodes: [1000] })]]));
    expect(() => bad.alloc(be, "k", 0, [heads, cap, headDim], "f32")).toThrow(/^placement: mbind\(bind 1000\) of K layer 0 failed: E/);
  });

  it("segments of one region bound apart: each keeps its own policy", () => {
    using be = createCpuBackend({ threads: 1 });
    using store = new TieredStore(layoutOf([[seg(0, REGION / 2, "bind"), seg(REGION / 2, REGION / 2, "interleave")]]));
    const k = store.alloc(be, "k", 0, [heads, cap, headDim], "f32");
    be.write(k, pattern(heads * cap * headDim, 2));
    expect(store.verify().map((c) => [c.policy, c.ok])).toEqual([["bind", true], ["interleave", true]]);
  });

  it("rejects a layout whose segments leave a gap or are not page-aligned", () => {
    expect(() => new TieredStore(layoutOf([[seg(0, PAGE, "bind"), seg(2 * PAGE, REGION - 2 * PAGE, "bind")]]))).toThrow(HybridgenError);
    expect(() => new TieredStore(layoutOf([[seg(0, 100, "bind"), seg(100, REGION - 100, "bind")]]))).toThrow(/page-aligned/);
  });
});

describe("TieredStore: the disk tier", () => {
  it("a file-backed half region reads back what was written, is not pinnable, and its file goes with release()", () => {
    const dir = tmp();
    using be = createCpuBackend({ threads: 1 });
    const store = new TieredStore(layoutOf([[seg(0, REGION / 2, "bind"), seg(REGION / 2, REGION / 2, "file", { dir })]]));
    const k = store.alloc(be, "k", 0, [heads, cap, headDim], "f32");
    const data = pattern(heads * cap * headDim, 3);
    be.write(k, data);
    expect(same(be.read(k), data)).toBe(true);
    const files = readdirSync(dir);
    expect(files).toHaveLength(1);
    expect(files[0]).toMatch(new RegExp(`^hybridgen-kv-${process.pid}-\\d+-k0\\.bin$`));
    expect(statSync(join(dir, files[0]!)).size).toBe(REGION / 2);
    expect(store.diskBytes).toBe(REGION / 2);
    expect(store.pinnable(k)).toBe(false);
    const checks = store.verify();
    expect(checks[1]).toMatchObject({ mode: "file", mappedFile: join(dir, files[0]!), ok: true });
    expect(checks[0]).toMatchObject({ mode: "bind", ok: true });
    store.prefetch("k", 0, 100, headDim * 4, cap, heads); // read-ahead of the file part of each head's rows
    be.free(k);
    store.release();
    expect(readdirSync(dir)).toEqual([]);
    expect(liveDiskFiles()).toEqual([]);
  });

  it("a KvCache placed on the store keeps rows through evictions, file-backed V included; close() removes the files", () => {
    const dir = tmp();
    using be = createCpuBackend({ threads: 1 });
    const cache = new KvCache(be, { layers: 2, kvHeads: 2, headDim: 64, maxContext: 4096 + 32, gpuKvBudget: 48, evictBlock: 16, maxAppend: 16 } as never);
    const bytes = 2 * cache.storeCapacity * 64 * 4;
    const pages = Math.ceil(bytes / PAGE) * PAGE;
    const file = (): StoreSegment[] => [seg(0, pages, "file", { dir })];
    const mem = (): StoreSegment[] => [seg(0, pages, "bind")];
    const store = new TieredStore({ regionBytes: pages, pageBytes: PAGE, k: [mem(), mem()], v: [file(), file()] });
    cache.placeStore(store);
    expect(readdirSync(dir)).toHaveLength(2);
    expect(cache.stageStoreV(1)).toBe(cache.storeV[1]);
    cache.close();
    expect(readdirSync(dir)).toEqual([]);
  });

  it("readAhead: the next layer's file-backed pages at the gathered slots, adjacent rows in one request; memory layers and picks that do not predict the next layer's none", () => {
    const dir = tmp();
    using be = createCpuBackend({ threads: 1 });
    // V: layer 0 in memory, layer 1 file-backed; rows of 64 f32 = 256 bytes, 16 to a page.
    using store = new TieredStore(layoutOf([[seg(0, REGION, "bind")], [seg(0, REGION, "bind")]], [[seg(0, REGION, "bind")], [seg(0, REGION, "file", { dir })]]));
    const v0 = store.alloc(be, "v", 0, [heads, cap, headDim], "f32");
    const v1 = store.alloc(be, "v", 1, [heads, cap, headDim], "f32");
    const kmax = 20;
    const ids = new Int32Array(heads * kmax), counts = Int32Array.of(16, 3);
    for (let i = 0; i < 16; i++) ids[i] = i; // head 0: slots 0..15, one page
    ids.set([5, 100, 101], kmax); // head 1: two pages apart
    store.readAhead(v0, ids, counts, kmax, false); // the page index's picks: no read-ahead
    expect(store.readAheadStats).toEqual({ requests: 0, bytes: 0 });
    store.readAhead(v0, ids, counts, kmax, true);
    expect(store.readAheadStats).toEqual({ requests: 3, bytes: 3 * PAGE });
    store.readAhead(v1, ids, counts, kmax, true); // no layer 2
    const k0 = store.alloc(be, "k", 0, [heads, cap, headDim], "f32");
    store.alloc(be, "k", 1, [heads, cap, headDim], "f32");
    store.readAhead(k0, ids, counts, kmax, true); // K layer 1 is in memory
    expect(store.readAheadStats.requests).toBe(3);
  });

  it("a full disk (ENOSPC from the reservation) is a one-line error that leaves no file behind", () => {
    const dir = tmp();
    using be = createCpuBackend({ threads: 1 });
    const store = new TieredStore(layoutOf([[seg(0, REGION, "file", { dir })]]), { failFileErrno: 28 });
    expect(() => store.alloc(be, "k", 0, [heads, cap, headDim], "f32")).toThrow(/^disk tier: cannot create 2097152-byte file .*hybridgen-kv-.*: ENOSPC$/);
    store.release();
    expect(readdirSync(dir)).toEqual([]);
  });

  it("a read-only or missing directory fails at creation, naming the file", () => {
    using be = createCpuBackend({ threads: 1 });
    const store = new TieredStore(layoutOf([[seg(0, REGION, "file", { dir: "/nonexistent-hg-dir" })]]));
    expect(() => store.alloc(be, "k", 0, [heads, cap, headDim], "f32")).toThrow(/^disk tier: cannot create .*\/nonexistent-hg-dir\/hybridgen-kv-.*: ENOENT$/);
    store.release();
  });

  it("files a killed process left behind are swept; files of live processes are kept", () => {
    const dir = tmp();
    writeFileSync(join(dir, "hybridgen-kv-999999999-0-v3.bin"), "x"); // no such pid
    writeFileSync(join(dir, `hybridgen-kv-${process.ppid}-0-v3.bin`), "x"); // alive
    writeFileSync(join(dir, "other.bin"), "x");
    expect(sweepStaleDiskFiles(dir)).toEqual(["hybridgen-kv-999999999-0-v3.bin"]);
    expect(readdirSync(dir).sort()).toEqual([`hybridgen-kv-${process.ppid}-0-v3.bin`, "other.bin"].sort());
  });

  const child = (dir: string, end: "exit" | "wait") => `
    const { createCpuBackend, TieredStore } = await import(${JSON.stringify(join(import.meta.dirname, "../src/index.ts"))});
    const be = createCpuBackend({ threads: 1 });
    const store = new TieredStore({ regionBytes: ${REGION}, pageBytes: ${PAGE}, k: [[{ offset: 0, bytes: ${REGION}, mode: "file", tier: "f", nodes: [], dir: ${JSON.stringify(dir)} }]], v: [] });
    store.alloc(be, "k", 0, [${heads}, ${cap}, ${headDim}], "f32");
    console.log("ready");
    // "exit": leave once the parent has looked (it writes a line), so it never races the exit hook.
    ${end === "exit" ? 'process.stdin.once("data", () => process.exit(0));' : "setInterval(() => {}, 1000);"}
  `;
  const runChild = (dir: string, end: "exit" | "wait") =>
    new Promise<{ code: number | null; signal: string | null; sawFile: boolean }>((resolve) => {
      const p = spawn(process.execPath, ["-e", child(dir, end)], { stdio: ["pipe", "pipe", "inherit"] });
      let sawFile = false;
      p.stdout.on("data", (d: Buffer) => {
        if (!d.toString().includes("ready")) return;
        sawFile = readdirSync(dir).length === 1;
        if (end === "wait") p.kill("SIGINT");
        else p.stdin.write("go\n");
      });
      p.on("exit", (code, signal) => resolve({ code, signal, sawFile }));
    });

  it("an exit without release() removes the files (exit hook)", async () => {
    const dir = tmp();
    const r = await runChild(dir, "exit");
    expect(r).toMatchObject({ code: 0, sawFile: true });
    expect(readdirSync(dir)).toEqual([]);
  });

  it("Ctrl-C (SIGINT) removes the files and still ends the process", async () => {
    const dir = tmp();
    const r = await runChild(dir, "wait");
    expect(r.sawFile).toBe(true);
    expect(r.signal === "SIGINT" || r.code === 130).toBe(true);
    expect(readdirSync(dir)).toEqual([]);
  });
});

describe("tier probes", () => {
  it("memory and file read bandwidths are positive, and the probe file is gone", () => {
    expect(probeMemoryReadBandwidth(16 * 2 ** 20, 0, 1, 1)).toBeGreaterThan(0);
    expect(probeMemoryReadBandwidth(4 * 2 ** 20, undefined, 2, 1)).toBeGreaterThan(0);
    const dir = tmp();
    expect(probeFileReadBandwidth(dir, 4 * 2 ** 20, 2 ** 20)).toBeGreaterThan(0);
    expect(readdirSync(dir)).toEqual([]);
    expect(existsSync(dir)).toBe(true);
    expect(() => probeFileReadBandwidth("/nonexistent-hg-dir")).toThrow(/^disk probe: .*ENOENT$/);
  });
});
