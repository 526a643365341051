/**
 * CudaBackend.hostTransfers: range checks against a stand-in native library (no GPU needed),
 * and on a GPU (skipped without CUDA) pinned round trips through the copy stream against the
 * host data, with event times.
 */
import { describe, expect, it } from "vitest";
import { HybridgenError, type HostRegion, type HostSignal } from "@hybridgen/core";
import { CudaBackend, createCudaBackend, cudaAvailability, type CudaHostLink, type CudaNative } from "../src/index.js";
import { expectOneLineErrors } from "./one-line-errors.js";
import { STAND_IN_DEVICE, standInNative, type NativeCall } from "./stand-in-native.js";

const cuda = cudaAvailability();

/** The stand-in library; pinning the region at address 12345 fails. */
function standIn(calls: NativeCall[]): CudaNative {
  return standInNative({ calls, answer: (name, args) => (name === "hg_host_pin" ? ((args[1] as number) === 12345 ? -1 : 0) : undefined) });
}

const device = STAND_IN_DEVICE;

describe("CudaBackend.hostTransfers checks (stand-in library)", () => {
  it("refuses out-of-range copies before any native copy, and passes good ones as 2-D descriptors", () => {
    const calls: NativeCall[] = [];
    using be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib: standIn(calls), device });
    const link = be.hostTransfers();
    expect(be.hostTransfers()).toBe(link); // one link per backend
    const t = be.alloc([4, 8]); // 128 bytes
    const host: HostRegion = { address: 0x7000_0000, byteLength: 64 };
    const copy = { host, hostOffset: 0, tensor: t, tensorOffset: 0, width: 16, rows: 4, hostPitch: 16, tensorPitch: 32 };
    const copies = () => calls.filter((c) => c.name === "hg_link_copy").length;
    expect(() => link.toHost([{ ...copy, tensorPitch: 40 }])).toThrow(/tensor bytes \[0, 136\) exceed f32\[4x8\]'s 128/);
    expect(() => link.toHost([{ ...copy, hostOffset: 8 }])).toThrow(/host bytes \[8, 72\) exceed the region's 64/);
    expect(() => link.toDevice([{ ...copy, hostPitch: 8 }])).toThrow(/pitches \(8, 32\) are smaller than the row width 16/);
    expect(() => link.toDevice([{ ...copy, width: 1.5 }])).toThrow(HybridgenError);
    expect(() => link.toDevice([{ ...copy, host: { address: 0, byteLength: 64 } }])).toThrow(/non-null address/);
    const other = new CudaBackend({ arenaBytes: 1 << 21 }, { lib: standIn([]), device });
    const foreign = other.alloc([4, 8]);
    expect(() => link.toHost([{ ...copy, tensor: foreign }])).toThrow(HybridgenError);
    other.close();
    expect(copies()).toBe(0);

    link.toHost([copy]);
    const c = calls.filter((x) => x.name === "hg_link_copy").at(-1)!;
    expect(c.args[1]).toBe(0); // device → host
    expect(c.args[3]).toBe(1);
    const d = c.args[2] as Float64Array;
    expect(Array.from(d.subarray(0, 6))).toEqual([0x7000_0000, be.address(t), 16, 4, 16, 32]);
    link.toDevice([copy]);
    const u = calls.filter((x) => x.name === "hg_link_copy").at(-1)!;
    expect(u.args[1]).toBe(1);
    expect(Array.from((u.args[2] as Float64Array).subarray(0, 6))).toEqual([be.address(t), 0x7000_0000, 16, 4, 32, 16]);
  });

  it("pins once, unpins what it pinned, leaves shared pages pageable, and unpins the rest on close", () => {
    const calls: NativeCall[] = [];
    const be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib: standIn(calls), device });
    const link = be.hostTransfers();
    const a = { address: 0x1000, byteLength: 4096 }, shared = { address: 0x9000, byteLength: 12345 }, b = { address: 0x20000, byteLength: 8192 };
    link.pin(a);
    expect(() => link.pin(a)).toThrow(/already pinned/);
    link.pin(shared); // the stand-in answers -1: pages pinned before
    link.pin(b);
    expect(() => link.unpin({ address: 0x5000, byteLength: 1 })).toThrow(/is not pinned/);
    link.unpin(shared);
    link.unpin(a);
    expect(calls.filter((c) => c.name === "hg_host_unpin").map((c) => c.args[0])).toEqual([0x1000]);
    be.close();
    expect(calls.filter((c) => c.name === "hg_host_unpin").map((c) => c.args[0])).toEqual([0x1000, 0x20000]);
    expect(calls.some((c) => c.name === "hg_link_destroy")).toBe(true);
    link.unpin(b); // after close: everything was unpinned already
    expect(() => link.toHost([])).toThrow(/host link is closed/);
  });
});

