/**
 * Each package is versioned on its own. The release tool (scripts/release.mjs) bumps only what
 * changed, on a scratch git repository of three packages; and through a real local registry, a
 * newer @hybridgen/selectors installs beside an older @hybridgen/core (both on one copy of
 * @hybridgen/spec, which their caret ranges admit) and runs.
 */
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { startLocalRegistry, type LocalRegistry } from "../src/local-registry.js";
import { sh } from "../src/run.js";
import { ROOT } from "../src/workspace-packages.js";

const BUN = process.execPath;
const release = (await import(join(ROOT, "scripts", "release.mjs"))) as {
  bump(v: string, kind: string): string;
  satisfiesCaret(v: string, range: string): boolean;
  planRelease(root: string, released: Record<string, { version: string; commit: string }>, kind?: string): { name: string; from: string; to: string; why: string; ranges: Record<string, string> }[];
  applyRelease(root: string, plan: unknown[]): void;
  markReleased(root: string): Record<string, { version: string; commit: string }>;
};
const scratch: string[] = [];
afterAll(() => {
  for (const d of scratch) rmSync(d, { recursive: true, force: true });
});

describe("scripts/release.mjs", () => {
  it("caret ranges as npm reads them", () => {
    expect(release.satisfiesCaret("0.1.4", "^0.1.0")).toBe(true);
    expect(release.satisfiesCaret("0.2.0", "^0.1.0")).toBe(false);
    expect(release.satisfiesCaret("0.0.2", "^0.0.1")).toBe(false);
    expect(release.satisfiesCaret("1.9.0", "^1.2.3")).toBe(true);
    expect(release.satisfiesCaret("1.2.2", "^1.2.3")).toBe(false);
    expect(release.bump("0.1.9", "patch")).toBe("0.1.10");
    expect(release.bump("0.1.9", "minor")).toBe("0.2.0");
  });

  it("bumps only the packages changed since their release; a dependent only when its range no longer admits the new version", () => {
    const root = mkdtempSync(join(tmpdir(), "hg-release-"));
    scratch.push(root);
    const write = (path: string, text: string) => {
      mkdirSync(join(root, path, ".."), { recursive: true });
      writeFileSync(join(root, path), text);
    };
    const pkg = (dir: string, name: string, dependencies: Record<string, string> = {}) =>
      write(`packages/${dir}/package.json`, `${JSON.stringify({ name, version: "0.1.0", dependencies }, null, 2)}\n`);
    write("package.json", JSON.stringify({ private: true, workspaces: ["packages/*"] }));
    pkg("core", "@x/core");
    pkg("selectors", "@x/selectors", { "@x/core": "^0.1.0" });
    pkg("scheduler", "@x/scheduler", { "@x/core": "^0.1.0" });
    for (const d of ["core", "selectors", "scheduler"]) write(`packages/${d}/src/index.ts`, "export {};\n");
    const git = (...args: string[]) => sh("git", ["-c", "user.email=t@t", "-c", "user.name=t", ...args], root);
    git("init", "-q");
    git("add", "-A");
    git("commit", "-qm", "first");
    const released = release.markReleased(root);
    expect(Object.keys(released).sort()).toEqual(["@x/core", "@x/scheduler", "@x/selectors"]);

    write("packages/selectors/src/index.ts", "export const better = true;\n");
    write("packages/core/test/new.test.ts", "// a test: not published, not a change\n");
    const plan = release.planRelease(root, released);
    expect(plan.map((s) => `${s.name} ${s.from}→${s.to}`).sort()).toEqual(["@x/core 0.1.0→0.1.0", "@x/scheduler 0.1.0→0.1.0", "@x/selectors 0.1.0→0.1.1"]);
    release.applyRelease(root, plan);
    expect(JSON.parse(readFileSync(join(root, "packages/selectors/package.json"), "utf8"))).toMatchObject({ version: "0.1.1", dependencies: { "@x/core": "^0.1.0" } });

    write("packages/core/src/index.ts", "export const changed = 1;\n");
    const minor = release.planRelease(root, released, "minor");
    const by = Object.fromEntries(minor.map((s) => [s.name, s]));
    expect(by["@x/core"]).toMatchObject({ from: "0.1.0", to: "0.2.0" });
    // ^0.1.0 does not admit 0.2.0: both dependents get ^0.2.0 and a patch bump; selectors, bumped to 0.1.1 for its own change and not released since, is not bumped twice.
    expect(by["@x/scheduler"]).toMatchObject({ from: "0.1.0", to: "0.1.1", ranges: { "@x/core": "^0.2.0" } });
    expect(by["@x/scheduler"]!.why).toBe("@x/core 0.2.0 is outside ^0.1.0");
    expect(by["@x/selectors"]).toMatchObject({ from: "0.1.1", to: "0.1.1", ranges: { "@x/core": "^0.2.0" } });
  });
});

