// The open registry and plugins loaded by module path or package name, as `--selector` names them.
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { z } from "zod";
import {
  builtinSelectors, createSelector, defineSelector, isBuiltinSelector, loadSelectorSpec, lookupSelector, quest, registerSelector,
  selectorFromSpec, selectorNames, unregisterSelector,
} from "../src/index.js";

const here = dirname(fileURLToPath(import.meta.url));
// Inside the package, so the plugins' own imports of @hybridgen/selectors and zod resolve as an installed plugin's would.
const tmp = mkdtempSync(join(here, ".plugins-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const PLUGIN = (name: string, extra = "") => `import { z } from "zod";
import { defineSelector } from "@hybridgen/selectors";
export default defineSelector({
  name: "${name}",
  timings: ["pre"],
  options: z.object({ stride: z.number().int().positive().default(8) }),
  select: ({ offloaded, k }, { stride }) => {
    const ids = [];
    for (let slot = offloaded - 1; slot >= 0 && ids.length < k; slot -= stride) ids.push(slot);
    return { kind: "shared", ids };
  },
});
${extra}`;

function write(rel: string, text: string): string {
  const path = join(tmp, rel);
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, text);
  return path;
}

const nothing = () => ({ kind: "shared" as const, ids: [] });

describe("registerSelector", () => {
  it("registers a plugin next to the built-ins, which it cannot shadow", () => {
    expect(selectorNames().slice(0, Object.keys(builtinSelectors).length)).toEqual(Object.keys(builtinSelectors));
    const mine = defineSelector({ name: "reg-mine", timings: ["pre"], select: nothing });
    registerSelector(mine);
    registerSelector(mine); // the same factory again: no-op
    expect(lookupSelector("reg-mine")).toBe(mine);
    expect(selectorNames()).toContain("reg-mine");
    expect(isBuiltinSelector("reg-mine")).toBe(false);
    expect(createSelector("reg-mine").name).toBe("reg-mine");
    expect(selectorFromSpec("topk+reg-mine").name).toBe("topk+reg-mine");

    const other = defineSelector({ name: "reg-mine", timings: ["post"], select: nothing });
    expect(() => registerSelector(other)).toThrow('registerSelector: a selector named "reg-mine" is registered already (pass { replace: true } to replace it)');
    registerSelector(other, { replace: true });
    expect(lookupSelector("reg-mine")).toBe(other);
    expect(unregisterSelector("reg-mine")).toBe(true);
    expect(lookupSelector("reg-mine")).toBeUndefined();

    const fake = defineSelector({ name: "topk", timings: ["pre"], select: nothing });
    expect(() => registerSelector(fake, { replace: true })).toThrow(`registerSelector: "topk" is a built-in selector's name; give the plugin another`);
    expect(() => unregisterSelector("quest")).toThrow('unregisterSelector: "quest" is a built-in selector');
    expect(() => registerSelector((() => 1) as never)).toThrow("registerSelector: expects a selector factory made with defineSelector, got a function without defineSelector's mark");
    expect(() => registerSelector({ select: nothing } as never)).toThrow("got an object");
  });

  it("options reach the registered factory, checked by its schema", () => {
    registerSelector(defineSelector({ name: "reg-opts", timings: ["pre"], options: z.object({ n: z.number() }), select: nothing }));
    expect(() => selectorFromSpec("reg-opts", { n: 1, m: 2 })).toThrow('selector "reg-opts" options: unknown key "m" (it takes n)');
    expect(() => selectorFromSpec("topk+streaming", { shared: true })).toThrow(/options apply to one selector, not a pair/);
  });
});

describe("loadSelectorSpec", () => {
  it("loads a default export by path, a named one by PATH:export, and registers them by name", async () => {
    write("strided.ts", PLUGIN("load-strided"));
    write("many.ts", `${PLUGIN("load-many-a")}\nexport const second = defineSelector({ name: "load-many-b", timings: ["pre"], select: () => ({ kind: "shared", ids: [] }) });\n`);
    expect(await loadSelectorSpec("./strided.ts", { cwd: tmp })).toBe("load-strided");
    expect(await loadSelectorSpec(join(tmp, "strided.ts"))).toBe("load-strided"); // again, absolute: the same factory
    expect(await loadSelectorSpec("./many.ts:second", { cwd: tmp })).toBe("load-many-b");
    expect(await loadSelectorSpec("./many.ts", { cwd: tmp })).toBe("load-many-a");
    expect(await loadSelectorSpec("topk+./strided.ts", { cwd: tmp })).toBe("topk+load-strided");
    const sel = selectorFromSpec("load-strided", { stride: 4 });
    expect(sel.timings).toEqual(["pre"]);
  });

  it("loads a package by name from the project's node_modules, and a package's named export", async () => {
    const project = join(tmp, "project");
    // The plugin project has @hybridgen/selectors and zod installed, as `bun add` would leave them.
    mkdirSync(join(project, "node_modules/@hybridgen"), { recursive: true });
    symlinkSync(join(here, ".."), join(project, "node_modules/@hybridgen/selectors"));
    symlinkSync(join(here, "../node_modules/zod"), join(project, "node_modules/zod"));
    write("project/node_modules/hg-plugin-strided/package.json", JSON.stringify({ name: "hg-plugin-strided", type: "module", exports: { ".": "./index.js" } }));
    write("project/node_modules/hg-plugin-strided/index.js", PLUGIN("pkg-strided", 'export const wide = defineSelector({ name: "pkg-wide", timings: ["pre"], select: () => ({ kind: "shared", ids: [] }) });'));
    expect(await loadSelectorSpec("hg-plugin-strided", { cwd: project })).toBe("pkg-strided");
    expect(await loadSelectorSpec("hg-plugin-strided:wide", { cwd: project })).toBe("pkg-wide");
    // Its defineSelector is the installed package's copy, not this one: the mark is shared, the built-in mark is not.
    expect(selectorFromSpec("pkg-strided", { stride: 2 }).name).toBe("pkg-strided");
    expect(lookupSelector("quest")).toBe(quest);
  });

  it("every failure is one line naming the spec", async () => {
    write("none.ts", "export const answer = 42;\n");
    write("two.ts", `${PLUGIN("two-a").replace("export default", "export const a =")}\nexport const b = defineSelector({ name: "two-b", timings: ["pre"], select: () => ({ kind: "shared", ids: [] }) });\n`);
    write("clash.ts", PLUGIN("topk"));
    write("broken.ts", "export default (;\n");
    const cases: [string, string | RegExp][] = [
      ["./missing.ts", `selector "./missing.ts": no module at ${join(tmp, "missing.ts")}`],
      ["./none.ts", 'selector "./none.ts": the module has no export "default"'],
      ["./none.ts:answer", 'selector "./none.ts:answer": export "answer" is not a selector made with defineSelector (got number)'],
      ["./two.ts", 'selector "./two.ts": the module exports several selectors (a, b); name one, e.g. ./two.ts:a'],
      ["./clash.ts", `registerSelector: "topk" is a built-in selector's name; give the plugin another`],
      ["./broken.ts", /^selector "\.\/broken\.ts": loading .*broken\.ts failed: /],
      ["no-such-selector-pkg", /^unknown selector "no-such-selector-pkg": not a registered name \(topk, .*\) and no package "no-such-selector-pkg" installed from /],
      ["topk+", 'selector "topk+": a pair is POST+PRE, e.g. topk+streaming'],
    ];
    for (const [spec, msg] of cases) await expect(loadSelectorSpec(spec, { cwd: tmp }), spec).rejects.toThrow(msg);
  });
});
