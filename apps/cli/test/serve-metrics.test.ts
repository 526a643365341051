// The server's hand-written Prometheus text (serve/metrics.ts) read back by a strict parser of the
// exposition format 0.0.4: every family's HELP and TYPE once, before its samples; valid names;
// label values escaped; histograms with ascending `le`, cumulative counts, +Inf = _count and the
// observations' _sum; counters that only count. The CLI README's metrics table names every family
// the server renders, and nothing else.
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { Histogram, Scalar, ServeMetrics } from "../src/serve/metrics.js";

interface Sample {
  readonly name: string;
  readonly labels: Record<string, string>;
  readonly value: number;
}
interface Family {
  readonly name: string;
  readonly type: string;
  readonly help: string;
  readonly samples: Sample[];
}

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;

/** Label values per the format: \\ \" \n escaped, nothing else. */
function parseLabels(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  let i = 0;
  while (i < text.length) {
    const eq = text.indexOf("=", i);
    const key = text.slice(i, eq);
    expect(key, `label name in {${text}}`).toMatch(/^[a-zA-Z_][a-zA-Z0-9_]*$/);
    expect(text[eq + 1], `label ${key} quoted`).toBe('"');
    let j = eq + 2, value = "";
    for (; text[j] !== '"'; j++) {
      expect(j, `label ${key} closed`).toBeLessThan(text.length);
      if (text[j] !== "\\") {
        value += text[j];
        continue;
      }
      const e = text[++j];
      expect(["\\", '"', "n"], `escape \\${e} in ${key}`).toContain(e);
      value += e === "n" ? "\n" : e;
    }
    expect(key in out, `label ${key} twice`).toBe(false);
    out[key] = value;
    i = j + 1;
    if (text[i] === ",") i++;
  }
  return out;
}

function parseValue(v: string): number {
  if (v === "+Inf") return Infinity;
  if (v === "-Inf") return -Infinity;
  expect(v, "a sample's value").toMatch(/^(NaN|-?\d+(\.\d+)?(e[+-]?\d+)?)$/);
  return Number(v);
}

