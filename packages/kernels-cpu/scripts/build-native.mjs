// Builds lib/libhgcpu.so from native/*.c with gcc (or $CC).
// The kernel files are compiled once per ISA with a distinct symbol suffix; dispatch.c
// picks one table at run time, so the library never needs -march=native.
import { execFileSync } from "node:child_process";
import { mkdirSync, existsSync, rmSync, renameSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { arch } from "node:os";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const src = join(root, "native");
const lib = join(root, "lib");
// Per-process object folder and an atomic rename at the end: parallel builds (turbo, a test
// run's global setup) must not delete each other's files or load a half-written library.
const obj = join(lib, `obj-${process.pid}`);
const cc = process.env.CC || "gcc";
const common = ["-O3", "-std=gnu11", "-fPIC", "-fno-math-errno", "-Wall", "-Wextra", "-Wno-unused-function", "-pthread", "-fvisibility=hidden"];

const kernelFiles = ["kernels_matmul.c", "kernels_logits.c", "kernels_attn.c", "kernels_elem.c"];
const commonFiles = ["pool.c", "dispatch.c", "ops.c", "attn_partial.c", "memory.c", "random_fill.c", "cpu_stage.c", "sel_prims.c", "sel_topk.c", "sel_quest.c", "sel_index.c", "kv_tier.c", "file_rows.c", "kq.c", "calib.c"];

function run(args) {
  try {
    execFileSync(cc, args, { stdio: ["ignore", "inherit", "inherit"] });
  } catch (e) {
    console.error(`build-native: ${cc} ${args.join(" ")} failed`);
    rmSync(obj, { recursive: true, force: true });
    process.exit(1);
  }
}

function accepts(flags) {
  try {
    execFileSync(cc, [...flags, "-x", "c", "-c", "-o", "/dev/null", "-"], { input: "int x;\n", stdio: ["pipe", "ignore", "ignore"] });
    return true;
  } catch {
    return false;
  }
}

if (!accepts([])) {
  console.error(`build-native: C compiler '${cc}' not found or not working (set CC)`);
  process.exit(1);
}

const isas = [{ name: "generic", flags: [] }];
if (arch() === "x64") {
  isas.push({ name: "avx2", flags: ["-mavx2", "-mfma", "-mf16c"] });
  const avx512 = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c"];
  isas.push({ name: "avx512", flags: avx512 });
}

rmSync(obj, { recursive: true, force: true });
mkdirSync(obj, { recursive: true });
const objects = [];
for (const isa of isas) {
  for (const f of kernelFiles) {
    const o = join(obj, `${f.replace(/\.c$/, "")}_${isa.name}.o`);
    run([...common, ...isa.flags, `-DHG_ISA_${isa.name.toUpperCase()}`, `-DHG_SUFFIX=_${isa.name}`, "-c", join(src, f), "-o", o]);
    objects.push(o);
  }
}
for (const f of commonFiles) {
  const o = join(obj, f.replace(/\.c$/, ".o"));
  run([...common, "-c", join(src, f), "-o", o]);
  objects.push(o);
}
const out = join(lib, "libhgcpu.so");
const tmp = join(obj, "libhgcpu.so");
run(["-shared", "-pthread", "-o", tmp, ...objects, "-lm"]);
if (!existsSync(tmp)) process.exit(1);
renameSync(tmp, out);
rmSync(obj, { recursive: true, force: true });
console.log(`build-native: ${out} (${isas.map((i) => i.name).join(", ")})`);
