/**
 * CudaBackend.hostTransfers: range checks against a stand-in native library (no GPU needed),
 * and on a GPU (skipped without CUDA) pinned round trips through the copy stream against the
 * host data, with event times.
 */
import { describe, expect, it } from "vitest";
import { HybridgenError, type HostRegion } from "@hybridgen/core";
import { CudaBackend, createCudaBackend, cudaAvailability, type CudaNative } from "../src/index.js";
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
