// Builds lib/libhgcuda.so from native/*.cu with nvcc: sm_90a machine code plus compute_90 PTX
// (other GPUs JIT it), cudart linked statically (the default) so the library loads where no
// CUDA runtime is installed. No nvcc, or no GPU (`nvidia-smi -L`) unless HYBRIDGEN_BUILD_CUDA=1
// or --force: says so and exits 0 (the JS side then reports "CUDA unavailable: library not
// built"); HYBRIDGEN_BUILD_CUDA=0 always skips. A compile error exits non-zero.
// --trace builds lib/libhgcuda-trace.so instead, with the stream GEMV's per-block event records
// compiled in (-DHG_TRACE, native/trace.cuh; for apps/bench/src/cuda/trace-bench.ts, never the default).
import { execFileSync, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, renameSync, rmSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const nativeDir = join(root, "native");
const libDir = join(root, "lib");
const trace = process.argv.includes("--trace");
const out = join(libDir, trace ? "libhgcuda-trace.so" : "libhgcuda.so");

function findNvcc() {
  const candidates = [];
  if (process.env.CUDA_HOME) candidates.push(join(process.env.CUDA_HOME, "bin", "nvcc"));
  try {
    const onPath = execFileSync("sh", ["-c", "command -v nvcc"], { encoding: "utf8" }).trim();
    if (onPath) candidates.push(onPath);
  } catch {
    /* not on PATH */
  }
  candidates.push("/usr/local/cuda/bin/nvcc");
  return candidates.find((p) => existsSync(p));
}

const nvcc = findNvcc();
if (!nvcc) {
  console.log("nvcc not found: skipping the CUDA build");
  process.exit(0);
}

/** `nvidia-smi -L` lists at least one GPU. */
function gpuPresent() {
  const r = spawnSync("nvidia-smi", ["-L"], { encoding: "utf8", timeout: 20_000 });
  return r.status === 0 && /^GPU \d+/m.test(r.stdout ?? "");
}

// Without a GPU the library cannot run here, and compiling it takes minutes: only when asked.
const wanted = process.env.HYBRIDGEN_BUILD_CUDA ?? "";
if (wanted === "0" || (wanted !== "1" && !process.argv.includes("--force") && !gpuPresent())) {
  console.log(
    wanted === "0"
      ? "kernels-cuda: HYBRIDGEN_BUILD_CUDA=0: skipping the CUDA build"
      : "kernels-cuda: no GPU found (nvidia-smi -L): skipping the CUDA build (HYBRIDGEN_BUILD_CUDA=1 builds it anyway)",
  );
  process.exit(0);
}

const sources = readdirSync(nativeDir)
  .filter((f) => f.endsWith(".cu"))
  .sort()
  .map((f) => join(nativeDir, f));
const headers = readdirSync(nativeDir).filter((f) => /\.(h|cuh)$/.test(f)).map((f) => join(nativeDir, f));
const newestInput = Math.max(...[...sources, ...headers, fileURLToPath(import.meta.url)].map((p) => statSync(p).mtimeMs));
if (existsSync(out) && statSync(out).mtimeMs >= newestInput && !process.argv.includes("--force")) {
  console.log(`kernels-cuda: ${out} is up to date`);
  process.exit(0);
}

mkdirSync(libDir, { recursive: true });
const tmp = `${out}.tmp-${process.pid}`;
const args = [
  "-O3",
  "-std=c++17",
  "--threads", "2", // the two targets of each file compiled side by side
  "-gencode", "arch=compute_90a,code=sm_90a", // sm_90a: wgmma (flash_v3.cu); same code as sm_90 otherwise
  "-gencode", "arch=compute_90,code=compute_90",
  "-Xcompiler", "-fPIC,-O2,-fvisibility=hidden",
  ...(trace ? ["-DHG_TRACE"] : []),
  "-shared",
  "-cudart", "static",
  "-o", tmp,
  ...sources,
];
console.log(`kernels-cuda: ${nvcc} ${args.join(" ")}`);
const r = spawnSync(nvcc, args, { stdio: "inherit" });
if (r.status !== 0) {
  rmSync(tmp, { force: true });
  console.error(`kernels-cuda: nvcc failed (exit ${r.status ?? r.signal})`);
  process.exit(1);
}
// A function of ours declared with C linkage but defined with C++ linkage (or not at all)
// links fine into a shared library and fails only when called: refuse such a library here.
const nm = spawnSync("nm", ["-D", "--undefined-only", tmp], { encoding: "utf8" });
const unresolved = nm.status === 0 ? nm.stdout.split("\n").map((l) => l.trim().split(/\s+/).pop() ?? "").filter((s) => /^hg_/.test(s)) : [];
if (unresolved.length > 0) {
  rmSync(tmp, { force: true });
  console.error(`kernels-cuda: the library leaves its own functions unresolved: ${unresolved.join(", ")} (a declaration inside extern "C" for a C++ definition?)`);
  process.exit(1);
}
renameSync(tmp, out); // atomic: a concurrent loader never sees a half-written library
console.log(`kernels-cuda: built ${out}`);
