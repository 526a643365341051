/**
 * CudaBackend.hostTransfers: argument and range checks against a stand-in native library (no GPU
 * needed). On a GPU the link is checked by apps/bench's device checks (see the end of this file).
 */
import { describe, expect, it } from "vitest";
import { HybridgenError, type HostRegion, type HostSignal } from "@hybridgen/spec";
import { CudaBackend, type CudaHostLink, type CudaNative } from "../src/index.js";
import { expectOneLineErrors } from "./one-line-errors.js";
import { STAND_IN_DEVICE, standInNative, type NativeCall } from "./stand-in-native.js";


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

  it("many pinned regions (a batch's stores), pinned and unpinned out of order: each range maps to the region holding it, its device address with it", () => {
    const calls: NativeCall[] = [];
    using be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib: mappedLib(calls), device });
    const link = be.hostTransfers();
    // 200 regions of 4 KiB with 4 KiB gaps from 0x400000, pinned in a shuffled order.
    const regions = Array.from({ length: 200 }, (_, i) => ({ address: 0x400000 + i * 8192, byteLength: 4096 }));
    const order = regions.map((_, i) => (i * 73) % 200);
    for (const i of order) link.pin(regions[i]!);
    const dst = be.alloc([8, 8]);
    const rows = { groups: 1, cap: 16, rowBytes: 32, kmax: 8 };
    const ids = Int32Array.from({ length: 8 }, (_, i) => i), counts = Int32Array.of(8);
    const source = () => calls.filter((x) => x.name === "hg_cu_gather_rows").at(-1)!.args[2];
    for (const i of [0, 1, 99, 137, 199]) {
      const r = regions[i]!;
      expect(link.mapped!(r), `region ${i}`).toBe(true);
      expect(link.mapped!({ address: r.address + 4000, byteLength: 96 }), `region ${i}'s last bytes`).toBe(true);
      expect(link.mapped!({ address: r.address + 4000, byteLength: 97 }), `past region ${i}'s end`).toBe(false);
      expect(link.mapped!({ address: r.address + 4096, byteLength: 16 }), `the gap after region ${i}`).toBe(false);
      link.gatherRows!(dst, { address: r.address + 512, byteLength: 512 }, rows, ids, counts);
      expect(source(), `region ${i}'s device address`).toBe(r.address + 512 + 2 ** 44);
    }
    expect(link.mapped!({ address: 0x3ff000, byteLength: 16 })).toBe(false); // below the first
    for (const i of order.slice(0, 100)) link.unpin(regions[i]!);
    for (const i of order.slice(0, 100)) expect(link.mapped!(regions[i]!), `unpinned region ${i}`).toBe(false);
    for (const i of order.slice(100)) expect(link.mapped!(regions[i]!), `still pinned region ${i}`).toBe(true);
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

  it("sendSignalledRows checks every send as sendSignalled does and passes one table of device addresses", () => {
    const calls: NativeCall[] = [];
    using be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib: mappedLib(calls), device });
    const link = be.hostTransfers();
    const query = { address: 0x400000, byteLength: 1 << 21 }, unmapped = { address: 0x1000, byteLength: 4096 };
    link.pin(query);
    const q = [be.alloc([1, 64]), be.alloc([1, 64])];
    const send = (i: number) => ({ dst: { address: query.address + 4096 * i, byteLength: 4096 }, src: q[i]!, bytes: 256 });
    expectOneLineErrors([
      [() => link.sendSignalledRows!([]), /^sendSignalledRows: 1 to 4096 sends are needed$/],
      [() => link.sendSignalledRows!([send(0), { ...send(1), bytes: 100 }]), /^sendSignalledRows: send 1: bytes must be a positive multiple of 16, got 100$/],
      [() => link.sendSignalledRows!([{ ...send(0), bytes: 512 }]), /^sendSignalledRows: send 0: 512 bytes exceed f32\[1x64\]'s 256$/],
      [() => link.sendSignalledRows!([{ ...send(0), dst: unmapped }]), /^sendSignalledRows: send 0: host region at 0x1000 is not pinned memory the device maps$/],
    ]);
    expect(calls.filter((x) => x.name === "hg_link_send_rows")).toHaveLength(0);
    link.sendSignalledRows!([send(0), send(1)]);
    const c = calls.filter((x) => x.name === "hg_link_send_rows").at(-1)!;
    expect([...(c.args[1] as Float64Array)]).toEqual([be.address(q[0]!), 0x400000 + 2 ** 44, 256, be.address(q[1]!), 0x400000 + 4096 + 2 ** 44, 256]);
    expect(c.args[2]).toBe(2);
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
        (args[1] as Float64Array).set([2.5, 1.25, 7, 40, 61.5, 3.75]);
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
    expect(link.times()).toEqual({ gpuMs: 2.5, txMs: 1.25, waitMs: 40, segmentMs: 61.5, hostWaitMs: 3.75 }); // cleared: the next call returns
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
    // fetchRows: each row checked as fetch() checks it (its row named), then one call with every row's word and value and every gather.
    const done2 = { address: tables.address + 128, value: 9 };
    expectOneLineErrors([
      [() => f.fetchRows!(0, []), /^rowFetch.fetchRows: 1 to 4096 rows are needed$/],
      [() => f.fetchRows!(0, [{ done, gathers: good }, { done: done2, gathers: [] }]), /^rowFetch.fetchRows: row 1: 1 to 8 gathers are needed$/],
    ]);
    expect(named(calls, "hg_fetch_rows_batch")).toHaveLength(0);
    f.fetchRows!(0, [{ done, gathers: good }, { done: done2, gathers: [good[1]!] }]);
    const b = named(calls, "hg_fetch_rows_batch").at(-1)!;
    expect(b.args[1]).toBe(0);
    expect([...(b.args[2] as Float64Array)]).toEqual([done.address + 2 ** 44, 5, done2.address + 2 ** 44, 9]);
    expect(b.args[3]).toBe(2);
    expect([...(b.args[4] as Float64Array)]).toEqual([
      be.address(k), 0x400000 + 2 ** 44, table.address + 2 ** 44, 2, 8, 64, 32,
      be.address(v), 0x400000 + 2 ** 44, table.address + 2 ** 44, 2, 8, 64, 32,
      be.address(v), 0x400000 + 2 ** 44, table.address + 2 ** 44, 2, 8, 64, 32,
    ]);
    expect(b.args[5]).toBe(3);
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

  it("handOffRows checks each row's signal as awaitSignal, its logits as readMapped and its gathers as gatherRowsAt, and passes one table of device addresses", () => {
    const calls: NativeCall[] = [];
    using be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib: lib(calls), device });
    const link = be.hostTransfers();
    const store = { address: 0x400000, byteLength: 2 * 64 * 32 }, tables = { address: 0x600000, byteLength: 4096 };
    for (const r of [store, tables]) link.pin(r);
    const k = be.alloc([2 * 8, 8]), v = be.alloc([2 * 8, 8]), scores = be.alloc([4, 8]);
    const rows = { groups: 2, cap: 64, rowBytes: 32, kmax: 8 };
    const table = { address: tables.address + 256, byteLength: 2 * 9 * 4 };
    const logits = { host: { address: tables.address + 1024, byteLength: 4 * 8 * 4 }, hostOffset: 0, tensor: scores, tensorOffset: 0, width: 8 * 4, rows: 4, hostPitch: 8 * 4, tensorPitch: 8 * 4 };
    const verified = { done: { address: tables.address + 64, value: 5 }, logits: null, gathers: [{ dst: k, src: store, rows, table }, { dst: v, src: store, rows, table }] };
    const plain = { done: { address: tables.address + 128, value: 9 }, logits, gathers: [{ dst: v, src: store, rows, table }] };
    expectOneLineErrors([
      [() => link.handOffRows!([]), /handOffRows: 1 to 4096 rows are needed/],
      [() => link.handOffRows!([{ ...plain, gathers: undefined as never }]), /handOffRows: row 0 needs done, logits and 0 to 8 gathers/],
      [() => link.handOffRows!([verified, { ...plain, done: { address: 0x1000, value: 1 } }]), /handOffRows: row 1: the word at 0x1000 is neither the link's stage word nor in pinned memory the device maps/],
      [() => link.handOffRows!([{ ...plain, logits: { ...logits, width: 6 } }]), /handOffRows: row 0: width, pitches and both start addresses must be multiples of 4 bytes/],
      [() => link.handOffRows!([{ ...plain, logits: { ...logits, host: { address: 0x1000, byteLength: 128 } } }]), /host region at 0x1000 is not pinned memory the device maps/],
      [() => link.handOffRows!([{ ...verified, gathers: [{ ...verified.gathers[0]!, table: { ...table, byteLength: 68 } }] }]), /handOffRows: row 0: a table of 2 × \(1 \+ 8\) ints needs 72 bytes, the region has 68/],
      [() => link.handOffRows!([{ ...verified, gathers: [{ ...verified.gathers[0]!, rows: { ...rows, kmax: 16 }, table: { ...table, byteLength: 2 * 17 * 4 } }] }]), /handOffRows: row 0: 2 × 16 rows of 32 bytes exceed f32\[16x8\]'s 512/],
    ]);
    expect(named(calls, "hg_link_hand_off_rows")).toHaveLength(0);
    link.handOffRows!([verified, plain]);
    const c = named(calls, "hg_link_hand_off_rows").at(-1)!;
    expect([...(c.args[1] as Float64Array)]).toEqual([
      tables.address + 64 + 2 ** 44, 5, 0, 0, 0, 0, 0, 0,
      tables.address + 128 + 2 ** 44, 9, be.address(scores), tables.address + 1024 + 2 ** 44, 32, 4, 32, 32,
    ]);
    expect(c.args[2]).toBe(2);
    expect([...(c.args[3] as Float64Array)]).toEqual([
      be.address(k), 0x400000 + 2 ** 44, table.address + 2 ** 44, 2, 8, 64, 32,
      be.address(v), 0x400000 + 2 ** 44, table.address + 2 ** 44, 2, 8, 64, 32,
      be.address(v), 0x400000 + 2 ** 44, table.address + 2 ** 44, 2, 8, 64, 32,
    ]);
    expect(c.args[4]).toBe(3);
  });

  it("rescoreRows checks each row's scores, q, keys, columns and table, refuses rows of another shape, and passes one table with the K dtype", () => {
    const calls: NativeCall[] = [];
    using be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib: lib(calls), device });
    const link = be.hostTransfers();
    const tables = { address: 0x600000, byteLength: 4096 };
    link.pin(tables);
    const scores = [be.alloc([4, 40]), be.alloc([4, 40])], q = be.alloc([1, 4 * 16]), keys = [be.alloc([2, 8, 16], "bf16"), be.alloc([2, 6, 16], "bf16")];
    const row = (i: number) => ({ scores: scores[i]!, col: 2 * i, q, keys: keys[i]!, kmax: i === 0 ? 8 : 6, scale: 0.25, table: { address: tables.address + 64 * i, byteLength: 64 } });
    expectOneLineErrors([
      [() => link.rescoreRows!([]), /^rescoreRows: 1 to 4096 rows are needed$/],
      [() => link.rescoreRows!([row(0), { ...row(1), kmax: 7 }]), /^rescoreRows: row 1: 7 rows a KV head exceed the keys' 6$/],
      [() => link.rescoreRows!([{ ...row(0), col: 33 }]), /^rescoreRows: row 0: columns \[33, 41\) exceed the scores' width 40$/],
      [() => link.rescoreRows!([{ ...row(0), scale: Number.NaN }]), /^rescoreRows: row 0: scale NaN is not finite$/],
      [() => link.rescoreRows!([row(0), { ...row(1), keys: be.alloc([2, 6, 16], "f16") }]), /^rescoreRows: row 1: 4 heads, 2 KV heads, head dim 16, K f16: not row 0's 4, 2, 16, bf16$/],
      [() => link.rescoreRows!([{ ...row(0), table: { address: 0x1000, byteLength: 64 } }]), /the table at 0x1000 is not pinned memory the device maps/],
    ]);
    expect(named(calls, "hg_link_rescore_rows")).toHaveLength(0);
    link.rescoreRows!([row(0), row(1)]);
    const c = named(calls, "hg_link_rescore_rows").at(-1)!;
    expect([...(c.args[1] as Float64Array)]).toEqual([
      be.address(scores[0]!), 40, be.address(q), be.address(keys[0]!), 8, 8, tables.address + 2 ** 44, 0.25,
      be.address(scores[1]!) + 8, 40, be.address(q), be.address(keys[1]!), 6, 6, tables.address + 64 + 2 ** 44, 0.25,
    ]);
    expect(c.args.slice(2)).toEqual([2, 2, 4, 2, 16]);
  });

  it("keepRows checks each row's scores, columns and groups as padColumnsAt and its V rows as gatherRowsAt, and passes one table of device addresses", () => {
    const calls: NativeCall[] = [];
    using be = new CudaBackend({ arenaBytes: 1 << 21 }, { lib: lib(calls), device });
    const link = be.hostTransfers();
    const store = { address: 0x400000, byteLength: 2 * 64 * 32 }, tables = { address: 0x600000, byteLength: 4096 };
    for (const r of [store, tables]) link.pin(r);
    const v = be.alloc([2 * 8, 8]), scores = be.alloc([4, 20]);
    const rows = { groups: 2, cap: 64, rowBytes: 32, kmax: 8 };
    const row = { scores, col: 3, group: 2, keep: 2, values: v, src: store, rows, table: { address: tables.address + 256, byteLength: 2 * 9 * 4 } };
    expectOneLineErrors([
      [() => link.keepRows!([]), /^keepRows: 1 to 4096 rows are needed$/],
      [() => link.keepRows!([{ ...row, keep: 0 }]), /^keepRows: row 0: col must be a non-negative integer, keep and group positive ones, got 3, 0 and 2$/],
      [() => link.keepRows!([row, { ...row, group: 4 }]), /^keepRows: row 1: 2 KV heads of 4 query heads are not the scores' 4$/],
      [() => link.keepRows!([{ ...row, col: 13 }]), /^keepRows: row 0: columns \[13, 21\) exceed the scores' width 20$/],
      [() => link.keepRows!([{ ...row, scores: be.alloc([4, 20], "bf16") }]), /^keepRows: row 0: scores must be an f32 \[heads, width\] tensor/],
      [() => link.keepRows!([{ ...row, table: { ...row.table, byteLength: 68 } }]), /^keepRows: row 0: a table of 2 × \(1 \+ 8\) ints needs 72 bytes, the region has 68$/],
      [() => link.keepRows!([{ ...row, rows: { ...rows, kmax: 16 }, table: { ...row.table, byteLength: 2 * 17 * 4 } }]), /^keepRows: row 0: 2 × 16 rows of 32 bytes exceed f32\[16x8\]'s 512$/],
      [() => link.keepRows!([{ ...row, src: { address: 0x1000, byteLength: 4096 } }]), /host region at 0x1000 is not pinned memory the device maps/],
    ]);
    expect(named(calls, "hg_link_keep_rows")).toHaveLength(0);
    link.keepRows!([row, { ...row, col: 0, keep: 8 }]);
    const c = named(calls, "hg_link_keep_rows").at(-1)!;
    expect([...(c.args[1] as Float64Array)]).toEqual([
      be.address(scores) + 12, 20, 2, be.address(v), 0x400000 + 2 ** 44, tables.address + 256 + 2 ** 44, 2, 8, 64, 32, 2,
      be.address(scores), 20, 8, be.address(v), 0x400000 + 2 ** 44, tables.address + 256 + 2 ** 44, 2, 8, 64, 32, 2,
    ]);
    expect(c.args[2]).toBe(2);
  });
});

// The link on a GPU (sendSignalled, round trips, gathers, the stage hand-off, rows fetched ahead) is
// checked on the device by apps/bench: cuda/stage-handoff-checks.ts and cuda/mapped-rows-checks.ts
// (`hybrid-bench --skip-bench`), which may use the CPU backend for pinned host memory.
