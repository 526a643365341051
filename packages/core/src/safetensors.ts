/**
 * safetensors reader (memory-mapped, validated) and writer.
 *
 * Layout: u64 LE header length N, N bytes of JSON, then the data section. The JSON maps
 * tensor names to {dtype, shape, data_offsets: [begin, end]} (offsets relative to the data
 * section) plus an optional "__metadata__" map of strings. Everything in the header is
 * checked before any view is handed out, so a lying header is an error, never an
 * out-of-bounds read.
 */
import { closeSync, fstatSync, openSync, readSync, writeSync } from "node:fs";
import { DTYPE_BYTES, type DType, HybridgenError, fail } from "@hybridgen/spec";
import type { WeightSource, WeightView } from "./model-files.js";

/** safetensors dtype names we can load, and the core dtype each maps to. */
const FROM_ST: Readonly<Record<string, DType>> = { F32: "f32", F16: "f16", BF16: "bf16" };
const TO_ST: Readonly<Record<DType, string>> = { f32: "F32", f16: "F16", bf16: "BF16" };

/** Same cap as the reference implementation: a bigger header is corrupt, not a model. */
const MAX_HEADER_BYTES = 100_000_000;

export interface SafetensorsTensorInfo {
  readonly name: string;
  readonly dtype: DType;
  readonly shape: readonly number[];
  /** Byte range within the data section. */
  readonly begin: number;
  readonly end: number;
}

/** A tensor to write: raw little-endian bytes of `dtype`, `product(shape)` elements. */
export interface SafetensorsTensor {
  readonly name: string;
  readonly dtype: DType;
  readonly shape: readonly number[];
  readonly data: Uint8Array;
}

/** Where a tensor's bytes live: one of the file's mappings and the offset of the data in it. */
interface Placement {
  readonly map: Uint8Array;
  readonly offset: number;
}

export class SafetensorsFile implements WeightSource, Disposable {
  readonly metadata: Readonly<Record<string, string>>;
  readonly tensors: ReadonlyMap<string, SafetensorsTensorInfo>;
  #placement: Map<string, Placement> | null;

  /** Use `openSafetensors`. */
  constructor(
    readonly path: string,
    tensors: Map<string, SafetensorsTensorInfo>,
    placement: Map<string, Placement>,
    metadata: Record<string, string>,
  ) {
    this.tensors = tensors;
    this.#placement = placement;
    this.metadata = metadata;
  }

  get closed(): boolean {
    return this.#placement === null;
  }

  names(): string[] {
    return [...this.tensors.keys()];
  }

  /** A view into the mapping (no copy); undefined when the file has no such tensor. */
  get(name: string): WeightView | undefined {
    const info = this.tensors.get(name);
    if (!info) return undefined;
    const placement = this.#placement ?? fail(`${this.path}: read of tensor ${name} after close()`);
    const { map, offset } = placement.get(name)!;
    return { dtype: info.dtype, shape: info.shape, bytes: map.subarray(offset, offset + info.end - info.begin) };
  }

  /**
   * Drops this object's references to the mappings. Bun unmaps when the last view is garbage
   * collected, so views still held (weights used in place) stay valid; no explicit munmap,
   * which would turn those views into dangling pointers.
   */
  close(): void {
    this.#placement = null;
  }

  [Symbol.dispose](): void {
    this.close();
  }
}

/** A name or value from the header as it goes into a one-line error: control characters escaped, long ones cut. */
function shown(text: string): string {
  const cut = text.length > 80 ? `${text.slice(0, 80)}…` : text;
  return /[\u0000-\u001f\u007f-\u009f\u2028\u2029]/.test(cut) ? JSON.stringify(cut) : cut;
}

function isNonNegInt(v: unknown): v is number {
  return typeof v === "number" && Number.isSafeInteger(v) && v >= 0;
}

/** Parses and validates the header of `map`; throws HybridgenError naming `path` and the tensor. */
/** Reads the u64 length and the JSON header with plain reads (the data is mapped later). */
function readHeaderBytes(path: string, fd: number, fileSize: number): Uint8Array {
  const lenBuf = new Uint8Array(8);
  if (readSync(fd, lenBuf, 0, 8, 0) !== 8) fail(`${path}: cannot read the header length`);
  const headerLen = new DataView(lenBuf.buffer).getBigUint64(0, true);
  if (headerLen > BigInt(fileSize - 8)) {
    fail(`${path}: header length ${headerLen} exceeds the file (${fileSize} bytes): truncated or not safetensors`);
  }
  const n = Number(headerLen);
  if (n > MAX_HEADER_BYTES) fail(`${path}: header length ${n} is implausibly large`);
  const header = new Uint8Array(n);
  let got = 0;
  while (got < n) {
    const r = readSync(fd, header, got, n - got, 8 + got);
    if (r <= 0) fail(`${path}: file ended inside the header`);
    got += r;
  }
  return header;
}

