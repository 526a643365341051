/**
 * Each way into libhgcpu.so (the backend, the CPU stage, the random fill) reports a missing
 * library with the same one-line message naming the path and how to build it, in a fresh
 * process (a loaded library is cached per process) with HYBRIDGEN_KERNELS_CPU_LIB pointing nowhere.
 */
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const entry = fileURLToPath(new URL("../src/index.ts", import.meta.url));
const missing = "/nonexistent/hybridgen/libhgcpu.so";

function firstError(body: string): string {
  const script = `const m = await import(${JSON.stringify(entry)}); try { ${body}; console.log("no error"); } catch (e) { console.log(e.code + " " + e.message); }`;
  const r = spawnSync(process.execPath, ["-e", script], { env: { ...process.env, HYBRIDGEN_KERNELS_CPU_LIB: missing }, encoding: "utf8" });
  return r.stdout.trim().split("\n").at(-1) ?? r.stderr;
}

describe("kernels-cpu without its native library", () => {
  it("the backend, the CPU stage and the random fill give the same one-line error", () => {
    const want = `ENATIVE kernels-cpu: native library not found at ${missing} and none prebuilt for ${process.platform}-${process.arch}; build it with 'node scripts/build-native.mjs' in the package (needs gcc), or set HYBRIDGEN_KERNELS_CPU_LIB`;
    expect(firstError("m.createCpuBackend({ threads: 1 })")).toBe(want);
    expect(firstError("new m.NativeCpuStage({ threads: 1 })")).toBe(want);
    expect(firstError(`m.createNativeRandomFill(1)(new Uint8Array(8), "f32", { key: 1, scale: 1, offset: 0 })`)).toBe(want);
  });
});
