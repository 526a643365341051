// `prepack`: ships the library built here as the prebuilt one for this platform
// (prebuilds/<platform>-<arch>/libhgcpu.so), which an install elsewhere uses when it fits.
import { copyFileSync, existsSync, mkdirSync, renameSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const built = join(root, "lib", "libhgcpu.so");
if (!existsSync(built)) {
  console.error(`prebuild: ${built} is missing: run 'bun run build' in packages/kernels-cpu before packing`);
  process.exit(1);
}
const dir = join(root, "prebuilds", `${process.platform}-${process.arch}`);
mkdirSync(dir, { recursive: true });
// Copy then rename: two packs at once (npm pack beside bun publish) never ship a half-written file.
const tmp = join(root, "lib", `.prebuilt-${process.pid}.so`); // outside prebuilds/, which is shipped
copyFileSync(built, tmp);
renameSync(tmp, join(dir, "libhgcpu.so"));
console.error(`prebuild: ${join(dir, "libhgcpu.so")}`);