function parseHeader(path: string, header: Uint8Array, fileSize: number): {
  dataStart: number;
  tensors: Map<string, SafetensorsTensorInfo>;
  metadata: Record<string, string>;
} {
  if (header.length < 2 || header[0] !== 0x7b /* { */) fail(`${path}: header is not a JSON object`);
  let json: unknown;
  try {
    json = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(header));
  } catch (e) {
    fail(`${path}: header is not valid JSON (${(e as Error).message})`);
  }
  if (json === null || typeof json !== "object" || Array.isArray(json)) fail(`${path}: header is not a JSON object`);

  const dataStart = 8 + header.length;
  const dataLen = fileSize - dataStart;
  const tensors = new Map<string, SafetensorsTensorInfo>();
  let metadata: Record<string, string> = {};

  for (const [name, raw] of Object.entries(json as Record<string, unknown>)) {
    if (name === "__metadata__") {
      if (raw === null || typeof raw !== "object" || Array.isArray(raw)) fail(`${path}: __metadata__ is not an object`);
      for (const [k, v] of Object.entries(raw)) {
        if (typeof v !== "string") fail(`${path}: __metadata__.${shown(k)} is not a string`);
      }
      metadata = raw as Record<string, string>;
      continue;
    }
    const where = `${path}: tensor ${shown(name)}`;
    if (raw === null || typeof raw !== "object" || Array.isArray(raw)) fail(`${where}: entry is not an object`);
    const e = raw as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
    if (typeof e.dtype !== "string") fail(`${where}: missing dtype`);
    const dtype = (Object.hasOwn(FROM_ST, e.dtype) ? FROM_ST[e.dtype] : undefined) ??
      fail(`${path}: unsupported dtype ${shown(e.dtype)} for tensor ${shown(name)} (supported: F32, F16, BF16)`);
    if (!Array.isArray(e.shape) || !e.shape.every(isNonNegInt)) fail(`${where}: shape must be an array of non-negative integers`);
    const shape = e.shape as number[];
    const offs = e.data_offsets;
    if (!Array.isArray(offs) || offs.length !== 2 || !offs.every(isNonNegInt)) {
      fail(`${where}: data_offsets must be [begin, end] non-negative integers`);
    }
    const [begin, end] = offs as [number, number];
    if (end < begin) fail(`${where}: data_offsets end ${end} < begin ${begin}`);
    let elements = 1;
    for (const d of shape) elements *= d;
    const expected = elements * DTYPE_BYTES[dtype];
    if (!Number.isSafeInteger(expected)) fail(`${where}: shape [${shape}] is too large`);
    if (end - begin !== expected) {
      fail(`${where}: data_offsets [${begin}, ${end}] hold ${end - begin} bytes but ${e.dtype} [${shape}] needs ${expected}`);
    }
    if (end > dataLen) fail(`${where}: data_offsets end ${end} is past the data section (${dataLen} bytes): truncated file?`);
    tensors.set(name, { name, dtype, shape, begin, end });
  }

  // The data section must be exactly covered: no overlaps, no holes, nothing after the end.
  const sorted = [...tensors.values()].sort((a, b) => a.begin - b.begin || a.end - b.end);
  let cursor = 0;
  let prev: SafetensorsTensorInfo | undefined;
  for (const t of sorted) {
    if (t.begin < cursor) fail(`${path}: tensors ${shown(prev!.name)} and ${shown(t.name)} overlap (bytes ${t.begin}..${cursor})`);
    if (t.begin > cursor) fail(`${path}: gap of ${t.begin - cursor} unindexed bytes before tensor ${shown(t.name)}`);
    cursor = t.end;
    prev = t;
  }
  if (cursor !== dataLen) fail(`${path}: ${dataLen - cursor} bytes after the last tensor are not indexed by the header`);
  return { dataStart, tensors, metadata };
}

/** Bun maps at most 4 GiB at once; bigger files are mapped in windows of whole tensors. */
const MAX_MAP_BYTES = 2 ** 32;
/** Window starts are rounded down to this (a multiple of every page size) to keep alignment. */
const MAP_ALIGN = 65536;

function mmapRange(path: string, offset: number, size: number): Uint8Array {
  try {
    const m = Bun.mmap(path, { shared: false, offset, size });
    if (m.length !== size) fail(`${path}: mapped ${m.length} of ${size} bytes at offset ${offset}`);
    return m;
  } catch (e) {
    if (e instanceof HybridgenError) throw e;
    fail(`${path}: cannot map ${size} bytes at offset ${offset} (${(e as Error).message})`);
  }
}

