/** The staged transport: the stage's pinned copies of the rows come up on the copy stream. */
import { describe, expect, it } from "vitest";
import { maxAbsDiff, randomIds, testSeed, tinyModel } from "@hybridgen/core/testing";
import { topKSelector } from "./hybrid-helpers.js";
import { CONTEXT, LAYERS, runTransport } from "./transport-run.js";

describe("the staged transport", () => {
  const { files } = tinyModel({ seed: testSeed(353), maxPositions: 64, heads: 4, kvHeads: 2, layers: LAYERS });
  const tokens = randomIds(testSeed(453), CONTEXT);

  it("is chosen where the link cannot gather rows, or staged rows are asked for; the host transport's logits bit for bit", () => {
    for (const logits of ["exact", "speculative", "verified"] as const) {
      for (const kernel of [false, true]) {
        const c = { logits, selector: () => topKSelector(kernel), timing: "post" as const, k: 3 };
        const host = runTransport(files, tokens, "host", c);
        const copies = runTransport(files, tokens, "copies", c);
        const asked = runTransport(files, tokens, "gathers", { ...c, rowPath: "staged" });
        expect(copies.name).toBe("staged");
        expect(copies.summary).toContain("; transport staged: V rows staged by the CPU stage on 3 of 3 layers (the device backend cannot gather rows from host memory)");
        expect(asked.name).toBe("staged");
        expect(asked.choice.stagedReason).toBe("staged rows asked for");
        for (const r of [copies, asked]) r.out.forEach((l, i) => expect(maxAbsDiff(l, host.out[i]!), `${logits} ${kernel} forward ${i}`).toBe(0));
      }
    }
  });
});
