/**
 * Issue 37's done-when checks, each met or not, from the repository as it stands:
 *   ./bun apps/bench/src/house-check.ts        (exit 0 whatever the outcome; --strict: exit 1 on any not met)
 * Its test (test/house-check.test.ts) asserts the checks that hold, a ratchet each landing tightens.
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { basename, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { COMMAND_RULES, planCommand } from "./readme/commands.js";
import { readmePaths, readText, shellCommands } from "./readme/readmes.js";
import { checkAllTables } from "./readme/tables.js";
import { readWorkspaces } from "./package-graph.js";

export interface HouseCheck {
  readonly name: string;
  readonly met: boolean;
  /** What was found: the figure, or what stands in the way. */
  readonly detail: string;
}

const SOURCE = /\.(ts|tsx|mts|js|mjs)$/;

/** Every source file under `dir` (node_modules, dist and dot-folders left out). */
function files(dir: string, keep: (name: string) => boolean = (n) => SOURCE.test(n) && !n.endsWith(".d.ts")): string[] {
  if (!existsSync(dir)) return [];
  const out: string[] = [];
  for (const e of readdirSync(dir).sort()) {
    if (e === "node_modules" || e === "dist" || e.startsWith(".")) continue;
    const p = join(dir, e);
    if (statSync(p).isDirectory()) out.push(...files(p, keep));
    else if (keep(e)) out.push(p);
  }
  return out;
}

