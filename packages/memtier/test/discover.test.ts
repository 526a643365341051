import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { totalmem, tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { HybridgenError } from "@hybridgen/spec";
import { cpulistHasCpus, discoverTiers, parseNodeMeminfo, withUnclaimedMemory } from "../src/index.js";
import { fakeSys } from "./fake-sys.js";

const GiB = 2 ** 30;
const made: string[] = [];
afterAll(() => made.forEach((d) => rmSync(d, { recursive: true, force: true })));
const track = (d: string) => (made.push(d), d);

describe("discoverTiers on a fake /sys", () => {
  it("two DRAM sockets and a CPU-less CXL expander with HMAT bandwidth", () => {
    const root = track(
      fakeSys([
        { id: 0, cpulist: "0-15,32-47\n", memTotalKb: 64 * 1024 * 1024, memFreeKb: 60 * 1024 * 1024, readBandwidthMBs: 200000 },
        { id: 1, cpulist: "16-31,48-63\n", memTotalKb: 64 * 1024 * 1024 },
        { id: 2, cpulist: "\n", memTotalKb: 256 * 1024 * 1024, readBandwidthMBs: 30000 },
      ]),
    );
    const tiers = discoverTiers({ sysRoot: root });
    expect(tiers.map((t) => [t.id, t.kind, t.numaNode])).toEqual([
      ["node0", "dram", 0],
      ["node1", "dram", 1],
      ["node2", "cxl", 2],
    ]);
    expect(tiers[0]!.capacityBytes).toBe(64 * GiB);
    expect(tiers[0]!.freeBytes).toBe(60 * GiB);
    expect(tiers[0]!.readBandwidthGBs).toBe(200);
    expect(tiers[1]!.readBandwidthGBs).toBeUndefined();
    expect(tiers[2]!.capacityBytes).toBe(256 * GiB);
    expect(tiers[2]!.readBandwidthGBs).toBe(30);
  });

  it("skips memory-less and unreadable nodes, orders by node number (node10 after node2)", () => {
    const root = track(
      fakeSys([
        { id: 10, cpulist: "", memTotalKb: 1024 },
        { id: 2, cpulist: "0-3", memTotalKb: 2048 },
        { id: 3, cpulist: "4-7", memTotalKb: 0 }, // CPUs but no memory
        { id: 4, cpulist: "8", memTotalKb: null }, // no meminfo
      ]),
    );
    expect(discoverTiers({ sysRoot: root }).map((t) => `${t.id}:${t.kind}:${t.capacityBytes}`)).toEqual(["node2:dram:2097152", "node10:cxl:1048576"]);
  });

  it("falls back to one DRAM tier from os.totalmem() when /sys is missing", () => {
    const tiers = discoverTiers({ sysRoot: join(tmpdir(), "no-such-sys-root-hg") });
    expect(tiers).toHaveLength(1);
    expect(tiers[0]).toMatchObject({ id: "ram", kind: "dram", capacityBytes: totalmem() });
  });

  it("adds file tiers (explicit capacity, or the file system's free space) and rejects missing dirs", () => {
    const dir = track(mkdtempSync(join(tmpdir(), "hg-kv-")));
    const root = track(fakeSys([{ id: 0, cpulist: "0", memTotalKb: 1024 }]));
    const tiers = discoverTiers({ sysRoot: root, fileTiers: [{ path: dir, capacityBytes: 5 * GiB }, { path: dir }] });
    expect(tiers[1]).toMatchObject({ id: `file:${dir}`, kind: "file", capacityBytes: 5 * GiB, path: dir });
    expect(tiers[2]!.capacityBytes).toBeGreaterThan(0);
    expect(() => discoverTiers({ sysRoot: root, fileTiers: [{ path: join(dir, "nope") }] })).toThrow(HybridgenError);
    expect(() => discoverTiers({ sysRoot: root, fileTiers: [{ path: join(dir, "nope") }] })).toThrow(/is not an existing directory/);
  });

  it("reads this machine's real /sys without error", () => {
    const tiers = discoverTiers();
    expect(tiers.length).toBeGreaterThan(0);
    expect(tiers.some((t) => t.kind === "dram")).toBe(true);
    if (existsSync("/sys/devices/system/node/node0/meminfo")) expect(tiers[0]!.id).toBe("node0");
  });
});

describe("sysfs parsers", () => {
  it("meminfo lines to bytes, cpulists", () => {
    const m = parseNodeMeminfo("Node 1 MemTotal:       32594412 kB\nNode 1 MemFree: 100 kB\ngarbage\n");
    expect(m.get("MemTotal")).toBe(32594412 * 1024);
    expect(m.get("MemFree")).toBe(102400);
    expect(cpulistHasCpus("0-3,8\n")).toBe(true);
    expect(cpulistHasCpus("\n")).toBe(false);
  });
});

describe("withUnclaimedMemory", () => {
  const node = (id: string, kind: "dram" | "cxl", cap: number, free: number) => ({ id, kind, capacityBytes: cap, freeBytes: free });
  it("one DRAM node that counts far less than the OS takes the OS's figures", () => {
    expect(withUnclaimedMemory([node("node0", "dram", 11 * GiB, 9 * GiB)], 125 * GiB, 120 * GiB)).toEqual([node("node0", "dram", 125 * GiB, 120 * GiB)]);
  });
  it("a node that counts what the OS does, several nodes, or a CXL-only view stay as they are", () => {
    const one = [node("node0", "dram", 120 * GiB, 100 * GiB)];
    expect(withUnclaimedMemory(one, 125 * GiB, 110 * GiB)).toBe(one);
    const two = [node("node0", "dram", 11 * GiB, 9 * GiB), node("node1", "cxl", 11 * GiB, 9 * GiB)];
    expect(withUnclaimedMemory(two, 125 * GiB, 110 * GiB)).toBe(two);
    const cxl = [node("node1", "cxl", 11 * GiB, 9 * GiB)];
    expect(withUnclaimedMemory(cxl, 125 * GiB, 110 * GiB)).toBe(cxl);
  });
});
