import { defineConfig } from "tsup";
import { packageBuild } from "../../tsup.package";

// The package and its test helpers (`@hybridgen/core/testing`).
export default defineConfig({ ...packageBuild, entry: ["src/index.ts", "src/testing/index.ts"] });
