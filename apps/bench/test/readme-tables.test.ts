/**
 * Every table of figures in a README is generated from its committed result file
 * (docs/performance/**\/*.json) and matches it: regenerating changes nothing, and no table of
 * figures lacks its marker. A figure changes by rewriting its result file, then
 * `./bun apps/bench/src/readme/tables.ts --write`. The renderer's views are checked on small
 * written files.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { checkAllTables, checkReadmeTables } from "../src/readme/tables.js";

const ROOT = fileURLToPath(new URL("../../..", import.meta.url));

describe("README tables", () => {
  it("every marked table equals its result file, and every table of figures is marked", () => {
    const states = checkAllTables(ROOT);
    expect(states.flatMap((s) => s.stale)).toEqual([]);
    expect(states.flatMap((s) => s.unmarked)).toEqual([]);
    expect(states.reduce((n, s) => n + s.marked, 0)).toBeGreaterThan(20);
  });

  describe("on a written README", () => {
    const root = mkdtempSync(join(tmpdir(), "hg-tables-"));
    afterAll(() => rmSync(root, { recursive: true, force: true }));
    const write = (path: string, text: string) => {
      mkdirSync(join(root, path, ".."), { recursive: true });
      writeFileSync(join(root, path), text);
    };
    write("docs/performance/x/speed.json", JSON.stringify({ table: { columns: ["weights", "tok/s"], align: ["left", "right"], rows: [["f32", "768"], ["bf16", "1802"]] } }));
    write("docs/performance/x/eval.json", JSON.stringify({
      setup: { configs: ["full", "h2o"] },
      text: [{ config: "full", k: null, perplexity: 5.4449, top1: 1, kl: 0 }, { config: "h2o", k: 8, perplexity: 6.3921, top1: 0.7708, kl: 0.3512 }, { config: "h2o", k: 16, perplexity: 6.2, top1: 0.8, kl: 0.2 }],
      tasks: [{ config: "full", k: null, task: "recall-2k", accuracy: 0.75 }, { config: "h2o", k: 8, task: "recall-2k", accuracy: 0.1667 }],
    }));
    write("docs/performance/x/bench.json", JSON.stringify({
      setup: { configs: ["full"], contexts: [2048, 131000] },
      points: [{ config: "full", context: 2048, batch: 1, status: "ok", msPerToken: 4.2833 }, { config: "full", context: 131000, batch: 1, status: "skipped" }],
    }));

    write("docs/performance/x/serve.json", JSON.stringify({ results: [
      { label: "full", rate: "inf", requests: 8, seconds: 40, requestsPerSec: 0.2, outputTokensPerSec: 51.2, ttftMs: { p50: 9000, p99: 30000 }, tpotMs: { p50: 10, p99: 12 } },
      {
        label: "hybrid", rate: "inf", requests: 8, seconds: 20, requestsPerSec: 0.4, outputTokensPerSec: 102.4, meanBatch: 7.5, steps: 96, meanStepMs: 62.5, stepFloorMs: 11.04,
        chunks: 40, meanChunkMs: 140.25, chunkFloorMs: 47.5, outsideStepsS: 0.234, ttftMs: { p50: 5000, p99: 9000 }, tpotMs: { p50: 40, p99: 60 },
      },
      { label: "cut", rate: "inf", requests: 8, completed: 3, seconds: 20, requestsPerSec: 0.15, outputTokensPerSec: 25.6, meanBatch: 8, ttftMs: { p50: 5000, p99: 9000 }, tpotMs: { p50: 40, p99: 60 } },
    ] }));

    it("serve-bench's results: a row a configuration, output tokens/s against the first's; k of N where a time limit cut the rate; the mean batch, steps and chunks (count × ms, floor) and the time outside both where recorded", () => {
      write("SERVE.md", "<!-- table: docs/performance/x/serve.json serve -->\n");
      expect(checkReadmeTables(root, "SERVE.md").generated.split("\n").slice(1, 6)).toEqual([
        "| config | arrival rate (req/s) | requests | time (s) | req/s | output tok/s | vs full | mean batch | decode steps × ms (floor) | prefill chunks × ms (floor) | outside both (s) | TTFT p50 / p99 (s) | TPOT p50 / p99 (ms) | TPOT p99 / p50 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        "| full | all at once | 8 | 40.0 | 0.200 | 51.2 | 1.00× | – | – | – | – | 9.00 / 30.00 | 10.0 / 12.0 | 1.20 |",
        "| hybrid | all at once | 8 | 20.0 | 0.400 | 102.4 | 2.00× | 7.50 | 96 × 62.5 (11.0) | 40 × 140.3 (47.5) | 0.23 | 5.00 / 9.00 | 40.0 / 60.0 | 1.50 |",
        "| cut | all at once | 3 of 8 | 20.0 | 0.150 | 25.6 | 0.50× | 8.00 | – | – | – | 5.00 / 9.00 | 40.0 / 60.0 | 1.50 |",
      ]);
    });

    it("a stale table is reported and regenerated; an unmarked table of figures is reported; a table of flags is not", () => {
      write("README.md", [
        "<!-- table: docs/performance/x/speed.json -->", "| weights | tok/s |", "| --- | ---: |", "| f32 | 700 |", "",
        "| weights | tok/s |", "| --- | ---: |", "| f16 | 1921 |", "",
        "| flag | meaning | default |", "| --- | --- | --- |", "| `--k` | K | 64 |", "",
        "<!-- table: docs/performance/x/eval.json eval-text k=8 -->", "", "<!-- table: docs/performance/x/eval.json eval-tasks ks=8 -->", "",
        "<!-- table: docs/performance/x/bench.json bench-context -->", "",
      ].join("\n"));
      const s = checkReadmeTables(root, "README.md");
      expect(s.stale).toEqual(["README.md:2", "README.md:15", "README.md:17", "README.md:19"]);
      expect(s.unmarked).toEqual(["README.md:6"]);
      expect(s.generated.split("\n").slice(0, 5)).toEqual(["<!-- table: docs/performance/x/speed.json -->", "| weights | tok/s |", "| --- | ---: |", "| f32 | 768 |", "| bf16 | 1802 |"]);
      expect(s.generated).toContain([
        "| config | perplexity | top-1 agreement with full | mean KL (nats) | completions |", "| --- | ---: | ---: | ---: | ---: |",
        "| full | 5.445 | 100.0% | 0 | 75.0% |", "| h2o | 6.392 | 77.1% | 0.351 | 16.7% |",
      ].join("\n"));
      expect(s.generated).toContain(["| config | 2K, K = 8 |", "| --- | ---: |", "| full | 75.0% |", "| h2o | 16.7% |"].join("\n"));
      expect(s.generated).toContain(["| config | 2K | 128K (131 000) |", "| --- | ---: | ---: |", "| full | 4.28 | – |"].join("\n"));
      write("README.md", s.generated);
      expect(checkReadmeTables(root, "README.md").stale).toEqual([]);
    });

    it("a marker naming a file outside docs/performance, a missing file or an unknown view fails with its line", () => {
      for (const [marker, message] of [
        ["<!-- table: notes/x.json -->", "README.md:1: a table's result file must be docs/performance/**/*.json, not notes/x.json"],
        ["<!-- table: docs/performance/x/none.json -->", "README.md:1: docs/performance/x/none.json does not exist"],
        ["<!-- table: docs/performance/x/eval.json pie -->", "README.md:1: unknown table view pie (views: eval-text, eval-tasks, bench-context, bench-batch, workload, serve)"],
      ] as const) {
        write("README.md", `${marker}\n`);
        expect(() => checkReadmeTables(root, "README.md")).toThrow(message);
      }
    });
  });
});