/** Maps the tensors' bytes: the whole file when it fits one mapping, else windows of tensors. */
function placeTensors(path: string, fileSize: number, dataStart: number, tensors: Map<string, SafetensorsTensorInfo>): Map<string, Placement> {
  const placement = new Map<string, Placement>();
  if (fileSize <= MAX_MAP_BYTES) {
    const map = mmapRange(path, 0, fileSize);
    for (const t of tensors.values()) placement.set(t.name, { map, offset: dataStart + t.begin });
    return placement;
  }
  const sorted = [...tensors.values()].sort((a, b) => a.begin - b.begin);
  let i = 0;
  while (i < sorted.length) {
    const start = Math.floor((dataStart + sorted[i].begin) / MAP_ALIGN) * MAP_ALIGN;
    let j = i;
    while (j + 1 < sorted.length && dataStart + sorted[j + 1].end - start <= MAX_MAP_BYTES) j++;
    const end = dataStart + sorted[j].end;
    if (end - start > MAX_MAP_BYTES) fail(`${path}: tensor ${sorted[i].name} (${end - start} bytes) is larger than one mapping can hold (4 GiB)`);
    const map = mmapRange(path, start, Math.max(1, end - start));
    for (let k = i; k <= j; k++) placement.set(sorted[k].name, { map, offset: dataStart + sorted[k].begin - start });
    i = j + 1;
  }
  return placement;
}

/**
 * Validates the header of `path` and maps its data (MAP_PRIVATE: a stray write never
 * reaches the file). Note: truncating a mapped file under a running process is fatal (SIGBUS);
 * replace model files by renaming instead.
 */
export function openSafetensors(path: string): SafetensorsFile {
  let fd: number;
  try {
    fd = openSync(path, "r");
  } catch (e) {
    fail(`${path}: cannot open (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
  }
  let parsed: ReturnType<typeof parseHeader>;
  let size: number;
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) fail(`${path}: not a regular file`);
    size = st.size;
    if (size < 8) fail(`${path}: not a safetensors file (${size} bytes, shorter than the 8-byte header length)`);
    parsed = parseHeader(path, readHeaderBytes(path, fd, size), size);
  } finally {
    closeSync(fd);
  }
  const placement = placeTensors(path, size, parsed.dataStart, parsed.tensors);
  return new SafetensorsFile(path, parsed.tensors, placement, parsed.metadata);
}

/**
 * Writes a safetensors file. Tensors are laid out by descending element size (then in the
 * given order) and the header is space-padded to a multiple of 8, so every tensor starts
 * aligned to its element size when the file is mapped.
 */
export function writeSafetensors(
  path: string,
  tensors: readonly SafetensorsTensor[],
  metadata?: Readonly<Record<string, string>>,
): void {
  const seen = new Set<string>();
  for (const t of tensors) {
    if (t.name === "__metadata__") fail(`writeSafetensors: "__metadata__" is not a valid tensor name`);
    if (seen.has(t.name)) fail(`writeSafetensors: duplicate tensor name ${t.name}`);
    seen.add(t.name);
    if (!(t.dtype in TO_ST)) fail(`writeSafetensors: unsupported dtype ${t.dtype} for tensor ${t.name}`);
    if (!t.shape.every(isNonNegInt)) fail(`writeSafetensors: tensor ${t.name} has a bad shape [${t.shape}]`);
    const expected = t.shape.reduce((a, b) => a * b, 1) * DTYPE_BYTES[t.dtype];
    if (t.data.length !== expected) {
      fail(`writeSafetensors: tensor ${t.name} has ${t.data.length} bytes but ${t.dtype} [${t.shape}] needs ${expected}`);
    }
  }
  const order = tensors
    .map((t, i) => ({ t, i }))
    .sort((a, b) => DTYPE_BYTES[b.t.dtype] - DTYPE_BYTES[a.t.dtype] || a.i - b.i)
    .map((x) => x.t);

  const header: Record<string, unknown> = {};
  if (metadata && Object.keys(metadata).length > 0) header.__metadata__ = { ...metadata };
  let offset = 0;
  for (const t of order) {
    header[t.name] = { dtype: TO_ST[t.dtype], shape: [...t.shape], data_offsets: [offset, offset + t.data.length] };
    offset += t.data.length;
  }
  let json = new TextEncoder().encode(JSON.stringify(header));
  const padded = Math.ceil(json.length / 8) * 8;
  if (padded !== json.length) {
    const p = new Uint8Array(padded).fill(0x20);
    p.set(json);
    json = p;
  }
  const len = new Uint8Array(8);
  new DataView(len.buffer).setBigUint64(0, BigInt(json.length), true);

  const fd = openSync(path, "w");
  try {
    writeAll(fd, len);
    writeAll(fd, json);
    for (const t of order) writeAll(fd, t.data);
  } finally {
    closeSync(fd);
  }
}

function writeAll(fd: number, data: Uint8Array): void {
  let done = 0;
  while (done < data.length) done += writeSync(fd, data, done, data.length - done);
}
