/**
 * Property-based fuzzing of the safetensors reader: valid files written by writeSafetensors,
 * then mutated (random bytes, a lying header length, truncation, any JSON in any header field).
 * Each opens with every tensor in bounds, or fails with one HybridgenError line; nothing is
 * allocated in proportion to a size the file claims.
 */
import { mkdtempSync, rmSync, unlinkSync, writeFileSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import { openSafetensors, writeSafetensors, type SafetensorsTensor } from "../src/safetensors.js";
import { keyPaths, loadsOrOneLineError, withValueAt } from "./fuzz-helpers.js";

// One seed per run of the suite, so CI is repeatable; HYBRIDGEN_FUZZ_SEED explores others.
fc.configureGlobal({ seed: Number(process.env.HYBRIDGEN_FUZZ_SEED ?? 20261203) });

const dir = mkdtempSync(join(tmpdir(), "hybridgen-fuzz-st-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let serial = 0;

const BYTES: Record<string, number> = { f32: 4, f16: 2, bf16: 2 };

const tensorArb = fc.record({
  name: fc.string({ unit: "binary", minLength: 1, maxLength: 12 }).filter((s) => s !== "__metadata__"),
  dtype: fc.constantFrom("f32", "f16", "bf16") as fc.Arbitrary<"f32" | "f16" | "bf16">,
  shape: fc.array(fc.integer({ min: 0, max: 5 }), { maxLength: 3 }),
});

/** The bytes of a valid safetensors file holding `specs` (unique names). */
function validFile(specs: { name: string; dtype: "f32" | "f16" | "bf16"; shape: number[] }[]): Uint8Array {
  const seen = new Set<string>();
  const tensors: SafetensorsTensor[] = [];
  for (const s of specs) {
    if (seen.has(s.name)) continue;
    seen.add(s.name);
    const n = s.shape.reduce((a, b) => a * b, 1) * BYTES[s.dtype];
    tensors.push({ ...s, data: new Uint8Array(n).map((_, i) => i & 0xff) });
  }
  const path = join(dir, `valid-${serial++}.safetensors`);
  writeSafetensors(path, tensors, { format: "pt" });
  const bytes = readFileSync(path);
  unlinkSync(path);
  return bytes;
}

/** Opens `bytes` as a file; a file that opens must hand out views inside it, of the size the header says. */
function openBytes(bytes: Uint8Array): "ok" | "error" {
  const path = join(dir, `case-${serial++}.safetensors`);
  writeFileSync(path, bytes);
  try {
    return loadsOrOneLineError(() => {
      using f = openSafetensors(path);
      for (const t of f.tensors.values()) {
        const view = f.get(t.name)!;
        expect(view.bytes.length).toBe(t.end - t.begin);
        expect(8 + t.end).toBeLessThanOrEqual(bytes.length);
      }
    });
  } finally {
    unlinkSync(path);
  }
}

const RUNS = 600;

describe("safetensors reader under fuzzing", () => {
  it("random byte changes anywhere in a valid file", () => {
    fc.assert(
      fc.property(fc.array(tensorArb, { maxLength: 4 }), fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { minLength: 1, maxLength: 8 }), (specs, edits) => {
        const bytes = validFile(specs);
        for (const [at, value] of edits) bytes[at % bytes.length] = value;
        openBytes(bytes);
      }),
      { numRuns: RUNS },
    );
  });

  it("a lying header length (any u64) and truncation at any point", () => {
    fc.assert(
      fc.property(fc.array(tensorArb, { maxLength: 4 }), fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }), fc.nat(), fc.boolean(), (specs, length, cut, lie) => {
        const bytes = validFile(specs);
        if (lie) new DataView(bytes.buffer, bytes.byteOffset).setBigUint64(0, length, true);
        const rss = process.memoryUsage().rss;
        openBytes(lie ? bytes : bytes.subarray(0, cut % (bytes.length + 1)));
        // Nothing near a claimed multi-GB header was allocated.
        expect(process.memoryUsage().rss - rss).toBeLessThan(256 * 1024 * 1024);
      }),
      { numRuns: RUNS },
    );
  });

  it("any JSON value in place of any header field", () => {
    fc.assert(
      fc.property(fc.array(tensorArb, { minLength: 1, maxLength: 3 }), fc.nat(), fc.jsonValue(), (specs, pick, value) => {
        const bytes = validFile(specs);
        const len = Number(new DataView(bytes.buffer, bytes.byteOffset).getBigUint64(0, true));
        const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + len)));
        const paths = keyPaths(header);
        const mutated = withValueAt(header, paths[pick % paths.length], value);
        const json = new TextEncoder().encode(JSON.stringify(mutated));
        const out = new Uint8Array(8 + json.length + bytes.length - 8 - len);
        new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
        out.set(json, 8);
        out.set(bytes.subarray(8 + len), 8 + json.length);
        openBytes(out);
      }),
      { numRuns: 400 },
    );
  });
});
