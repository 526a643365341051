import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { HybridgenError, type Tensor } from "@hybridgen/spec";
import { createCpuBackend, CpuBackendOptionsSchema, type CpuBackend } from "../src/index.js";

// Every bad input must be a one-line HybridgenError naming the problem, before any pointer
// reaches C (a segfault would kill the test process).
function throws(fn: () => unknown, pattern: RegExp): void {
  let err: unknown;
  try {
    fn();
  } catch (e) {
    err = e;
  }
  expect(err, `expected an error matching ${pattern}`).toBeInstanceOf(HybridgenError);
  const message = (err as Error).message;
  expect(message).toMatch(pattern);
  expect(message).not.toContain("\n");
}

describe("bad input", () => {
  let be: CpuBackend;
  let other: CpuBackend;
  beforeEach(() => {
    be = createCpuBackend({ threads: 2 });
    other = createCpuBackend({ threads: 1 });
  });
  afterEach(() => {
    be.close();
    other.close();
  });

  it("rejects tensors of another backend or backend instance", () => {
    const x = be.alloc([2, 8]);
    const w = other.alloc([4, 8]);
    const out = be.alloc([2, 4]);
    throws(() => be.matmul(out, x, w, 2), /w belongs to another CpuBackend instance/);
    const fake: Tensor = { dtype: "f32", shape: [4, 8], backend: "cuda" };
    throws(() => be.matmul(out, x, fake, 2), /w belongs to backend 'cuda'/);
    throws(() => be.free(fake), /belongs to backend 'cuda'/);
  });

  it("rejects freed tensors and double frees", () => {
    const x = be.alloc([2, 8]);
    const out = be.alloc([2, 8]);
    be.free(x);
    throws(() => be.relu(x, 1), /x was freed/);
    throws(() => be.add(out, x, out, 1), /a was freed/);
    throws(() => be.free(x), /already freed/);
  });

  it("rejects shape, dtype and row-count mismatches", () => {
    const x = be.alloc([2, 8]);
    const w = be.alloc([4, 9]);
    const out = be.alloc([2, 4]);
    throws(() => be.matmul(out, x, w, 2), /x rows have 8 values but w f32\[4x9\] expects k=9/);
    const w8 = be.alloc([4, 8]);
    throws(() => be.matmul(out, x, w8, 3), /x f32\[2x8\] has 2 rows, 3 requested/);
    throws(() => be.matmul(out, x, w8, 1.5), /row count 1.5/);
    throws(() => be.matmul(be.alloc([2, 4], "bf16"), x, w8, 1), /out must be f32, got bf16/);
    throws(() => be.matmul(out, x, w8, 1, be.alloc([5])), /bias f32\[5\] must have m=4/);
    throws(() => be.matmul(x, x, be.alloc([8, 8]), 1), /out must not overlap x/);
    throws(() => be.rmsNorm(x, x, be.alloc([7]), 1, 1e-5), /weight f32\[7\] must have 8 elements/);
    throws(() => be.add(out, x, x, 1), /out rows have 4 values, expected 8|a rows have 8 values, expected 4/);
    throws(() => be.softmax(x, 1, 9), /9 columns requested/);
    throws(() => be.argmax(x, 2), /row 2 is outside/);
    throws(() => be.write(x, new Float32Array(10), 7), /do not fit/);
    throws(() => be.read(x, 10, 7), /outside/);
    throws(() => be.copyRows(be.alloc([2, 8], "f16"), 0, be.alloc([2, 8], "bf16"), 0, 1), /cannot convert bf16 rows to f16/);
    throws(() => be.copyRows(x, 1, be.alloc([4, 8]), 0, 2), /dst rows 1..3 exceed 2 rows/);
    throws(() => be.view(x, 10, [7]), /outside/);
  });

  it("rejects bad weights and allocations", () => {
    throws(() => be.loadWeight(new Uint8Array(10), "f32", [3]), /needs 12 bytes, got 10/);
    throws(() => be.alloc([2, 0]), /not a positive integer/);
    throws(() => be.alloc([2, 3], "f64" as never), /unknown dtype 'f64'/);
  });

  it("rejects out-of-range ids, positions and slots", () => {
    const table = be.alloc([10, 4]);
    const out = be.alloc([3, 4]);
    throws(() => be.embedding(out, table, Int32Array.of(1, 10)), /id 10 at position 1 is outside the table's 10 rows/);
    throws(() => be.embedding(out, table, Int32Array.of(-1)), /id -1/);
    throws(() => be.embedding(out, table, new Int32Array(4)), /has 3 rows, 4 requested/);
    const cos = be.alloc([16, 2]);
    const sin = be.alloc([16, 2]);
    const x = be.alloc([2, 8]);
    throws(() => be.rope(x, 2, Int32Array.of(0, 16), 2, 4, cos, sin), /position 16 of row 1 is outside the tables' 16 positions/);
    throws(() => be.rope(x, 2, Int32Array.of(0), 2, 4, cos, sin), /1 positions for 2 rows/);
    throws(() => be.rope(x, 1, Int32Array.of(0), 2, 5, cos, sin), /not heads 2 x headDim 5/);

    const k = be.alloc([2, 32, 8], "bf16");
    const q = be.alloc([1, 32]);
    const logits = be.alloc([4, 40]);
    throws(() => be.attnLogitsGather(logits, 0, q, 0, k, Int32Array.of(0, 5, 32), 1), /slot 32 at index 2 is outside the cache capacity 32/);
    throws(() => be.attnLogitsGather(logits, 0, q, 0, k, Int32Array.of(-3), 1), /slot -3/);
    throws(() => be.attnLogits(logits, 0, q, 0, k, 30, 3, 1), /tokens 30..33 exceed the cache capacity 32/);
    throws(() => be.attnLogits(logits, 38, q, 0, k, 0, 3, 1), /columns 38..41 exceed logits width 40/);
    throws(() => be.attnLogits(logits, 0, q, 1, k, 0, 3, 1), /q row 1 is outside/);
    throws(() => be.attnLogits(be.alloc([3, 40]), 0, be.alloc([1, 24]), 0, k, 0, 3, 1), /3 query heads are not a multiple of 2 KV heads/);
    throws(() => be.attnLogits(logits, 0, be.alloc([1, 30]), 0, k, 0, 3, 1), /q rows have 30 values, not heads 4 x headDim 8/);
    const agg = be.alloc([1, 32]);
    throws(() => be.attnAggregateGather(agg, 0, logits, 0, k, Int32Array.of(40), false), /slot 40/);
    throws(() => be.attnAggregate(agg, 0, logits, 0, be.alloc([2, 32]), 0, 3, false), /v must be 3-D/);
  });

  it("rejects bad options and a closed backend", () => {
    throws(() => createCpuBackend({ threads: 0 }), /threads/);
    throws(() => createCpuBackend({ isa: "sse" as never }), /isa/);
    expect(CpuBackendOptionsSchema.safeParse({ threads: 2, isa: "generic" }).success).toBe(true);
    const prev = process.env.HYBRIDGEN_ISA;
    process.env.HYBRIDGEN_ISA = "neon";
    try {
      throws(() => createCpuBackend(), /HYBRIDGEN_ISA=neon is not one of/);
      process.env.HYBRIDGEN_ISA = "generic";
      using g = createCpuBackend({ threads: 1 });
      expect(g.isa).toBe("generic");
    } finally {
      if (prev === undefined) delete process.env.HYBRIDGEN_ISA;
      else process.env.HYBRIDGEN_ISA = prev;
    }
    const x = be.alloc([4]);
    be.close();
    throws(() => be.relu(x, 1), /closed/);
  });
});
