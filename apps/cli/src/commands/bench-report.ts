/**
 * `hybridgen bench`'s output: one markdown table per figure, the speed-up of HybridGen over each
 * baseline, the SVG charts of Figs. 15, 16, 17 and 21, and bench.json with every number.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { groupedBarsSpec, renderSvg, type BarDatum } from "../charts/index.js";
import type { BenchPoint } from "./bench-measure.js";

export interface BenchReport {
  readonly setup: Record<string, unknown>;
  readonly points: readonly BenchPoint[];
}

const f2 = (x: number | undefined) => (x === undefined ? "–" : x.toFixed(2));
const f1 = (x: number | undefined) => (x === undefined ? "–" : x.toFixed(1));
const ok = (p: BenchPoint) => p.status === "ok" && p.msPerToken !== undefined;

/** The configuration speed-ups are measured against: "hybridgen" if run, else the first HybridGen variant. */
export function headline(points: readonly BenchPoint[]): string | undefined {
  const names = [...new Set(points.filter((p) => p.family === "hybridgen").map((p) => p.config))];
  return names.includes("hybridgen") ? "hybridgen" : names[0];
}

const key = (p: Pick<BenchPoint, "model" | "context" | "batch">) => `${p.model}\u0000${p.context}\u0000${p.batch}`;

function index(points: readonly BenchPoint[]) {
  const at = new Map<string, Map<string, BenchPoint>>();
  for (const p of points) {
    if (!at.has(key(p))) at.set(key(p), new Map());
    at.get(key(p))!.set(p.config, p);
  }
  return (p: Pick<BenchPoint, "model" | "context" | "batch">, config: string) => {
    const q = at.get(key(p))?.get(config);
    return q && ok(q) ? q : undefined;
  };
}

function table(header: string[], rows: string[][]): string {
  return [`| ${header.join(" | ")} |`, `| ${header.map(() => "---").join(" | ")} |`, ...rows.map((r) => `| ${r.join(" | ")} |`)].join("\n");
}

/** The tables, as markdown. */
export function benchTables(r: BenchReport): string {
  const pts = r.points, at = index(pts), hg = headline(pts);
  const ratio = (p: BenchPoint) => {
    const full = at(p, "full");
    return ok(p) && full ? (p.msPerToken! / full.msPerToken!).toFixed(2) : "–";
  };
  const speedup = (p: BenchPoint) => {
    const h = hg ? at(p, hg) : undefined;
    return ok(p) && h ? `${(p.msPerToken! / h.msPerToken!).toFixed(2)}×` : "–";
  };
  const cell = (p: BenchPoint) => (ok(p) ? [f2(p.msPerToken), f1(p.tokensPerSec)] : [p.status, p.note ?? ""]);
  const out: string[] = [];
  const batch1 = pts.filter((p) => p.batch === 1);
  const firstContext = new Map<string, number>();
  for (const p of batch1) firstContext.set(p.model, Math.min(firstContext.get(p.model) ?? Infinity, p.context));

  out.push(`### Fig. 15 — decode latency per model (batch 1, each model's shortest context)\n`);
  out.push(table(["model", "context", "config", "ms/token", "tokens/s", "× full attention", `${hg ?? "HybridGen"} speed-up`],
    batch1.filter((p) => p.context === firstContext.get(p.model)).map((p) => [p.model, String(p.context), p.config, ...cell(p), ratio(p), speedup(p)])));
  out.push(`\n### Fig. 16 — decode latency per context length (batch 1)\n`);
  out.push(table(["model", "context", "config", "ms/token", "tokens/s", "× full attention", `${hg ?? "HybridGen"} speed-up`],
    batch1.map((p) => [p.model, String(p.context), p.config, ...cell(p), ratio(p), speedup(p)])));
  const batches = new Set(pts.map((p) => p.batch));
  if (batches.size > 1 || !batches.has(1)) {
    out.push(`\n### Fig. 17 — decode per batch size\n`);
    out.push(table(["model", "context", "batch", "config", "ms/step", "tokens/s"],
      pts.filter((p) => p.status !== "skipped").map((p) => [p.model, String(p.context), String(p.batch), p.config, ...cell(p)])));
  }
  const variants = batch1.filter((p) => p.family === "hybridgen");
  if (variants.length > 0) {
    out.push(`\n### Fig. 21 — HybridGen ablation: fixed K post / pre, adaptive K, feedback scheduler (batch 1)\n`);
    out.push(table(["model", "context", "variant", "ms/token", "tokens/s", "last K / timing", "T_gpu / T_cpu / T_tx ms/step", "× hybridgen-post"], variants.map((p) => {
      const post = at(p, "hybridgen-post"), t = p.stageMs;
      return [p.model, String(p.context), p.config, ...cell(p), p.finalK === undefined ? "–" : `${p.finalK} / ${p.finalTiming}`,
        t ? `${f2(t.gpu)} / ${f2(t.cpu)} / ${f2(t.tx)}` : "–", ok(p) && post ? (p.msPerToken! / post.msPerToken!).toFixed(2) : "–"];
    })));
  }
  if (hg) {
    out.push(`\n### Speed-up of ${hg} over each baseline (baseline ms/token ÷ ${hg} ms/token, batch 1)\n`);
    const rows: string[][] = [];
    for (const model of new Set(batch1.map((p) => p.model))) {
      for (const config of new Set(batch1.filter((p) => p.model === model && p.config !== hg).map((p) => p.config))) {
        const xs = batch1.filter((p) => p.model === model && p.config === config && ok(p)).flatMap((p) => {
          const h = at(p, hg);
          return h ? [{ context: p.context, s: p.msPerToken! / h.msPerToken! }] : [];
        });
        if (xs.length === 0) continue;
        const geo = Math.exp(xs.reduce((a, x) => a + Math.log(x.s), 0) / xs.length);
        rows.push([model, config, xs.map((x) => `${x.context}: ${x.s.toFixed(2)}×`).join(", "), `${geo.toFixed(2)}×`]);
      }
    }
    out.push(table(["model", "baseline", "per context", "geometric mean"], rows));
  }
  return `${out.join("\n")}\n`;
}

