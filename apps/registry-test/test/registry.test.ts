/**
 * Every package published to a real local registry (Verdaccio) and installed from it into a
 * fresh project with `bun add`, as a user would: no overrides, no tarball paths, only the
 * registry of the @hybridgen scope in the project's .npmrc. The installed packages then run a
 * selector plugin through the library API and the installed `hybridgen` through bunx, on
 * stories15M (fetched by set-up; fetched here when missing).
 */
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ensureStories15M } from "@hybridgen/core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startLocalRegistry, type LocalRegistry } from "../src/local-registry.js";
import { runCommand, sh } from "../src/run.js";
import { publishablePackages, type WorkspacePackage } from "../src/workspace-packages.js";

const BUN = process.execPath;
const PROMPT = "Once upon a time";
const TOKENS = "24";

let registry: LocalRegistry;
let project: string;
let modelDir: string;
let packages: WorkspacePackage[];
/** The project's environment: its own bun cache (a republished 0.1.0 must not come from an old cache), no colour. */
let env: NodeJS.ProcessEnv;

function fixture(name: string): string {
  return new URL(`../fixtures/${name}`, import.meta.url).pathname;
}

beforeAll(async () => {
  packages = publishablePackages();
  for (const p of packages) {
    if (!existsSync(join(p.dir, "dist", "index.js"))) throw new Error(`${p.name} is not built: run \`bun run build\` first`);
  }
  modelDir = await ensureStories15M({});
  registry = await startLocalRegistry();
  project = mkdtempSync(join(tmpdir(), "hybridgen-fresh-project-"));
  env = { ...process.env, BUN_INSTALL_CACHE_DIR: join(registry.dir, "bun-cache"), NO_COLOR: "1", FORCE_COLOR: "0" };
  for (const p of packages) {
    sh(BUN, ["publish", "--registry", registry.url], p.dir, { env: { ...env, NPM_CONFIG_TOKEN: registry.token } });
  }
}, 120_000);

afterAll(async () => {
  if (project) rmSync(project, { recursive: true, force: true });
  await registry?.stop();
  if (registry) expect(existsSync(registry.dir)).toBe(false);
});