describe("CudaBackend.hostTransfers: rows gathered from mapped host memory (stand-in library)", () => {
  /** The stand-in maps regions pinned at 0x200000 and up (device address + 2^44); lower ones stay unmapped. */
  const mappedLib = (calls: NativeCall[]) => standInNative({
    calls,
    answer: (name, args) => {
      if (name !== "hg_host_device_ptr") return undefined;
      const address = args[0] as number;
      if (address < 0x200000) return 1;
      (args[1] as Float64Array)[0] = address + 2 ** 44;
      return 0;
    },
  });

  it("maps what the device maps, checks every range before the native call, and passes the device address", () => {
    const calls: NativeCall[] = [];
    using be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib: mappedLib(calls), device });
    const link = be.hostTransfers();
    const store = { address: 0x400000, byteLength: 2 * 64 * 32 }, unmappedStore = { address: 0x1000, byteLength: 2 * 64 * 32 };
    link.pin(store);
    link.pin(unmappedStore);
    expect(link.mapped!(store)).toBe(true);
    expect(link.mapped!({ address: 0x400000 + 64, byteLength: 128 })).toBe(true); // inside it
    expect(link.mapped!({ address: 0x400000 + 64, byteLength: store.byteLength })).toBe(false); // past its end
    expect(link.mapped!(unmappedStore)).toBe(false);
    expect(link.mapped!({ address: 0x900000, byteLength: 16 })).toBe(false); // never pinned
    const dst = be.alloc([2 * 8, 8]); // 2 groups × 8 rows of 32 bytes
    const rows = { groups: 2, cap: 64, rowBytes: 32, kmax: 8 };
    const ids = Int32Array.from({ length: 16 }, (_, i) => i * 3), counts = Int32Array.of(8, 5);
    const gathers = () => calls.filter((c) => c.name === "hg_cu_gather_rows").length;
    expect(() => link.gatherRows!(dst, store, { ...rows, rowBytes: 40 }, ids, counts)).toThrow(/40 bytes is not a whole number of 16-byte pieces/);
    expect(() => link.gatherRows!(dst, store, { ...rows, cap: 4 }, ids, counts)).toThrow(/8 rows a group from a region of 4/);
    expect(() => link.gatherRows!(dst, store, rows, ids.subarray(0, 15), counts)).toThrow(/ids must be an Int32Array of at least 2 × 8/);
    expect(() => link.gatherRows!(dst, store, rows, ids, Int32Array.of(8))).toThrow(/counts must be/);
    expect(() => link.gatherRows!(dst, store, { ...rows, cap: 128 }, ids, counts)).toThrow(/2 × 128 rows of 32 bytes exceed the host region's 4096/);
    expect(() => link.gatherRows!(dst, store, { ...rows, kmax: 16, cap: 64 }, new Int32Array(32), counts)).toThrow(/2 × 16 rows of 32 bytes exceed f32\[16x8\]'s 512/);
    expect(() => link.gatherRows!(dst, unmappedStore, rows, ids, counts)).toThrow(/is not pinned memory the device maps/);
    expect(gathers()).toBe(0);
    const sub = { address: store.address + 1024, byteLength: 2 * 64 * 32 - 1024 };
    link.gatherRows!(dst, { ...store }, rows, ids, counts);
    const c = calls.filter((x) => x.name === "hg_cu_gather_rows").at(-1)!;
    expect(c.args.slice(1, 3)).toEqual([be.address(dst), 0x400000 + 2 ** 44]);
    expect(Array.from(c.args[3] as Int32Array)).toEqual([8, 5]);
    expect(Array.from(c.args[4] as Int32Array)).toEqual(Array.from(ids));
    expect(c.args.slice(5)).toEqual([2, 8, 64, 32]);
    expect(() => link.gatherRows!(dst, sub, rows, ids, counts)).toThrow(/exceed the host region's 3072/);
    link.unpin(store);
    expect(link.mapped!(store)).toBe(false);
  });

  it("sendSignalled checks its ranges and the mapping before the native call, and passes the device address", () => {
    const calls: NativeCall[] = [];
    using be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib: mappedLib(calls), device });
    const link = be.hostTransfers();
    const query = { address: 0x400000, byteLength: 1 << 21 }, unmapped = { address: 0x1000, byteLength: 4096 };
    link.pin(query);
    const q = be.alloc([1, 64]);
    const sends = () => calls.filter((c) => c.name === "hg_link_send_signalled").length;
    expect(() => link.sendSignalled!(query, q, 100)).toThrow(/bytes must be a positive multiple of 16, got 100/);
    expect(() => link.sendSignalled!(query, q, 512)).toThrow(/512 bytes exceed f32\[1x64\]'s 256/);
    expect(() => link.sendSignalled!({ address: 0x400000, byteLength: 128 }, q, 256)).toThrow(/256 bytes exceed the host region's 128/);
    expect(() => link.sendSignalled!(unmapped, q, 256)).toThrow(/is not pinned memory the device maps/);
    expect(sends()).toBe(0);
    link.sendSignalled!(query, q, 256);
    const c = calls.filter((x) => x.name === "hg_link_send_signalled").at(-1)!;
    expect(c.args.slice(1, 4)).toEqual([be.address(q), 0x400000 + 2 ** 44, 256]);
    link.unpin(query);
  });
});

describe("CudaBackend.hostTransfers: the stage hand-off on the device (stand-in library)", () => {
  const STAGE_WORD = 0x5000_0040, STAGE_WORD_DEV = 2 ** 45 + 0x40;
  /** Maps regions pinned at 0x200000 and up (device address + 2^44); hands out the stage word; `gaveUp` answers hg_link_gave_up. */
  const lib = (calls: NativeCall[], gaveUp?: { value: number; held: number }) => standInNative({
    calls,
    answer: (name, args) => {
      if (name === "hg_host_device_ptr") {
        const address = args[0] as number;
        if (address < 0x200000) return 1;
        (args[1] as Float64Array)[0] = address + 2 ** 44;
        return 0;
      }
      if (name === "hg_link_stage_signal") {
        const out = args[1] as Float64Array;
        out[0] = calls.filter((c) => c.name === name).length;
        out[1] = STAGE_WORD;
        out[2] = STAGE_WORD_DEV;
        return 0;
      }
      if (name === "hg_link_times") {
        (args[1] as Float64Array).set([2.5, 1.25, 7, 40]);
        return 0;
      }
      if (name === "hg_link_gave_up" && gaveUp) {
        (args[1] as Float64Array).set([gaveUp.value, gaveUp.held]);
        gaveUp = undefined; // the native call clears the flag
        return 1;
      }
      return undefined;
    },
  });
  const named = (calls: NativeCall[], name: string) => calls.filter((c) => c.name === name);

  it("stageSignal hands out the link's word; awaitSignal checks the signal and passes the word's device address and the value", () => {
    const calls: NativeCall[] = [];
    using be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib: lib(calls), device });
    const link = be.hostTransfers();
    const region = { address: 0x400000, byteLength: 1 << 21 };
    link.pin(region);
    expect(() => link.awaitSignal!({ address: STAGE_WORD, value: 1 })).toThrow(/neither the link's stage word nor in pinned memory the device maps/); // not handed out yet
    const s = link.stageSignal!();
    expect(s).toEqual({ address: STAGE_WORD, value: 1 });
    expect(link.stageSignal!().value).toBe(2);
    expectOneLineErrors([
      [() => link.awaitSignal!({ address: STAGE_WORD, value: -1 }), /a signal value must be an integer in \[0, 2³²\), got -1/],
      [() => link.awaitSignal!({ address: STAGE_WORD, value: 2 ** 32 }), /a signal value must be an integer/],
      [() => link.awaitSignal!({ address: STAGE_WORD, value: 1.5 }), /a signal value must be an integer/],
      [() => link.awaitSignal!({ address: STAGE_WORD + 2, value: 1 }), /4-byte aligned word address/],
      [() => link.awaitSignal!({ address: 0, value: 1 }), /non-null/],
      [() => link.awaitSignal!(null as never), /non-null/],
      [() => link.awaitSignal!({ address: 0x1000, value: 1 }), /the word at 0x1000 is neither the link's stage word/],
      [() => link.awaitSignal!({ address: region.address + region.byteLength, value: 1 }), /neither the link's stage word/], // just past the region
    ]);
    expect(named(calls, "hg_link_await_signal")).toHaveLength(0);
    link.awaitSignal!(s);
    link.awaitSignal!({ address: region.address + 64, value: 0xffffffff }); // a word in a mapped region
    const waits = named(calls, "hg_link_await_signal");
    expect(waits.map((c) => c.args.slice(1))).toEqual([[STAGE_WORD_DEV, 1], [region.address + 64 + 2 ** 44, 0xffffffff]]);
    expect(waits[0].args[0]).toBe(named(calls, "hg_link_stage_signal")[0].args[0]); // the link
  });

  it("setWaitTimeout checks its milliseconds; fence() and times() throw once when the device gave up, and times() reports the waits", () => {
    const calls: NativeCall[] = [];
    using be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib: lib(calls, { value: 7, held: 5 }), device });
    const link = be.hostTransfers() as CudaHostLink;
    expect(link.waitTimeoutMs).toBe(10_000);
    expectOneLineErrors([
      [() => link.setWaitTimeout(0), /setWaitTimeout: ms must be a number in \(0, 3600000\], got 0/],
      [() => link.setWaitTimeout(Number.NaN), /got NaN/],
      [() => link.setWaitTimeout(4e6), /got 4000000/],
    ]);
    expect(named(calls, "hg_link_set_timeout")).toHaveLength(0);
    link.setWaitTimeout(50);
    expect(named(calls, "hg_link_set_timeout").map((c) => c.args[1])).toEqual([50]);
    expect(link.waitTimeoutMs).toBe(50);
    expectOneLineErrors([[() => link.times(), /^the device gave up waiting for the CPU stage \(signal value 7; the word held 5\)$/]]);
    expect(link.times()).toEqual({ gpuMs: 2.5, txMs: 1.25, waitMs: 40 }); // cleared: the next call returns
    link.fence();
  });

  it("a give-up found by fence() throws there", () => {
    const calls: NativeCall[] = [];
    using be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib: lib(calls, { value: 3, held: 0 }), device });
    const link = be.hostTransfers();
    expect(() => link.fence()).toThrow("the device gave up waiting for the CPU stage (signal value 3; the word held 0)");
    link.fence();
    expect(named(calls, "hg_link_fence")).toHaveLength(2);
  });

  it("readMapped checks the copy as toDevice does, plus 4-byte multiples and the mapping, and passes device addresses", () => {
    const calls: NativeCall[] = [];
    using be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib: lib(calls), device });
    const link = be.hostTransfers();
    const logits = { address: 0x400000, byteLength: 4096 }, unmapped = { address: 0x1000, byteLength: 4096 };
    link.pin(logits);
    link.pin(unmapped);
    const t = be.alloc([4, 40]); // 160-byte rows
    const copy = { host: logits, hostOffset: 0, tensor: t, tensorOffset: 8 * 4, width: 8 * 4, rows: 4, hostPitch: 8 * 4, tensorPitch: 40 * 4 };
    const other = new CudaBackend({ arenaBytes: 1 << 21 }, { lib: standIn([]), device });
    const foreign = other.alloc([4, 40]);
    expectOneLineErrors([
      [() => link.readMapped!({ ...copy, tensorOffset: 36 * 4 }), /readMapped: tensor bytes \[144, 656\) exceed f32\[4x40\]'s 640/],
      [() => link.readMapped!({ ...copy, hostOffset: 4000 }), /host bytes \[4000, 4128\) exceed the region's 4096/],
      [() => link.readMapped!({ ...copy, hostPitch: 16 }), /pitches \(16, 160\) are smaller than the row width 32/],
      [() => link.readMapped!({ ...copy, width: 30, hostPitch: 32 }), /multiples of 4 bytes/],
      [() => link.readMapped!({ ...copy, hostOffset: 2 }), /multiples of 4 bytes/],
      [() => link.readMapped!({ ...copy, tensorOffset: 2 }), /multiples of 4 bytes/],
      [() => link.readMapped!({ ...copy, hostPitch: 34 }), /multiples of 4 bytes/],
      [() => link.readMapped!({ ...copy, rows: -1 }), /rows and width must be non-negative integers/],
      [() => link.readMapped!({ ...copy, host: unmapped }), /host region at 0x1000 is not pinned memory the device maps/],
      [() => link.readMapped!({ ...copy, host: { address: 0x900000, byteLength: 4096 } }), /is not pinned memory the device maps/],
      [() => link.readMapped!({ ...copy, tensor: foreign }), /./],
      [() => link.readMapped!(null as never), /a HostCopy is needed/],
    ]);
    other.close();
    expect(named(calls, "hg_cu_read_mapped")).toHaveLength(0);
    link.readMapped!(copy);
    link.readMapped!({ ...copy, hostOffset: 12, rows: 1, hostPitch: 3, tensorPitch: undefined }); // one row: pitches unused
    link.readMapped!({ ...copy, rows: 0 }); // nothing to copy: no native call
    const reads = named(calls, "hg_cu_read_mapped");
    expect(reads.map((c) => c.args.slice(1))).toEqual([
      [be.address(t) + 32, 0x400000 + 2 ** 44, 32, 4, 160, 32],
      [be.address(t) + 32, 0x400000 + 12 + 2 ** 44, 32, 1, 32, 32],
    ]);
  });

  it("gatherRowsAt checks gatherRows's ranges and the table's size, alignment and mapping, and passes the table's device address", () => {
    const calls: NativeCall[] = [];
    using be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib: lib(calls), device });
    const link = be.hostTransfers();
    const store = { address: 0x400000, byteLength: 2 * 64 * 32 }, tables = { address: 0x600000, byteLength: 4096 }, unmapped = { address: 0x1000, byteLength: 4096 };
    for (const r of [store, tables, unmapped]) link.pin(r);
    const dst = be.alloc([2 * 8, 8]);
    const rows = { groups: 2, cap: 64, rowBytes: 32, kmax: 8 };
    const table = { address: tables.address + 256, byteLength: 2 * 9 * 4 };
    expectOneLineErrors([
      [() => link.gatherRowsAt!(dst, store, { ...rows, rowBytes: 40 }, table), /gatherRowsAt: a row of 40 bytes is not a whole number of 16-byte pieces/],
      [() => link.gatherRowsAt!(dst, store, { ...rows, kmax: 0 }, table), /must be positive 32-bit integers/],
      [() => link.gatherRowsAt!(dst, store, { ...rows, cap: 4 }, table), /8 rows a group from a region of 4/],
      [() => link.gatherRowsAt!(dst, store, rows, { ...table, byteLength: 2 * 9 * 4 - 4 }), /a table of 2 × \(1 \+ 8\) ints needs 72 bytes, the region has 68/],
      [() => link.gatherRowsAt!(dst, store, rows, { ...table, address: table.address + 2 }), /the table at 0x600102 is not 4-byte aligned/],
      [() => link.gatherRowsAt!(dst, store, rows, { address: 0x1000, byteLength: 72 }), /the table at 0x1000 is not pinned memory the device maps/],
      [() => link.gatherRowsAt!(dst, store, rows, { address: tables.address + 4090, byteLength: 72 }), /not 4-byte aligned/],
      [() => link.gatherRowsAt!(dst, store, rows, { address: tables.address + 4064, byteLength: 72 }), /not pinned memory the device maps/], // runs past the region
      [() => link.gatherRowsAt!(dst, store, { ...rows, cap: 128 }, table), /2 × 128 rows of 32 bytes exceed the host region's 4096/],
      [() => link.gatherRowsAt!(dst, store, { ...rows, kmax: 16 }, { ...table, byteLength: 2 * 17 * 4 }), /2 × 16 rows of 32 bytes exceed f32\[16x8\]'s 512/],
      [() => link.gatherRowsAt!(dst, unmapped, rows, table), /host region at 0x1000 is not pinned memory the device maps/],
    ]);
    expect(named(calls, "hg_cu_gather_rows_at")).toHaveLength(0);
    link.gatherRowsAt!(dst, store, rows, table);
    const c = named(calls, "hg_cu_gather_rows_at").at(-1)!;
    expect(c.args.slice(1)).toEqual([be.address(dst), 0x400000 + 2 ** 44, table.address + 2 ** 44, 2, 8, 64, 32]);
    expect(named(calls, "hg_cu_gather_rows")).toHaveLength(0); // no upload
  });

  it("padColumnsAt checks the scores, columns, groups and the table, and passes the table's device address", () => {
    const calls: NativeCall[] = [];
    using be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib: lib(calls), device });
    const link = be.hostTransfers();
    const tables = { address: 0x600000, byteLength: 4096 };
    link.pin(tables);
    link.pin({ address: 0x1000, byteLength: 4096 });
    const scores = be.alloc([8, 50]);
    const table = { address: tables.address, byteLength: 4 * 4 };
    const bf = be.alloc([8, 50], "bf16"), flat = be.alloc([400]);
    expectOneLineErrors([
      [() => link.padColumnsAt!(bf, 10, 20, 2, table), /padColumnsAt: scores must be an f32 \[heads, width\] tensor, got bf16\[8x50\]/],
      [() => link.padColumnsAt!(flat, 10, 20, 2, table), /scores must be an f32 \[heads, width\] tensor/],
      [() => link.padColumnsAt!(scores, 31, 20, 2, table), /columns \[31, 51\) exceed the scores' width 50/],
      [() => link.padColumnsAt!(scores, -1, 20, 2, table), /col must be a non-negative integer, got -1/],
      [() => link.padColumnsAt!(scores, 10, 0, 2, table), /kmax and group must be positive integers, got 0 and 2/],
      [() => link.padColumnsAt!(scores, 10, 20, 3, table), /8 heads are not a whole number of groups of 3/],
      [() => link.padColumnsAt!(scores, 10, 20, 1, table), /a table of 8 counts needs 32 bytes, the region has 16/],
      [() => link.padColumnsAt!(scores, 10, 20, 2, { address: 0x1000, byteLength: 16 }), /the table at 0x1000 is not pinned memory the device maps/],
    ]);
    expect(named(calls, "hg_cu_pad_columns")).toHaveLength(0);
    link.padColumnsAt!(scores, 30, 20, 2, table);
    expect(named(calls, "hg_cu_pad_columns").at(-1)!.args.slice(1)).toEqual([be.address(scores), tables.address + 2 ** 44, 8, 50, 30, 20, 2]);
  });

  it("rowFetch checks each gather as gatherRowsAt and the signal as awaitSignal, passes device addresses, marks ready/release on the compute stream, and closes with the link", () => {
    const calls: NativeCall[] = [];
    const be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib: lib(calls), device });
    const link = be.hostTransfers();
    const store = { address: 0x400000, byteLength: 2 * 64 * 32 }, tables = { address: 0x600000, byteLength: 4096 };
    for (const r of [store, tables]) link.pin(r);
    const k = be.alloc([2 * 8, 8]), v = be.alloc([2 * 8, 8]);
    const rows = { groups: 2, cap: 64, rowBytes: 32, kmax: 8 };
    const table = { address: tables.address + 256, byteLength: 2 * 9 * 4 };
    const done = { address: tables.address + 64, value: 5 };
    const f = link.rowFetch!();
    const good = [{ dst: k, src: store, rows, table }, { dst: v, src: store, rows, table }];
    expectOneLineErrors([
      [() => f.fetch(2 as never, done, good), /rowFetch.fetch: slot must be 0 or 1, got 2/],
      [() => f.fetch(0, { ...done, address: 0x1000 }, good), /the word at 0x1000 is neither the link's stage word nor in pinned memory the device maps/],
      [() => f.fetch(0, { ...done, value: -1 }, good), /a signal value must be an integer/],
      [() => f.fetch(0, done, []), /1 to 8 gathers are needed/],
      [() => f.fetch(0, done, [{ ...good[0], table: { ...table, byteLength: 68 } }]), /a table of 2 × \(1 \+ 8\) ints needs 72 bytes, the region has 68/],
      [() => f.fetch(0, done, [{ ...good[0], rows: { ...rows, kmax: 16 } }]), /./],
      [() => f.fetch(0, done, [{ ...good[0], src: { address: 0x1000, byteLength: 4096 } }]), /not pinned memory the device maps/],
      [() => f.ready(-1 as never), /rowFetch.ready: slot must be 0 or 1, got -1/],
    ]);
    expect(named(calls, "hg_fetch_rows")).toHaveLength(0);
    f.fetch(1, done, good);
    const c = named(calls, "hg_fetch_rows").at(-1)!;
    expect(c.args.slice(1, 4)).toEqual([1, done.address + 2 ** 44, 5]);
    expect([...(c.args[4] as Float64Array)]).toEqual([
      be.address(k), 0x400000 + 2 ** 44, table.address + 2 ** 44, 2, 8, 64, 32,
      be.address(v), 0x400000 + 2 ** 44, table.address + 2 ** 44, 2, 8, 64, 32,
    ]);
    expect(c.args[5]).toBe(2);
    f.ready(1);
    f.release(1);
    expect(named(calls, "hg_fetch_mark").map((m) => m.args.slice(1))).toEqual([[1, 0], [1, 1]]);
    const g = link.rowFetch!();
    g.close();
    g.close(); // idempotent
    expect(() => g.ready(0)).toThrow(/the row fetch is closed/);
    be.close(); // closes the link, which closes f first
    expect(named(calls, "hg_fetch_destroy")).toHaveLength(2);
    expect(calls.findIndex((x) => x.name === "hg_fetch_destroy" && x.args[0] === c.args[0])).toBeLessThan(calls.findIndex((x) => x.name === "hg_link_destroy"));
  });
});

