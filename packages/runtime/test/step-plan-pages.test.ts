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
    expect(layerBudget(plan(1000, "topk"), widths, 0)).toBe(1000);
    expect(layerBudget(quest, widths, 0)).toBe(Math.max(1000, Math.ceil((QUEST_PAGE_SHARE * 8000) / 16) * 16));
  });

  it("never more than candidates·K, nor more than the offloaded tokens", () => {
    expect(layerBudget(plan(100, { name: "quest", pageSize: 16 }), widths, 1)).toBe(400);
    expect(layerBudget(plan(100, { name: "quest", pageSize: 16 }), { ...widths, rescore: [false, false] }, 1)).toBe(400);
    expect(layerBudget(plan(100, { name: "index", form: "int8", pageSize: 8, superPages: 16 }), { ...widths, rescore: [false, false] }, 1)).toBe(100);
    expect(layerBudget({ ...plan(800, { name: "quest", pageSize: 16 }), offloaded: 800 }, widths, 1)).toBe(800);
  });

  it("Quest's candidates cover QUEST_PAGE_SHARE of the offloaded pages on every layer (at most candidates·K), the page index's floor stays PAGE_FLOOR", () => {
    const long = (k: number, kernel: StepPlan["kernel"]): StepPlan => ({ ...plan(k, kernel), offloaded: 64000 });
    const floor = Math.ceil((QUEST_PAGE_SHARE * 64000) / 16) * 16;
    expect(floor).toBeGreaterThan(4 * PAGE_FLOOR * 16);
    expect(layerBudget(long(4000, { name: "quest", pageSize: 16 }), widths, 1)).toBe(floor);
    expect(layerKmax(long(4000, { name: "quest", pageSize: 16 }), widths, 1)).toBe(floor);
    // An exact layer's choice is final: it covers the same share, not a quarter of it.
    expect(layerBudget(long(4000, { name: "quest", pageSize: 16 }), { ...widths, rescore: [false, false] }, 1)).toBe(floor);
    expect(layerBudget(long(4000, { name: "index", form: "int8", pageSize: 8, superPages: 16 }), widths, 1)).toBe(4 * PAGE_FLOOR * 8);
    // Never above candidates·K, nor the offloaded tokens; without a calibration, K as given.
    expect(layerBudget(long(1000, { name: "quest", pageSize: 16 }), { ...widths, rescore: [false, false] }, 1)).toBe(4000);
    expect(layerBudget({ ...plan(1000, { name: "quest", pageSize: 16 }), offloaded: 1000 }, { ...widths, rescore: [false, false] }, 1)).toBe(PAGE_FLOOR * 16);
    expect(layerBudget(long(1000, { name: "quest", pageSize: 16 }), { ...widths, kShare: null, rescore: [false, false] }, 1)).toBe(1000);
  });
});