describe("the packages through a local registry", () => {
  it("every package is published with exports, types, files, engines and no workspace: ranges", async () => {
    for (const p of packages) {
      const r = await fetch(`${registry.url}${p.name.replace("/", "%2f")}`);
      expect(r.status, p.name).toBe(200);
      const doc = (await r.json()) as { versions: Record<string, Record<string, any>> };
      const m = doc.versions[p.version];
      expect(m, `${p.name}@${p.version}`).toBeDefined();
      expect(m.exports?.["."]?.types, p.name).toBe("./dist/index.d.ts");
      expect(m.types, p.name).toBe("./dist/index.d.ts");
      expect(m.files, p.name).toContain("dist");
      expect(m.engines?.bun, p.name).toMatch(/^>=1\./);
      const ranges = { ...m.dependencies, ...m.peerDependencies, ...m.optionalDependencies };
      for (const [dep, range] of Object.entries(ranges)) expect(String(range), `${p.name} → ${dep}`).not.toMatch(/^workspace:/);
      // Internal dependencies are caret ranges that admit the version the registry holds (each package is versioned on its own).
      for (const [dep, range] of Object.entries(m.dependencies ?? {})) {
        const internal = packages.find((q) => q.name === dep);
        if (internal) expect(range, `${p.name} → ${dep}`).toBe(`^${internal.version}`);
      }
    }
  });

  it("bun add @hybridgen/core @hybridgen/selectors @hybridgen/kernels-cpu in a fresh project", () => {
    writeFileSync(join(project, "package.json"), `${JSON.stringify({ name: "fresh-project", private: true, type: "module" }, null, 2)}\n`);
    // The one line a private registry needs: which registry serves the scope.
    writeFileSync(join(project, ".npmrc"), `@hybridgen:registry=${registry.url}\n`);
    sh(BUN, ["add", "@hybridgen/core", "@hybridgen/selectors", "@hybridgen/kernels-cpu"], project, { env });
    const manifest = JSON.parse(readFileSync(join(project, "package.json"), "utf8"));
    expect(Object.keys(manifest.dependencies).sort()).toEqual(["@hybridgen/core", "@hybridgen/kernels-cpu", "@hybridgen/selectors"]);
    expect(manifest.overrides).toBeUndefined();
    // zod is a peer: one copy, the project's, shared by the plugin and the packages.
    expect(existsSync(join(project, "node_modules", "zod", "package.json"))).toBe(true);
    expect(existsSync(join(project, "node_modules", "@hybridgen", "selectors", "node_modules", "zod"))).toBe(false);
    const kc = join(project, "node_modules", "@hybridgen", "kernels-cpu");
    expect(existsSync(join(kc, "prebuilds", `${process.platform}-${process.arch}`, "libhgcpu.so"))).toBe(true);
    expect(existsSync(join(kc, "src"))).toBe(false);
    const check = `import { createCpuBackend } from "@hybridgen/kernels-cpu";
const b = createCpuBackend({ threads: 1 });
const a = b.alloc([2, 3]), c = b.alloc([2, 3]), o = b.alloc([2, 3]);
b.write(a, Float32Array.of(1, 2, 3, 4, 5, 6)); b.write(c, Float32Array.of(0.5, 0.25, 0, -1, -2, -3));
b.add(o, a, c, 2);
console.log(Array.from(b.read(o)).join(","));
b.close();`;
    writeFileSync(join(project, "check-add.ts"), check);
    expect(sh(BUN, ["check-add.ts"], project, { env })).toBe("1.5,2.25,3,3,3,3");
  });

  it("bun add @hybridgen/selectors pulls the spec, not the engine, and the spec's kit runs", () => {
    const author = mkdtempSync(join(tmpdir(), "hybridgen-plugin-author-"));
    try {
      writeFileSync(join(author, "package.json"), `${JSON.stringify({ name: "plugin-author", private: true, type: "module" }, null, 2)}\n`);
      writeFileSync(join(author, ".npmrc"), `@hybridgen:registry=${registry.url}\n`);
      sh(BUN, ["add", "@hybridgen/selectors", "zod"], author, { env });
      expect(readdirSync(join(author, "node_modules", "@hybridgen")).sort()).toEqual(["selectors", "spec"]);
      const check = `import { defineSelector } from "@hybridgen/selectors";
import { HybridgenError } from "@hybridgen/spec";
import { ReferenceBackend } from "@hybridgen/spec/kit";
const s = defineSelector({ name: "first", timings: ["post"], usesBudget: false, select: () => ({ kind: "shared", ids: [0] }) });
const b = new ReferenceBackend();
const a = b.alloc([1, 3]), o = b.alloc([1, 3]);
b.write(a, Float32Array.of(1, 2, 3));
b.add(o, a, a, 1);
console.log(typeof s, new HybridgenError("x").name, Array.from(b.read(o)).join(","));`;
      writeFileSync(join(author, "check-spec.ts"), check);
      expect(sh(BUN, ["check-spec.ts"], author, { env })).toBe("function HybridgenError 2,4,6");
    } finally {
      rmSync(author, { recursive: true, force: true });
    }
  });

  it("a selector plugin runs through the library API and reproduces full attention's text", () => {
    sh(BUN, ["add", "@hybridgen/runtime", "zod"], project, { env });
    copyFileSync(fixture("every-token.ts"), join(project, "every-token.ts"));
    copyFileSync(fixture("library-run.ts"), join(project, "library-run.ts"));
    const out = JSON.parse(sh(BUN, ["library-run.ts", modelDir, PROMPT, TOKENS], project, { env }).split("\n").at(-1)!);
    expect(out.fullText.length).toBeGreaterThan(40);
    expect(out.hybridText).toBe(out.fullText);
    // Called for each of stories15M's 6 layers at every decode step once tokens are offloaded
    // (past the 8 resident positions).
    expect(out.pluginCalls % 6).toBe(0);
    expect(out.pluginCalls).toBeGreaterThanOrEqual(6 * (Number(TOKENS) - 8));
  });

  it("bunx hybridgen generate runs the installed CLI, and the plugin through --selector ./every-token.ts", () => {
    sh(BUN, ["add", "@hybridgen/cli"], project, { env });
    const args = ["hybridgen", "generate", "--model", modelDir, "--prompt", PROMPT, "--temperature", "0", "--max-tokens", TOKENS, "--threads", "1"];
    const full = runCommand(BUN, ["x", ...args], project, { env });
    expect(full.status, full.stderr).toBe(0);
    expect(full.stdout.startsWith(`${PROMPT}, there was a little`)).toBe(true);
    const hybridArgs = ["--attention", "hybrid", "--gpu-kv-budget", "8", "--sink-tokens", "2", "--logits", "exact"];
    const plugin = runCommand(BUN, ["x", ...args, ...hybridArgs, "--selector", "./every-token.ts", "--selector-options", '{"newestFirst":true}'], project, { env });
    expect(plugin.status, plugin.stderr).toBe(0);
    expect(plugin.stderr).toContain("every-token");
    expect(plugin.stdout).toBe(full.stdout);
    const builtin = runCommand(BUN, ["x", ...args, ...hybridArgs, "--selector", "all"], project, { env });
    expect(builtin.status, builtin.stderr).toBe(0);
    expect(builtin.stdout).toBe(full.stdout);
    // Not a terminal: no colour codes anywhere.
    expect(`${full.stdout}${full.stderr}${plugin.stderr}`).not.toMatch(/\x1b\[/);
  });
});
