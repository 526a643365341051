/** Every op against the reference on the GPU; skipped where CUDA is unavailable (CI). */
import { describe, expect, it } from "vitest";
import { createCudaBackend, cudaAvailability } from "../src/index.js";
import { runOpChecks } from "../device/op-checks.js";
import { runPartialChecks } from "../device/partial-checks.js";

const cuda = cudaAvailability();
const SEED = Number(process.env.HG_TEST_SEED ?? Date.now() % 2 ** 31);

describe.skipIf(!cuda.available)(`CUDA backend on the GPU (seed ${SEED})`, () => {
  it("every op matches the reference backend", () => {
    using be = createCudaBackend({ arenaBytes: 2 ** 31 });
    const failed = runOpChecks(be, SEED).filter((r) => !r.ok);
    expect(failed).toEqual([]);
    expect(be.liveTensors).toBe(0);
  });

  it("hybrid attention's window kernels (attnPartial, attnMerge) match the reference backend", () => {
    using be = createCudaBackend({ arenaBytes: 2 ** 31 });
    expect(runPartialChecks(be, SEED).filter((r) => !r.ok)).toEqual([]);
    expect(be.liveTensors).toBe(0);
  });
});

it("reports why CUDA is unavailable, or that it is", () => {
  if (!cuda.available) expect(cuda.reason).toMatch(/^CUDA unavailable: /);
  else expect(cuda.devices.length).toBeGreaterThan(0);
});
