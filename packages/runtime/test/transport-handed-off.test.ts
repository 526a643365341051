/** The handed-off transport: the device waits for each layer's queued job and reads its output in place; rows may be fetched ahead. */
import { describe, expect, it } from "vitest";
import { maxAbsDiff, randomIds, testSeed, tinyModel } from "@hybridgen/core/testing";
import { queryPreSelector, streamingSelector, topKSelector } from "./hybrid-helpers.js";
import { CONTEXT, LAYERS, runTransport, STEPS } from "./transport-run.js";

describe("the handed-off transport", () => {
  const { files } = tinyModel({ seed: testSeed(355), maxPositions: 64, heads: 4, kvHeads: 2, layers: LAYERS });
  const tokens = randomIds(testSeed(455), CONTEXT);

  it("is chosen where the stage queues a step; every kernel step handed off, with and without rows fetched ahead; the host transport's logits bit for bit", () => {
    for (const logits of ["exact", "speculative", "verified"] as const) {
      for (const c of [
        { logits, selector: () => topKSelector(true), timing: "post" as const, k: 3 },
        { logits, selector: () => streamingSelector(2, true), timing: "pre" as const, k: 4 },
      ]) {
        const host = runTransport(files, tokens, "host", c);
        for (const setting of ["queue", "queue+fetch"] as const) {
          const label = `${logits} ${c.timing} ${setting}`;
          const got = runTransport(files, tokens, setting, c);
          expect(got.name, label).toBe("handed-off");
          expect(got.choice.fetchAhead, label).toBe(setting === "queue+fetch");
          expect(got.handedOff, label).toBe(STEPS);
          expect(got.summary, label).toContain(`; transport handed-off${setting === "queue+fetch" ? " (rows fetched ahead)" : ""}: V rows read by the device`);
          got.out.forEach((l, i) => expect(maxAbsDiff(l, host.out[i]!), `${label} forward ${i}`).toBe(0));
        }
      }
    }
  });

  it("a step whose selection runs in JS is not handed off (it runs as the mapped transport does); tracked scores choose the mapped transport", () => {
    const js = { logits: "verified" as const, selector: queryPreSelector, timing: "pre" as const, k: 3 };
    const host = runTransport(files, tokens, "host", js), got = runTransport(files, tokens, "queue", js);
    expect(got.name).toBe("handed-off");
    expect(got.handedOff).toBe(0);
    got.out.forEach((l, i) => expect(maxAbsDiff(l, host.out[i]!), `forward ${i}`).toBe(0));
    const tracked = runTransport(files, tokens, "queue", { logits: "exact", selector: () => topKSelector(true), timing: "post", k: 3, trackScores: true });
    expect(tracked.name).toBe("mapped");
    expect(tracked.choice.records).toBe(false);
  });
});
