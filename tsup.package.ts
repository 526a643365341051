/**
 * The build every package shares; each package's tsup.config.ts starts from it: ESM with
 * .d.ts, `bun:*` modules and the other @hybridgen packages left as imports.
 */
import type { Options } from "tsup";

export const packageBuild: Options = {
  entry: ["src/index.ts"],
  format: ["esm"],
  dts: true,
  clean: true,
  target: "es2022",
  platform: "node",
  external: [/^bun:/, /^@hybridgen\//],
};
