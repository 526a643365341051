/** The batched-decode kernels on the GPU (device/batch-checks.ts); skipped where CUDA is unavailable (CI). */
import { describe, expect, it } from "vitest";
import { createCudaBackend, cudaAvailability } from "../src/index.js";
import { runArgmaxRowsChecks, runBatchAttnChecks, runMatmulSplitChecks, runSkinnyChecks } from "../device/batch-checks.js";

const cuda = cudaAvailability();
const SEED = Number(process.env.HG_TEST_SEED ?? Date.now() % 2 ** 31);

describe.skipIf(!cuda.available)(`batched-decode kernels on the GPU (seed ${SEED})`, () => {
  it("skinny GEMM (every variant), matmulSplit and argmaxRows = reference; attnDecodeBatch = the per-row path (eager and recorded)", () => {
    using be = createCudaBackend({ arenaBytes: 2 ** 31 });
    const results = [...runSkinnyChecks(be, SEED), ...runMatmulSplitChecks(be, SEED + 2), ...runArgmaxRowsChecks(be, SEED + 3), ...runBatchAttnChecks(be, SEED + 1)];
    // Skinny: 2 dtypes × (7 shapes × 4 variants + 1 fallback); matmulSplit: 5 cases × 4 variants; argmaxRows: 3; attention: 18.
    expect(results.length).toBe(58 + 20 + 3 + 18);
    expect(results.filter((r) => !r.ok)).toEqual([]);
    expect(be.liveTensors).toBe(0);
  });
});