describe.skipIf(!cuda.available)("host link on the GPU", () => {
  it("sendSignalled, eager and recorded: the word reaches each value once the bytes are in host memory", async () => {
    const { createCpuBackend } = await import("../../kernels-cpu/src/index.js");
    const { toArrayBuffer } = await import("bun:ffi");
    using be = createCudaBackend({ arenaBytes: 2 ** 26 });
    using host = createCpuBackend({ threads: 1 });
    const link = be.hostTransfers();
    const buf = host.alloc([1, 1 << 19]); // 2 MiB: pinned and mapped
    const region = host.hostRegion(buf);
    link.pin(region);
    const q = be.alloc([1, 4096]);
    let last = 0;
    for (const recorded of [false, true, true]) {
      const data = Float32Array.from({ length: 4096 }, (_, i) => Math.cos(i + last));
      be.write(q, data);
      if (recorded) be.beginStep!("signalled-send-test");
      const s = link.sendSignalled!(region, q, 4096 * 4);
      if (recorded) be.endStep!();
      expect(s.value).toBe(last + 1);
      last = s.value;
      const word = new Uint32Array(toArrayBuffer(s.address as never, 0, 4));
      const t0 = performance.now();
      while (word[0] !== s.value && performance.now() - t0 < 5000) await new Promise((r) => setTimeout(r, 1));
      expect(word[0]).toBe(s.value);
      expect(host.read(buf, 0, 4096)).toEqual(data);
    }
    be.free(q);
    link.unpin(region);
  });

  it("pinned round trips through the copy stream keep the data; events give T_tx and T_gpu", async () => {
    const { createCpuBackend } = await import("../../kernels-cpu/src/index.js");
    using be = createCudaBackend({ arenaBytes: 2 ** 28 });
    using host = createCpuBackend({ threads: 1 });
    const link = be.hostTransfers();
    const rows = 64, cols = 96;
    const src = Float32Array.from({ length: rows * cols }, (_, i) => Math.sin(i * 0.37) * 100);
    const h = host.alloc([rows, cols]);
    host.write(h, src);
    const region = host.hostRegion(h);
    link.pin(region);
    const d = be.alloc([rows, 2 * cols]); // wider rows: a pitched copy into the left half
    link.mark("resume");
    link.toDevice([{ host: region, hostOffset: 0, tensor: d, tensorOffset: 0, width: cols * 4, rows, hostPitch: cols * 4, tensorPitch: 2 * cols * 4 }]);
    be.add(d, d, d, rows); // compute after the upload: doubles the left half
    const back = host.alloc([rows, cols]);
    const backRegion = host.hostRegion(back);
    link.pin(backRegion);
    link.toHost([{ host: backRegion, hostOffset: 0, tensor: d, tensorOffset: 0, width: cols * 4, rows, hostPitch: cols * 4, tensorPitch: 2 * cols * 4 }]);
    link.mark("pause");
    link.fence();
    const got = host.read(back);
    for (let i = 0; i < src.length; i++) expect(got[i]).toBe(src[i] * 2);
    const t = link.times();
    expect(t.txMs).toBeGreaterThan(0);
    expect(t.gpuMs).toBeGreaterThanOrEqual(0);
    const bw = link.bandwidth!(16 * 2 ** 20, 2);
    expect(bw.h2d).toBeGreaterThan(1e8);
    expect(bw.d2h).toBeGreaterThan(1e8);
    link.unpin(region);
    link.unpin(backRegion);
  });

  it("gatherRows reads the rows of pinned host memory in place, eager and recorded: the same bytes as a host gather, padded rows zero", async () => {
    const { createCpuBackend } = await import("../../kernels-cpu/src/index.js");
    using be = createCudaBackend({ arenaBytes: 2 ** 28 });
    using host = createCpuBackend({ threads: 1 });
    const link = be.hostTransfers();
    const groups = 2, cap = 4096, width = 128, kmax = 100; // a 4 MiB f32 store: pinned and mapped
    const store = host.alloc([groups, cap, width]);
    host.write(store, Float32Array.from({ length: groups * cap * width }, (_, i) => Math.sin(i * 0.013) * 50));
    const region = host.hostRegion(store);
    link.pin(region);
    expect(link.mapped!(region)).toBe(true);
    const all = host.read(store);
    const counts = Int32Array.of(kmax, 61);
    const ids = Int32Array.from({ length: groups * kmax }, (_, i) => ((i % kmax) * 37 + 5) % cap);
    ids[kmax + 3] = cap + 7; // outside the store: a zero row
    const want = new Float32Array(groups * kmax * width);
    for (let g = 0; g < groups; g++) {
      for (let i = 0; i < counts[g]; i++) {
        const id = ids[g * kmax + i];
        if (id < cap) want.set(all.subarray((g * cap + id) * width, (g * cap + id + 1) * width), (g * kmax + i) * width);
      }
    }
    const rows = { groups, cap, rowBytes: width * 4, kmax };
    for (const recorded of [false, true]) {
      const dst = be.alloc([groups * kmax, width]);
      be.write(dst, Float32Array.from({ length: groups * kmax * width }, () => NaN));
      if (recorded) be.beginStep!("gather-rows-test");
      link.gatherRows!(dst, region, rows, ids.slice(), counts.slice());
      if (recorded) be.endStep!();
      const got = be.read(dst);
      expect(new Uint32Array(got.buffer)).toEqual(new Uint32Array(want.buffer));
      be.free(dst);
    }
    link.unpin(region);
  });
});