/** The families of a 0.0.4 text, checked line by line. */
function parse(text: string): Map<string, Family> {
  expect(text.endsWith("\n")).toBe(true);
  const families = new Map<string, Family>();
  let current: { name: string; help?: string; type?: string; samples: Sample[] } | null = null;
  const close = () => {
    if (!current) return;
    expect(current.type, `# TYPE of ${current.name}`).toBeDefined();
    expect(families.has(current.name), `${current.name} declared twice`).toBe(false);
    families.set(current.name, { name: current.name, type: current.type!, help: current.help!, samples: current.samples });
  };
  for (const line of text.slice(0, -1).split("\n")) {
    const meta = /^# (HELP|TYPE) (\S+) (.*)$/.exec(line);
    if (meta) {
      const [, kind, name, rest] = meta;
      expect(name).toMatch(NAME);
      if (kind === "HELP") {
        close();
        expect(rest!.length, `help of ${name}`).toBeGreaterThan(0);
        expect(rest, `help of ${name} is one line`).not.toMatch(/\n/);
        current = { name: name!, help: rest!, samples: [] };
      } else {
        expect(current?.name, `# TYPE ${name} right after its # HELP`).toBe(name);
        expect(current!.samples).toHaveLength(0);
        expect(["counter", "gauge", "histogram"]).toContain(rest);
        current!.type = rest!;
      }
      continue;
    }
    const m = /^([^\s{]+)(?:\{(.*)\})? (\S+)$/.exec(line);
    expect(m, `a sample line: ${JSON.stringify(line)}`).not.toBeNull();
    const [, name, labels, value] = m!;
    expect(name).toMatch(NAME);
    expect(current, `${name} before any # HELP`).not.toBeNull();
    const base = current!.type === "histogram" ? name!.replace(/_(bucket|sum|count)$/, "") : name;
    expect(base, `${name} belongs to the family declared above it`).toBe(current!.name);
    current!.samples.push({ name: name!, labels: labels ? parseLabels(labels) : {}, value: parseValue(value!) });
  }
  close();
  return families;
}

/** A histogram family's buckets in order, checked: ascending le, cumulative, +Inf last and equal to _count. */
function histogram(f: Family): { buckets: [number, number][]; sum: number; count: number } {
  expect(f.type).toBe("histogram");
  const buckets = f.samples.filter((s) => s.name === `${f.name}_bucket`).map((s): [number, number] => [parseValue(s.labels.le!), s.value]);
  const sum = f.samples.find((s) => s.name === `${f.name}_sum`)!.value, count = f.samples.find((s) => s.name === `${f.name}_count`)!.value;
  expect(buckets.at(-1)![0], `${f.name}: the last bucket is +Inf`).toBe(Infinity);
  expect(buckets.at(-1)![1], `${f.name}: +Inf holds every observation`).toBe(count);
  buckets.forEach(([le, n], i) => {
    if (i === 0) return;
    expect(le, `${f.name}: le ascending`).toBeGreaterThan(buckets[i - 1]![0]);
    expect(n, `${f.name}: counts cumulative`).toBeGreaterThanOrEqual(buckets[i - 1]![1]);
  });
  return { buckets, sum, count };
}

describe("the server's Prometheus text", () => {
  it("parses as exposition format 0.0.4: each family once with HELP and TYPE, valid samples, histograms cumulative with +Inf = _count", () => {
    const m = new ServeMetrics();
    const ttfts = [0.0004, 0.02, 0.02, 0.7, 3, 75];
    for (const t of ttfts) m.ttft.observe(t);
    for (const b of [1, 3, 3, 8, 40]) m.batchSizes.observe(b);
    m.requests.inc(1, { endpoint: "/v1/completions", status: "200" });
    m.requests.inc(2, { endpoint: "/v1/completions", status: "400" });
    m.finished.inc(1, { reason: "cancelled" });
    m.kvBytes.set(1 << 20, { tier: "node0" });
    m.kvBytes.set(3 << 20, { tier: "disk" });
    m.hybridSteps.inc(4, { timing: "pre" });
    const families = parse(m.render());
    for (const name of [
      "hybridgen_requests_running", "hybridgen_requests_queued", "hybridgen_generation_tokens_total", "hybridgen_time_to_first_token_seconds",
      "hybridgen_time_per_output_token_seconds", "hybridgen_batch_size", "hybridgen_kv_bytes", "hybridgen_hybrid_k", "hybridgen_hybrid_steps_total",
      "hybridgen_cpu_stage_seconds", "hybridgen_cpu_stage_seconds_total", "hybridgen_decode_step_seconds", "hybridgen_prefill_chunk_seconds", "hybridgen_slot_renew_seconds",
      "hybridgen_slot_reuses_total", "hybridgen_decode_bytes_total", "hybridgen_prefill_flops_total", "hybridgen_prefill_link_bytes_total",
    ]) expect(families.has(name), name).toBe(true);
    for (const f of families.values()) {
      if (f.type === "histogram") histogram(f);
      if (f.type === "counter") for (const s of f.samples) expect(s.value, `${s.name} counts up from 0`).toBeGreaterThanOrEqual(0);
    }

    const ttft = histogram(families.get("hybridgen_time_to_first_token_seconds")!);
    expect(ttft.count).toBe(ttfts.length);
    expect(ttft.sum).toBeCloseTo(ttfts.reduce((a, b) => a + b, 0), 12);
    for (const [le, n] of ttft.buckets) expect(n, `le ${le}`).toBe(ttfts.filter((t) => t <= le).length);
    const batch = histogram(families.get("hybridgen_batch_size_steps")!);
    expect(batch.buckets.find(([le]) => le === 4)![1]).toBe(3);
    expect(batch.buckets.find(([le]) => le === 32)![1], "40 falls in +Inf only").toBe(4);

    const tiers = Object.fromEntries(families.get("hybridgen_kv_bytes")!.samples.map((s) => [s.labels.tier, s.value]));
    expect(tiers).toEqual({ window: 0, node0: 1 << 20, disk: 3 << 20 });
    expect(families.get("hybridgen_requests_total")!.samples.map((s) => [s.labels, s.value])).toEqual([
      [{ endpoint: "/v1/completions", status: "200" }, 1], [{ endpoint: "/v1/completions", status: "400" }, 2],
    ]);
    expect(families.get("hybridgen_requests_finished_total")!.samples.find((s) => s.labels.reason === "cancelled")!.value).toBe(1);
  });

  it("label values are escaped and read back as written; non-finite values render as the format's words", () => {
    const odd = 'a "quoted" \\ back\nslash';
    const s = new Scalar("test_odd", "A gauge with an odd label.", "gauge", []);
    s.set(2.5, { path: odd });
    s.set(Infinity, { path: "up" });
    s.set(-Infinity, { path: "down" });
    const h = new Histogram("test_h", "A histogram.", [0.5, 1]);
    h.observe(Infinity);
    const f = parse(`${s.render()}\n${h.render()}\n`);
    expect(f.get("test_odd")!.samples.map((x) => [x.labels.path, x.value])).toEqual([[odd, 2.5], ["up", Infinity], ["down", -Infinity]]);
    expect(histogram(f.get("test_h")!)).toEqual({ buckets: [[0.5, 0], [1, 0], [Infinity, 1]], sum: Infinity, count: 1 });
  });

  it("the CLI README's metrics table names every family the server renders, and no other", () => {
    const readme = readFileSync(new URL("../README.md", import.meta.url), "utf8");
    const table = readme.slice(readme.indexOf("**Metrics**"));
    const rows = table.slice(0, table.indexOf("\n\n", table.indexOf("| metric |"))).split("\n").filter((l) => l.startsWith("| `hybridgen_"));
    const named = rows.flatMap((r) => [...r.split(" | ")[0]!.matchAll(/`(hybridgen_[a-z_]+)(?:\{[a-z,]+\})?`/g)].map((m) => m[1]!));
    expect(new Set(named).size).toBe(named.length);
    expect(new Set(named)).toEqual(new Set(parse(new ServeMetrics().render()).keys()));
  });
});
