/**
 * CudaBackend.setDecodeTuning / decodeTuning against a stand-in native library (no GPU): the
 * switches reach hg_cu_set_decode_option with the right codes, read back through
 * hg_cu_get_decode_option, and bad input is a one-line HybridgenError that never reaches C.
 */
import { describe, expect, it } from "vitest";
import { HybridgenError } from "@hybridgen/core";
import { CudaBackend, type CudaNative } from "../src/index.js";
import { STAND_IN_DEVICE, standInNative } from "./stand-in-native.js";

function fake(): { lib: CudaNative; sets: [number, number][] } {
  // what a fresh context starts with: PDL off, 2 rows a round, merge kernel, chunks ≥ 64, one warp a row, 4 loads
  const options = [0, 2, 0, 64, 0, 4, 0, 0, 0, 0];
  const sets: [number, number][] = [];
  const lib = standInNative({
    answer: (name, args) => {
      if (name === "hg_cu_set_decode_option") {
        const [which, value] = [args[1] as number, args[2] as number];
        sets.push([which, value]);
        const old = options[which];
        options[which] = value;
        return old;
      }
      if (name === "hg_cu_get_decode_option") return options[args[1] as number] ?? -1;
      return undefined;
    },
  });
  return { lib, sets };
}

const device = STAND_IN_DEVICE;

describe("CudaBackend decode tuning", () => {
  it("passes each switch to the library and reads it back", () => {
    const { lib, sets } = fake();
    const be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib, device });
    expect(be.decodeTuning).toEqual({ programmaticLaunch: false, attnUnroll: 2, attnMergeInKernel: false, attnMinChunk: 64, gemvSplit: 0, gemvUnroll: 4, attnAsyncCopy: false, qkvRope: false, gemvStream: 0, attnCluster: false });
    be.setDecodeTuning({ attnUnroll: 4 });
    expect(sets).toEqual([[1, 4]]);
    expect(be.decodeTuning.attnUnroll).toBe(4);
    be.setDecodeTuning({ programmaticLaunch: true, attnUnroll: 2 });
    expect(sets).toEqual([[1, 4], [0, 1], [1, 2]]);
    expect(be.decodeTuning).toMatchObject({ programmaticLaunch: true, attnUnroll: 2 });
    sets.length = 0;
    be.setDecodeTuning({ attnMergeInKernel: true, attnMinChunk: 128, gemvSplit: 1, gemvUnroll: 8, attnAsyncCopy: true, qkvRope: true, gemvStream: 128, attnCluster: true });
    expect(sets).toEqual([[2, 1], [3, 128], [4, 1], [5, 8], [6, 1], [7, 1], [8, 128], [9, 1]]);
    expect(be.decodeTuning).toEqual({ programmaticLaunch: true, attnUnroll: 2, attnMergeInKernel: true, attnMinChunk: 128, gemvSplit: 1, gemvUnroll: 8, attnAsyncCopy: true, qkvRope: true, gemvStream: 128, attnCluster: true });
    be.setDecodeTuning({ gemvSplit: 4, attnMergeInKernel: false });
    expect(sets.slice(8)).toEqual([[4, 4], [2, 0]]);
    be.close();
  });

  it("reports a switch the library refuses", () => {
    const { lib } = fake();
    (lib as unknown as Record<string, unknown>).hg_cu_set_decode_option = () => -1;
    const be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib, device });
    expect(() => be.setDecodeTuning({ gemvSplit: 2 })).toThrow(/refused switch 4 = 2/);
    be.close();
  });

  it("refuses unknown switches and non-boolean values before calling C", () => {
    const { lib, sets } = fake();
    const be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib, device });
    expect(() => be.setDecodeTuning({ warpSpecialise: true } as never)).toThrow(HybridgenError);
    expect(() => be.setDecodeTuning({ warpSpecialise: true } as never)).toThrow(/unknown switch "warpSpecialise"/);
    expect(() => be.setDecodeTuning({ programmaticLaunch: 1 } as never)).toThrow(/programmaticLaunch must be a boolean, got 1/);
    expect(() => be.setDecodeTuning({ attnUnroll: 3 } as never)).toThrow(/attnUnroll must be 2 or 4, got 3/);
    // a bad field anywhere: nothing is set, not even the good fields before it
    expect(() => be.setDecodeTuning({ gemvSplit: 3 } as never)).toThrow(/gemvSplit must be 0, 1, 2, 4 or 8, got 3/);
    expect(() => be.setDecodeTuning({ attnMinChunk: 32 } as never)).toThrow(/attnMinChunk must be 64, 128 or 256, got 32/);
    expect(() => be.setDecodeTuning({ attnMergeInKernel: "yes" } as never)).toThrow(/attnMergeInKernel must be a boolean/);
    expect(() => be.setDecodeTuning({ gemvUnroll: 16 } as never)).toThrow(/gemvUnroll must be 4 or 8, got 16/);
    expect(() => be.setDecodeTuning({ attnCluster: 1 } as never)).toThrow(/attnCluster must be a boolean, got 1/);
    expect(() => be.setDecodeTuning({ programmaticLaunch: false, attnUnroll: 8 } as never)).toThrow(HybridgenError);
    expect(sets).toEqual([]);
    be.close();
    expect(() => be.setDecodeTuning({ attnUnroll: 4 })).toThrow(HybridgenError);
  });
});
