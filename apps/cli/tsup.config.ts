import { defineConfig } from "tsup";
import { packageBuild } from "../../tsup.package";

export default defineConfig({
  ...packageBuild,
  // hybridgen.ts is the bin: tsup keeps its #! line and marks the output executable.
  entry: ["src/index.ts", "src/hybridgen.ts"],
  dts: { entry: "src/index.ts" },
});
