/** Schedulers by name: the built-ins registered, a plugin's added and built from the runtime's context, bad names refused in one line. */
import { describe, expect, it } from "vitest";
import { FeedbackScheduler, FixedScheduler, lookupScheduler, registerScheduler, schedulerNames } from "../src/index.js";

describe("registerScheduler", () => {
  it("has fixed and feedback, built from the resolved K, floor and timing", () => {
    expect(schedulerNames().slice(0, 2)).toEqual(["fixed", "feedback"]);
    const fixed = lookupScheduler("fixed").build({ k: 12, kMin: 12, timing: "pre", timings: ["pre", "post"] });
    expect(fixed).toBeInstanceOf(FixedScheduler);
    expect(fixed.initial()).toEqual({ k: 12, timing: "pre" });
    const fb = lookupScheduler("feedback");
    expect(fb.takesKMin).toBe(true);
    const s = fb.build({ k: 32, kMin: 16, timing: "post", timings: ["post"] });
    expect(s).toBeInstanceOf(FeedbackScheduler);
    expect((s as FeedbackScheduler).options).toMatchObject({ kMin: 16, allowPre: false, returnToPost: true });
  });

  it("adds a plugin's scheduler, and names the problem with a bad or taken name", () => {
    registerScheduler({ name: "halving", takesKMin: true, build: ({ k, kMin, timing }) => ({ name: "halving", initial: () => ({ k, timing }), next: () => ({ k: kMin, timing }), reset() {} }) });
    expect(schedulerNames()).toContain("halving");
    expect(lookupScheduler("halving").build({ k: 8, kMin: 4, timing: "post", timings: ["post"] }).next({} as never)).toEqual({ k: 4, timing: "post" });
    expect(() => registerScheduler({ name: "fixed", takesKMin: false, build: () => new FixedScheduler() })).toThrow('registerScheduler: "fixed" is registered already');
    expect(() => registerScheduler({ name: "Bad", takesKMin: false, build: () => new FixedScheduler() })).toThrow('registerScheduler: name "Bad" must be lower-case kebab-case');
    expect(() => lookupScheduler("nope")).toThrow(/^unknown scheduler "nope" \(registered: fixed, feedback/);
  });
});
