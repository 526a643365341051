/** bench's tables and chart data from synthetic points: the ratios and speed-ups are the right quotients. */
import { describe, expect, it } from "vitest";
import type { BenchPoint } from "../src/commands/bench-measure.js";
import { benchCharts, benchTables, headline } from "../src/commands/bench-report.js";

const pt = (config: string, context: number, ms: number, o: Partial<BenchPoint> = {}): BenchPoint => ({
  model: "m", context, batch: 1, config, family: config.startsWith("hybridgen") ? "hybridgen" : "baseline",
  kind: config === "full" ? "full" : config === "flexgen" ? "aog" : "hybrid", status: "ok", msPerToken: ms, tokensPerSec: 1000 / ms, ...o,
});

describe("bench report", () => {
  const points = [
    pt("full", 1024, 2), pt("flexgen", 1024, 8), pt("hybridgen-post", 1024, 5), pt("hybridgen", 1024, 4, { finalK: 80, finalTiming: "post", stageMs: { gpu: 3, cpu: 2.5, tx: 0.25 } }),
    pt("full", 4096, 3), pt("flexgen", 4096, 30), pt("hybridgen-post", 4096, 12), pt("hybridgen", 4096, 6),
    // Batch 4: every configuration runs (one hybrid attention per sequence); ms per step, tokens/s over the batch.
    pt("full", 1024, 3, { batch: 4, tokensPerSec: 4000 / 3 }), pt("flexgen", 1024, 16, { batch: 4, tokensPerSec: 4000 / 16 }), pt("hybridgen", 1024, 5, { batch: 4, tokensPerSec: 4000 / 5 }),
  ];

  it("speed-ups are baseline ÷ hybridgen per context with their geometric mean; ratios are ÷ full", () => {
    expect(headline(points)).toBe("hybridgen");
    const t = benchTables({ setup: {}, points });
    expect(t).toContain("| m | 1024 | flexgen | 8.00 | 125.0 | 4.00 | 2.00× |");
    expect(t).toContain("| m | 4096 | flexgen | 30.00 | 33.3 | 10.00 | 5.00× |");
    expect(t).toContain("| m | flexgen | 1024: 2.00×, 4096: 5.00× | 3.16× |"); // √(2·5)
    expect(t).toContain("| m | 1024 | hybridgen | 4.00 | 250.0 | 80 / post | 3.00 / 2.50 / 0.25 | 0.80 |"); // Fig. 21: ÷ hybridgen-post
    expect(t).toContain("| m | 1024 | 4 | full | 3.00 | 1333.3 |"); // Fig. 17
    expect(t).toContain("| m | 1024 | 4 | hybridgen | 5.00 | 800.0 |");
  });

  it("a context the device window holds: the offloading configs are skipped with the reason in the latency tables and left out of Fig. 17", () => {
    const note = "the device window (512) holds the whole context";
    const skip = (config: string, batch: number) => pt(config, 512, NaN, { batch, status: "skipped", note, msPerToken: undefined, tokensPerSec: undefined });
    const t = benchTables({ setup: {}, points: [
      pt("full", 512, 1), skip("flexgen", 1), skip("hybridgen", 1), pt("full", 512, 2, { batch: 4, tokensPerSec: 2000 }), skip("flexgen", 4), skip("hybridgen", 4),
    ] });
    expect(t).toContain(`| m | 512 | flexgen | skipped | ${note} | – | – |`);
    const fig17 = t.split("### Fig. 17")[1]!.split("###")[0]!;
    expect(fig17).toContain("| m | 512 | 4 | full | 2.00 | 2000.0 |");
    expect(fig17).not.toContain("skipped");
  });

  it("charts: Fig. 15 normalised to flexgen, one datum per point that ran", () => {
    const charts = benchCharts({ setup: {}, points });
    expect(charts.map((c) => c.file)).toEqual(["fig15-latency-per-model.svg", "fig16-latency-per-context.svg", "fig17-throughput-per-batch.svg", "fig21-scheduler-ablation.svg"]);
    const fig15 = (charts[0]!.spec as { data: { values: { series: string; y: number }[] } }).data.values;
    expect(fig15.map((d) => [d.series, d.y])).toEqual([["full", 0.25], ["flexgen", 1], ["hybridgen-post", 0.625], ["hybridgen", 0.5]]);
    const fig17 = (charts[2]!.spec as { data: { values: unknown[] } }).data.values;
    expect(fig17.length).toBe(11);
  });
});
