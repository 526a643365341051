/**
 * The package graph holds in this repository (no package imports an app, no backend imports the
 * other, the spec imports no workspace, the plugins ship and import the spec alone, no relative
 * import into another workspace — tests, benches and the root's scripts included —, every workspace
 * import declared), and the checker finds each kind of break in a small workspace written for the test.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { checkPackageGraph, readWorkspaces } from "../src/package-graph.js";

const ROOT = fileURLToPath(new URL("../../..", import.meta.url));

describe("package graph", () => {
  it("holds in this repository", () => {
    const names = readWorkspaces(ROOT).map((w) => `${w.kind} ${w.name}`);
    expect(names).toEqual(expect.arrayContaining(["package @hybridgen/spec", "package @hybridgen/core", "package @hybridgen/kernels-cpu", "package @hybridgen/kernels-cuda", "app @hybridgen/cli", "app @hybridgen/bench"]));
    expect(checkPackageGraph(ROOT)).toEqual([]);
  });

  describe("finds each break in a written workspace", () => {
    const root = mkdtempSync(join(tmpdir(), "hg-graph-"));
    afterAll(() => rmSync(root, { recursive: true, force: true }));
    const write = (path: string, text: string) => {
      mkdirSync(dirname(join(root, path)), { recursive: true });
      writeFileSync(join(root, path), text);
    };
    const pkg = (dir: string, name: string, dependencies: Record<string, string> = {}, devDependencies: Record<string, string> = {}) =>
      write(`${dir}/package.json`, JSON.stringify({ name, dependencies, devDependencies }));
    // The written files' imports, built here so that this file's own text holds none (the checker scans test folders too).
    const from = (what: string, spec: string) => `${what} from "${spec}";`;
    const dynamic = (what: string, spec: string) => `const ${what} = await import("${spec}");`;
    write("package.json", JSON.stringify({ workspaces: ["packages/*", "apps/*"] }));
    pkg("packages/spec", "@hybridgen/spec");
    pkg("packages/core", "@hybridgen/core", { "@hybridgen/spec": "0.1.0" });
    pkg("packages/kernels-cpu", "@hybridgen/kernels-cpu", { "@hybridgen/spec": "0.1.0" }, { "@hybridgen/core": "0.1.0" });
    pkg("packages/kernels-cuda", "@hybridgen/kernels-cuda", { "@hybridgen/core": "0.1.0", "@hybridgen/cli": "0.1.0" });
    pkg("packages/runtime", "@hybridgen/runtime", { "@hybridgen/core": "0.1.0", "@hybridgen/kernels-cpu": "0.1.0" });
    pkg("apps/cli", "@hybridgen/cli", { "@hybridgen/core": "0.1.0", "@hybridgen/kernels-cpu": "0.1.0" });
    write("packages/core/src/index.ts", from("export *", "./model.js") + "\n");
    write("packages/spec/src/index.ts", from("import { model }", "@hybridgen/core") + "\n");
    write("packages/kernels-cpu/src/index.ts", [from("import { x }", "@hybridgen/spec"), from("import { y }", "./native/y.js"), ""].join("\n"));
    write("packages/kernels-cuda/device/check.ts", [
      from("import { createCpuBackend }", "@hybridgen/kernels-cpu"),
      from("import { run }", "../../../apps/cli/src/run.js"),
      dynamic("{ fill }", "../../kernels-cpu/src/fill.js"),
      from("import { own }", "../src/index.js"),
    ].join("\n"));
    write("packages/kernels-cuda/src/index.ts", from("export { parse }", "@hybridgen/cli/parse") + "\n");
    write("packages/kernels-cuda/src/stage.ts", from("import { stage }", "@hybridgen/core") + "\n");
    write("packages/runtime/src/index.ts", [from("import { a }", "@hybridgen/kernels-cpu"), from("import { s }", "@hybridgen/scheduler"), from("import { stage }", "@hybridgen/core"), ""].join("\n"));
    // A plugin's test may drive the engine through a devDependency; never by a relative path.
    write("packages/kernels-cpu/test/stage.test.ts", [from("import { tinyModel }", "../../core/test/helpers.js"), from("import { LlamaModel }", "@hybridgen/core"), ""].join("\n"));
    write("apps/cli/test/report.test.ts", from("import { summary }", "../../../scripts/common/report.mjs") + "\n"); // the repository's scripts: allowed from a test
    write("packages/core/bench/speed.ts", from("import { fill }", "../../kernels-cpu/src/fill.js") + "\n"); // a bench inside a package: scanned too
    write("packages/core/tsup.config.ts", from("import { packageBuild }", "../../tsup.package") + "\n"); // the shared build config: allowed outside src
    write("packages/runtime/src/paths.ts", from("import { ROOT }", "../../../scripts/common/tools.mjs") + "\n"); // published code leaving its workspace
    write("scripts/eval.ts", from("import { generate }", "../packages/core/dist/index.js") + "\n"); // the repository's scripts reaching into a package
    write("apps/cli/src/index.ts", [from("import { createCudaBackend }", "@hybridgen/kernels-cuda"), from("import { b }", "@hybridgen/kernels-cpu"), from("import z", "zod"), ""].join("\n"));

    it("names each broken rule with its file and line", () => {
      const got = checkPackageGraph(root).map((v) => `${v.where} ${v.rule}: ${v.detail}`);
      expect(got).toEqual([
        'packages/core/bench/speed.ts:1 relative import into another workspace: "../../kernels-cpu/src/fill.js" leaves packages/core',
        'packages/kernels-cpu/test/stage.test.ts:1 relative import into another workspace: "../../core/test/helpers.js" leaves packages/kernels-cpu',
        "packages/kernels-cuda/package.json plugin reaches past the spec: @hybridgen/kernels-cuda depends on @hybridgen/core",
        "packages/kernels-cuda/package.json package imports an app: @hybridgen/kernels-cuda depends on @hybridgen/cli",
        "packages/kernels-cuda/device/check.ts:1 backend imports a backend: @hybridgen/kernels-cuda imports @hybridgen/kernels-cpu",
        'packages/kernels-cuda/device/check.ts:2 relative import into another workspace: "../../../apps/cli/src/run.js" leaves packages/kernels-cuda',
        'packages/kernels-cuda/device/check.ts:3 relative import into another workspace: "../../kernels-cpu/src/fill.js" leaves packages/kernels-cuda',
        "packages/kernels-cuda/src/index.ts:1 package imports an app: @hybridgen/kernels-cuda imports @hybridgen/cli/parse",
        "packages/kernels-cuda/src/stage.ts:1 plugin reaches past the spec: @hybridgen/kernels-cuda imports @hybridgen/core",
        'packages/runtime/src/paths.ts:1 relative import into another workspace: "../../../scripts/common/tools.mjs" leaves packages/runtime',
        "packages/spec/src/index.ts:1 spec imports a workspace: @hybridgen/spec imports @hybridgen/core",
        "apps/cli/src/index.ts:1 undeclared workspace import: @hybridgen/cli imports @hybridgen/kernels-cuda without a dependency on @hybridgen/kernels-cuda in its package.json",
        'scripts/eval.ts:1 relative import into another workspace: "../packages/core/dist/index.js" reaches into packages/core',
      ]);
    });
  });
});
