import { describe, expect, it } from "vitest";
import { HybridgenError } from "@hybridgen/spec";
import { CudaBackendOptionsSchema, formatCudaVersion, parseCudaBackendOptions, parseDeviceRecord, selectCudaDevice, type CudaAvailability } from "../src/index.js";

const h200 = parseDeviceRecord(0, "NVIDIA H200\t9\t0\t150109880320\t132\t0000:00:06.0");
const available: CudaAvailability = { available: true, devices: [h200], runtimeVersion: 13000, driverVersion: 13000, libraryPath: "/x" };

describe("device records", () => {
  it("parses the native record and rejects garbage", () => {
    expect(h200).toEqual({
      index: 0, name: "NVIDIA H200", major: 9, minor: 0, computeCapability: "9.0",
      totalMemoryBytes: 150109880320, multiprocessors: 132, pciBusId: "0000:00:06.0",
    });
    expect(() => parseDeviceRecord(1, "cudaErrorInvalidDevice: invalid device ordinal")).toThrow(/CUDA device 1: unreadable device record/);
    expect(formatCudaVersion(12080)).toBe("12.8");
  });
});

describe("CudaBackendOptionsSchema", () => {
  it("fills defaults", () => {
    const o = parseCudaBackendOptions({});
    expect(o).toMatchObject({ device: 0, arenaFraction: 0.9, cudaGraphs: true, cublas: "auto" });
    expect("pinnedStagingBytes" in o).toBe(false); // the stage's and the cache's own buffers are pinned instead
    // The stream layout is fixed (one compute, one copy stream): no option, and an old caller's key is dropped.
    expect(Object.keys(parseCudaBackendOptions({ computeStreams: 2, copyStreams: 2 }))).not.toContain("copyStreams");
    expect(CudaBackendOptionsSchema.parse({ device: 1, arenaBytes: 2 ** 34 }).arenaBytes).toBe(2 ** 34);
  });
  it("rejects bad values, naming the option", () => {
    expect(() => parseCudaBackendOptions({ device: -1 })).toThrow(/CUDA backend options: device/);
    expect(() => parseCudaBackendOptions({ arenaFraction: 1.5 })).toThrow(/arenaFraction/);
    expect(() => parseCudaBackendOptions({ arenaBytes: 0 })).toThrow(/CUDA backend options: arenaBytes/);
    expect(() => parseCudaBackendOptions({ cublas: "on" })).toThrow(/cublas/);
  });
});

describe("selectCudaDevice", () => {
  it("returns the device, or explains why not", () => {
    expect(selectCudaDevice(parseCudaBackendOptions({}), available)).toBe(h200);
    expect(() => selectCudaDevice(parseCudaBackendOptions({ device: 2 }), available)).toThrow(/CUDA device 2 requested, but 1 present \(0: NVIDIA H200\)/);
    expect(() => selectCudaDevice(parseCudaBackendOptions({ arenaBytes: 2 ** 40 }), available)).toThrow(/arena of 1099511627776 bytes requested/);
    const none: CudaAvailability = { available: false, reason: "CUDA unavailable: no NVIDIA driver found", libraryPath: "/x" };
    expect(() => selectCudaDevice(parseCudaBackendOptions({}), none)).toThrow(HybridgenError);
    expect(() => selectCudaDevice(parseCudaBackendOptions({}), none)).toThrow("CUDA unavailable: no NVIDIA driver found");
  });
});
