/**
 * The workspace's package graph and the rules it must keep: no package (packages/*) depends on or
 * imports an app (apps/*), no backend imports another backend, the spec imports no workspace, the
 * plugins (selectors, scheduler, memtier, both backends) ship on the spec alone, and no source file
 * reaches into another workspace by a relative path. Read from every package.json's dependency fields
 * and from the import specifiers of every source file of each workspace (any folder but node_modules,
 * dist and built libraries) and of the repository's own scripts (`scripts/`, outside every workspace).
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve, sep } from "node:path";

/** The backends: neither may import the other (the engine picks one; the spec holds their contract). */
export const BACKENDS: readonly string[] = ["@hybridgen/kernels-cpu", "@hybridgen/kernels-cuda"];
/** Folders never scanned: installed, built or generated files. */
const SKIPPED_DIRS: ReadonlySet<string> = new Set(["node_modules", "dist", "lib", "prebuilds", "bench-out"]);
/** A file under this folder is what the package publishes: its relative imports stay inside its
 * workspace. Any other file (tests, benches, configs) may reach the repository's own files outside
 * every workspace (its scripts, the shared build config), never into another workspace. */
const PUBLISHED_DIR = "src";
/** The repository's scripts outside every workspace: scanned too, and must not reach into one. */
export const ROOT_SCRIPT_DIRS: readonly string[] = ["scripts"];
/** The contracts: it depends on no workspace. */
export const SPEC = "@hybridgen/spec";
/** Packages that meet the engine on the spec alone: their dependencies and their src import no other
 * workspace (their tests may still drive the engine through a devDependency). */
