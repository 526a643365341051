import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { CudaLibrary, EXPECTED_ABI_VERSION, cudaAvailability, cudaLibraryPath, describeCudaAvailability } from "../src/index.js";
import { notBuiltReason } from "../src/not-built.js";

const libPath = cudaLibraryPath();
const built = existsSync(libPath);
// A machine with an NVIDIA driver exposes these device nodes; without them no GPU can be used.
const gpuPresent = existsSync("/dev/nvidiactl") || existsSync("/dev/nvidia0");
const tmp = mkdtempSync(join(tmpdir(), "hg-cuda-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

describe("cudaAvailability", () => {
  it("reports this machine correctly, without throwing", () => {
    const a = cudaAvailability({ refresh: true });
    if (!built) {
      expect(a).toMatchObject({ available: false });
      if (!a.available) expect(a.reason).toMatch(/^CUDA unavailable: the CUDA library is not built \(.*libhgcuda\.so is missing/);
    } else if (!gpuPresent) {
      expect(a.available).toBe(false);
      if (!a.available) expect(a.reason).toMatch(/^CUDA unavailable: (no NVIDIA driver found|no CUDA device|the NVIDIA driver supports)/);
    } else {
      expect(a.available).toBe(true);
      if (a.available) {
        expect(a.devices.length).toBeGreaterThan(0);
        for (const d of a.devices) {
          expect(d.name.length).toBeGreaterThan(0);
          expect(d.major).toBeGreaterThanOrEqual(3);
          expect(d.totalMemoryBytes).toBeGreaterThan(2 ** 30);
          expect(d.multiprocessors).toBeGreaterThan(0);
        }
        expect(a.runtimeVersion).toBeGreaterThanOrEqual(13000);
      }
    }
    expect(describeCudaAvailability(a).length).toBeGreaterThan(10);
    expect(cudaAvailability()).toBe(cudaAvailability()); // cached per process
  });

  it("a missing library is a reason, not an exception", () => {
    const a = cudaAvailability({ libraryPath: join(tmp, "nope.so") });
    expect(a.available).toBe(false);
    if (!a.available) expect(a.reason).toBe(`CUDA unavailable: ${notBuiltReason(join(tmp, "nope.so"))}`);
  });

  it("a file that is not a library is a reason, not a crash", () => {
    const bogus = join(tmp, "bogus.so");
    writeFileSync(bogus, "this is not an ELF file\n");
    const a = cudaAvailability({ libraryPath: bogus });
    expect(a.available).toBe(false);
    if (!a.available) expect(a.reason).toMatch(new RegExp(`^CUDA unavailable: cannot load ${bogus.replace(/[.]/g, "\\.")}: `));
  });
});

describe.skipIf(!built)("the native probe", () => {
  it("agrees with the availability answer and never overruns a small buffer", () => {
    using lib = new CudaLibrary(libPath);
    expect(lib.abiVersion()).toBe(EXPECTED_ABI_VERSION);
    expect(lib.runtimeVersion()).toBeGreaterThanOrEqual(13000);
    const full = lib.probe();
    if (gpuPresent) expect(full.rc).toBeGreaterThan(0);
    else expect(full.rc).toBeLessThan(0);
    expect(full.text.length).toBeGreaterThan(5);
    for (const size of [1, 2, 8, 17]) {
      const short = lib.probe(size);
      expect(short.rc).toBe(full.rc);
      expect(short.text).toBe(full.text.slice(0, size - 1)); // truncated, NUL-terminated
    }
    const bad = lib.deviceInfo(4096);
    expect(bad.rc).toBeLessThan(0);
    expect(bad.text).toMatch(/^cuda\w+: /);
  });
});

describe("why the library is missing", () => {
  it("names the step this machine lacks: nvcc, a GPU (set-up builds only where one is found), or the build itself", () => {
    const p = "/x/libhgcuda.so";
    expect(notBuiltReason(p, { nvcc: false, gpu: false })).toBe("the CUDA library is not built (/x/libhgcuda.so is missing: building it needs nvcc (the CUDA toolkit))");
    expect(notBuiltReason(p, { nvcc: true, gpu: false })).toBe("the CUDA library is not built (/x/libhgcuda.so is missing: set-up builds it only where a GPU is found, and this machine has none (HYBRIDGEN_BUILD_CUDA=1 builds it anyway))");
    expect(notBuiltReason(p, { nvcc: true, gpu: true })).toBe("the CUDA library is not built (/x/libhgcuda.so is missing: run npm run setup, or bun run build in packages/kernels-cuda)");
    expect(notBuiltReason(p, { nvcc: false, gpu: true })).toMatch(/needs nvcc/);
  });
});