const FIGURES = {
  fig15: "fig15-latency-per-model.svg",
  fig16: "fig16-latency-per-context.svg",
  fig17: "fig17-throughput-per-batch.svg",
  fig21: "fig21-scheduler-ablation.svg",
} as const;

/** The charts' data: Fig. 15 normalised to flexgen where it ran (as the paper's), else ms/token. */
export function benchCharts(r: BenchReport): { file: string; spec: ReturnType<typeof groupedBarsSpec> }[] {
  const pts = r.points.filter(ok), at = index(pts);
  const order = [...new Set(r.points.map((p) => p.config))];
  const batch1 = pts.filter((p) => p.batch === 1);
  const firstContext = new Map<string, number>();
  for (const p of batch1) firstContext.set(p.model, Math.min(firstContext.get(p.model) ?? Infinity, p.context));
  const charts: { file: string; spec: ReturnType<typeof groupedBarsSpec> }[] = [];
  const fig15 = batch1.filter((p) => p.context === firstContext.get(p.model));
  if (fig15.length > 0) {
    const normalised = fig15.every((p) => at(p, "flexgen"));
    charts.push({ file: FIGURES.fig15, spec: groupedBarsSpec({
      title: `Decode latency per model (batch 1${normalised ? ", normalised to FlexGen-style AoG" : ""})`,
      xTitle: "model", yTitle: normalised ? "time / token (flexgen = 1)" : "ms / token", seriesOrder: order, rule: normalised ? 1 : undefined,
      data: fig15.map((p): BarDatum => ({ x: `${p.model} @${p.context}`, series: p.config, y: normalised ? p.msPerToken! / at(p, "flexgen")!.msPerToken! : p.msPerToken! })),
    }) });
  }
  if (batch1.length > 0) {
    charts.push({ file: FIGURES.fig16, spec: groupedBarsSpec({
      title: "Decode latency per context length (batch 1)", xTitle: "context (tokens)", yTitle: "ms / token", seriesOrder: order,
      data: batch1.map((p) => ({ x: p.context, series: p.config, y: p.msPerToken!, facet: p.model })),
    }) });
  }
  if (new Set(pts.map((p) => p.batch)).size > 1) {
    charts.push({ file: FIGURES.fig17, spec: groupedBarsSpec({
      title: "Decode throughput per batch size", xTitle: "batch", yTitle: "tokens / s", seriesOrder: order,
      data: pts.map((p) => ({ x: p.batch, series: p.config, y: p.tokensPerSec!, facet: `${p.model} @${p.context}` })),
    }) });
  }
  const variants = batch1.filter((p) => p.family === "hybridgen");
  if (variants.length > 0) {
    charts.push({ file: FIGURES.fig21, spec: groupedBarsSpec({
      title: "HybridGen ablation (batch 1)", xTitle: "context (tokens)", yTitle: "ms / token", seriesOrder: order.filter((c) => variants.some((p) => p.config === c)),
      data: variants.map((p) => ({ x: p.context, series: p.config, y: p.msPerToken!, facet: p.model })),
    }) });
  }
  return charts;
}

/** Writes bench.json and the SVG charts into `dir`; returns the files written. */
export async function writeBenchOutputs(r: BenchReport, dir: string): Promise<string[]> {
  mkdirSync(dir, { recursive: true });
  const files = [join(dir, "bench.json")];
  writeFileSync(files[0]!, `${JSON.stringify(r, null, 1)}\n`);
  for (const c of benchCharts(r)) {
    const file = join(dir, c.file);
    writeFileSync(file, await renderSvg(c.spec));
    files.push(file);
  }
  return files;
}
