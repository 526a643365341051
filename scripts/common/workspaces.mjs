// The workspaces of the root package.json's "dir/*" globs, in glob then name order: each
// one's folder, its package.json path and its parsed manifest (root scripts share this listing).
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";

export function workspaceManifests(root) {
  const { workspaces } = JSON.parse(readFileSync(join(root, "package.json"), "utf8"));
  const out = [];
  for (const glob of workspaces) {
    const base = join(root, glob.replace(/\/\*$/, ""));
    if (!existsSync(base)) continue;
    for (const name of readdirSync(base).sort()) {
      const file = join(base, name, "package.json");
      if (existsSync(file)) out.push({ dir: join(base, name), file, manifest: JSON.parse(readFileSync(file, "utf8")) });
    }
  }
  return out;
}
