/**
 * README tables generated from committed result files: a table right under a marker line
 *   <!-- table: docs/performance/PATH.json [VIEW] [key=value …] -->
 * is rendered from that file by VIEW (default: the file's own `table`), so a figure in a README
 * changes only with its result file. `./bun apps/bench/src/readme/tables.ts --write` regenerates
 * every marked table; without --write it lists the tables that differ (the CI test's check).
 */
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { markdownTables, readmePaths, type ReadmeTable } from "./readmes.js";

/** A result file's own table: the figures as measured, with where and how. */
export interface TableFile {
  readonly measured?: string;
  readonly table: { readonly columns: readonly string[]; readonly align?: readonly ("left" | "right")[]; readonly rows: readonly (readonly string[])[] };
}

interface EvalText { config: string; k: number | null; perplexity: number; top1: number; kl: number }
interface EvalTask { config: string; k: number | null; task: string; accuracy: number }
interface EvalFile { setup: { configs: string[] }; text: EvalText[]; tasks: EvalTask[] }
interface BenchPoint { config: string; context: number; batch: number; status: string; msPerToken?: number; tokensPerSec?: number }
interface BenchFile { setup: { configs: string[]; contexts: number[] }; points: BenchPoint[] }
interface WorkloadRow { config: string; status: string; note?: string; batch?: number; waves?: number; window?: number; tokensPerSec?: number; p50Ms?: number; p99Ms?: number; msPerStep?: number; predictedMsPerStep?: number | null; bytesPerStep?: { gpu: number; tiers: Record<string, number>; link: number }; floorMsPerStep?: number | null }
interface WorkloadFile { result: { rows: WorkloadRow[] } }
interface ServeResult {
  label: string; rate: number | "inf"; requests: number; completed?: number; seconds: number; requestsPerSec: number; outputTokensPerSec: number; meanBatch?: number; meanStepMs?: number; meanChunkMs?: number;
  steps?: number; chunks?: number; stepFloorMs?: number; chunkFloorMs?: number; outsideStepsS?: number;
  ttftMs: { p50: number; p99: number }; tpotMs: { p50: number; p99: number };
}
interface ServeFile { results: ServeResult[] }

type Args = Record<string, string>;
type Rows = { columns: string[]; align: ("left" | "right")[]; rows: string[][] };

const pct = (x: number) => `${(x * 100).toFixed(1)}%`;
/** A mean KL as the eval tables print it: 0, or two significant digits in exponent form below 0.01. */
const kl = (x: number) => (x === 0 ? "0" : x < 0.01 ? x.toExponential(1) : x.toFixed(3).replace(/0+$/, ""));
/** 2048 → "2K"; 131000 → "128K (131 000)". */
const ctxLabel = (c: number) => (c % 1024 === 0 ? `${c / 1024}K` : `${Math.round(c / 1024)}K (${c.toLocaleString("en-US").replace(/,/g, " ")})`);
const right = (n: number): ("left" | "right")[] => ["left", ...Array<"right">(n).fill("right")];

/** The row of `config` at K (baselines have no K), or undefined. */
function atK<T extends { config: string; k: number | null }>(rows: readonly T[], config: string, k: number): T | undefined {
  return rows.find((r) => r.config === config && (r.k === k || r.k === null));
}

