import { expect, it } from "vitest";
import { createCpuBackend } from "../src/index.js";

// Native memory must not grow with use: tensors freed by free() and close(), views are
// plain handles, ops allocate nothing per call. Resident memory after many cycles stays
// within a margin far below what a leak would add (here ~8 GiB if nothing were freed).
// The pages are written, so leaked memory would be resident.
it("alloc/free, views and ops over many cycles do not grow resident memory", () => {
  const fill = new Float32Array(1 << 19).fill(1); // touching the pages makes a leak resident
  const cycle = () => {
    using be = createCpuBackend({ threads: 2 });
    const w = be.alloc([256, 256]);
    const x = be.alloc([4, 256]);
    const out = be.alloc([4, 256]);
    for (let i = 0; i < 200; i++) {
      const big = be.alloc([1 << 19]); // 2 MiB: the mmap path
      const small = be.alloc([1000], "bf16"); // the malloc path
      be.write(big, fill);
      be.matmul(be.view(out, 0, [2, 256]), be.view(x, 0, [2, 256]), w, 2);
      be.free(big);
      be.free(small);
    }
    // left alive on purpose: close() must free them
    be.write(be.alloc([1 << 19]), fill);
    be.alloc([3, 3], "f16");
  };
  for (let i = 0; i < 3; i++) cycle(); // warm up allocator and JIT
  const before = process.memoryUsage().rss;
  for (let i = 0; i < 20; i++) cycle();
  const grown = process.memoryUsage().rss - before;
  expect(grown, `rss grew by ${(grown / 2 ** 20).toFixed(1)} MiB`).toBeLessThan(64 * 2 ** 20);
});
