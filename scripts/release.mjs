// `node scripts/release.mjs [--bump patch|minor|major] [--write] [--mark]`: versions each package
// on its own. A package changed since its last release (releases.json: the version and commit
// each was published at; tests do not count) gets the bump; a dependent whose caret range no
// longer admits the new version gets the new range and a patch bump; every other package keeps
// its version. Without --write it prints the plan; --mark records HEAD as released at the
// versions in the manifests (run it after publishing).
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { workspaceManifests } from "./common/workspaces.mjs";

const DEP_FIELDS = ["dependencies", "peerDependencies", "optionalDependencies"];

/** "1.2.3" → [1, 2, 3]. */
export function parseVersion(v) {
  const m = /^(\d+)\.(\d+)\.(\d+)$/.exec(v);
  if (!m) throw new Error(`not a release version: ${v}`);
  return [Number(m[1]), Number(m[2]), Number(m[3])];
}

const cmp = (a, b) => a[0] - b[0] || a[1] - b[1] || a[2] - b[2];

/** Whether `version` is in the caret range `range` (^X.Y.Z: the leftmost non-zero part fixed). */
export function satisfiesCaret(version, range) {
  if (!range.startsWith("^")) return range === version;
  const v = parseVersion(version), r = parseVersion(range.slice(1));
  if (cmp(v, r) < 0) return false;
  if (r[0] > 0) return v[0] === r[0];
  if (r[1] > 0) return v[0] === 0 && v[1] === r[1];
  return v[0] === 0 && v[1] === 0 && v[2] === r[2];
}

export function bump(version, kind) {
  const [a, b, c] = parseVersion(version);
  if (kind === "major") return `${a + 1}.0.0`;
  if (kind === "minor") return `${a}.${b + 1}.0`;
  if (kind === "patch") return `${a}.${b}.${c + 1}`;
  throw new Error(`--bump must be patch, minor or major, not ${kind}`);
}

/** The publishable workspace packages under `root` (no "private"): name → { dir, manifest }. */
export function publishable(root) {
  return new Map(workspaceManifests(root).filter((w) => !w.manifest.private).map((w) => [w.manifest.name, w]));
}

const git = (root, args) => execFileSync("git", args, { cwd: root, encoding: "utf8" }).trim();

/** Files of `dir` changed between `commit` and the working tree, tests left out (they are not published). */
function changedFiles(root, dir, commit) {
  const rel = relative(root, dir);
  const out = git(root, ["diff", "--name-only", commit, "--", rel]) + "\n" + git(root, ["ls-files", "--others", "--exclude-standard", "--", rel]);
  return out.split("\n").filter((f) => f && !/(^|\/)test\//.test(f.slice(rel.length + 1)) && !/\.test\.[cm]?[jt]s$/.test(f));
}

/**
 * The release plan: for each package, its version now and next and why. `released` is releases.json's
 * record; a package it does not name has never been released and is released as it stands.
 */
export function planRelease(root, released, kind = "patch") {
  const pkgs = publishable(root);
  const plan = new Map();
  for (const [name, p] of pkgs) {
    const last = released[name];
    const changed = last ? changedFiles(root, p.dir, last.commit) : [];
    const next = last && changed.length > 0 && last.version === p.manifest.version ? bump(p.manifest.version, kind) : p.manifest.version;
    plan.set(name, { name, from: p.manifest.version, to: next, base: last?.version ?? p.manifest.version, why: !last ? "never released" : changed.length ? `changed: ${changed.slice(0, 3).join(", ")}${changed.length > 3 ? `, … (${changed.length})` : ""}` : "unchanged", ranges: {} });
  }
  // A dependent whose range no longer admits its dependency's new version: the new range, and a patch bump.
  for (let again = true; again; ) {
    again = false;
    for (const [name, p] of pkgs) {
      const step = plan.get(name);
      for (const field of DEP_FIELDS) {
        for (const [dep, range] of Object.entries(p.manifest[field] ?? {})) {
          const d = plan.get(dep);
          const current = step.ranges[dep] ?? range;
          if (!d || satisfiesCaret(d.to, current)) continue;
          step.ranges[dep] = `^${d.to}`;
          if (step.to === step.base) { // not bumped since its release yet (a version already bumped is not bumped twice)
            step.to = bump(step.from, "patch");
            step.why = `${dep} ${d.to} is outside ${range}`;
          }
          again = true;
        }
      }
    }
  }
  return [...plan.values()];
}

/** Writes the plan's versions and ranges into the manifests. */
export function applyRelease(root, plan) {
  const pkgs = publishable(root);
  for (const step of plan) {
    const p = pkgs.get(step.name);
    const m = p.manifest;
    m.version = step.to;
    for (const field of DEP_FIELDS) for (const dep of Object.keys(m[field] ?? {})) if (step.ranges[dep]) m[field][dep] = step.ranges[dep];
    writeFileSync(p.file, `${JSON.stringify(m, null, 2)}\n`);
  }
}

export function readReleased(root) {
  const file = join(root, "releases.json");
  return existsSync(file) ? JSON.parse(readFileSync(file, "utf8")) : {};
}

/** Records HEAD as released at the manifests' versions. */
export function markReleased(root) {
  const commit = git(root, ["rev-parse", "HEAD"]);
  const out = {};
  for (const [name, p] of publishable(root)) out[name] = { version: p.manifest.version, commit };
  writeFileSync(join(root, "releases.json"), `${JSON.stringify(out, null, 2)}\n`);
  return out;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const root = fileURLToPath(new URL("..", import.meta.url));
  const args = process.argv.slice(2);
  const flag = (name) => args.includes(name);
  const at = args.indexOf("--bump");
  const kind = at >= 0 ? args[at + 1] : "patch";
  try {
    if (flag("--mark")) {
      const out = markReleased(root);
      console.log(`releases.json: ${Object.keys(out).length} packages released at ${Object.values(out)[0]?.commit.slice(0, 12)}`);
    } else {
      const plan = planRelease(root, readReleased(root), kind);
      for (const s of plan) console.log(`${s.name.padEnd(26)} ${s.from === s.to ? `${s.from} (kept)` : `${s.from} → ${s.to}`}  ${s.why}${Object.keys(s.ranges).length ? `; ranges ${Object.entries(s.ranges).map(([d, r]) => `${d} ${r}`).join(", ")}` : ""}`);
      if (flag("--write")) applyRelease(root, plan);
      else console.log("(a plan: --write applies it)");
    }
  } catch (e) {
    console.error(`error: ${e instanceof Error ? e.message : String(e)}`);
    process.exit(1);
  }
}
