import { describe, expect, it } from "vitest";
import { seededRandom, type MemoryTier, type StoreSegment } from "@hybridgen/spec";
import { discoverTiers, kSpillUnitBytes, layoutStore, placeKv, placeLocal, tierShares } from "../src/index.js";
import { fakeSys } from "./fake-sys.js";

const MiB = 2 ** 20, GiB = 2 ** 30, PAGE = 4096;
// Two sockets and a CPU-less (CXL) node, described as sysfs shows them.
const twoSocketsCxl = () =>
  discoverTiers({
    sysRoot: fakeSys([
      { id: 0, cpulist: "0-7", memTotalKb: 64 * 1024 * 1024 },
      { id: 1, cpulist: "8-15", memTotalKb: 64 * 1024 * 1024 },
      { id: 2, cpulist: "", memTotalKb: 256 * 1024 * 1024 },
    ]),
  });

const bytesOn = (regions: StoreSegment[][], pred: (s: StoreSegment) => boolean) => regions.flat().filter(pred).reduce((n, s) => n + s.bytes, 0);

describe("layoutStore: placements on described topologies", () => {
  it("semantic on two sockets + CXL: K bound to node0, V bound to the CPU-less node2", () => {
    const tiers = twoSocketsCxl();
    expect(tiers.map((t) => `${t.id}:${t.kind}`)).toEqual(["node0:dram", "node1:dram", "node2:cxl"]);
    const r = layoutStore({ tiers, placement: placeKv("semantic", tiers), layers: 32, regionBytes: 256 * MiB });
    expect(r.fits).toBe(true);
    expect(r.layout.k.every((segs) => segs.length === 1 && segs[0]!.mode === "bind" && segs[0]!.nodes.join() === "0")).toBe(true);
    expect(r.layout.v.every((segs) => segs.length === 1 && segs[0]!.tier === "node2" && segs[0]!.nodes.join() === "2")).toBe(true);
    expect(r.tiers.find((t) => t.id === "node0")).toMatchObject({ kBytes: 32 * 256 * MiB, vBytes: 0 });
  });

  it("semantic spills K to node1 at a page boundary inside a region when node0 is full", () => {
    const tiers = twoSocketsCxl();
    // node0 holds 57.6 GiB after headroom: 1.5 GiB regions × 40 layers of K = 60 GiB overflows it.
    const r = layoutStore({ tiers, placement: placeKv("semantic", tiers), layers: 40, regionBytes: 1.5 * GiB });
    const split = r.layout.k.find((segs) => segs.length === 2)!;
    expect(split.map((s) => s.tier)).toEqual(["node0", "node1"]);
    expect(split[1]!.offset % PAGE).toBe(0);
    expect(r.tiers.find((t) => t.id === "node0")!.kBytes).toBe(r.tiers.find((t) => t.id === "node0")!.availableBytes);
  });

  it("interleave: every region interleaved over all three nodes", () => {
    const tiers = twoSocketsCxl();
    const r = layoutStore({ tiers, placement: placeKv("interleave", tiers), layers: 4, regionBytes: 64 * MiB });
    for (const segs of [...r.layout.k, ...r.layout.v]) expect(segs).toEqual([{ offset: 0, bytes: 64 * MiB, tier: "node0+node1+node2", mode: "interleave", nodes: [0, 1, 2] }]);
  });

  it("local: no binding; K and V on the local node", () => {
    const tiers = twoSocketsCxl();
    const r = layoutStore({ tiers, placement: placeLocal(tiers, 1), layers: 2, regionBytes: MiB });
    expect(r.layout.k[0]).toEqual([{ offset: 0, bytes: MiB, tier: "node1", mode: "local", nodes: [] }]);
    expect(r.tiers.find((t) => t.id === "node1")).toMatchObject({ kBytes: 2 * MiB, vBytes: 2 * MiB });
  });

  it("one node (this machine's shape): K and V both bound to node 0", () => {
    const tiers = discoverTiers({ sysRoot: fakeSys([{ id: 0, cpulist: "0-1", memTotalKb: 8 * 1024 * 1024 }]) });
    const r = layoutStore({ tiers, placement: placeKv("semantic", tiers), layers: 2, regionBytes: 10_000 });
    expect(r.layout.regionBytes).toBe(12_288); // whole pages
    expect([...r.layout.k, ...r.layout.v].flat().map((s) => `${s.mode}:${s.nodes}`)).toEqual(Array(4).fill("bind:0"));
  });
});

