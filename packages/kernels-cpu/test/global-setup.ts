// Builds lib/libhgcpu.so before the tests when it is missing or older than native/*.
import { execFileSync } from "node:child_process";
import { existsSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";

export default function setup(): void {
  const root = join(import.meta.dirname, "..");
  const lib = join(root, "lib", "libhgcpu.so");
  const native = join(root, "native");
  const newest = Math.max(...readdirSync(native).map((f) => statSync(join(native, f)).mtimeMs));
  if (process.env.HYBRIDGEN_KERNELS_CPU_LIB) return;
  if (!existsSync(lib) || statSync(lib).mtimeMs < newest) {
    execFileSync("node", [join(root, "scripts", "build-native.mjs")], { stdio: "inherit" });
  }
}
