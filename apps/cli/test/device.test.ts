/** --device auto|cpu|cuda|MODULE: which backend runs (through the runtime's registry), the fallback reason, and the stats line. */
import { beforeAll, describe, expect, it } from "vitest";
import { cudaAvailability } from "@hybridgen/kernels-cuda";
import { ONE_THREAD_BACKEND, requireBuiltBin, runBin } from "./helpers.js";
import { PROMPT, greedyStory, stories15M } from "./model-fixture.js";

let model = "";
beforeAll(async () => {
  requireBuiltBin();
  model = await stories15M();
});

const cuda = cudaAvailability();
const args = () => ["generate", "--model", model, "--prompt", PROMPT, "--temperature", "0", "--max-tokens", "24"];

describe("--device", () => {
  it("cpu runs on the CPU backend and says so on the stats line", () => {
    const r = runBin([...args(), "--device", "cpu"]);
    expect(r.code, r.stderr).toBe(0);
    expect(greedyStory().startsWith(r.stdout.trimEnd())).toBe(true);
    expect(r.stderr.trimEnd().split("\n").at(-1)).toMatch(/\| device: cpu\/\w+$/);
  });

  it("auto takes the GPU where CUDA is usable, else the CPU with the reason on stderr", () => {
    const r = runBin(args());
    expect(r.code, r.stderr).toBe(0);
    expect(greedyStory().startsWith(r.stdout.trimEnd())).toBe(true);
    if (cuda.available) {
      expect(r.stderr).toMatch(/\| device: cuda\//);
    } else {
      // The reason in plain words; the CUDA error itself with --verbose.
      expect(r.stderr).toMatch(/ \((no GPU found|the GPU is not usable): running on the CPU[^)]*\) in \d+ ms\n/);
      expect(r.stderr).toMatch(/\| device: cpu\/\w+\n$/);
      expect(runBin([...args(), "--verbose"]).stderr).toContain(`: ${cuda.reason}) in `);
    }
  });

  it.skipIf(cuda.available)("cuda without a usable GPU is a one-line error with the reason", () => {
    const r = runBin([...args(), "--device", "cuda"]);
    expect(r.code).not.toBe(0);
    expect(r.stdout).toBe("");
    expect(r.stderr).toMatch(/^error: CUDA unavailable: .+\n$/);
  });

  it("a backend module (its default export a BackendEntry) runs the model: the greedy story, its device on the stats line", () => {
    const r = runBin([...args(), "--device", ONE_THREAD_BACKEND]);
    expect(r.code, r.stderr).toBe(0);
    expect(greedyStory().startsWith(r.stdout.trimEnd())).toBe(true);
    expect(r.stderr.trimEnd().split("\n").at(-1)).toMatch(/\| device: one-thread\/\w+$/);
  });

  it("an unknown device is the same one line from generate, serve and bench, naming the registered backends (exit 2)", () => {
    const line = 'error: invalid value for --device: must be one of auto, cpu, cuda or a backend module (./my-backend.ts) (got "tpu")\n';
    for (const argv of [[...args(), "--device", "tpu"], ["serve", "--model", model, "--device", "tpu"], ["bench", "--model", model, "--device", "tpu"]]) {
      const r = runBin(argv);
      expect([r.code, r.stderr], argv[0]).toEqual([2, line]);
    }
  });
});
