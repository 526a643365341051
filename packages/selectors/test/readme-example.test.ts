// The README's plugin example, run as written: its `// FILE.ts` code blocks are written out and
// main.ts is imported; every console.log must print what its trailing comment says.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it, vi } from "vitest";

const here = dirname(fileURLToPath(import.meta.url));
const readme = readFileSync(join(here, "../README.md"), "utf8");
// Inside the package, so the example's imports resolve as they would for a user of the package.
const tmp = mkdtempSync(join(here, ".readme-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

/** The ```ts blocks whose first line is `// NAME.ts`, by name. */
function fileBlocks(md: string): Map<string, string> {
  const files = new Map<string, string>();
  for (const m of md.matchAll(/```ts\n\/\/ ([\w-]+\.ts)\n([\s\S]*?)```/g)) files.set(m[1]!, m[2]!);
  return files;
}

describe("the README's plugin example", () => {
  it("has the plugin and the program, and prints what its comments say", async () => {
    const files = fileBlocks(readme);
    expect([...files.keys()].sort()).toEqual(["main.ts", "strided.ts"]);
    for (const [name, text] of files) writeFileSync(join(tmp, name), text);
    const expected = [...files.get("main.ts")!.matchAll(/console\.log\(.*\); \/\/ (.*)$/gm)].map((m) => m[1]);
    expect(expected.length).toBeGreaterThan(1);
    const printed: string[] = [];
    const log = vi.spyOn(console, "log").mockImplementation((...args: unknown[]) => void printed.push(args.map(String).join(" ")));
    try {
      await import(join(tmp, "main.ts"));
    } finally {
      log.mockRestore();
    }
    expect(printed).toEqual(expected);
  });

  it("names the CLI's --selector forms that the CLI accepts", () => {
    expect(readme).toContain("--selector ./strided.ts --selector-options '{\"stride\":4}'");
    expect(readme).toContain("--selector topk+./strided.ts");
  });
});
