/**
 * CudaBackend.setDecodeTuning / decodeTuning against a stand-in native library (no GPU): the
 * switches reach hg_cu_set_decode_option with the right codes, read back through
 * hg_cu_get_decode_option, and bad input is a one-line HybridgenError that never reaches C.
 */
import { describe, expect, it } from "vitest";
import { HybridgenError } from "@hybridgen/core";
import { CudaBackend, type CudaNative, type DecodeTuning } from "../src/index.js";
import { STAND_IN_DEVICE, standInNative } from "./stand-in-native.js";

function fake(): { lib: CudaNative; sets: [number, number][] } {
  // what a fresh context on an sm_90 GPU starts with: 4 rows a round, the weight stream's 128 KB
  // ring, no cluster, the attention, RoPE and K/V append launched programmatically (13), a round's
  // rows folded in together (14), the slot size chosen per GEMV (19), the norm's scale on the dot
  // products (26), 7 KB slots for long plain rows (30), the attention on tensor cores (31), the K/V
  // append inside RoPE (32), the argmax's float4 rows (36), the argmax over all SMs (37) and the
  // pick copied on a side stream (38), stream grids splitting the rows evenly (41); codes 0, 2–7, 10–12, 15–18, 20–25, 27–29, 33–35, 39 and 40 (retired switches) are
  // unknown (-1)
  const options = [-1, 4, -1, -1, -1, -1, -1, -1, 128, 0, -1, -1, -1, 2, 1, -1, -1, -1, -1, 0, -1, -1, -1, -1, -1, -1, 1, -1, -1, -1, 1, 5, 1, -1, -1, -1, 1, 1, 1, -1, -1, 1];
  const sets: [number, number][] = [];
  const lib = standInNative({
    answer: (name, args) => {
      if (name === "hg_cu_set_decode_option") {
        const [which, value] = [args[1] as number, args[2] as number];
        sets.push([which, value]);
        const old = options[which] ?? -1;
        if (old < 0) return -1;
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
    expect(be.decodeTuning).toEqual({ attnUnroll: 4, gemvStream: 128, attnCluster: false, attnPdl: 2, attnGroup: true, gemvSlotKb: 0, gemvNormFold: true, gemvFillRing: true, attnMma: 5, ropeAppend: true, argmaxVec: true, argmaxSplit: true, feedSide: true, gemvGrid: true });
    be.setDecodeTuning({ attnUnroll: 4 });
    expect(sets).toEqual([[1, 4]]);
    expect(be.decodeTuning.attnUnroll).toBe(4);
    be.setDecodeTuning({ attnCluster: true, attnUnroll: 2 });
    expect(sets).toEqual([[1, 4], [9, 1], [1, 2]]);
    expect(be.decodeTuning).toMatchObject({ attnCluster: true, attnUnroll: 2 });
    sets.length = 0;
    be.setDecodeTuning({ attnUnroll: 4, gemvStream: 128, attnCluster: false });
    expect(sets).toEqual([[1, 4], [8, 128], [9, 0]]);
    expect(be.decodeTuning).toEqual({ attnUnroll: 4, gemvStream: 128, attnCluster: false, attnPdl: 2, attnGroup: true, gemvSlotKb: 0, gemvNormFold: true, gemvFillRing: true, attnMma: 5, ropeAppend: true, argmaxVec: true, argmaxSplit: true, feedSide: true, gemvGrid: true });
    be.setDecodeTuning({ gemvStream: 0, attnCluster: true });
    expect(sets.slice(3)).toEqual([[8, 0], [9, 1]]);
    // one switch at a time: [the change, the option code and value passed to C]
    const steps: [Partial<DecodeTuning>, [number, number]][] = [
      [{ attnPdl: 1 }, [13, 1]],
      [{ attnGroup: false }, [14, 0]],
      [{ gemvSlotKb: 16 }, [19, 16]],
      [{ gemvNormFold: false }, [26, 0]],
      [{ gemvFillRing: false }, [30, 0]],
      [{ attnMma: 2 }, [31, 2]],
      [{ attnMma: 0 }, [31, 0]],
      [{ ropeAppend: false }, [32, 0]],
      [{ attnMma: 1 }, [31, 1]],
      [{ argmaxVec: false }, [36, 0]],
      [{ argmaxSplit: false }, [37, 0]],
      [{ feedSide: false }, [38, 0]],
      [{ gemvGrid: false }, [41, 0]],
    ];
    for (const [change, code] of steps) {
      const before = sets.length;
      be.setDecodeTuning(change);
      expect(sets.slice(before)).toEqual([code]);
      expect(be.decodeTuning).toMatchObject(change);
    }
    be.close();
  });

  it("reports a switch the library refuses", () => {
    const { lib } = fake();
    (lib as unknown as Record<string, unknown>).hg_cu_set_decode_option = () => -1;
    const be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib, device });
    expect(() => be.setDecodeTuning({ gemvStream: 64 })).toThrow(/refused switch 8 = 64/);
    be.close();
  });

  it("refuses unknown switches and non-boolean values before calling C", () => {
    const { lib, sets } = fake();
    const be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib, device });
    expect(() => be.setDecodeTuning({ warpSpecialise: true } as never)).toThrow(HybridgenError);
    expect(() => be.setDecodeTuning({ warpSpecialise: true } as never)).toThrow(/unknown switch "warpSpecialise"/);
    // the retired switches are unknown now, whatever the value
    for (const gone of ["programmaticLaunch", "gemvSplit", "gemvUnroll", "qkvRope", "attnMergeInKernel", "attnMinChunk", "attnAsyncCopy", "l2Prefetch", "attnTile", "attnFold", "gemvChain", "gemvXPass", "gemvSiluSplit", "gemvSlot16", "gemvL2Ahead", "attnOverlap", "gemvDynamic", "gemvStage", "attnEarly", "attnMergeOnce", "attnL2Next", "gemvIdleL2", "gemvBalance", "attnMergeLoads", "attnMergeLast", "gemvRope", "l2Ahead", "gemvPair"]) {
      expect(() => be.setDecodeTuning({ [gone]: false } as never)).toThrow(new RegExp(`unknown switch "${gone}"`));
    }
    expect(() => be.setDecodeTuning({ attnUnroll: 3 } as never)).toThrow(/attnUnroll must be 2 or 4, got 3/);
    // a bad field anywhere: nothing is set, not even the good fields before it
    expect(() => be.setDecodeTuning({ attnUnroll: 2, gemvStream: 32 } as never)).toThrow(/gemvStream must be 0, 64, 128 or 192, got 32/);
    expect(() => be.setDecodeTuning({ attnCluster: "yes" } as never)).toThrow(/attnCluster must be a boolean/);
    expect(() => be.setDecodeTuning({ attnCluster: 1 } as never)).toThrow(/attnCluster must be a boolean, got 1/);
    expect(() => be.setDecodeTuning({ attnCluster: false, attnUnroll: 8 } as never)).toThrow(HybridgenError);
    expect(() => be.setDecodeTuning({ gemvSlotKb: 4 } as never)).toThrow(/gemvSlotKb must be 0, 8 or 16, got 4/);
    expect(() => be.setDecodeTuning({ attnMma: true } as never)).toThrow(/attnMma must be 0, 1, 2, 3, 4 or 5, got true/);
    expect(sets).toEqual([]);
    be.close();
    expect(() => be.setDecodeTuning({ attnUnroll: 4 })).toThrow(HybridgenError);
  });
});
