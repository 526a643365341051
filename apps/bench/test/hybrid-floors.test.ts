import { describe, expect, it } from "vitest";
import { stepBytes, stepFloor, type ModelBytes } from "../src/hybrid-floors.js";

// The 8B shape's per-layer numbers, weights left out so each side's charge reads plainly.
const m: ModelBytes = { layers: 32, heads: 32, kvHeads: 8, headDim: 128, weightBytes: 0, kvElem: 2 };
const row = 8 * 128 * 2;

describe("hybrid step floors", () => {
  it("Quest's CPU side reads its bf16 page summaries (min and max) and one partial page, then the gathered rows", () => {
    const b = stepBytes(m, { window: 4096, offloaded: 126_928, k: 256, timing: "pre", logits: "verified", candidates: 4, selector: "quest" });
    const pages = Math.ceil(126_928 / 16);
    expect(b.cpu).toBe(32 * (pages * 8 * 128 * 2 * 2 + 16 * row + 1024 * row * 2));
    expect(b.link).toBe(32 * (32 * 128 * 4 + 2 * 1024 * row));
    expect(b.device).toBe(32 * (2 * 4096 * row + 2 * 1024 * row));
  });

  it("verified layers that keep K of their candidates: every candidate's K row, the kept V rows alone (keep as many as the candidates: all of them)", () => {
    const shape = { window: 4096, offloaded: 126_928, k: 256, timing: "pre", logits: "verified", candidates: 4, selector: "quest" } as const;
    const all = stepBytes(m, shape), kept = stepBytes(m, { ...shape, keep: 1 });
    expect(all.link - kept.link).toBe(32 * 768 * row);
    expect(all.cpu - kept.cpu).toBe(32 * 768 * row);
    expect(all.device - kept.device).toBe(32 * 768 * row);
    expect(stepBytes(m, { ...shape, keep: 4 })).toEqual(all);
  });

  it("post top-K scans every offloaded K row; the floor is the largest side", () => {
    const b = stepBytes(m, { window: 4096, offloaded: 28_704, k: 256, timing: "post", logits: "speculative", candidates: 4, selector: "topk" });
    expect(b.cpu).toBe(32 * (28_704 * row + 256 * row));
    const f = stepFloor(b, { hbm: 4e12, hostRead: 1e11, h2d: 5e10 });
    expect(f.floorMs).toBe(Math.max(f.deviceMs, f.cpuMs, f.linkMs));
    expect(f.cpuMs).toBeCloseTo((b.cpu / 1e11) * 1e3, 12);
  });
});
