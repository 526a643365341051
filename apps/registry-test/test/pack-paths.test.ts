/**
 * Every way a package gets packed (`npm pack`, `bun pm pack`; `bun publish` is the registry
 * test's) yields the same publishable manifest: no workspace: range survives, and the tarball
 * holds the built entry points, the README and, for kernels-cpu, this platform's prebuilt library.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { sh } from "../src/run.js";
import { publishablePackages, type WorkspacePackage } from "../src/workspace-packages.js";

let work: string;
let packages: WorkspacePackage[];

beforeAll(() => {
  work = mkdtempSync(join(tmpdir(), "hybridgen-pack-paths-"));
  packages = publishablePackages();
});

afterAll(() => rmSync(work, { recursive: true, force: true }));

interface Packed {
  readonly files: string[];
  readonly manifest: Record<string, any>;
}

function read(tarball: string): Packed {
  const files = sh("tar", ["-tzf", tarball], work).split("\n");
  return { files, manifest: JSON.parse(sh("tar", ["-xzOf", tarball, "package/package.json"], work)) };
}

/** Every package packed by `tool`, by name. npm packs them all in one run (its start-up is slow). */
function packAll(tool: "npm" | "bun"): Map<string, Packed> {
  const dest = mkdtempSync(join(work, `${tool}-`));
  const env = { ...process.env, NO_COLOR: "1" };
  const out = new Map<string, Packed>();
  if (tool === "npm") {
    const listing = JSON.parse(sh("npm", ["pack", "--json", "--pack-destination", dest, ...packages.map((p) => p.dir)], work, { env })) as { name: string; filename: string }[];
    for (const t of listing) out.set(t.name, read(join(dest, t.filename)));
  } else {
    for (const p of packages) {
      const name = sh(process.execPath, ["pm", "pack", "--destination", dest, "--quiet"], p.dir, { env }).split("\n").at(-1)!.trim();
      out.set(p.name, read(name.startsWith("/") ? name : join(dest, name)));
    }
  }
  return out;
}

describe.each(["npm", "bun"] as const)("%s pack", (tool) => {
  it("every package: no workspace: ranges, entry points, README", () => {
    const packed = packAll(tool);
    expect([...packed.keys()].sort()).toEqual(packages.map((p) => p.name).sort());
    for (const p of packages) {
      const { files, manifest } = packed.get(p.name)!;
      for (const section of ["dependencies", "peerDependencies", "optionalDependencies", "devDependencies"]) {
        for (const [dep, range] of Object.entries(manifest[section] ?? {})) {
          expect(String(range), `${tool} pack ${p.name}: ${section}.${dep}`).not.toMatch(/^workspace:/);
        }
      }
      for (const needed of ["package/package.json", "package/README.md", "package/dist/index.js", "package/dist/index.d.ts"]) {
        expect(files, `${tool} pack ${p.name}`).toContain(needed);
      }
      expect(files.some((f) => f.startsWith("package/src/")), `${tool} pack ${p.name} ships src/`).toBe(false);
      if (p.name === "@hybridgen/kernels-cpu") {
        expect(files).toContain(`package/prebuilds/${process.platform}-${process.arch}/libhgcpu.so`);
        expect(files).toContain("package/scripts/install-native.mjs");
        expect(files.some((f) => f.startsWith("package/native/") && f.endsWith(".c"))).toBe(true);
      }
    }
  });
});
