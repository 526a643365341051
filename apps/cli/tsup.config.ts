import { defineConfig } from "tsup";

export default defineConfig({
  // hybridgen.ts is the bin: tsup keeps its #! line and marks the output executable.
  entry: ["src/index.ts", "src/hybridgen.ts"],
  format: ["esm"],
  dts: { entry: "src/index.ts" },
  clean: true,
  target: "es2022",
  platform: "node",
  external: [/^bun:/, /^@hybridgen\//],
});
