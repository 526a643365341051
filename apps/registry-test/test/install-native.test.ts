/**
 * kernels-cpu's install step as it runs in an installed package (no src/): a prebuilt library
 * that fits is kept, none fitting builds native/ with $CC, and no compiler is one error line.
 * The build runs through a recording stand-in compiler (the real gcc build takes a minute and
 * is what `bun run build` does in every CI run).
 */
import { chmodSync, cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { runCommand } from "../src/run.js";
import { ROOT } from "../src/workspace-packages.js";

const SOURCE = join(ROOT, "packages", "kernels-cpu");
const PLATFORM = `${process.platform}-${process.arch}`;
let work: string;
let pkg: string;

/** A compiler that answers the probe, writes every -o it is given and logs its arguments. */
function fakeCompiler(log: string): string {
  const path = join(work, "fake-cc");
  writeFileSync(
    path,
    `#!/bin/sh\necho "$*" >> ${JSON.stringify(log)}\nout=""\nwhile [ $# -gt 0 ]; do if [ "$1" = "-o" ]; then out="$2"; fi; shift; done\n` +
      `if [ -n "$out" ] && [ "$out" != /dev/null ]; then echo built > "$out"; fi\nexit 0\n`,
  );
  chmodSync(path, 0o755);
  return path;
}

function install(env: Record<string, string>) {
  const { HYBRIDGEN_KERNELS_CPU_LIB: _, ...rest } = process.env;
  return runCommand("node", [join(pkg, "scripts", "install-native.mjs")], pkg, { env: { ...rest, ...env } });
}

beforeEach(() => {
  work = mkdtempSync(join(tmpdir(), "hybridgen-install-native-"));
  pkg = join(work, "node_modules", "@hybridgen", "kernels-cpu");
  mkdirSync(pkg, { recursive: true });
  // What the published package holds, less the prebuilt library: package.json, scripts/, native/.
  cpSync(join(SOURCE, "package.json"), join(pkg, "package.json"));
  cpSync(join(SOURCE, "scripts"), join(pkg, "scripts"), { recursive: true });
  cpSync(join(SOURCE, "native"), join(pkg, "native"), { recursive: true });
});

afterEach(() => rmSync(work, { recursive: true, force: true }));

describe("@hybridgen/kernels-cpu install step", () => {
  it("keeps a prebuilt library that fits this platform and builds nothing", () => {
    mkdirSync(join(pkg, "prebuilds", PLATFORM), { recursive: true });
    writeFileSync(join(pkg, "prebuilds", PLATFORM, "libhgcpu.so"), "prebuilt");
    const log = join(work, "cc.log");
    const r = install({ CC: fakeCompiler(log) });
    expect(r.status, r.stderr).toBe(0);
    expect(existsSync(log)).toBe(false);
    expect(existsSync(join(pkg, "lib"))).toBe(false);
  });

  it("builds lib/libhgcpu.so from native/ with $CC when only another platform's prebuilt is shipped", () => {
    mkdirSync(join(pkg, "prebuilds", "linux-other"), { recursive: true });
    writeFileSync(join(pkg, "prebuilds", "linux-other", "libhgcpu.so"), "another platform");
    const log = join(work, "cc.log");
    const r = install({ CC: fakeCompiler(log) });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stderr).toContain(`no prebuilt native library for ${PLATFORM}: building it from source`);
    expect(readFileSync(join(pkg, "lib", "libhgcpu.so"), "utf8")).toBe("built\n");
    const calls = readFileSync(log, "utf8").trim().split("\n");
    // Every C file of native/ is compiled, and one -shared link makes the library.
    for (const c of readdirSync(join(pkg, "native")).filter((f) => f.endsWith(".c"))) {
      expect(calls.some((line) => line.includes(`/native/${c} `)), c).toBe(true);
    }
    expect(calls.filter((line) => line.startsWith("-shared")).length).toBe(1);
  });

  it("without a working compiler fails with one error line naming the platform and the fix", () => {
    const r = install({ CC: join(work, "no-such-compiler") });
    expect(r.status).toBe(1);
    const lines = r.stderr.trim().split("\n");
    expect(lines).toHaveLength(1);
    expect(lines[0]).toBe(
      `error: @hybridgen/kernels-cpu: no prebuilt native library for ${PLATFORM} and no working C compiler ('${join(work, "no-such-compiler")}') to build one: ` +
        "install gcc (or set CC) and reinstall, or set HYBRIDGEN_KERNELS_CPU_LIB",
    );
    expect(existsSync(join(pkg, "lib", "libhgcpu.so"))).toBe(false);
  });

  it("does nothing in the repository's own checkout (bun run build builds the library there)", () => {
    const r = runCommand("node", [join(SOURCE, "scripts", "install-native.mjs")], SOURCE, { env: { ...process.env, CC: join(work, "no-such-compiler") } });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stderr).toBe("");
  });
});
