import { expect, it } from "vitest";
// @ts-expect-error: a plain .mjs root script without type declarations
import { summarizeReport } from "../../../scripts/common/vitest-report.mjs";
import { rng } from "./helpers.js";

type Status = "passed" | "failed" | "skipped" | "todo";

it("scripts/test.mjs sums vitest JSON reports as a plain count would (seeded random reports)", () => {
  const rand = rng(77);
  for (let trial = 0; trial < 200; trial++) {
    const files = Array.from({ length: Math.floor(rand() * 5) }, (_, f) => {
      const crashed = rand() < 0.15; // a file that failed to load has no assertions
      const statuses: Status[] = crashed ? [] : Array.from({ length: Math.floor(rand() * 6) }, () => (["passed", "passed", "failed", "skipped", "todo"] as const)[Math.floor(rand() * 5)]!);
      const failed = crashed || statuses.includes("failed");
      return { crashed, statuses, report: { name: `/x/test/f${f}.test.ts`, status: failed ? "failed" : "passed", assertionResults: statuses.map((status) => ({ status })) } };
    });
    // Reference: count by hand; a crashed file is one failure; an empty report is one failure.
    let passed = 0, failed = 0, skipped = 0;
    for (const f of files) {
      passed += f.statuses.filter((s) => s === "passed").length;
      failed += f.statuses.filter((s) => s === "failed").length + (f.crashed ? 1 : 0);
      skipped += f.statuses.filter((s) => s === "skipped" || s === "todo").length;
    }
    if (passed + failed + skipped === 0) failed += 1;
    const got = summarizeReport({ testResults: files.map((f) => f.report) });
    expect({ passed: got.passed, failed: got.failed, skipped: got.skipped }).toEqual({ passed, failed, skipped });
  }
});
