import { defineConfig } from "tsup";
import { packageBuild } from "../../tsup.package";

// The /lab entry: the benches' switches and probes of a CudaBackend, kept out of the main entry.
export default defineConfig({ ...packageBuild, entry: ["src/index.ts", "src/lab.ts"] });
