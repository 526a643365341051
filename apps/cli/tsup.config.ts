import { defineConfig } from "tsup";
import { packageBuild } from "../../tsup.package";

export default defineConfig({
  ...packageBuild,
  // hybridgen.ts is the bin: tsup keeps its #! line and marks the output executable. sse-reader: the server's clients' reader alone (@hybridgen/cli/sse).
  entry: { index: "src/index.ts", hybridgen: "src/hybridgen.ts", "sse-reader": "src/serve/sse-reader.ts" },
  dts: { entry: { index: "src/index.ts", "sse-reader": "src/serve/sse-reader.ts" } },
});
