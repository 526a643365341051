import { defineConfig } from "tsup";
import { packageBuild } from "../../tsup.package";

// The /lab entry: bench-only internals for apps/bench, kept out of the main entry.
export default defineConfig({ ...packageBuild, entry: ["src/index.ts", "src/lab.ts"] });
