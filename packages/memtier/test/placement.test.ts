import { describe, expect, it } from "vitest";
import { kvBytesPerToken, seededRandom, type MemoryTier } from "@hybridgen/spec";
import { fastestFirst, formatBytes, placeDramOnly, placeInterleave, placeKv, placeSemantic, planCapacity } from "../src/index.js";

const GiB = 2 ** 30;
const tiers: MemoryTier[] = [
  { id: "node2", kind: "cxl", numaNode: 2, capacityBytes: 256 * GiB },
  { id: "node0", kind: "dram", numaNode: 0, capacityBytes: 64 * GiB },
  { id: "file:/nvme", kind: "file", capacityBytes: 2048 * GiB, path: "/nvme" },
  { id: "node1", kind: "dram", numaNode: 1, capacityBytes: 64 * GiB },
];

describe("placement policies", () => {
  it("orders tiers fastest first: DRAM by bandwidth then node, CXL, files", () => {
    const t = [...tiers, { id: "node3", kind: "dram" as const, numaNode: 3, capacityBytes: GiB, readBandwidthGBs: 300 }];
    expect(fastestFirst(t).map((x) => x.id)).toEqual(["node3", "node0", "node1", "node2", "file:/nvme"]);
  });
  it("semantic: K fills DRAM first, V fills the slowest memory first, files last", () => {
    const p = placeSemantic(tiers);
    expect(p.k).toEqual({ mode: "fill", order: ["node0", "node1", "node2", "file:/nvme"] });
    expect(p.v).toEqual({ mode: "fill", order: ["node2", "node1", "node0", "file:/nvme"] });
  });
  it("interleave: K and V over every memory tier; dram-only: DRAM nodes", () => {
    expect(placeInterleave(tiers).k).toEqual({ mode: "interleave", tiers: ["node0", "node1", "node2"] });
    expect(placeDramOnly(tiers).v).toEqual({ mode: "fill", order: ["node0", "node1"] });
    expect(placeKv("dram-only", tiers).policy).toBe("dram-only");
  });
  it("errors name the problem", () => {
    expect(() => placeKv("semantic", [])).toThrow(/no memory tiers/);
    expect(() => placeKv("fastest" as never, tiers)).toThrow(/unknown policy "fastest"/);
    expect(() => placeDramOnly([tiers[0]!])).toThrow(/placement "dram-only": no DRAM tier among \[node2\]/);
  });
});