describe.skipIf(!cuda.available)("the stage hand-off on the GPU", () => {
  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
  const bits = (a: Float32Array) => new Uint32Array(a.buffer, a.byteOffset, a.length);

  /** A CUDA backend, its link, and a pinned (mapped) 2 MiB host block with f32/i32 views over it. */
  async function rig() {
    const { createCpuBackend } = await import("../../kernels-cpu/src/index.js");
    const { toArrayBuffer } = await import("bun:ffi");
    const be = createCudaBackend({ arenaBytes: 2 ** 28 });
    const host = createCpuBackend({ threads: 1 });
    const link = be.hostTransfers() as CudaHostLink;
    const buf = host.alloc([1, 1 << 19]);
    const region = host.hostRegion(buf);
    link.pin(region);
    const bytes = toArrayBuffer(region.address as never, 0, region.byteLength);
    return {
      be, host, link, region, f32: new Float32Array(bytes), i32: new Int32Array(bytes),
      word: (s: HostSignal) => new Uint32Array(toArrayBuffer(s.address as never, 0, 4)),
      [Symbol.dispose]() {
        link.unpin(region);
        host[Symbol.dispose]();
        be[Symbol.dispose]();
      },
    };
  }

  /** The CPU stage's side, from a timer: after `ms`, `write()` its output, then raise the signal's word. */
  function raiseLater(word: Uint32Array, s: HostSignal, ms: number, write?: () => void): void {
    setTimeout(() => {
      write?.();
      Atomics.store(word, 0, s.value);
    }, ms);
  }

  it("awaitSignal holds the compute stream until a host write raises the word: eager, then a recorded step captured once and replayed with new values", async () => {
    using r = await rig();
    const { be, link, region, f32 } = r;
    const n = 4096;
    const dst = be.alloc([1, n]);
    const before = be.graphStats();
    for (let step = 0; step < 4; step++) {
      const recorded = step > 0;
      f32.fill(-1, 0, n); // what the device would read without the wait
      const s = link.stageSignal();
      expect(s.value).toBe(step + 1);
      if (recorded) be.beginStep("await-signal-test");
      link.awaitSignal(s);
      link.readMapped({ host: region, hostOffset: 0, tensor: dst, tensorOffset: 0, width: n * 4, rows: 1 });
      if (recorded) be.endStep();
      const want = Float32Array.from({ length: n }, (_, i) => i * 0.25 + step);
      raiseLater(r.word(s), s, 30, () => f32.set(want));
      await sleep(100);
      expect(be.read(dst)).toEqual(want);
    }
    const after = be.graphStats();
    expect([after.captures - before.captures, after.replays - before.replays, after.drained - before.drained]).toEqual([1, 2, 0]);
    be.free(dst);
  });

  it("a wait past the timeout gives up: times() names it, a wait queued behind it returns at once, fence() reports a later one, and the next wait works", async () => {
    using r = await rig();
    const { link } = r;
    const s = link.stageSignal();
    const word = r.word(s);
    const held = word[0];
    link.setWaitTimeout(50);
    link.awaitSignal(s); // never raised
    await sleep(10); // that wait runs with 50 ms
    link.setWaitTimeout(60_000);
    link.awaitSignal(link.stageSignal()); // behind a give-up: returns at once, not in a minute
    const t0 = performance.now();
    expect(() => link.times()).toThrow(`the device gave up waiting for the CPU stage (signal value ${s.value}; the word held ${held})`);
    expect(performance.now() - t0).toBeLessThan(5000);
    link.times(); // reported once
    link.setWaitTimeout(20);
    const s2 = link.stageSignal();
    link.awaitSignal(s2);
    await sleep(200);
    expect(() => link.fence()).toThrow(`(signal value ${s2.value}; the word held ${held})`);
    link.setWaitTimeout(10_000);
    const s3 = link.stageSignal();
    Atomics.store(word, 0, s3.value);
    link.awaitSignal(s3);
    expect(link.times().waitMs).toBeLessThan(1000);
  });

  it("times().gpuMs leaves out the time the device spent waiting; waitMs reports it", async () => {
    using r = await rig();
    const { be, link } = r;
    const x = be.alloc([64, 1024]);
    link.times();
    link.mark("resume");
    be.add(x, x, x, 64);
    const s = link.stageSignal();
    link.awaitSignal(s);
    be.add(x, x, x, 64);
    link.mark("pause");
    raiseLater(r.word(s), s, 60);
    await sleep(150);
    const t = link.times();
    expect(t.waitMs).toBeGreaterThan(40);
    expect(t.gpuMs).toBeGreaterThanOrEqual(0);
    expect(t.gpuMs).toBeLessThan(10);
    be.free(x);
  });

  it("readMapped copies pitched rows from mapped memory in 4- and 16-byte pieces, eager and recorded", async () => {
    using r = await rig();
    const { be, link, region, f32 } = r;
    const rows = 5, tw = 40;
    const src = Float32Array.from({ length: 1024 }, (_, i) => Math.sin(i * 0.7) * 10);
    f32.set(src);
    const cases = [
      { hostOffset: 4, tensorOffset: 12, width: 7 * 4, hostPitch: 37 * 4, tensorPitch: tw * 4 }, // 4-byte pieces
      { hostOffset: 64, tensorOffset: 0, width: 32 * 4, hostPitch: 48 * 4, tensorPitch: tw * 4 }, // 16-byte pieces
    ];
    for (const [i, c] of cases.entries()) {
      const want = new Float32Array(rows * tw).fill(7);
      for (let row = 0; row < rows; row++) {
        for (let j = 0; j < c.width / 4; j++) want[c.tensorOffset / 4 + row * tw + j] = src[c.hostOffset / 4 + (row * c.hostPitch) / 4 + j];
      }
      for (const recorded of [false, true]) {
        const t = be.alloc([rows, tw]);
        be.write(t, new Float32Array(rows * tw).fill(7));
        if (recorded) be.beginStep(`read-mapped-test-${i}`);
        link.readMapped({ host: region, tensor: t, rows, ...c });
        if (recorded) be.endStep();
        expect(be.read(t)).toEqual(want);
        be.free(t);
      }
    }
  });

  it("gatherRowsAt reads the [counts | ids] table from mapped memory when it runs: gatherRows's bytes, eager and recorded with a rewritten table", async () => {
    using r = await rig();
    const { createCpuBackend } = await import("../../kernels-cpu/src/index.js");
    const { be, link, region, i32 } = r;
    using host = createCpuBackend({ threads: 1 });
    const groups = 2, cap = 4096, width = 128, kmax = 100;
    const store = host.alloc([groups, cap, width]);
    host.write(store, Float32Array.from({ length: groups * cap * width }, (_, i) => Math.sin(i * 0.013) * 50));
    const storeRegion = host.hostRegion(store);
    link.pin(storeRegion);
    const rows = { groups, cap, rowBytes: width * 4, kmax };
    const table = { address: region.address, byteLength: groups * (1 + kmax) * 4 };
    for (const [step, recorded] of [false, true, true].entries()) {
      const counts = Int32Array.of(kmax - step, 61 + step);
      const ids = Int32Array.from({ length: groups * kmax }, (_, i) => ((i % kmax) * (37 + step) + 5) % cap);
      ids[kmax + 3] = cap + 7; // outside the store: a zero row
      const want = be.alloc([groups * kmax, width]), got = be.alloc([groups * kmax, width]);
      for (const t of [want, got]) be.write(t, new Float32Array(groups * kmax * width).fill(NaN));
      link.gatherRows!(want, storeRegion, rows, ids, counts);
      i32.set(counts, 0);
      i32.set(ids, groups);
      if (recorded) be.beginStep("gather-rows-at-test");
      link.gatherRowsAt(got, storeRegion, rows, table);
      if (recorded) be.endStep();
      expect(bits(be.read(got))).toEqual(bits(be.read(want)));
      be.free(want);
      be.free(got);
    }
    link.unpin(storeRegion);
  });

  it("padColumnsAt sets the columns past each group's count to −∞ (counts clamped to [0, kmax]), eager and recorded", async () => {
    using r = await rig();
    const { be, link, region, i32 } = r;
    const heads = 8, width = 50, group = 2, col = 10, kmax = 20;
    const table = { address: region.address + 8192, byteLength: (heads / group) * 4 };
    const values = Float32Array.from({ length: heads * width }, (_, i) => i * 0.5 - 30);
    for (const [step, counts] of [[3, -1, 99, 20], [0, 7, 20, 1], [19, 2, -5, 40]].entries()) {
      i32.set(counts, 8192 / 4);
      const want = values.slice();
      for (let h = 0; h < heads; h++) {
        const n = Math.min(Math.max(counts[Math.floor(h / group)], 0), kmax);
        for (let j = n; j < kmax; j++) want[h * width + col + j] = -Infinity;
      }
      const scores = be.alloc([heads, width]);
      be.write(scores, values);
      if (step > 0) be.beginStep("pad-columns-test");
      link.padColumnsAt(scores, col, kmax, group, table);
      if (step > 0) be.endStep();
      expect(be.read(scores)).toEqual(want);
      be.free(scores);
    }
  });
});