export const PLUGINS: readonly string[] = ["@hybridgen/selectors", "@hybridgen/scheduler", "@hybridgen/memtier", ...BACKENDS];
const DEP_FIELDS = ["dependencies", "devDependencies", "peerDependencies", "optionalDependencies"] as const;
/** The fields an installed package brings along (a devDependency stays in the repository). */
const SHIPPED_FIELDS: readonly string[] = ["dependencies", "peerDependencies", "optionalDependencies"];
const SOURCE_FILE = /\.(ts|tsx|mts|cts|js|mjs|cjs)$/;
// import … from "x", export … from "x", import "x", import("x"), require("x")
const SPECIFIER = /(?:\bfrom\s*|\bimport\s*\(\s*|\bimport\s+|\brequire\s*\(\s*)["']([^"']+)["']/g;

export interface Workspace {
  readonly name: string;
  /** Absolute folder. */
  readonly dir: string;
  readonly kind: "package" | "app";
  readonly deps: readonly string[];
  /** The dependencies an install of it brings (devDependencies left out). */
  readonly shipped: readonly string[];
}

export interface GraphViolation {
  /** The file (or package.json) relative to the root, with its line where it is a source file. */
  readonly where: string;
  readonly rule:
    | "package imports an app"
    | "backend imports a backend"
    | "spec imports a workspace"
    | "plugin reaches past the spec"
    | "relative import into another workspace"
    | "undeclared workspace import";
  readonly detail: string;
}

/** Every workspace of the root package.json's "dir/*" globs: apps/* are apps, the rest packages. */
export function readWorkspaces(root: string): Workspace[] {
  const { workspaces } = JSON.parse(readFileSync(join(root, "package.json"), "utf8")) as { workspaces: string[] };
  const out: Workspace[] = [];
  for (const glob of workspaces) {
    const base = join(root, glob.replace(/\/\*$/, ""));
    if (!existsSync(base)) continue;
    for (const entry of readdirSync(base).sort()) {
      const dir = join(base, entry);
      const pj = join(dir, "package.json");
      if (!existsSync(pj)) continue;
      const pkg = JSON.parse(readFileSync(pj, "utf8")) as Record<string, unknown>;
      const of = (fields: readonly string[]) => fields.flatMap((f) => Object.keys((pkg[f] as Record<string, string> | undefined) ?? {}));
      out.push({ name: pkg.name as string, dir, kind: relative(root, base).split(sep)[0] === "apps" ? "app" : "package", deps: of(DEP_FIELDS), shipped: of(SHIPPED_FIELDS) });
    }
  }
  return out;
}

function sourceFiles(dir: string): string[] {
  if (!existsSync(dir)) return [];
  const out: string[] = [];
  for (const entry of readdirSync(dir).sort()) {
    if (SKIPPED_DIRS.has(entry) || entry.startsWith(".")) continue;
    const path = join(dir, entry);
    if (statSync(path).isDirectory()) out.push(...sourceFiles(path));
    else if (SOURCE_FILE.test(entry) && !entry.endsWith(".d.ts")) out.push(path);
  }
  return out;
}

/** The workspace package a bare specifier names ("@hybridgen/core/x" → "@hybridgen/core"), if any. */
function workspaceOf(spec: string, byName: Map<string, Workspace>): Workspace | undefined {
  const parts = spec.split("/");
  return byName.get(spec.startsWith("@") ? parts.slice(0, 2).join("/") : parts[0]);
}

/** The rule an edge from `from` to `to` breaks, if any; `shipped`: a dependency an install brings or
 * an import of the package's src, where a plugin may reach the spec only. */
function edgeRule(from: Workspace, to: Workspace, shipped: boolean): GraphViolation["rule"] | null {
  if (from.kind === "package" && to.kind === "app") return "package imports an app";
  if (BACKENDS.includes(from.name) && BACKENDS.includes(to.name) && from.name !== to.name) return "backend imports a backend";
  if (from.name === SPEC && to !== from) return "spec imports a workspace";
  if (shipped && PLUGINS.includes(from.name) && to.name !== SPEC && to !== from) return "plugin reaches past the spec";
  return null;
}

/** Every broken rule in the workspace under `root` (empty: the graph holds). */
export function checkPackageGraph(root: string): GraphViolation[] {
  const workspaces = readWorkspaces(root);
  const byName = new Map(workspaces.map((w) => [w.name, w]));
  const violations: GraphViolation[] = [];
  for (const w of workspaces) {
    for (const dep of w.deps) {
      const to = byName.get(dep);
      const rule = to && edgeRule(w, to, w.shipped.includes(dep));
      if (rule) violations.push({ where: relative(root, join(w.dir, "package.json")), rule, detail: `${w.name} depends on ${dep}` });
    }
    const files = sourceFiles(w.dir).map((file) => ({ file, unconfined: relative(w.dir, file).split(sep)[0] !== PUBLISHED_DIR }));
    for (const { file, unconfined } of files) {
      const text = readFileSync(file, "utf8");
      for (const m of text.matchAll(SPECIFIER)) {
        const spec = m[1];
        const where = `${relative(root, file)}:${text.slice(0, m.index).split("\n").length}`;
        if (spec.startsWith(".")) {
          const target = resolve(dirname(file), spec);
          const inside = (d: string) => target === d || target.startsWith(d + sep);
          const leaves = unconfined ? workspaces.some((o) => o !== w && inside(o.dir)) : !inside(w.dir);
          if (leaves) violations.push({ where, rule: "relative import into another workspace", detail: `"${spec}" leaves ${relative(root, w.dir)}` });
          continue;
        }
        const to = workspaceOf(spec, byName);
        if (!to || to === w) continue;
        const rule = edgeRule(w, to, !unconfined);
        if (rule) violations.push({ where, rule, detail: `${w.name} imports ${spec}` });
        else if (!w.deps.includes(to.name)) violations.push({ where, rule: "undeclared workspace import", detail: `${w.name} imports ${spec} without a dependency on ${to.name} in its package.json` });
      }
    }
  }
  for (const file of ROOT_SCRIPT_DIRS.flatMap((d) => sourceFiles(join(root, d)))) {
    const text = readFileSync(file, "utf8");
    for (const m of text.matchAll(SPECIFIER)) {
      if (!m[1].startsWith(".")) continue;
      const target = resolve(dirname(file), m[1]);
      const into = workspaces.find((o) => target === o.dir || target.startsWith(o.dir + sep));
      if (into) violations.push({ where: `${relative(root, file)}:${text.slice(0, m.index).split("\n").length}`, rule: "relative import into another workspace", detail: `"${m[1]}" reaches into ${relative(root, into.dir)}` });
    }
  }
  return violations;
}
