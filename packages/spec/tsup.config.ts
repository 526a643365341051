import { defineConfig } from "tsup";
import { packageBuild } from "../../tsup.package";

// The contracts and the backend kit (`@hybridgen/spec/kit`).
export default defineConfig({ ...packageBuild, entry: ["src/index.ts", "src/kit/index.ts"] });