describe("layoutStore: the disk tier", () => {
  const disk: MemoryTier = { id: "file:/nvme", kind: "file", capacityBytes: 100 * GiB, path: "/nvme" };
  const node0: MemoryTier = { id: "node0", kind: "dram", numaNode: 0, capacityBytes: 16 * GiB };

  it("a host budget sends V to disk first, its last layers first, then K page-wise (a K spill, its regions memory)", () => {
    const tiers = [node0, disk];
    const budget = 10 * GiB; // K (8 GiB) fits, V gets 2 GiB of memory
    const r = layoutStore({ tiers, placement: placeKv("semantic", tiers), layers: 8, regionBytes: GiB, hostBudgetBytes: budget });
    expect(bytesOn(r.layout.k, (s) => s.mode === "file")).toBe(0);
    expect(r.layout.v.map((segs) => segs.map((s) => s.mode).join("+"))).toEqual(["bind", "bind", "file", "file", "file", "file", "file", "file"]);
    expect(r.layout.v[2]![0]).toMatchObject({ dir: "/nvme", mode: "file" });
    expect(r.diskBytes).toBe(6 * GiB);
    expect(r.layout.kSpill).toBeUndefined();
    const tight = layoutStore({ tiers, placement: placeKv("semantic", tiers), layers: 8, regionBytes: GiB, hostBudgetBytes: 6 * GiB });
    expect(bytesOn(tight.layout.v, (s) => s.mode === "file")).toBe(8 * GiB);
    // K: 6 GiB in memory, 2 GiB on disk — not K's last two layers: every K region stays bound to node0, and a K spill
    // keeps 2 GiB of its coldest units in a file of the disk tier; 8 GiB of K in 16 382 units at most: 129 pages a unit.
    expect(tight.layout.k.flat().every((s) => s.mode === "bind" && s.tier === "node0")).toBe(true);
    expect(bytesOn(tight.layout.k, () => true)).toBe(8 * GiB);
    expect(tight.layout.kSpill).toEqual({ unitBytes: 129 * PAGE, files: [{ tier: "file:/nvme", dir: "/nvme", bytes: 2 * GiB }] });
    expect(tight.tiers.map((t) => [t.id, t.kBytes, t.vBytes])).toEqual([["node0", 6 * GiB, 0], ["file:/nvme", 2 * GiB, 8 * GiB]]);
    expect(tight.diskBytes).toBe(10 * GiB);
    // No memory at all for the store: K's regions are still memory (the first memory tier K would use), all of it spilled as it comes.
    const none = layoutStore({ tiers, placement: placeKv("semantic", tiers), layers: 8, regionBytes: GiB, hostBudgetBytes: 0 });
    expect(none.layout.k.flat().every((s) => s.tier === "node0" && s.mode === "bind")).toBe(true);
    expect(none.layout.kSpill!.files).toEqual([{ tier: "file:/nvme", dir: "/nvme", bytes: 8 * GiB }]);
  });

  it("kSpillUnitBytes: whole pages, as few as keep K within a quarter of the map limit", () => {
    expect(kSpillUnitBytes(GiB, PAGE)).toBe(PAGE * Math.ceil(262_144 / 16_382)); // 17 pages
    expect(kSpillUnitBytes(48 * 1024, PAGE)).toBe(PAGE);
    expect(kSpillUnitBytes(69.6 * GiB, PAGE)).toBe(PAGE * Math.ceil(Math.ceil((69.6 * GiB) / PAGE) / 16_382)); // the 2M run's K: 1 114 pages, 4.35 MiB
    expect(kSpillUnitBytes(GiB, PAGE, 400)).toBe(PAGE * Math.ceil(262_144 / 100));
  });

  it("interleave with a disk tier: what memory cannot hold goes to the file", () => {
    const tiers = [node0, disk];
    const r = layoutStore({ tiers, placement: placeKv("interleave", tiers), layers: 8, regionBytes: GiB, hostBudgetBytes: 12 * GiB });
    expect(bytesOn(r.layout.k, (s) => s.mode === "interleave")).toBe(8 * GiB);
    expect(bytesOn(r.layout.v, (s) => s.mode === "interleave")).toBe(4 * GiB);
    expect(r.diskBytes).toBe(4 * GiB);
  });

  it("no room anywhere: fits is false and the shortfall is counted", () => {
    const tiers = [node0];
    const exact = layoutStore({ tiers, placement: placeKv("semantic", tiers), layers: 8, regionBytes: GiB, headroom: 0 });
    expect(exact).toMatchObject({ fits: true, shortfallBytes: 0 });
    const over = layoutStore({ tiers, placement: placeKv("semantic", tiers), layers: 9, regionBytes: GiB, headroom: 0 });
    expect(over).toMatchObject({ fits: false, shortfallBytes: 2 * GiB });
    expect(over.layout.v[8]).toEqual([{ offset: 0, bytes: GiB, tier: "(no room)", mode: "local", nodes: [] }]);
  });

  it("invariants over random tier sets: segments tile every region, pages align, bytes are conserved", () => {
    const rnd = seededRandom(7);
    for (let trial = 0; trial < 200; trial++) {
      const n = 1 + Math.floor(rnd() * 3);
      const tiers: MemoryTier[] = Array.from({ length: n }, (_, i) => ({
        id: `node${i}`, kind: i === 0 || rnd() < 0.5 ? "dram" : "cxl", numaNode: i, capacityBytes: Math.floor(rnd() * 8 * GiB),
      }));
      if (rnd() < 0.5) tiers.push({ ...disk, capacityBytes: Math.floor(rnd() * 16 * GiB) });
      const policy = (["semantic", "interleave", "local", "dram-only"] as const)[Math.floor(rnd() * 4)]!;
      const layers = 1 + Math.floor(rnd() * 6), regionBytes = 1 + Math.floor(rnd() * GiB);
      const r = layoutStore({ tiers, placement: placeKv(policy, tiers), layers, regionBytes, hostBudgetBytes: rnd() < 0.5 ? Math.floor(rnd() * 8 * GiB) : undefined });
      for (const segs of [...r.layout.k, ...r.layout.v]) {
        let at = 0;
        for (const s of segs) {
          expect(s.offset).toBe(at);
          expect(s.offset % PAGE).toBe(0);
          at += s.bytes;
        }
        expect(at).toBe(r.layout.regionBytes);
      }
      const placed = r.tiers.reduce((m, t) => m + t.kBytes + t.vBytes, 0);
      expect(placed + r.shortfallBytes).toBe(2 * layers * r.layout.regionBytes);
      expect(r.fits).toBe(r.shortfallBytes === 0);
    }
  });
});

describe("tierShares", () => {
  it("gives each of a batch's sequences a whole-byte share of every tier's capacity and free bytes", () => {
    const tiers: MemoryTier[] = [
      { id: "node0", kind: "dram", numaNode: 0, capacityBytes: 10 * 2 ** 30 + 3, freeBytes: 7 * 2 ** 30 },
      { id: "disk", kind: "file", path: "/tmp/kv", capacityBytes: 100 * 2 ** 30 },
    ];
    const s = tierShares(tiers, 4);
    expect(s.map((t) => [t.id, t.capacityBytes, t.freeBytes])).toEqual([["node0", Math.floor((10 * 2 ** 30 + 3) / 4), 7 * 2 ** 28], ["disk", 25 * 2 ** 30, undefined]]);
    expect(s[1]).not.toHaveProperty("freeBytes");
    expect(tierShares(tiers, 1)).toEqual(tiers);
    expect(() => tierShares(tiers, 0)).toThrow("batch must be a positive integer, got 0");
  });
});