describe("a newer @hybridgen/selectors beside an older @hybridgen/core, from a registry", () => {
  let registry: LocalRegistry | undefined;
  afterAll(async () => {
    await registry?.stop();
  });

  it("installs with one copy of the spec they meet on and runs", async () => {
    registry = await startLocalRegistry();
    const env = { ...process.env, BUN_INSTALL_CACHE_DIR: join(registry.dir, "bun-cache"), NO_COLOR: "1", FORCE_COLOR: "0" };
    const publish = (dir: string) => sh(BUN, ["publish", "--registry", registry!.url], dir, { env: { ...env, NPM_CONFIG_TOKEN: registry!.token } });
    const spec = JSON.parse(readFileSync(join(ROOT, "packages/spec/package.json"), "utf8"));
    const core = JSON.parse(readFileSync(join(ROOT, "packages/core/package.json"), "utf8"));
    const sel = JSON.parse(readFileSync(join(ROOT, "packages/selectors/package.json"), "utf8"));
    // Both meet on the spec: selectors needs no core at all.
    expect(sel.dependencies["@hybridgen/spec"]).toBe(`^${spec.version}`);
    expect(core.dependencies["@hybridgen/spec"]).toBe(`^${spec.version}`);
    expect(sel.dependencies["@hybridgen/core"]).toBeUndefined();
    publish(join(ROOT, "packages/spec"));
    publish(join(ROOT, "packages/core"));
    publish(join(ROOT, "packages/selectors"));

    // The next selectors: a change of its own, the release tool's patch bump, core untouched.
    const next = mkdtempSync(join(tmpdir(), "hg-selectors-next-"));
    scratch.push(next);
    for (const f of ["dist", "README.md"]) cpSync(join(ROOT, "packages/selectors", f), join(next, f), { recursive: true });
    writeFileSync(join(next, "dist", "index.js"), `${readFileSync(join(next, "dist", "index.js"), "utf8")}\nexport const releasedAfterCore = true;\n`);
    const newer = release.bump(sel.version, "patch");
    writeFileSync(join(next, "package.json"), `${JSON.stringify({ ...sel, version: newer, scripts: {}, devDependencies: {} }, null, 2)}\n`);
    publish(next);

    const project = mkdtempSync(join(tmpdir(), "hg-versions-project-"));
    scratch.push(project);
    writeFileSync(join(project, "package.json"), `${JSON.stringify({ name: "versions-project", private: true, type: "module" }, null, 2)}\n`);
    writeFileSync(join(project, ".npmrc"), `@hybridgen:registry=${registry.url}\n`);
    sh(BUN, ["add", `@hybridgen/core@${core.version}`, `@hybridgen/selectors@${newer}`, "zod"], project, { env });
    const installed = (name: string) => JSON.parse(readFileSync(join(project, "node_modules", "@hybridgen", name, "package.json"), "utf8")).version;
    expect([installed("core"), installed("selectors")]).toEqual([core.version, newer]);
    // One copy of the spec, shared by the older core and the newer selectors.
    for (const name of ["core", "selectors"]) expect(existsSync(join(project, `node_modules/@hybridgen/${name}/node_modules/@hybridgen/spec`)), name).toBe(false);
    expect(installed("spec")).toBe(spec.version);
    writeFileSync(join(project, "run.ts"), `import { headLayout, referencePrimitives } from "@hybridgen/core";
import { createSelector, releasedAfterCore } from "@hybridgen/selectors";
const sel = createSelector("streaming", { sinks: 2 });
const layout = headLayout(8, 2, 64);
const s = sel.select({ timing: "pre", layer: 0, step: 0, sequence: 0, offloaded: 100, k: 5,
  positions: referencePrimitives.range(0, 100), layout, state: sel.initState({ layer: 0, sequence: 0, layout }),
  query: new Float32Array(8 * 64), speculative: true, primitives: referencePrimitives });
console.log(releasedAfterCore, s.kind, Array.from(s.ids).join(" "));
`);
    expect(sh(BUN, ["run.ts"], project, { env })).toBe("true shared 0 1 97 98 99");
  }, 180_000);
});
