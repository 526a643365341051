/** `hybridgen eval`'s output: the tables, eval.json, and the charts of Figs. 14 and 20. */
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { groupedBarsSpec, renderSvg, type BarDatum } from "../charts/index.js";
import type { EvalRun, TaskResult, TextResult } from "./eval-measure.js";

export interface EvalReport {
  readonly setup: Record<string, unknown>;
  readonly text: readonly TextResult[];
  readonly tasks: readonly TaskResult[];
}

const kCell = (r: EvalRun) => (r.k === null ? "–" : String(r.k));
const pct = (x: number) => `${(x * 100).toFixed(1)}%`;

function table(header: string[], rows: string[][]): string {
  return [`| ${header.join(" | ")} |`, `| ${header.map(() => "---").join(" | ")} |`, ...rows.map((r) => `| ${r.join(" | ")} |`)].join("\n");
}

/** The runs shown at K = `k`: K-independent ones and the others at k. */
const atK = <T extends EvalRun>(rs: readonly T[], k: number) => rs.filter((r) => r.k === null || r.k === k);

export function evalTables(r: EvalReport, k: number): string {
  const out: string[] = [];
  if (r.text.length > 0) {
    out.push(`### Text: teacher-forced against full attention (${r.text[0]!.predictions} predictions)\n`);
    out.push(table(["config", "K", "perplexity", "top-1 agreement", "mean KL (nats)"],
      r.text.map((t) => [t.config, kCell(t), t.perplexity.toFixed(3), pct(t.top1), t.kl.toExponential(2)])));
  }
  const tasks = [...new Set(r.tasks.map((t) => t.task))];
  if (tasks.length > 0) {
    const runs = [...new Map(r.tasks.map((t) => [`${t.config}\u0000${t.k}`, t])).values()];
    const acc = (run: EvalRun, task: string) => r.tasks.find((t) => t.task === task && t.config === run.config && t.k === run.k);
    out.push(`\n### Tasks: accuracy (${tasks.map((t) => `${t}: ${r.tasks.find((x) => x.task === t)!.items} items`).join(", ")})\n`);
    out.push(table(["config", "K", ...tasks], runs.map((run) => [run.config, kCell(run), ...tasks.map((t) => {
      const a = acc(run, t);
      return a ? pct(a.accuracy) : "–";
    })])));
  }
  const sched = r.tasks.filter((t) => t.family === "hybridgen" && t.meanLastK !== undefined);
  if (sched.length > 0) {
    out.push(`\n### HybridGen's last decode step per item: mean K and share run pre-QKᵀ\n`);
    out.push(table(["config", "K", ...tasks], [...new Map(sched.map((t) => [`${t.config}\u0000${t.k}`, t])).values()].map((run) => [run.config, kCell(run), ...tasks.map((task) => {
      const x = sched.find((t) => t.task === task && t.config === run.config && t.k === run.k);
      return x ? `${x.meanLastK!.toFixed(0)} / ${pct(x.preShare!)}` : "–";
    })])));
  }
  out.push(`\n### Per method at K = ${k} (Fig. 20)\n`);
  const methods = [...new Set([...r.text, ...r.tasks].map((x) => x.config))];
  out.push(table(["config", ...(r.text.length ? ["text top-1"] : []), ...tasks], methods.map((c) => {
    const t = atK(r.text, k).find((x) => x.config === c);
    return [c, ...(r.text.length ? [t ? pct(t.top1) : "–"] : []), ...tasks.map((task) => {
      const a = atK(r.tasks, k).find((x) => x.config === c && x.task === task);
      return a ? pct(a.accuracy) : "–";
    })];
  })));
  return `${out.join("\n")}\n`;
}

export function evalCharts(r: EvalReport, k: number): { file: string; spec: ReturnType<typeof groupedBarsSpec> }[] {
  const ks = [...new Set([...r.text, ...r.tasks].map((x) => x.k).filter((x): x is number => x !== null))].sort((a, b) => a - b);
  const order = [...new Set([...r.text, ...r.tasks].map((x) => x.config))];
  // K-independent runs are repeated at every K: flat references beside the selective ones.
  const perK = <T extends EvalRun>(rs: readonly T[], value: (x: T) => number, facet: (x: T) => string): BarDatum[] =>
    rs.flatMap((x) => (x.k === null ? ks : [x.k]).map((kk) => ({ x: kk, series: x.config, y: value(x), facet: facet(x) })));
  const charts: { file: string; spec: ReturnType<typeof groupedBarsSpec> }[] = [];
  const fig14 = [...perK(r.text, (t) => t.top1, () => "text: top-1 agreement"), ...perK(r.tasks, (t) => t.accuracy, (t) => `${t.task}: accuracy`)];
  if (fig14.length > 0 && ks.length > 0) {
    charts.push({ file: "fig14-accuracy-vs-k.svg", spec: groupedBarsSpec({ title: "Accuracy vs K", xTitle: "K (tokens per KV head)", yTitle: "accuracy", seriesOrder: order, data: fig14 }) });
  }
  const fig20 = [
    ...atK(r.text, k).map((t) => ({ x: "text top-1", series: t.config, y: t.top1 })),
    ...atK(r.tasks, k).map((t) => ({ x: t.task, series: t.config, y: t.accuracy })),
  ];
  if (fig20.length > 0) {
    charts.push({ file: "fig20-accuracy-per-method.svg", spec: groupedBarsSpec({ title: `Accuracy per method (K = ${k})`, xTitle: "task", yTitle: "accuracy", seriesOrder: order, data: fig20 }) });
  }
  return charts;
}

export async function writeEvalOutputs(r: EvalReport, k: number, dir: string): Promise<string[]> {
  mkdirSync(dir, { recursive: true });
  const files = [join(dir, "eval.json")];
  writeFileSync(files[0]!, `${JSON.stringify(r, null, 1)}\n`);
  for (const c of evalCharts(r, k)) {
    const file = join(dir, c.file);
    writeFileSync(file, await renderSvg(c.spec));
    files.push(file);
  }
  return files;
}