/** Views of a result file other than its own table, by name. */
const VIEWS: Record<string, (file: unknown, args: Args) => Rows> = {
  /** `hybridgen eval --text`'s eval.json at one K: perplexity, top-1 agreement, mean KL, and the first task's accuracy. */
  "eval-text": (file, args) => {
    const f = file as EvalFile, k = Number(args.k);
    const task = f.tasks[0]?.task;
    const rows = f.setup.configs.map((c) => {
      const t = atK(f.text, c, k);
      const a = task ? atK(f.tasks.filter((x) => x.task === task), c, k) : undefined;
      if (!t) throw new Error(`eval-text: no text result for ${c} at K = ${k}`);
      return [c, t.perplexity.toFixed(3), pct(t.top1), kl(t.kl), ...(a ? [pct(a.accuracy)] : [])];
    });
    const columns = ["config", "perplexity", "top-1 agreement with full", "mean KL (nats)", ...(task ? ["completions"] : [])];
    return { columns, align: right(columns.length - 1), rows };
  },
  /** eval.json's tasks: one column per task and K of `ks` (accuracy). */
  "eval-tasks": (file, args) => {
    const f = file as EvalFile, ks = args.ks!.split(",").map(Number);
    const tasks = [...new Set(f.tasks.map((t) => t.task))];
    const cols = tasks.flatMap((task) => ks.map((k) => ({ task, k })));
    const rows = f.setup.configs.map((c) => [c, ...cols.map(({ task, k }) => {
      const r = atK(f.tasks.filter((t) => t.task === task), c, k);
      if (!r) throw new Error(`eval-tasks: no ${task} result for ${c} at K = ${k}`);
      return pct(r.accuracy);
    })]);
    const label = (task: string) => task.replace(/^[a-z]+-/, "").toUpperCase();
    return { columns: ["config", ...cols.map(({ task, k }) => `${label(task)}, K = ${k}`)], align: right(cols.length), rows };
  },
  /** `hybridgen bench`'s bench.json: ms/token per config (rows) and context (columns) at batch `batch` (default 1). */
  "bench-context": (file, args) => {
    const f = file as BenchFile, batch = Number(args.batch ?? 1);
    const rows = f.setup.configs.map((c) => [c, ...f.setup.contexts.map((ctx) => {
      const p = f.points.find((x) => x.config === c && x.context === ctx && x.batch === batch);
      return p && p.status === "ok" && p.msPerToken !== undefined ? p.msPerToken.toFixed(2) : "–";
    })]);
    return { columns: ["config", ...f.setup.contexts.map(ctxLabel)], align: right(f.setup.contexts.length), rows };
  },
  /** `hybridgen bench`'s bench.json per batch size at one context (context=N, default the first): tokens/s, and each configuration's ratio to full attention's at that batch. */
  "bench-batch": (file, args) => {
    const f = file as BenchFile & { setup: { batches: number[] } }, ctx = Number(args.context ?? f.setup.contexts[0]);
    const tps = (c: string, b: number) => {
      const p = f.points.find((x) => x.config === c && x.context === ctx && x.batch === b);
      return p && p.status === "ok" && p.tokensPerSec !== undefined ? p.tokensPerSec : undefined;
    };
    const rows = f.setup.configs.map((c) => [c, ...f.setup.batches.map((b) => {
      const t = tps(c, b), full = tps("full", b);
      if (t === undefined) return "–";
      return c === "full" || full === undefined ? t.toFixed(1) : `${t.toFixed(1)} (${(t / full).toFixed(2)}×)`;
    })]);
    return { columns: ["config", ...f.setup.batches.map((b) => `batch ${b}`)], align: right(f.setup.batches.length), rows };
  },
  /** `hybridgen bench --workload`'s workload.json: a row per configuration, its tokens/s against full attention's best feasible. */
  workload: (file) => {
    const rows = (file as WorkloadFile).result.rows, full = rows.find((r) => r.config === "full" && r.status === "ok");
    const f = (x: number | null | undefined, d: number) => (x === null || x === undefined ? "–" : x.toFixed(d));
    return {
      columns: ["config", "batch × waves", "window", "tokens/s", "vs full", "ms/token p50", "ms/token p99", "ms/step", "planned ms/step", "device GB/step", "host GB/step", "link GB/step", "floor ms/step", "× floor"],
      align: right(13),
      rows: rows.map((r) => r.status !== "ok" ? [r.config, r.status, ...Array<string>(12).fill("–")] : [
        r.config, `${r.batch} × ${r.waves}`, r.window === undefined ? "all" : String(r.window), f(r.tokensPerSec, 1),
        full ? `${(r.tokensPerSec! / full.tokensPerSec!).toFixed(2)}×` : "–", f(r.p50Ms, 2), f(r.p99Ms, 2), f(r.msPerStep, 2), f(r.predictedMsPerStep, 2),
        ...(r.bytesPerStep ? [f(r.bytesPerStep.gpu / 1e9, 2), f(Object.values(r.bytesPerStep.tiers).reduce((n, v) => n + v, 0) / 1e9, 2), f(r.bytesPerStep.link / 1e9, 3)] : ["–", "–", "–"]),
        f(r.floorMsPerStep, 2), r.floorMsPerStep ? `${(r.msPerStep! / r.floorMsPerStep).toFixed(2)}×` : "–",
      ]),
    };
  },
  /**
   * apps/bench serve-bench's --json file: a row per configuration and rate, its output tokens/s against the first row's (the baseline) at
   * that rate; "k of N" requests where a time limit ended the rate first; the mean batch of its decode steps; where the time went —
   * decode steps and prefill chunks (how many × the mean wall time, the floor in parentheses where recorded) and the time in neither.
   */
  serve: (file) => {
    const rows = (file as ServeFile).results;
    const base = (r: ServeResult) => rows.find((x) => x.rate === r.rate)!;
    const part = (n: number | undefined, ms: number | undefined, floor: number | undefined) =>
      ms === undefined ? "–" : `${n === undefined ? "" : `${n} × `}${ms.toFixed(1)}${floor === undefined ? "" : ` (${floor.toFixed(1)})`}`;
    return {
      columns: [
        "config", "arrival rate (req/s)", "requests", "time (s)", "req/s", "output tok/s", `vs ${rows[0]?.label ?? "first"}`, "mean batch", "decode steps × ms (floor)",
        "prefill chunks × ms (floor)", "outside both (s)", "TTFT p50 / p99 (s)", "TPOT p50 / p99 (ms)", "TPOT p99 / p50",
      ],
      align: right(13),
      rows: rows.map((r) => [
        r.label, r.rate === "inf" ? "all at once" : String(r.rate), r.completed === undefined || r.completed === r.requests ? String(r.requests) : `${r.completed} of ${r.requests}`,
        r.seconds.toFixed(1), r.requestsPerSec.toFixed(3), r.outputTokensPerSec.toFixed(1),
        `${(r.outputTokensPerSec / base(r).outputTokensPerSec).toFixed(2)}×`, r.meanBatch === undefined ? "–" : r.meanBatch.toFixed(2),
        part(r.steps, r.meanStepMs, r.stepFloorMs), part(r.chunks, r.meanChunkMs, r.chunkFloorMs), r.outsideStepsS === undefined ? "–" : r.outsideStepsS.toFixed(2),
        `${(r.ttftMs.p50 / 1000).toFixed(2)} / ${(r.ttftMs.p99 / 1000).toFixed(2)}`, `${r.tpotMs.p50.toFixed(1)} / ${r.tpotMs.p99.toFixed(1)}`, (r.tpotMs.p99 / r.tpotMs.p50).toFixed(2),
      ]),
    };
  },
};

