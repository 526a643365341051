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

/** Two f32 safetensors files with one header and equal values (a zero step may flip a zero's sign). */
function sameWeights(a: Buffer, b: Buffer): boolean {
  const size = Number(a.readBigUInt64LE(0));
  if (a.length !== b.length || !a.subarray(0, 8 + size).equals(b.subarray(0, 8 + size))) return false;
  const x = new Float32Array(a.buffer.slice(a.byteOffset + 8 + size, a.byteOffset + a.length));
  const y = new Float32Array(b.buffer.slice(b.byteOffset + 8 + size, b.byteOffset + b.length));
  return x.every((v, i) => v === y[i]);
}

describe.skipIf(!numpy)("needle-3l's numpy trainer (apps/bench/train/tiny_retrieval.py)", () => {
  it("its hand-written gradients equal central differences (plain and stretched positions), a grown model computes its start's logits, stretching keeps records whole", () => {
    const r = python(["--check"]);
    expect(r.stderr).toBe("");
    expect(r.stdout).toMatch(/gradient check: worst relative error/);
    expect(r.stdout).toMatch(/grown to 5 layers: logits within 0\.0e\+00 of the start's/);
    expect(r.stdout).toMatch(/stretched positions: \d+ of 16 sequences, .* jumps only between fillers before the questions/);
    expect(r.status).toBe(0);
  });

  it("a fine-tune starts from its --start model's weights, with or without --span (a zero learning rate returns them unchanged)", () => {
    const dir = mkdtempSync(join(tmpdir(), "needle-3l-start-"));
    try {
      expect(python(["--out", dir, "--parity"]).status).toBe(0);
      const start = readFileSync(join(dir, "needle-3l", "model.safetensors"));
      for (const [extra, name] of [[[], "needle-3l"], [["--span", "2000", "--name", "stretched"], "stretched"]] as const) {
        const out = join(dir, `out-${name}`);
        const r = python(["--out", out, "--start", join(dir, "needle-3l"), "--steps", "1", "--lr", "0", "--log-every", "1000", ...extra]);
        expect(r.status, r.stderr).toBe(0);
        expect(sameWeights(readFileSync(join(out, name, "model.safetensors")), start)).toBe(true);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
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
