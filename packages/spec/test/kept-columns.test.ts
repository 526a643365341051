/** keptColumns: the definition of the candidates a verified layer keeps (HostTransfers.keepRows). */
import { describe, expect, it } from "vitest";
import { keptColumns } from "../src/index.js";

describe("keptColumns", () => {
  it("keeps each KV head's best `keep` of its n columns by the group's largest logit, ties to the lower column", () => {
    // 2 KV heads of 2 query heads; width 7, columns from 1, kmax 5.
    const scores = Float32Array.from([
      9, 1, 5, 3, 3, 0, 9, // head 0: columns 1..5 = 1 5 3 3 0
      9, 2, 0, 4, 3, 7, 9, // head 1: 2 0 4 3 7 → group max 2 5 4 3 7
      9, 6, 6, 6, 6, 6, 9, // head 2: 6 6 6 6 6 (all tied)
      9, -1, -1, -1, 8, -1, 9, // head 3: → group max 6 6 6 8 6
    ]);
    const kept = keptColumns(scores, 7, 1, 2, 5, Int32Array.of(5, 4), 2);
    expect([...kept]).toEqual([0, 1, 0, 0, 1, /* KV head 1, n 4: 8 best, then the lowest of the 6s */ 1, 0, 0, 1, 0]);
    // n ≤ keep: every one of the n; counts are clamped to [0, kmax].
    expect([...keptColumns(scores, 7, 1, 2, 5, Int32Array.of(2, -3), 3)]).toEqual([1, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
    expect([...keptColumns(scores, 7, 1, 2, 5, Int32Array.of(99, 0), 5)]).toEqual([1, 1, 1, 1, 1, 0, 0, 0, 0, 0]);
  });

  it("-0 ranks as +0 (a tie, the lower column first)", () => {
    const scores = Float32Array.from([-0, 0, -0, 0]);
    expect([...keptColumns(scores, 4, 0, 1, 4, Int32Array.of(4), 1)]).toEqual([1, 0, 0, 0]);
    expect([...keptColumns(Float32Array.from([0, -0, -1, 0]), 4, 0, 1, 4, Int32Array.of(4), 2)]).toEqual([1, 1, 0, 0]);
  });
});