const lines = (path: string) => readFileSync(path, "utf8").split("\n").length - 1;
const IMPORT = /(?:\bfrom\s*|\bimport\s*\(\s*|\bimport\s+)["'](@hybridgen\/[\w-]+)/g;

/** core ≤ 8 000 lines of source (packages/core/src). */
function coreLines(root: string): HouseCheck {
  const n = files(join(root, "packages/core/src")).reduce((s, f) => s + lines(f), 0);
  return { name: "core ≤ 8k source lines", met: n <= 8000, detail: `packages/core/src: ${n} lines` };
}

/** The plugin-facing packages depend on and import no @hybridgen package but the spec. */
function onlySpec(root: string): HouseCheck {
  const names = ["@hybridgen/selectors", "@hybridgen/scheduler", "@hybridgen/memtier", "@hybridgen/kernels-cpu", "@hybridgen/kernels-cuda"];
  const ws = readWorkspaces(root).filter((w) => names.includes(w.name));
  const bad: string[] = [];
  if (!readWorkspaces(root).some((w) => w.name === "@hybridgen/spec")) bad.push("no @hybridgen/spec package");
  for (const w of ws) {
    // What the package installs with it (a test's devDependency on core is not shipped), and what its src imports.
    const pkg = JSON.parse(readFileSync(join(w.dir, "package.json"), "utf8")) as Record<string, Record<string, string> | undefined>;
    const shipped = ["dependencies", "peerDependencies", "optionalDependencies"].flatMap((f) => Object.keys(pkg[f] ?? {}));
    const other = new Set(shipped.filter((d) => d.startsWith("@hybridgen/") && d !== "@hybridgen/spec"));
    for (const f of files(join(w.dir, "src"))) for (const m of readFileSync(f, "utf8").matchAll(IMPORT)) if (m[1] !== "@hybridgen/spec" && m[1] !== w.name) other.add(m[1]!);
    if (other.size) bad.push(`${w.name} → ${[...other].sort().join(", ")}`);
  }
  return { name: "selectors/scheduler/memtier/backends import only the spec", met: bad.length === 0, detail: bad.length ? bad.join("; ") : "each imports @hybridgen/spec alone" };
}

/** Hybrid attention is assembled in one place: the files outside tests that build one (HybridAttention.attach / new HybridAttention), less its own definition. */
function assemblySites(root: string): HouseCheck {
  const sites: string[] = [];
  for (const base of ["packages", "apps"]) {
    for (const f of files(join(root, base))) {
      const rel = relative(root, f);
      if (rel.split("/").includes("test")) continue;
      const text = readFileSync(f, "utf8");
      if (/\bclass HybridAttention\b/.test(text)) continue;
      if (/HybridAttention\.attach\(|new HybridAttention\(/.test(text)) sites.push(rel);
    }
  }
  return { name: "one assembly site", met: sites.length === 1, detail: `${sites.length} file${sites.length === 1 ? "" : "s"}: ${sites.join(", ")}` };
}

/** No bench, probe or eval code in a package: no bench folder, no file named for a bench. */
function noLabInPackages(root: string): HouseCheck {
  const found: string[] = [];
  for (const w of readWorkspaces(root).filter((x) => x.kind === "package")) {
    for (const d of ["bench", "benches", "eval", "probes"]) if (existsSync(join(w.dir, d))) found.push(relative(root, join(w.dir, d)) + "/");
    for (const f of files(w.dir)) if (/(^|[-.])bench([-.]|$)/.test(basename(f)) && !relative(w.dir, f).startsWith("test/")) found.push(relative(root, f));
  }
  // The CUDA backend's bench-only switches and probes stay behind its /lab entry: none public on the class.
  const cuda = join(root, "packages/kernels-cuda/src/cuda-backend.ts");
  const LAB_ONLY = /^ {2}(?:get )?(setMatmulPath|setBatchCopies|setSkinny|skinny|matmulPathFor|readBandwidth|gatherBench|injectFault|setMatvecFusion|matvecFusion|setCudaGraphs|profilerRange|graphStats|resetGraphs|setPlanMajor|planMajor|attnDecodeIsSplitK|attnCausalUsesTensorCores|setBatchAttention)\(/gm;
  if (existsSync(cuda)) for (const m of readFileSync(cuda, "utf8").matchAll(LAB_ONLY)) found.push(`CudaBackend.${m[1]} (public; belongs behind kernels-cuda/lab)`);
  const scripts = files(join(root, "scripts")).filter((f) => !relative(join(root, "scripts"), f).startsWith("common/") && !/\/(setup|test|release)\.mjs$/.test(f));
  found.push(...scripts.map((f) => relative(root, f)));
  return { name: "no lab code in packages", met: found.length === 0, detail: found.length ? found.join(", ") : "benches, probes and evals all in apps/bench" };
}

/** No NOTES file in a package or an app other than the notebook. */
function noNotes(root: string): HouseCheck {
  const found: string[] = [];
  for (const w of readWorkspaces(root)) for (const f of files(w.dir, (n) => /NOTES/i.test(n) && n.endsWith(".md"))) found.push(relative(root, f));
  return { name: "no NOTES in packages", met: found.length === 0, detail: found.length ? found.join(", ") : "every note in apps/bench/notes/" };
}

/** The hybrid step's transports: one file each (host, staged, mapped, handed off) and a test naming each. */
function transports(root: string): HouseCheck {
  const wanted = ["host", "staged", "mapped", "handed-off"];
  const all = readWorkspaces(root).flatMap((w) => files(join(w.dir, "src")).map((f) => ({ w, f })));
  const tests = readWorkspaces(root).flatMap((w) => files(join(w.dir, "test")));
  const missing: string[] = [], untested: string[] = [];
  for (const t of wanted) {
    const pattern = new RegExp(`(^|/)${t.replace("-", "-?")}-transport\\.ts$`);
    const file = all.find(({ f }) => pattern.test(f) && /\/transports?\//.test(f));
    if (!file) {
      missing.push(t);
      continue;
    }
    const stem = basename(file.f, ".ts");
    const named = new RegExp(`^(transport-${t}|${t}-transport)\\.test\\.ts$`);
    if (!tests.some((x) => named.test(basename(x)) || readFileSync(x, "utf8").includes(`/${stem}.js`))) untested.push(stem);
  }
  const met = missing.length === 0 && untested.length === 0;
  return { name: "the step's transports each in their own file with a test", met, detail: met ? wanted.map((t) => `${t}-transport.ts`).join(", ") : [missing.length ? `no file for ${missing.join(", ")}` : "", untested.length ? `no test for ${untested.join(", ")}` : ""].filter(Boolean).join("; ") };
}

/** Every table of figures in a README is generated from a result file and matches it. */
function readmeTables(root: string): HouseCheck {
  const states = checkAllTables(root);
  const unmarked = states.flatMap((s) => s.unmarked), stale = states.flatMap((s) => s.stale);
  const marked = states.reduce((n, s) => n + s.marked, 0);
  const tested = existsSync(join(root, "apps/bench/test/readme-tables.test.ts"));
  const met = unmarked.length === 0 && stale.length === 0 && tested;
  return { name: "README tables generated and checked", met, detail: `${marked} generated; ${unmarked.length} not generated${unmarked.length ? ` (${unmarked.join(", ")})` : ""}; ${stale.length} stale${tested ? "" : "; no CI test"}` };
}

/** Every README command runs in a test, or is skipped for a stated reason. */
function readmeCommands(root: string): HouseCheck {
  const planned = readmePaths(root).flatMap((r) => shellCommands(r, readText(root, r))).map(planCommand);
  const run = planned.filter((c) => !c.skip).length;
  const tested = existsSync(join(root, "apps/bench/test/readme-commands.test.ts"));
  return { name: "README commands tested", met: tested && COMMAND_RULES.length > 0, detail: `${run} run, ${planned.length - run} skipped (GPU, network, a user's model directory, CI's own)${tested ? "" : "; no CI test"}` };
}

/** Item 3: backends by name — the CLI's --device and the benches' --backend open through the runtime's registry, never a backend's factory. */
function backendRegistry(root: string): HouseCheck {
  const runtime = files(join(root, "packages/runtime/src")).map((f) => readFileSync(f, "utf8")).join("\n");
  const bad: string[] = [];
  if (!/export function registerBackend\(/.test(runtime) || !/export async function openBackend\(/.test(runtime)) bad.push("no registerBackend/openBackend in @hybridgen/runtime");
  for (const rel of ["apps/cli/src/device-backend.ts", "apps/bench/src/open-backend.ts"]) {
    const text = existsSync(join(root, rel)) ? readFileSync(join(root, rel), "utf8") : "";
    if (!/openBackend\w*\b[^;]*from "@hybridgen\/runtime"/.test(text) || /create(Cpu|Cuda)Backend\(/.test(text)) bad.push(`${rel} does not open through the registry`);
  }
  // The CLI's plan, info and workload bench probe and describe devices through the registry too: no source of it imports kernels-cuda.
  const direct = files(join(root, "apps/cli/src")).filter((f) => /["']@hybridgen\/kernels-cuda["']/.test(readFileSync(f, "utf8")));
  if (direct.length) bad.push(`${direct.map((f) => f.slice(root.length + 1)).join(", ")} import @hybridgen/kernels-cuda (probe or describe through the registry)`);
  return { name: "backends registered by name", met: bad.length === 0, detail: bad.length ? bad.join("; ") : "registerBackend/openBackend/probeBackend; the CLI's --device, plan, info and the benches' --backend go through them" };
}

/** Item 3: the hybrid options' flags parsed by the runtime's schema — no command restates one's bounds with its own integer parser. */
function optionSchemas(root: string): HouseCheck {
  const options = join(root, "packages/runtime/src/options.ts");
  const m = existsSync(options) ? /HYBRID_OPTION_FLAGS = \{([^}]*)\}/.exec(readFileSync(options, "utf8")) : null;
  if (!m) return { name: "hybrid flags from the runtime's schema", met: false, detail: "no HYBRID_OPTION_FLAGS in packages/runtime/src/options.ts" };
  const flags = [...m[1]!.matchAll(/"?([a-z-]+)"?:/g)].map((x) => x[1]!);
  const restated: string[] = [];
  for (const f of [...files(join(root, "apps/cli/src")), ...files(join(root, "apps/bench/src"))]) {
    const text = readFileSync(f, "utf8");
    for (const flag of flags) {
      if (text.includes(`integer("${flag}"`) || text.includes(`Number(arg("${flag}"`)) restated.push(`${relative(root, f)} --${flag}`);
    }
  }
  return { name: "hybrid flags from the runtime's schema", met: restated.length === 0, detail: restated.length ? `parsed apart: ${restated.join(", ")}` : `${flags.length} flags, each parsed by parseHybridFlag` };
}

export function houseChecks(root: string): HouseCheck[] {
  return [coreLines, onlySpec, assemblySites, noLabInPackages, noNotes, transports, readmeTables, readmeCommands, backendRegistry, optionSchemas].map((c) => c(root));
}

if (import.meta.main) {
  const root = fileURLToPath(new URL("../../../", import.meta.url));
  const checks = houseChecks(root);
  for (const c of checks) console.log(`${c.met ? "met    " : "not met"}  ${c.name}: ${c.detail}`);
  console.log(`${checks.filter((c) => c.met).length} of ${checks.length} met`);
  process.exit(process.argv.includes("--strict") && checks.some((c) => !c.met) ? 1 : 0);
}
