import { closeSync, ftruncateSync, openSync, readFileSync, rmSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { HybridgenError, openSafetensors, writeSafetensors, type SafetensorsTensor } from "../src/index.js";
import { bytesOf, randomF32, rng, tempDir, removeTempDirs } from "./model-io-fixtures.js";

afterAll(removeTempDirs);

const dir = tempDir("hg-st-");

/** A file from a raw header (object or literal JSON text) and `dataBytes` of random data. */
function rawFile(name: string, header: unknown, dataBytes: number, headerLenOverride?: bigint): string {
  const json = new TextEncoder().encode(typeof header === "string" ? header : JSON.stringify(header));
  const buf = new Uint8Array(8 + json.length + dataBytes);
  new DataView(buf.buffer).setBigUint64(0, headerLenOverride ?? BigInt(json.length), true);
  buf.set(json, 8);
  const r = rng(dataBytes + 1);
  for (let i = 8 + json.length; i < buf.length; i++) buf[i] = Math.floor(r() * 256);
  const p = join(dir, name);
  writeFileSync(p, buf);
  return p;
}

function expectError(path: string, pattern: RegExp): void {
  let err: unknown;
  try {
    openSafetensors(path).close();
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(HybridgenError);
  const msg = (err as Error).message;
  expect(msg).toMatch(pattern);
  expect(msg).toContain(path);
  expect(msg).not.toContain("\n");
}

describe("writeSafetensors → openSafetensors", () => {
  it("round-trips f32/f16/bf16 tensors and metadata, aligned, without copying", () => {
    const r = rng(42);
    const u16 = (n: number) => Uint16Array.from({ length: n }, () => Math.floor(r() * 65536));
    const tensors: SafetensorsTensor[] = [
      { name: "odd.f16", dtype: "f16", shape: [3], data: bytesOf(u16(3)) },
      { name: "w.f32", dtype: "f32", shape: [5, 7], data: bytesOf(randomF32(r, 35)) },
      { name: "b.bf16", dtype: "bf16", shape: [2, 3, 1], data: bytesOf(u16(6)) },
      { name: "empty", dtype: "f32", shape: [0, 4], data: new Uint8Array(0) },
      { name: "scalar", dtype: "f32", shape: [], data: bytesOf(randomF32(r, 1)) },
    ];
    const path = join(dir, "rt.safetensors");
    writeSafetensors(path, tensors, { format: "pt", note: "hi" });

    const headerLen = Number(new DataView(readFileSync(path).buffer).getBigUint64(0, true));
    expect((8 + headerLen) % 8).toBe(0);

    using f = openSafetensors(path);
    expect(f.metadata).toEqual({ format: "pt", note: "hi" });
    expect(f.names().sort()).toEqual(tensors.map((t) => t.name).sort());
    for (const t of tensors) {
      const v = f.get(t.name)!;
      expect(v.dtype).toBe(t.dtype);
      expect(v.shape).toEqual(t.shape);
      expect(Array.from(v.bytes)).toEqual(Array.from(t.data));
      // The mapping is page-aligned and tensors are laid out largest element first.
      expect(v.bytes.byteOffset % (t.dtype === "f32" ? 4 : 2)).toBe(0);
    }
    expect(f.get("missing")).toBeUndefined();
    // A view of the map, not a copy: two gets share the same buffer.
    expect(f.get("w.f32")!.bytes.buffer).toBe(f.get("b.bf16")!.bytes.buffer);
    const w = new Float32Array(f.get("w.f32")!.bytes.slice().buffer);
    expect(Array.from(w)).toEqual(Array.from(new Float32Array(tensors[1].data.slice().buffer)));
  });

  it("maps files over 4 GiB (Bun's limit for one mapping) in windows of tensors", () => {
    // A sparse 4.5 GiB file: two 2 GiB tensors and a small one with known values at the end.
    const G = 2 ** 31;
    const header = {
      a: { dtype: "F32", shape: [G / 4], data_offsets: [0, G] },
      b: { dtype: "F16", shape: [G / 2], data_offsets: [G, 2 * G] },
      c: { dtype: "F32", shape: [3, 5], data_offsets: [2 * G, 2 * G + 60] },
      d: { dtype: "F32", shape: [2 ** 27], data_offsets: [2 * G + 60, 2 * G + 60 + 2 ** 29] },
    };
    const json = new TextEncoder().encode(JSON.stringify(header));
    const len = new Uint8Array(8);
    new DataView(len.buffer).setBigUint64(0, BigInt(json.length), true);
    const dataStart = 8 + json.length;
    const values = randomF32(rng(9), 15);
    const path = join(dir, "big.safetensors");
    const fd = openSync(path, "w");
    try {
      writeSync(fd, len, 0, 8, 0);
      writeSync(fd, json, 0, json.length, 8);
      ftruncateSync(fd, dataStart + 2 * G + 60 + 2 ** 29);
      writeSync(fd, bytesOf(values), 0, 60, dataStart + 2 * G);
      writeSync(fd, Uint8Array.of(7), 0, 1, dataStart + G - 1); // last byte of a
      writeSync(fd, Uint8Array.of(9), 0, 1, dataStart + G); // first byte of b
    } finally {
      closeSync(fd);
    }
    try {
      using f = openSafetensors(path);
      const a = f.get("a")!.bytes;
      const b = f.get("b")!.bytes;
      expect([a.length, b.length, f.get("d")!.bytes.length]).toEqual([G, G, 2 ** 29]);
      expect([a[G - 1], b[0], b[1]]).toEqual([7, 9, 0]);
      expect(Array.from(new Float32Array(f.get("c")!.bytes.slice().buffer))).toEqual(Array.from(values));
    } finally {
      rmSync(path, { force: true }); // unlinking a mapped file is safe; only truncation is not
    }
  });

  it("errors on use after close", () => {
    const path = join(dir, "closed.safetensors");
    writeSafetensors(path, [{ name: "x", dtype: "f32", shape: [2], data: new Uint8Array(8) }]);
    const f = openSafetensors(path);
    f.close();
    expect(f.closed).toBe(true);
    expect(() => f.get("x")).toThrow(/after close/);
  });

  it("rejects bad tensors on write", () => {
    const p = join(dir, "w.safetensors");
    expect(() => writeSafetensors(p, [{ name: "x", dtype: "f32", shape: [3], data: new Uint8Array(8) }])).toThrow(/has 8 bytes but f32 \[3\] needs 12/);
    const t = { name: "x", dtype: "f32" as const, shape: [1], data: new Uint8Array(4) };
    expect(() => writeSafetensors(p, [t, t])).toThrow(/duplicate tensor name x/);
  });
});

describe("openSafetensors rejects malformed files with one clear line", () => {
  const ok = { a: { dtype: "F32", shape: [2, 2], data_offsets: [0, 16] } };

  it("missing, empty and tiny files", () => {
    expectError(join(dir, "nope.safetensors"), /cannot open \(ENOENT\)/);
    expectError(rawFile("empty.st", "", 0, 0n), /header is not a JSON object/);
    const tiny = join(dir, "tiny.st");
    writeFileSync(tiny, new Uint8Array(5));
    expectError(tiny, /not a safetensors file \(5 bytes/);
    const zero = join(dir, "zero.st");
    writeFileSync(zero, new Uint8Array(0));
    expectError(zero, /not a safetensors file \(0 bytes/);
  });

  it("a header length that lies (past the end of the file)", () => {
    expectError(rawFile("lie.st", ok, 16, 10_000n), /header length 10000 exceeds the file/);
    expectError(rawFile("huge.st", ok, 16, 2n ** 63n), /exceeds the file/);
  });

  it("bad JSON and non-object headers", () => {
    expectError(rawFile("json.st", '{"a": {"dtype": "F32",', 16), /header is not valid JSON/);
    expectError(rawFile("arr.st", "[1, 2]", 0), /header is not a JSON object/);
    expectError(rawFile("ent.st", { a: 5 }, 0), /tensor a: entry is not an object/);
  });

  it("unknown dtype", () => {
    expectError(rawFile("i64.st", { weird: { dtype: "I64", shape: [2], data_offsets: [0, 16] } }, 16), /unsupported dtype I64 for tensor weird/);
  });

  it("bad shapes and offsets", () => {
    expectError(rawFile("neg.st", { a: { dtype: "F32", shape: [-1], data_offsets: [0, 4] } }, 4), /tensor a: shape must be an array of non-negative integers/);
    expectError(rawFile("frac.st", { a: { dtype: "F32", shape: [1.5], data_offsets: [0, 4] } }, 4), /shape must be/);
    expectError(rawFile("offs.st", { a: { dtype: "F32", shape: [2], data_offsets: [0] } }, 8), /tensor a: data_offsets must be \[begin, end\]/);
    expectError(rawFile("rev.st", { a: { dtype: "F32", shape: [0], data_offsets: [8, 0] } }, 8), /end 0 < begin 8/);
  });

  it("offsets that lie about the size", () => {
    expectError(rawFile("size.st", { a: { dtype: "F32", shape: [2, 2], data_offsets: [0, 12] } }, 12), /tensor a: data_offsets \[0, 12\] hold 12 bytes but F32 \[2,2\] needs 16/);
    expectError(rawFile("bf.st", { a: { dtype: "BF16", shape: [3], data_offsets: [0, 12] } }, 12), /needs 6/);
  });

  it("a truncated file", () => {
    expectError(rawFile("trunc.st", ok, 10), /tensor a: data_offsets end 16 is past the data section \(10 bytes\)/);
    // A real file cut short.
    const full = join(dir, "full.safetensors");
    writeSafetensors(full, [{ name: "x", dtype: "f32", shape: [64], data: bytesOf(randomF32(rng(3), 64)) }]);
    const bytes = readFileSync(full);
    const cut = join(dir, "cut.safetensors");
    writeFileSync(cut, bytes.subarray(0, bytes.length - 100));
    expectError(cut, /tensor x: .*past the data section/);
    writeFileSync(cut, bytes.subarray(0, 20));
    expectError(cut, /header length \d+ exceeds the file \(20 bytes\)/);
  });

  it("overlapping tensors, gaps and unindexed trailing bytes", () => {
    const overlap = {
      a: { dtype: "F32", shape: [4], data_offsets: [0, 16] },
      b: { dtype: "F32", shape: [4], data_offsets: [8, 24] },
    };
    expectError(rawFile("ov.st", overlap, 24), /tensors a and b overlap/);
    const gap = { a: { dtype: "F32", shape: [1], data_offsets: [0, 4] }, b: { dtype: "F32", shape: [1], data_offsets: [8, 12] } };
    expectError(rawFile("gap.st", gap, 12), /gap of 4 unindexed bytes before tensor b/);
    expectError(rawFile("tail.st", ok, 20), /4 bytes after the last tensor are not indexed/);
  });

  it("metadata that is not a string map", () => {
    expectError(rawFile("meta.st", { __metadata__: { n: 1 }, ...ok }, 16), /__metadata__\.n is not a string/);
  });
});
