/** calibrated-eval --from: runs side by side on one device (a length or a seed each) add up into one table; runs of other prompt shapes are refused. */
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";

const script = fileURLToPath(new URL("../src/eval/calibrated-eval.ts", import.meta.url));
const dir = mkdtempSync(join(tmpdir(), "hg-from-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const cell = (correct: number, total: number, meanK: number, exact: Record<string, number>, layerK: number[]) =>
  ({ correct, total, meanK, exactLayers: exact, calibMs: 10 * total, prefillMs: 100 * total, preSteps: 0, steps: 4 * total, layerK, decodeMs: total });
const run = (seed: number, length: number, full: ReturnType<typeof cell>, def: ReturnType<typeof cell>, window = 256) => ({
  backend: "cuda", models: [{ dir: "/m/vt-8l", task: "vartrack" }], lengths: [length], seed, prompts: 6, records: 64, window, sinks: 4, massTarget: 0.95,
  modes: ["full", "default"], results: { "vt-8l (vartrack)": { full: { [length]: full }, default: { [length]: def } } },
});
const write = (name: string, x: unknown) => {
  const f = join(dir, name);
  writeFileSync(f, JSON.stringify(x));
  return f;
};
const from = (files: string[], extra: string[] = []) =>
  spawnSync(process.execPath, [script, "--from", files.join(","), ...extra], { encoding: "utf8", timeout: 60_000 });

describe("calibrated-eval --from", () => {
  it("adds up each cell's prompts, answers, rows, exact layers and K per layer; a length with fewer prompts says how many", () => {
    const a = write("a.json", run(1, 16384, cell(5, 6, 6 * 16128, {}, []), cell(5, 6, 6 * 900, { none: 4, "1": 2 }, [6 * 100, 6 * 50])));
    const b = write("b.json", run(2, 16384, cell(4, 5, 5 * 16128, {}, []), cell(3, 5, 5 * 1000, { none: 5 }, [5 * 200, 5 * 60])));
    const c = write("c.json", run(1, 4096, cell(12, 16, 16 * 3840, {}, []), cell(12, 16, 16 * 400, { none: 16 }, [16 * 64, 16 * 64])));
    const table = join(dir, "t.json"), json = join(dir, "m.json");
    const r = from([a, b, c], ["--table", table, "--json", json]);
    expect(r.status, r.stderr).toBe(0);
    const t = JSON.parse(readFileSync(table, "utf8")) as { measured: string; table: { columns: string[]; rows: string[][] } };
    expect(t.table.columns).toEqual(["model (task)", "mode", "4 096", "16 384", "mean rows a KV head (4 096 / 16 384)"]);
    expect(t.table.rows).toEqual([
      ["vt-8l (vartrack)", "full attention", "0.750", "0.818 (11 prompts)", "3840 / 16128"],
      ["vt-8l (vartrack)", "defaults (device: feedback, topk+quest, verified ×4)", "0.750", "0.727 (11 prompts)", "400 / 945"],
    ]);
    expect(t.measured).toContain("seeds 1,2");
    const m = JSON.parse(readFileSync(json, "utf8")) as { results: Record<string, Record<string, Record<string, { total: number; exactLayers: Record<string, number>; layerK: number[] }>>> };
    const d = m.results["vt-8l (vartrack)"]!.default!["16384"]!;
    expect([d.total, d.exactLayers, d.layerK]).toEqual([11, { none: 9, "1": 2 }, [1600, 600]]);
    expect(r.stdout).toContain("calibration 10.0 ms of a 100 ms prefill, mean K per layer 145/55");
  });

  it("refuses runs of another window", () => {
    const a = write("w1.json", run(1, 4096, cell(1, 1, 3840, {}, []), cell(1, 1, 400, {}, [])));
    const b = write("w2.json", run(1, 8192, cell(1, 1, 7936, {}, []), cell(1, 1, 400, {}, []), 64));
    const r = from([a, b]);
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain("has window 64");
  });
});
