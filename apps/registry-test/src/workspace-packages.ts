/** The repository's publishable packages (every workspace without "private"), dependencies first. */
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

export const ROOT = fileURLToPath(new URL("../../../", import.meta.url));

export interface WorkspacePackage {
  readonly name: string;
  readonly version: string;
  readonly dir: string;
  readonly manifest: Record<string, any>;
}

export function publishablePackages(): WorkspacePackage[] {
  const { workspaces } = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { workspaces: string[] };
  const found = new Map<string, WorkspacePackage>();
  for (const glob of workspaces) {
    const base = join(ROOT, glob.replace(/\/\*$/, ""));
    for (const entry of readdirSync(base).sort()) {
      const file = join(base, entry, "package.json");
      if (!existsSync(file)) continue;
      const manifest = JSON.parse(readFileSync(file, "utf8"));
      if (!manifest.private) found.set(manifest.name, { name: manifest.name, version: manifest.version, dir: join(base, entry), manifest });
    }
  }
  // Dependencies first, so a registry never holds a package whose own dependency is missing.
  const ordered: WorkspacePackage[] = [];
  const visit = (p: WorkspacePackage, path: string[]): void => {
    if (ordered.includes(p)) return;
    if (path.includes(p.name)) throw new Error(`dependency cycle: ${[...path, p.name].join(" -> ")}`);
    for (const dep of Object.keys(p.manifest.dependencies ?? {})) {
      const d = found.get(dep);
      if (d) visit(d, [...path, p.name]);
    }
    ordered.push(p);
  };
  for (const p of found.values()) visit(p, []);
  return ordered;
}
