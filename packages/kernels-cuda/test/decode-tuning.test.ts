/**
 * CudaBackend.setDecodeTuning / decodeTuning against a stand-in native library (no GPU): the
 * switches reach hg_cu_set_decode_option with the right codes, read back through
 * hg_cu_get_decode_option, and bad input is a one-line HybridgenError that never reaches C.
 */
import { describe, expect, it } from "vitest";
import { HybridgenError } from "@hybridgen/core";
import { CudaBackend, backendSymbols, type CudaNative } from "../src/index.js";

function fake(): { lib: CudaNative; sets: [number, number][] } {
  const options = [0, 2]; // what a fresh context starts with (PDL off, 2 rows a round)
  const sets: [number, number][] = [];
  const lib: Record<string, (...args: unknown[]) => unknown> = {};
  for (const name of Object.keys(backendSymbols)) {
    lib[name] = (...args: unknown[]) => {
      switch (name) {
        case "hg_cu_create": return 4096;
        case "hg_cu_heap_base": return 2 ** 40;
        case "hg_cu_heap_bytes": return 1 << 20;
        case "hg_cu_arena_bytes": return (1 << 20) + 4096;
        case "hg_cu_num_sms": return 132;
        case "hg_cu_set_decode_option": {
          const [which, value] = [args[1] as number, args[2] as number];
          sets.push([which, value]);
          const old = options[which];
          options[which] = value;
          return old;
        }
        case "hg_cu_get_decode_option": return options[args[1] as number] ?? -1;
        default: return 0;
      }
    };
  }
  return { lib: lib as unknown as CudaNative, sets };
}

const device = { index: 0, name: "Fake GPU", major: 9, minor: 0, computeCapability: "9.0", totalMemoryBytes: 2 ** 34, multiprocessors: 132, pciBusId: "" };

describe("CudaBackend decode tuning", () => {
  it("passes each switch to the library and reads it back", () => {
    const { lib, sets } = fake();
    const be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib, device });
    expect(be.decodeTuning).toEqual({ programmaticLaunch: false, attnUnroll: 2 });
    be.setDecodeTuning({ attnUnroll: 4 });
    expect(sets).toEqual([[1, 4]]);
    expect(be.decodeTuning.attnUnroll).toBe(4);
    be.setDecodeTuning({ programmaticLaunch: true, attnUnroll: 2 });
    expect(sets).toEqual([[1, 4], [0, 1], [1, 2]]);
    expect(be.decodeTuning).toEqual({ programmaticLaunch: true, attnUnroll: 2 });
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
    expect(() => be.setDecodeTuning({ programmaticLaunch: false, attnUnroll: 8 } as never)).toThrow(HybridgenError);
    expect(sets).toEqual([]);
    be.close();
    expect(() => be.setDecodeTuning({ attnUnroll: 4 })).toThrow(HybridgenError);
  });
});