describe("planCapacity", () => {
  const llama8b = kvBytesPerToken({ layers: 32, kvHeads: 8, headDim: 128 }, "bf16");

  it("Llama-3.1-8B, 128K context, batch 4, 4K window: semantic keeps K in DRAM, V on CXL", () => {
    const plan = planCapacity({ tiers, placement: placeSemantic(tiers), bytesPerToken: llama8b, contextTokens: 131072, batch: 4, windowTokens: 4096 });
    const off = 131072 - 4096;
    expect(plan.offloadedTokensPerSequence).toBe(off);
    expect(plan.kBytes).toBe(off * 4 * 65536); // 126976 tokens × 4 × 64 KiB = 31 GiB
    expect(plan.windowBytes).toBe(4096 * 4 * 131072);
    const byId = Object.fromEntries(plan.tiers.map((t) => [t.id, t]));
    expect(byId.node0!.kBytes).toBe(plan.kBytes);
    expect(byId.node0!.vBytes).toBe(0);
    expect(byId.node2!.vBytes).toBe(plan.vBytes);
    expect(plan.fits).toBe(true);
    expect(formatBytes(plan.kBytes)).toBe("31.0 GiB");
    expect(formatBytes(1536)).toBe("1.50 KiB");
  });

  it("dram-only overflows where semantic spills V to CXL; interleave reports over-subscription", () => {
    const args = { tiers, bytesPerToken: llama8b, contextTokens: 1_000_000, batch: 1, windowTokens: 0 }; // 122 GiB of KV
    const dram = planCapacity({ ...args, placement: placeDramOnly(tiers) });
    expect(dram.fits).toBe(false);
    expect(dram.shortfallBytes).toBe(1_000_000 * 131072 - Math.floor(64 * GiB * 0.9) * 2);
    expect(planCapacity({ ...args, placement: placeSemantic(tiers) }).fits).toBe(true);
    const il = planCapacity({ ...args, placement: placeInterleave(tiers), contextTokens: 1_500_000 });
    expect(il.fits).toBe(false); // a third of 183 GiB exceeds 57.6 GiB of each DRAM node
    expect(il.tiers.find((t) => t.id === "node0")!.fits).toBe(false);
  });

  it("invariants on random tiers and sizes: bytes conserved, no tier over, fill order respected", () => {
    const r = seededRandom(17);
    for (let trial = 0; trial < 200; trial++) {
      const t: MemoryTier[] = Array.from({ length: 1 + Math.floor(r() * 4) }, (_, i) => ({
        id: `node${i}`,
        kind: i === 0 || r() < 0.5 ? "dram" : "cxl",
        numaNode: i,
        capacityBytes: Math.floor(r() * 64 * GiB),
      }));
      const policy = (["semantic", "interleave", "dram-only"] as const)[Math.floor(r() * 3)]!;
      const placement = placeKv(policy, t);
      const bpt = { k: 1 + Math.floor(r() * 65536), v: 1 + Math.floor(r() * 65536) };
      const ctx = Math.floor(r() * 300_000);
      const plan = planCapacity({ tiers: t, placement, bytesPerToken: bpt, contextTokens: ctx, batch: 1 + Math.floor(r() * 8), windowTokens: Math.floor(r() * 8192), headroom: r() * 0.3 });
      const placedK = plan.tiers.reduce((s, x) => s + x.kBytes, 0);
      const placedV = plan.tiers.reduce((s, x) => s + x.vBytes, 0);
      if (placement.k.mode === "fill") {
        expect(placedK + placedV + plan.shortfallBytes).toBe(plan.kBytes + plan.vBytes);
        for (const x of plan.tiers) expect(x.usedBytes).toBeLessThanOrEqual(x.availableBytes);
        // A later tier in K's order only gets K bytes once every earlier one is full.
        const order = placement.k.order;
        for (let i = 1; i < order.length; i++) {
          const here = plan.tiers.find((x) => x.id === order[i])!;
          const prev = plan.tiers.find((x) => x.id === order[i - 1])!;
          if (here.kBytes > 0) expect(prev.kBytes).toBe(prev.availableBytes);
        }
      } else {
        expect(placedK).toBe(plan.kBytes);
        expect(placedV).toBe(plan.vBytes);
      }
      expect(plan.fits).toBe(plan.shortfallBytes === 0);
      // Fill rules never over-fill a tier (what does not fit is shortfall); interleave over-subscribes tiers.
      if (plan.fits) expect(plan.tiers.every((x) => x.fits)).toBe(true);
      if (placement.k.mode === "interleave") expect(plan.fits).toBe(plan.tiers.every((x) => x.fits));
    }
  });

  it("rejects unknown tiers and bad numbers with one-line errors", () => {
    const p = placeSemantic(tiers);
    expect(() => planCapacity({ tiers: tiers.slice(0, 2), placement: p, bytesPerToken: llama8b, contextTokens: 10, windowTokens: 1 })).toThrow(/K pool names tier "node1", which is not one of \[node2, node0\]/);
    expect(() => planCapacity({ tiers, placement: p, bytesPerToken: llama8b, contextTokens: -1, windowTokens: 1 })).toThrow(/capacity plan: contextTokens/);
    expect(() => planCapacity({ tiers: [tiers[1]!, tiers[1]!], placement: placeDramOnly([tiers[1]!]), bytesPerToken: llama8b, contextTokens: 10, windowTokens: 1 })).toThrow(/listed twice/);
  });
});
