import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { LlamaModel, openModelDir } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";

const script = fileURLToPath(new URL("../train/tiny_retrieval.py", import.meta.url));
const python = (args: string[]) => spawnSync("python3", [script, ...args], { encoding: "utf8", timeout: 100_000 });
// The trainer needs numpy alone; a machine without it cannot run the script at all.
const numpy = spawnSync("python3", ["-c", "import numpy"]).status === 0;

describe.skipIf(!numpy)("needle-3l's numpy trainer (apps/bench/train/tiny_retrieval.py)", () => {
  it("its hand-written gradients equal central differences (plain and stretched positions), a grown model computes its start's logits, stretching keeps records whole", () => {
    const r = python(["--check"]);
    expect(r.stderr).toBe("");
    expect(r.stdout).toMatch(/gradient check: worst relative error/);
    expect(r.stdout).toMatch(/grown to 5 layers: logits within 0\.0e\+00 of the start's/);
    expect(r.stdout).toMatch(/stretched positions: \d+ of 16 sequences, .* jumps only between fillers before the questions/);
    expect(r.status).toBe(0);
  });

  it("writes weights the engine runs to numpy's logits", () => {
    const dir = mkdtempSync(join(tmpdir(), "needle-3l-"));
    try {
      const r = python(["--out", dir, "--parity"]);
      expect(r.status, r.stderr).toBe(0);
      const ids: number[] = JSON.parse(readFileSync(join(dir, "ids.json"), "utf8"));
      const bytes = readFileSync(join(dir, "logits.f32"));
      const want = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
      using be = createCpuBackend({ threads: 1 });
      using files = openModelDir(join(dir, "needle-3l"));
      using model = LlamaModel.load(files, be, { maxContext: 128 });
      const vocab = want.length / (ids.length - 1);
      expect(vocab).toBe(1518);
      let worst = 0, scale = 0;
      for (let i = 0; i < ids.length - 1; i++) {
        const got = model.forward(Int32Array.of(ids[i]!), i);
        for (let j = 0; j < vocab; j++) {
          worst = Math.max(worst, Math.abs(got[j]! - want[i * vocab + j]!));
          scale = Math.max(scale, Math.abs(want[i * vocab + j]!));
        }
      }
      // Weights scaled up make logits of several units: a layout slip (RoPE halves, GQA order, a transposed weight) moves them by as much.
      expect(scale).toBeGreaterThan(1);
      expect(worst).toBeLessThan(1e-3 * scale);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
