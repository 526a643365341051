/**
 * Greedy decode fed on the device (argmaxToFeed / embeddingFromFeed / feedResult) against a
 * stand-in native library (no GPU): the calls reach C with the row's address, width and slot;
 * bad input (a slot other than 0 or 1, a result or embedding before any pick, a table shorter
 * than the picked row) is a one-line HybridgenError that never reaches C. gpu.test.ts and the
 * device check run the real kernels.
 */
import { describe, expect, it } from "vitest";
import { HybridgenError } from "@hybridgen/spec";
import { CudaBackend } from "../src/index.js";
import { STAND_IN_DEVICE, STAND_IN_HEAP, standInNative, type NativeCall } from "./stand-in-native.js";

function make() {
  const calls: NativeCall[] = [];
  const lib = standInNative({
    calls,
    answer: (name, args) => {
      if (name !== "hg_cu_feed_result") return undefined;
      (args[2] as Int32Array)[0] = 40 + (args[1] as number); // the pick of that slot
      return 0;
    },
  });
  const be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib, device: STAND_IN_DEVICE });
  const feedCalls = () => calls.filter((c) => /feed/.test(c.name));
  return { be, feedCalls };
}

describe("CudaBackend token feed (stand-in native library)", () => {
  it("passes the row, its width and the slot to C, and reads the slot's pick back", () => {
    const { be, feedCalls } = make();
    const logits = be.alloc([2, 100]), table = be.alloc([100, 16], "bf16"), x = be.alloc([1, 16]);
    be.argmaxToFeed(logits, 1, 1);
    be.embeddingFromFeed(x, table);
    expect(be.feedResult(1)).toBe(41);
    const [pick, embed, result] = feedCalls();
    expect(pick.name).toBe("hg_cu_argmax_feed");
    expect(pick.args.slice(2)).toEqual([100, 1]);
    expect(Number(pick.args[1])).toBe(STAND_IN_HEAP + 100 * 4); // row 1 of f32 logits at the heap's start
    expect(embed.name).toBe("hg_cu_embedding_feed");
    expect(embed.args.slice(3)).toEqual([2, 16]); // bf16 table code, row width
    expect(result.name).toBe("hg_cu_feed_result");
    be.close();
  });

  it("refuses bad input before any native call", () => {
    const { be, feedCalls } = make();
    const logits = be.alloc([1, 100]), short = be.alloc([50, 16], "bf16"), x = be.alloc([1, 16]);
    expect(() => be.feedResult(0)).toThrow(/feedResult: slot 0 has no pick \(argmaxToFeed first\)/);
    expect(() => be.embeddingFromFeed(x, short)).toThrow(/nothing was picked into the feed/);
    expect(() => be.argmaxToFeed(logits, 0, 2)).toThrow(/slot must be 0 or 1, got 2/);
    expect(() => be.argmaxToFeed(logits, 1, 0)).toThrow(HybridgenError);
    expect(feedCalls()).toEqual([]);
    be.argmaxToFeed(logits, 0, 0);
    expect(() => be.embeddingFromFeed(x, short)).toThrow(/the feed holds picks below 100, the table has 50 rows/);
    expect(() => be.feedResult(1)).toThrow(/slot 1 has no pick/);
    expect(feedCalls().map((c) => c.name)).toEqual(["hg_cu_argmax_feed"]);
    be.close();
  });
});
