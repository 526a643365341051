import { beforeAll, expect, it } from "vitest";
import { requireBuiltBin, runBinStreaming } from "./helpers.js";
import { PROMPT, greedyStory, stories15M } from "./model-fixture.js";

let model = "";
beforeAll(async () => {
  requireBuiltBin();
  model = await stories15M();
});

it("Ctrl-C during generation keeps the text so far, says 'interrupted' and exits 130", async () => {
  let sent = false;
  // One thread and f32 weights: the slowest setting, so the signal lands mid-generation.
  const r = await runBinStreaming(
    ["generate", "--model", model, "--prompt", PROMPT, "--temperature", "0", "--max-tokens", "256", "--threads", "1"],
    (soFar, child) => {
      // Signal as soon as the first generated token is out (past the echoed prompt).
      if (!sent && soFar.length > PROMPT.length) {
        sent = true;
        child.kill("SIGINT");
      }
    },
  );
  expect(sent).toBe(true);
  expect(r.code).toBe(130);
  expect(r.stderr).toMatch(/\ninterrupted\n/);
  expect(r.stderr).not.toMatch(/error/);
  // What was printed is kept: a proper prefix of the full greedy story.
  const full = greedyStory();
  expect(r.stdout.length).toBeGreaterThan(PROMPT.length);
  expect(r.stdout.length).toBeLessThan(full.length - 1);
  expect(full.startsWith(r.stdout)).toBe(true);
});
