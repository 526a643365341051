import { describe, expect, it } from "vitest";
import { layerBudget, layerKmax, PAGE_FLOOR, QUEST_PAGE_SHARE, type LayerWidths, type StepPlan } from "../src/index.js";

const plan = (k: number, kernel: StepPlan["kernel"]): StepPlan => ({ timing: kernel === "topk" ? "post" : "pre", budget: k, kmax: k, offloaded: 8000, work: "kernel", kernel });
/** Calibrated shares: layer 0 all of K, layer 1 a few tokens (a needle layer). */
const widths: LayerWidths = { rescore: [false, true], candidates: 4, usesBudget: true, kShare: [1, 0.01] };

describe("a layer's share of K under page selection", () => {
  it("covers PAGE_FLOOR pages for Quest and the page index, the calibrated share for top-K", () => {
    const quest = plan(1000, { name: "quest", pageSize: 16 });
    expect(layerBudget(quest, widths, 1)).toBe(4 * PAGE_FLOOR * 16);
    expect(layerKmax(quest, widths, 1)).toBe(4 * PAGE_FLOOR * 16);
    expect(layerBudget(plan(1000, { name: "index", form: "int8", pageSize: 8, superPages: 16 }), widths, 1)).toBe(4 * PAGE_FLOOR * 8);
    expect(layerBudget(plan(1000, "topk"), widths, 1)).toBe(4 * 10);
    expect(layerBudget(quest, widths, 0)).toBe(1000);
  });

  it("never more than K itself, nor more than the offloaded tokens once verified", () => {
    expect(layerBudget(plan(100, { name: "quest", pageSize: 16 }), widths, 1)).toBe(400);
    expect(layerBudget(plan(100, { name: "quest", pageSize: 16 }), { ...widths, rescore: [false, false] }, 1)).toBe(100);
    expect(layerBudget({ ...plan(800, { name: "quest", pageSize: 16 }), offloaded: 800 }, widths, 1)).toBe(800);
  });

  it("Quest's floor grows with the offloaded pages (QUEST_PAGE_SHARE of them), the page index's stays PAGE_FLOOR", () => {
    const long = (kernel: StepPlan["kernel"]): StepPlan => ({ ...plan(4000, kernel), offloaded: 64000 });
    const pages = Math.ceil((QUEST_PAGE_SHARE * 64000) / 16);
    expect(pages).toBeGreaterThan(PAGE_FLOOR);
    expect(layerBudget(long({ name: "quest", pageSize: 16 }), widths, 1)).toBe(4 * pages * 16);
    expect(layerBudget(long({ name: "quest", pageSize: 16 }), { ...widths, rescore: [false, false] }, 1)).toBe(pages * 16);
    expect(layerBudget(long({ name: "index", form: "int8", pageSize: 8, superPages: 16 }), widths, 1)).toBe(4 * PAGE_FLOOR * 8);
    // Still never above K.
    expect(layerBudget({ ...plan(1000, { name: "quest", pageSize: 16 }), offloaded: 64000 }, { ...widths, rescore: [false, false] }, 1)).toBe(1000);
  });
});
