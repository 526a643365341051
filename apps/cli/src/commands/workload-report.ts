/**
 * `hybridgen bench --workload`'s output: one table (a row per configuration: decode tokens/s of
 * the whole workload, per-sequence ms/token p50/p99, the batch and waves it ran in, the
 * planner's ms/step beside the measured one), workload.json with every number and an SVG figure.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { groupedBarsSpec, renderSvg } from "../charts/index.js";
import type { WorkloadResult, WorkloadRow } from "./workload-measure.js";

export interface WorkloadReport {
  readonly setup: Record<string, unknown>;
  readonly result: WorkloadResult;
}

export const WORKLOAD_FIGURE = "workload-throughput.svg";

const f = (x: number | null | undefined, d: number) => (x === null || x === undefined ? "–" : x.toFixed(d));
const mib = (b: number | null) => (b === null ? "no cap" : b >= 2 ** 30 ? `${(b / 2 ** 30).toFixed(1)} GiB` : `${(b / 2 ** 20).toFixed(1)} MiB`);

/** Tokens/s of each row over full attention's best feasible tokens/s. */
const overFull = (r: WorkloadResult, row: WorkloadRow): string => {
  const full = r.rows.find((x) => x.kind === "full" && x.status === "ok");
  return row.status === "ok" && full ? `${(row.tokensPerSec! / full.tokensPerSec!).toFixed(2)}×` : "–";
};

/** A step's bytes by where, the columns' names and their cells (GB: 10⁹ bytes). */
export const STEP_BYTES = ["device GB/step", "host GB/step", "link GB/step"];
export function stepBytes(x: Pick<WorkloadRow, "bytesPerStep">): string[] {
  const b = x.bytesPerStep;
  if (!b) return ["–", "–", "–"];
  const host = Object.values(b.tiers).reduce((n, v) => n + v, 0);
  return [f(b.gpu / 1e9, 2), f(host / 1e9, 2), f(b.link / 1e9, 3)];
}

/** The table, as markdown. */
export function workloadTable(rep: WorkloadReport): string {
  const r = rep.result, { sequences, context } = r.workload;
  const head = `### Workload ${sequences} × ${context} tokens, ${r.model}, device memory ${mib(r.gpuMemBytes)} ` +
    `(${r.steps - r.warmup} measured steps a sequence; KV ${f((r.kvBytesPerToken * context * sequences) / 2 ** 20, 1)} MiB in all; model ${f(r.residentBytes / 2 ** 20, 1)} MiB)\n`;
  const rows = r.rows.map((x) =>
    x.status === "ok"
      ? [x.config, `${x.batch} × ${x.waves}`, x.window === undefined ? "all" : String(x.window), f(x.tokensPerSec, 1), overFull(r, x), f(x.p50Ms, 2), f(x.p99Ms, 2), f(x.msPerStep, 2),
        f(x.predictedMsPerStep, 2), ...stepBytes(x), f(x.floorMsPerStep, 2), x.floorMsPerStep ? `${(x.msPerStep! / x.floorMsPerStep).toFixed(2)}×` : "–"]
      : [x.config, x.status, "", "", "", "", "", "", "", "", "", "", "", x.note ?? ""]);
  const header = ["configuration", "batch × waves", "window", "tokens/s", "vs full", "ms/token p50", "ms/token p99", "ms/step", "planned ms/step", ...STEP_BYTES, "floor ms/step", "× floor"];
  return `${head}\n${[`| ${header.join(" | ")} |`, `| ${header.map(() => "---").join(" | ")} |`, ...rows.map((c) => `| ${c.join(" | ")} |`)].join("\n")}\n`;
}

/** The figure: the workload's decode tokens/s per configuration. */
export function workloadChart(rep: WorkloadReport): ReturnType<typeof groupedBarsSpec> {
  const r = rep.result;
  return groupedBarsSpec({
    title: `Decode throughput, ${r.workload.sequences} × ${r.workload.context} tokens under ${mib(r.gpuMemBytes)} of device memory`,
    xTitle: "model", yTitle: "tokens / s (whole workload)",
    data: r.rows.filter((x) => x.status === "ok").map((x) => ({ x: r.model, series: x.config, y: x.tokensPerSec! })),
  });
}

/** Writes workload.json and the figure into `dir`; returns the files written. */
export async function writeWorkloadOutputs(rep: WorkloadReport, dir: string): Promise<string[]> {
  mkdirSync(dir, { recursive: true });
  const json = join(dir, "workload.json"), svg = join(dir, WORKLOAD_FIGURE);
  writeFileSync(json, `${JSON.stringify(rep, null, 1)}\n`);
  writeFileSync(svg, await renderSvg(workloadChart(rep)));
  return [json, svg];
}
