// `npm test`: build, run every workspace's tests through turbo, sum their JSON reports.
// Ends with the plain line `N passed, N failed`; exits non-zero if anything failed or a
// workspace produced no report.
import { existsSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { ROOT, banner, die, findBun, run } from "./common/tools.mjs";
import { summarizeReport } from "./common/vitest-report.mjs";
import { workspaceManifests } from "./common/workspaces.mjs";

const bun = findBun();
if (!bun) die("bun not found", "run `npm run setup` first");
// Before set-up there is no turbo (nor any other dependency): say what to do, not "turbo: command not found".
if (!existsSync(join(ROOT, "node_modules", ".bin", "turbo"))) die("the dependencies are not installed", "run `npm run setup` first");

/** Workspace dirs (from the root package.json globs "dir/*") whose package has a test script. */
function testedWorkspaces() {
  return workspaceManifests(ROOT).filter((w) => w.manifest.scripts?.test).map((w) => ({ dir: w.dir, name: w.manifest.name }));
}

const workspaces = testedWorkspaces();
// A report left from an earlier run must not be counted as this run's.
for (const w of workspaces) rmSync(join(w.dir, "test-report.json"), { force: true });

banner("build");
if (run(bun.bin, ["run", "build"]).code !== 0) die("the build failed; tests not run", "see the messages above");

banner("tests (turbo run test)");
// --continue: one failing package must not hide the results of the others.
const turbo = run(bun.bin, ["x", "turbo", "run", "test", "--continue", "--concurrency=2", "--output-logs=new-only"]);

let passed = 0;
let failed = 0;
const lines = [];
for (const w of workspaces) {
  const reportPath = join(w.dir, "test-report.json");
  if (!existsSync(reportPath)) {
    failed += 1;
    lines.push(`${w.name.padEnd(26)} no test-report.json (the test run crashed or did not start)`);
    continue;
  }
  const s = summarizeReport(JSON.parse(readFileSync(reportPath, "utf8")));
  passed += s.passed;
  failed += s.failed;
  lines.push(`${w.name.padEnd(26)} ${String(s.passed).padStart(4)} passed ${String(s.failed).padStart(3)} failed${s.skipped ? ` ${s.skipped} skipped` : ""}${s.note ? `  (${s.note})` : ""}`);
}
if (turbo.code !== 0 && failed === 0) {
  // Every report is clean yet turbo failed: a task outside the reports broke; count it.
  failed += 1;
  lines.push(`turbo run test exited ${turbo.code} although every report passed`);
}

banner("summary");
process.stdout.write(`${lines.join("\n")}\n${passed} passed, ${failed} failed\n`);
process.exit(failed > 0 ? 1 : 0);