/** Markdown rows of a table (header, separator, body). */
export function markdown({ columns, align, rows }: Rows): string[] {
  const line = (cells: readonly string[]) => `| ${cells.join(" | ")} |`;
  return [line(columns), line(align.map((a) => (a === "right" ? "---:" : "---"))), ...rows.map(line)];
}

export interface Marker {
  readonly readme: string;
  /** 1-based line of the marker. */
  readonly line: number;
  readonly file: string;
  readonly view: string | undefined;
  readonly args: Args;
}

const MARKER = /^<!-- table: (\S+)((?:\s+[\w=,.-]+)*)\s*-->$/;

export function parseMarker(readme: string, line: number, text: string): Marker | undefined {
  const m = MARKER.exec(text.trim());
  if (!m) return undefined;
  const words = m[2]!.trim().split(/\s+/).filter(Boolean);
  const args: Args = {};
  let view: string | undefined;
  for (const w of words) {
    const eq = w.indexOf("=");
    if (eq > 0) args[w.slice(0, eq)] = w.slice(eq + 1);
    else view = w;
  }
  return { readme, line, file: m[1]!, view, args };
}

/** The table a marker stands for, rendered from its result file. */
export function renderMarker(root: string, m: Marker): string[] {
  const path = join(root, m.file);
  if (!/^docs\/performance\/.+\.json$/.test(m.file)) throw new Error(`${m.readme}:${m.line}: a table's result file must be docs/performance/**/*.json, not ${m.file}`);
  if (!existsSync(path)) throw new Error(`${m.readme}:${m.line}: ${m.file} does not exist`);
  const data = JSON.parse(readFileSync(path, "utf8")) as unknown;
  if (m.view === undefined) {
    const t = (data as TableFile).table;
    if (!t) throw new Error(`${m.readme}:${m.line}: ${m.file} has no "table" (name a view: ${Object.keys(VIEWS).join(", ")})`);
    return markdown({ columns: [...t.columns], align: [...(t.align ?? right(t.columns.length - 1))], rows: t.rows.map((r) => [...r]) });
  }
  const view = VIEWS[m.view];
  if (!view) throw new Error(`${m.readme}:${m.line}: unknown table view ${m.view} (views: ${Object.keys(VIEWS).join(", ")})`);
  return markdown(view(data, m.args));
}

