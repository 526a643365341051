// Proves each workspace package installs and works on its own, from its published tarball:
// `bun pm pack` every package → a scratch project → `bun add` the tarballs → import each
// (and run one kernels-cpu op). Needs a prior build (dist/, lib/). Exit 0 = all good.
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ROOT, die, findBun } from "./common/tools.mjs";

const bun = findBun();
if (!bun) die("bun not found", "run `npm run setup` first");

const keep = process.argv.includes("--keep");
const work = mkdtempSync(join(tmpdir(), "hybridgen-pack-"));
const tarballs = join(work, "tarballs");
const scratch = join(work, "scratch");

function sh(cmd, args, cwd) {
  const r = spawnSync(cmd, args, { cwd, encoding: "utf8" });
  if (r.error || r.status !== 0) {
    const out = `${r.stdout ?? ""}${r.stderr ?? ""}`.trim().split("\n").slice(-15).join("\n");
    throw new Error(`\`${cmd} ${args.join(" ")}\` failed in ${cwd}:\n${out || r.error?.message}`);
  }
  return r.stdout.trim();
}

function workspacePackages() {
  const out = [];
  for (const base of ["packages", "apps"]) {
    for (const name of readdirSync(join(ROOT, base)).sort()) {
      const dir = join(ROOT, base, name);
      const pkgPath = join(dir, "package.json");
      if (!existsSync(pkgPath)) continue;
      const pkg = JSON.parse(readFileSync(pkgPath, "utf8"));
      if (!pkg.private) out.push({ dir, name: pkg.name, pkg });
    }
  }
  return out;
}

// What a scratch project checks, run under Bun (kernels-cpu needs bun:ffi): the package
// imports and exports something; for kernels-cpu, one real op on fresh numbers.
const CHECK = `
const name = process.argv[2];
const mod = await import(name);
if (Object.keys(mod).length === 0) throw new Error(name + " exports nothing");
console.log("ok   import " + name + " (" + Object.keys(mod).length + " exports)");
if (name === "@hybridgen/kernels-cpu") {
  const backend = mod.createCpuBackend({ threads: 1 });
  try {
    // out = a + b over 3 rows of 37, against plain JS.
    let s = 12345;
    const rand = () => ((s = (Math.imul(s, 1103515245) + 12345) >>> 0) / 2 ** 32) * 2 - 1;
    const a = Float32Array.from({ length: 111 }, rand), b = Float32Array.from({ length: 111 }, rand);
    const ta = backend.alloc([3, 37]), tb = backend.alloc([3, 37]), to = backend.alloc([3, 37]);
    backend.write(ta, a); backend.write(tb, b);
    backend.add(to, ta, tb, 3);
    const got = backend.read(to);
    for (let i = 0; i < 111; i++) {
      if (Math.abs(got[i] - (a[i] + b[i])) > 1e-6) throw new Error("add mismatch at " + i + ": " + got[i] + " vs " + (a[i] + b[i]));
    }
    console.log("ok   kernels-cpu backend add() matches JS (" + backend.threads + " thread)");
  } finally { backend.close(); }
}
`;

try {
  const packages = workspacePackages();
  const files = {};
  for (const p of packages) {
    if (!existsSync(join(p.dir, "dist", "index.js"))) throw new Error(`${p.name} is not built (${p.dir}/dist missing): run \`bun run build\``);
    const file = sh(bun.bin, ["pm", "pack", "--destination", tarballs, "--quiet", "--ignore-scripts"], p.dir).split("\n").pop();
    files[p.name] = file.startsWith("/") ? file : join(tarballs, file);
    const listing = sh("tar", ["-tzf", files[p.name]], work);
    for (const needed of ["package/dist/index.js", "package/dist/index.d.ts", "package/README.md"]) {
      if (!listing.split("\n").includes(needed)) throw new Error(`${p.name}'s tarball lacks ${needed.slice(8)}`);
    }
    console.log(`ok   packed ${p.name}`);
  }
  // One scratch project per package, so each proves its own dependency list suffices. The
  // tarballs' "@hybridgen/x": "0.1.0" dependencies resolve to these tarballs (overrides),
  // never to the public registry.
  const overrides = Object.fromEntries(Object.entries(files).map(([n, f]) => [n, `file:${f}`]));
  for (const p of packages) {
    const dir = join(scratch, p.name.replace("@hybridgen/", ""));
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "scratch", private: true, type: "module", overrides }, null, 2));
    writeFileSync(join(dir, "check.mjs"), CHECK);
    sh(bun.bin, ["add", files[p.name]], dir);
    console.log(`ok   bun add ${p.name} (alone)`);
    console.log(sh(bun.bin, ["check.mjs", p.name], dir));
    if (p.pkg.bin?.hybridgen) {
      const version = sh(join(dir, "node_modules", ".bin", "hybridgen"), ["--version"], dir);
      if (!/^hybridgen \d+\.\d+\.\d+/.test(version)) throw new Error(`installed hybridgen --version printed ${JSON.stringify(version)}`);
      console.log(`ok   installed bin: ${version}`);
      // The whole installed stack, end to end, on the default model (fetched if missing).
      const story = sh(join(dir, "node_modules", ".bin", "hybridgen"), ["generate", "--prompt", "Once upon a time", "--temperature", "0", "--max-tokens", "12"], dir);
      if (!story.startsWith("Once upon a time, there was a little girl")) throw new Error(`installed hybridgen generate printed ${JSON.stringify(story)}`);
      console.log(`ok   installed bin generates: ${JSON.stringify(story)}`);
    }
  }
  console.log("pack-test: all packages install and load on their own");
} catch (e) {
  console.error(`pack-test failed: ${e.message}`);
  process.exitCode = 1;
} finally {
  if (keep) console.log(`kept ${work}`);
  else rmSync(work, { recursive: true, force: true });
}
