/**
 * Property-based fuzzing of the --prompts JSONL reader: lines of objects with the real keys and
 * any values, misspelt keys, non-objects, broken JSON, CR/LF mixes, and raw bytes from a file.
 * Each file reads into valid prompts or fails with one HybridgenError line.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { HybridgenError } from "@hybridgen/core";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import { parsePromptsJsonl, readPromptsJsonl } from "../src/read-prompts-jsonl.js";

// One seed per run of the suite, so CI is repeatable; HYBRIDGEN_FUZZ_SEED explores others.
fc.configureGlobal({ seed: Number(process.env.HYBRIDGEN_FUZZ_SEED ?? 20261203) });

const dir = mkdtempSync(join(tmpdir(), "hybridgen-fuzz-jsonl-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function readsOrOneLineError(read: () => ReturnType<typeof parsePromptsJsonl>): void {
  try {
    const prompts = read();
    expect(prompts.length).toBeGreaterThan(0);
    for (const p of prompts) {
      expect(typeof p.prompt).toBe("string");
      expect(Number.isInteger(p.line) && p.line >= 1).toBe(true);
      if (p.max_tokens !== undefined) expect(Number.isInteger(p.max_tokens) && p.max_tokens >= 1).toBe(true);
      if (p.seed !== undefined) expect(p.seed >= 0 && p.seed < 2 ** 32).toBe(true);
      if (p.temperature !== undefined) expect(p.temperature >= 0 && p.temperature <= 100).toBe(true);
    }
  } catch (e) {
    if (!(e instanceof HybridgenError)) throw new Error(`not a HybridgenError: ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}`);
    expect(e.message).not.toMatch(/[\n\r]/);
    expect(e.message.length).toBeLessThan(1000);
  }
}

const value = fc.oneof(fc.jsonValue({ maxDepth: 2 }), fc.string({ unit: "binary" }), fc.double(), fc.integer(), fc.constantFrom(-1, 0, 1, 2 ** 32, 1.5, 1e308));
const key = fc.oneof(fc.constantFrom("prompt", "max_tokens", "temperature", "seed"), fc.constantFrom("promt", "max-tokens", "Prompt", "__proto__", "constructor"), fc.string({ unit: "binary", maxLength: 8 }));
const objectLine = fc.dictionary(key, value, { maxKeys: 5 }).map((o) => JSON.stringify(o));
const goodLine = fc.record({ prompt: fc.string({ unit: "binary" }), max_tokens: fc.integer({ min: 1, max: 512 }) }, { requiredKeys: ["prompt"] }).map((o) => JSON.stringify(o));
const line = fc.oneof(
  { arbitrary: goodLine, weight: 3 },
  { arbitrary: objectLine, weight: 3 },
  { arbitrary: fc.jsonValue().map((v) => JSON.stringify(v) ?? "null"), weight: 1 },
  { arbitrary: fc.string({ unit: "binary", maxLength: 30 }), weight: 1 },
  { arbitrary: fc.constantFrom("", "   ", "{", '{"prompt": "a"', '{"prompt": "a"}}', "\r", '{"prompt":"\\ud800"}'), weight: 1 },
);
const eol = fc.constantFrom("\n", "\r\n", "\r");

describe("--prompts JSONL under fuzzing", () => {
  it("lines of any kind, joined by any line ending", () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(line, eol), { maxLength: 8 }), (lines) => {
        readsOrOneLineError(() => parsePromptsJsonl(lines.map(([l, e]) => l + e).join(""), "prompts.jsonl"));
      }),
      { numRuns: 2000 },
    );
  });

  it("raw bytes in the file, valid UTF-8 or not", () => {
    fc.assert(
      fc.property(fc.array(goodLine, { minLength: 1, maxLength: 4 }), fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { maxLength: 4 }), (lines, edits) => {
        const bytes = new TextEncoder().encode(lines.join("\n"));
        for (const [at, v] of edits) if (bytes.length > 0) bytes[at % bytes.length] = v;
        const path = join(dir, "prompts.jsonl");
        writeFileSync(path, bytes);
        readsOrOneLineError(() => readPromptsJsonl(path));
      }),
      { numRuns: 500 },
    );
  });
});