export interface TableState {
  readonly readme: string;
  /** The README's text with every marked table regenerated. */
  readonly generated: string;
  /** Marked tables whose text differs from their result file ("README:line"). */
  readonly stale: readonly string[];
  /** Tables of figures with no marker ("README:line"). */
  readonly unmarked: readonly string[];
  readonly marked: number;
}

/** Whether a table is one of figures: at least a third of its body cells after the first column start with a number, and it is not a list of flags or options (whose defaults are numbers). */
export function isFigureTable(t: ReadmeTable): boolean {
  if (/\|\s*(flag|option|variable|configuration)\s*\|/.test(t.rows[0]!) || /\|\s*(meaning|default|effect|what it is)\s*\|/.test(t.rows[0]!)) return false;
  const cells = t.rows.slice(2).flatMap((r) => r.split("|").slice(2, -1).map((c) => c.trim()));
  return cells.length > 0 && cells.filter((c) => /^\**[~≈<>±−-]?\d/.test(c)).length * 3 >= cells.length;
}

/** Every marked table of `readme` regenerated, and what differs or lacks a marker. */
export function checkReadmeTables(root: string, readme: string): TableState {
  const text = readFileSync(join(root, readme), "utf8");
  const lines = text.split("\n");
  const tables = markdownTables(readme, text);
  const out: string[] = [];
  const stale: string[] = [], unmarked: string[] = [];
  let marked = 0;
  const byLine = new Map(tables.map((t) => [t.line, t]));
  for (let i = 0; i < lines.length; i++) {
    const m = parseMarker(readme, i + 1, lines[i]!);
    if (!m) {
      const t = byLine.get(i + 1);
      if (t && isFigureTable(t) && !parseMarker(readme, i, lines[i - 1] ?? "")) unmarked.push(`${readme}:${i + 1}`);
      out.push(lines[i]!);
      continue;
    }
    marked++;
    const fresh = renderMarker(root, m);
    const t = byLine.get(i + 2);
    const old = t ? [...t.rows] : [];
    if (old.join("\n") !== fresh.join("\n")) stale.push(`${readme}:${i + 2}`);
    out.push(lines[i]!, ...fresh);
    i += old.length;
  }
  return { readme, generated: out.join("\n"), stale, unmarked, marked };
}

export function checkAllTables(root: string): TableState[] {
  return readmePaths(root).map((r) => checkReadmeTables(root, r));
}

if (import.meta.main) {
  const root = fileURLToPath(new URL("../../../../", import.meta.url));
  const write = process.argv.includes("--write");
  let bad = 0;
  for (const s of checkAllTables(root)) {
    if (write && s.stale.length) writeFileSync(join(root, s.readme), s.generated);
    for (const w of s.stale) console.log(`${write ? "regenerated" : "stale"}: ${w}`);
    for (const w of s.unmarked) console.log(`not generated: ${w} (a table of figures with no <!-- table: … --> marker)`);
    bad += (write ? 0 : s.stale.length) + s.unmarked.length;
    if (s.marked) console.log(`${s.readme}: ${s.marked} generated table${s.marked === 1 ? "" : "s"}`);
  }
  process.exit(bad ? 1 : 0);
}
