// `install`: an installed package keeps the prebuilt library when one fits this platform, else
// builds lib/libhgcpu.so from native/ with $CC (gcc); without a compiler it fails in one line.
import { execFileSync, spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const platform = `${process.platform}-${process.arch}`;
const fail = (message) => {
  console.error(`error: @hybridgen/kernels-cpu: ${message}`);
  process.exit(1);
};

// A source checkout (the monorepo) builds the library with `bun run build` instead.
if (existsSync(join(root, "src"))) process.exit(0);
if (process.env.HYBRIDGEN_KERNELS_CPU_LIB) process.exit(0);
if (existsSync(join(root, "prebuilds", platform, "libhgcpu.so"))) process.exit(0);
if (existsSync(join(root, "lib", "libhgcpu.so"))) process.exit(0);

const cc = process.env.CC || "gcc";
try {
  execFileSync(cc, ["-x", "c", "-c", "-o", "/dev/null", "-"], { input: "int x;\n", stdio: ["pipe", "ignore", "ignore"] });
} catch {
  fail(`no prebuilt native library for ${platform} and no working C compiler ('${cc}') to build one: install gcc (or set CC) and reinstall, or set HYBRIDGEN_KERNELS_CPU_LIB`);
}
console.error(`@hybridgen/kernels-cpu: no prebuilt native library for ${platform}: building it from source with ${cc} (a minute or two)`);
const build = spawnSync(process.execPath, [join(root, "scripts", "build-native.mjs")], { stdio: "inherit" });
if (build.status !== 0) fail(`building the native library for ${platform} with ${cc} failed (see the compiler's messages above)`);
