// Reads a vitest JSON report (the `json` reporter, Jest-compatible shape) into counts.

/**
 * { passed, failed, skipped, note }. A test file that failed to load (import error, syntax
 * error) has no test results but a failed status: it counts as one failure, so a package
 * that cannot even start is never reported as green. A report with no tests at all is a
 * failure too.
 */
export function summarizeReport(report) {
  let passed = 0;
  let failed = 0;
  let skipped = 0;
  const notes = [];
  for (const file of report.testResults ?? []) {
    let fileFailed = 0;
    for (const a of file.assertionResults ?? []) {
      if (a.status === "passed") passed += 1;
      else if (a.status === "failed") fileFailed += 1;
      else skipped += 1;
    }
    if (file.status === "failed" && fileFailed === 0) {
      fileFailed = 1;
      notes.push(`${file.name.split("/").slice(-2).join("/")} failed to run`);
    }
    failed += fileFailed;
  }
  if (passed + failed + skipped === 0) {
    failed += 1;
    notes.push("no tests ran");
  }
  return { passed, failed, skipped, note: notes.join("; ") };
}
