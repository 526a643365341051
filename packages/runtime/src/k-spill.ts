/**
 * KSpill: K on disk page-wise, coldest first — the last resort of the disk tier, once all of V is
 * there. It wraps the TieredStore of a layout with a `kSpill` (@hybridgen/memtier's layoutStore):
 * every K region is memory, bound as the layout says, and memory may hold all of K less the spill
 * files' bytes. When the store's K outgrows that, the units of K (the layout's unitBytes: whole
 * pages) the CPU stage selected least recently are written to a spill file and their addresses
 * remapped onto it (MAP_SHARED | MAP_FIXED): the stage's scoring reads them back through page
 * faults, its code and the tensors unchanged. A unit the stage selects again stays in the file; the
 * page cache, which keeps what is read every step, holds it in memory while memory allows.
 *
 * The spill files are unlinked as soon as they are open and reserved (posix_fallocate: a full disk
 * fails here, before the first token, not as a SIGBUS later): nothing reopens them by name, so the
 * kernel frees them when the store is released or the process ends, SIGKILL included.
 */
import { closeSync, fdatasyncSync, openSync, unlinkSync, writeSync } from "node:fs";
import { join } from "node:path";
import { dlopen, FFIType, read, toArrayBuffer } from "bun:ffi";
import { DTYPE_BYTES, HybridgenError, type Backend, type DType, type KvStoreAllocator, type Tensor } from "@hybridgen/core";
import type { SegmentCheck, TieredStore } from "@hybridgen/kernels-cpu";

const PROT_READ_WRITE = 0x3, MAP_SHARED_FIXED = 0x11, MADV_DONTNEED = 4, POSIX_FADV_DONTNEED = 4;
const ERRNO: Record<number, string> = { 2: "ENOENT", 5: "EIO", 9: "EBADF", 12: "ENOMEM", 13: "EACCES", 22: "EINVAL", 27: "EFBIG", 28: "ENOSPC", 30: "EROFS", 95: "EOPNOTSUPP", 122: "EDQUOT" };
const errnoName = (e: number) => ERRNO[e] ?? `errno ${e}`;

const libcSymbols = {
  mmap: { args: [FFIType.u64, FFIType.u64, FFIType.i32, FFIType.i32, FFIType.i32, FFIType.i64], returns: FFIType.i64_fast },
  posix_fallocate: { args: [FFIType.i32, FFIType.i64, FFIType.i64], returns: FFIType.i32 },
  madvise: { args: [FFIType.u64, FFIType.u64, FFIType.i32], returns: FFIType.i32 },
  posix_fadvise: { args: [FFIType.i32, FFIType.i64, FFIType.i64, FFIType.i32], returns: FFIType.i32 },
  __errno_location: { args: [], returns: FFIType.ptr },
} as const;
let libc: ReturnType<typeof dlopen<typeof libcSymbols>>["symbols"] | null = null;
const c = () => (libc ??= dlopen("libc.so.6", libcSymbols).symbols);

let serial = 0;

interface SpillFile {
  readonly path: string;
  readonly dir: string;
  readonly fd: number;
  readonly bytes: number;
  used: number;
}

interface KRegion {
  readonly tensor: Tensor;
  readonly address: number;
  /** Mapped bytes holding rows: the tensor's, in whole pages. */
  readonly extent: number;
  readonly heads: number;
  readonly capacity: number;
  readonly rowBytes: number;
  /** Index of its first unit in the store-wide arrays. */
  readonly base: number;
}

export class KSpill implements KvStoreAllocator {
  readonly unitBytes: number;
  /** Spill passes run, units moved to disk, and their bytes. */
  readonly stats = { passes: 0, units: 0, bytes: 0 };
  private readonly page: number;
  private readonly unitsPerRegion: number;
  private readonly disk: SpillFile[] = [];
  /** Addresses and lengths mapped from the spill files. */
  private readonly runs: [number, number][] = [];
  private readonly k: (KRegion | undefined)[];
  private readonly vLayer = new Map<Tensor, number>();
  /** Per unit: the clock when the stage last selected a row in it, or when its rows arrived. */
  private readonly stamps: Uint32Array;
  /** Per unit: 0 untouched, 1 in memory, 2 spilled. */
  private readonly state: Uint8Array;
  /** Units never spilled: a bound segment's first page, where TieredStore.verify() reads its policy. */
  private readonly keep: Uint8Array;
  /** K bytes memory may hold: every region less what the spill files take. */
  private readonly memoryBytes: number;
  private clock = 1;
  private lastLayer = Number.POSITIVE_INFINITY;
  private rows = 0;
  private residentBytes = 0;
  private released = false;

  constructor(readonly inner: TieredStore) {
    const layout = inner.layout, spill = layout.kSpill;
    if (!spill) throw new HybridgenError("K spill: the store's layout keeps all of K in memory (no kSpill)");
    if (spill.unitBytes % layout.pageBytes !== 0) throw new HybridgenError(`K spill: a unit of ${spill.unitBytes} bytes is not whole pages of ${layout.pageBytes}`);
    this.page = layout.pageBytes;
    this.unitBytes = spill.unitBytes;
    const layers = layout.k.length;
    this.unitsPerRegion = Math.ceil(layout.regionBytes / this.unitBytes);
    this.k = new Array(layers).fill(undefined);
    this.stamps = new Uint32Array(layers * this.unitsPerRegion);
    this.state = new Uint8Array(layers * this.unitsPerRegion);
    this.keep = new Uint8Array(layers * this.unitsPerRegion);
    layout.k.forEach((segs, l) => {
      for (const s of segs) if (s.mode !== "local") this.keep[l * this.unitsPerRegion + Math.floor(s.offset / this.unitBytes)] = 1;
    });
    const spillBytes = spill.files.reduce((n, f) => n + f.bytes, 0);
    this.memoryBytes = Math.max(0, layers * layout.regionBytes - spillBytes);
    try {
      // A pass spills whole units, so the last file keeps one more unit than the layout's share.
      spill.files.forEach((f, i) => this.disk.push(this.openFile(f.dir, f.bytes + (i === spill.files.length - 1 ? this.unitBytes : 0))));
    } catch (e) {
      this.closeFiles();
      throw e;
    }
  }

  private openFile(dir: string, bytes: number): SpillFile {
    const path = join(dir, `hybridgen-kv-${process.pid}-${serial++}-kspill.bin`); // the disk tier's pattern: the sweep takes one a kill left before the unlink
    let fd: number;
    try {
      fd = openSync(path, "wx+", 0o600);
    } catch (e) {
      throw new HybridgenError(`K spill: cannot create a file in ${dir}: ${(e as NodeJS.ErrnoException).code ?? String(e)}`);
    }
    unlinkSync(path);
    const rc = c().posix_fallocate(fd, 0, bytes);
    if (rc !== 0) {
      closeSync(fd);
      throw new HybridgenError(`K spill: cannot reserve ${bytes} bytes in ${dir}: ${errnoName(rc)}`);
    }
    return { path, dir, fd, bytes, used: 0 };
  }

  alloc(backend: Backend, pool: "k" | "v", layer: number, shape: readonly number[], dtype: DType): Tensor {
    const t = this.inner.alloc(backend, pool, layer, shape, dtype);
    if (pool === "v") {
      this.vLayer.set(t, layer);
      return t;
    }
    const region = backend.hostRegion?.(t);
    if (!region || region.address % this.page !== 0) throw new HybridgenError(`K spill: K of layer ${layer} is not a page-aligned host mapping`);
    const [heads, capacity, headDim] = shape as [number, number, number];
    this.k[layer] = {
      tensor: t, address: region.address, extent: Math.ceil(region.byteLength / this.page) * this.page,
      heads, capacity, rowBytes: headDim * DTYPE_BYTES[dtype], base: layer * this.unitsPerRegion,
    };
    return t;
  }

  /** K regions are remapped a unit at a time: a device must not pin them. */
  pinnable(t: Tensor): boolean {
    return !this.k.some((r) => r?.tensor === t) && this.inner.pinnable(t);
  }

  readAhead(v: Tensor, ids: Int32Array, counts: Int32Array, kmax: number, ahead: boolean): void {
    const layer = this.vLayer.get(v);
    const r = layer === undefined ? undefined : this.k[layer];
    if (r && layer !== undefined) {
      if (layer <= this.lastLayer) this.clock++; // a new step
      this.lastLayer = layer;
      for (let g = 0; g < Math.min(r.heads, counts.length); g++) {
        for (let i = 0; i < counts[g]!; i++) {
          const at = (g * r.capacity + ids[g * kmax + i]!) * r.rowBytes;
          this.stamps[r.base + Math.floor(at / this.unitBytes)] = this.clock;
          this.stamps[r.base + Math.floor((at + r.rowBytes - 1) / this.unitBytes)] = this.clock;
        }
      }
    }
    this.inner.readAhead(v, ids, counts, kmax, ahead);
  }

  stored(rows: number, sync: () => void): void {
    this.clock++;
    for (const r of this.k) {
      if (!r || rows <= this.rows) continue;
      for (let g = 0; g < r.heads; g++) {
        const lo = (g * r.capacity + this.rows) * r.rowBytes, hi = (g * r.capacity + rows) * r.rowBytes;
        for (let u = Math.floor(lo / this.unitBytes); u <= Math.floor((hi - 1) / this.unitBytes); u++) {
          const i = r.base + u;
          this.stamps[i] = this.clock;
          if (this.state[i] === 0) {
            this.state[i] = 1;
            this.residentBytes += this.unitLength(r, u);
          }
        }
      }
    }
    this.rows = rows;
    if (this.residentBytes > this.memoryBytes) this.spill(this.residentBytes - this.memoryBytes, sync);
  }

  /**
   * Moves at least `need` bytes of K to disk, in whole units: the least recently selected first —
   * not the least often, since a page just evicted from the window has no selections yet and would
   * go first under a count; ties in address order. Only units whose rows are all written.
   */
  private spill(need: number, sync: () => void): void {
    const byStamp = new Float64Array(this.clock + 1);
    for (const r of this.k) if (r) this.eachCandidate(r, (u, len) => (byStamp[this.stamps[r.base + u]!]! += len));
    let below = 0, cut = this.clock + 1; // past every stamp when the candidates are not enough: all go
    for (let s = 0; s <= this.clock; s++) {
      if (below + byStamp[s]! >= need) {
        cut = s;
        break;
      }
      below += byStamp[s]!;
    }
    let atCut = need - below;
    sync(); // the rows of pending evictions must be in memory before their pages are copied
    this.stats.passes++;
    for (const r of this.k) {
      if (!r) continue;
      let runStart = -1, runEnd = -1;
      const flush = () => {
        if (runStart >= 0) this.spillRun(r, runStart, runEnd);
        runStart = -1;
      };
      this.eachCandidate(r, (u, len) => {
        const s = this.stamps[r.base + u]!;
        const take = s < cut || (s === cut && atCut > 0);
        if (!take) return;
        if (s === cut) atCut -= len;
        this.stats.units++;
        const a = u * this.unitBytes;
        if (runStart >= 0 && a === runEnd) runEnd = a + len;
        else {
          flush();
          runStart = a;
          runEnd = a + len;
        }
      });
      flush();
    }
  }

  /** Units of `r` in memory whose rows are all below the store's count, in address order. */
  private eachCandidate(r: KRegion, f: (u: number, len: number) => void): void {
    const stride = r.capacity * r.rowBytes, n = Math.ceil(r.extent / this.unitBytes);
    for (let u = 0; u < n; u++) {
      const i = r.base + u;
      if (this.state[i] !== 1 || this.keep[i]) continue;
      const a = u * this.unitBytes, b = a + this.unitLength(r, u);
      let complete = true;
      for (let g = Math.floor(a / stride); g <= Math.min(r.heads - 1, Math.floor((b - 1) / stride)) && complete; g++) {
        complete = Math.ceil((Math.min(b, (g + 1) * stride) - g * stride) / r.rowBytes) <= this.rows;
      }
      if (complete) f(u, b - a);
    }
  }

  private unitLength(r: KRegion, u: number): number {
    return Math.min(this.unitBytes, r.extent - u * this.unitBytes);
  }

  /** Bytes [a, b) of `r` written to the spill files and mapped from them in place. */
  private spillRun(r: KRegion, a: number, b: number): void {
    while (a < b) {
      const f = this.disk.find((x) => x.used < x.bytes);
      if (!f) throw new HybridgenError(`K spill: the spill files are full (${this.disk.reduce((n, x) => n + x.bytes, 0)} bytes)`);
      const len = Math.min(b - a, f.bytes - f.used);
      const view = new Uint8Array(toArrayBuffer(r.address + a, 0, len));
      for (let done = 0; done < len; ) {
        try {
          done += writeSync(f.fd, view, done, len - done, f.used + done);
        } catch (e) {
          throw new HybridgenError(`K spill: cannot write ${len} bytes to its file in ${f.dir}: ${(e as NodeJS.ErrnoException).code ?? String(e)}`);
        }
      }
      const at = c().mmap(r.address + a, len, PROT_READ_WRITE, MAP_SHARED_FIXED, f.fd, f.used);
      if (at !== r.address + a) {
        throw new HybridgenError(`K spill: cannot map its file in ${f.dir} over K: ${errnoName(read.i32(c().__errno_location()!, 0))}`);
      }
      this.runs.push([r.address + a, len]);
      for (let u = Math.floor(a / this.unitBytes); u < Math.ceil((a + len) / this.unitBytes); u++) this.state[r.base + u] = 2;
      this.residentBytes -= len;
      this.stats.bytes += len;
      f.used += len;
      a += len;
    }
  }

  /** Benches: writes the spill files back and drops their pages from memory, so the next reads of spilled K go to the disk. */
  dropFileCache(): void {
    for (const f of this.disk) fdatasyncSync(f.fd);
    for (const [at, len] of this.runs) c().madvise(at, len, MADV_DONTNEED); // a shared file mapping: the file keeps the rows
    for (const f of this.disk) c().posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
  }

  /** Whether the unit holding byte `offset` of layer `layer`'s K region lives in a spill file. */
  spilled(layer: number, offset: number): boolean {
    return this.state[layer * this.unitsPerRegion + Math.floor(offset / this.unitBytes)] === 2;
  }

  /** K bytes in memory now (units touched and not spilled), and the most memory may hold. */
  get memory(): { residentBytes: number; limitBytes: number } {
    return { residentBytes: this.residentBytes, limitBytes: this.memoryBytes };
  }

  /** The spill files (unlinked: the names they had), their reserved and used bytes, and their descriptors. */
  get spillFiles(): readonly { path: string; fd: number; bytes: number; usedBytes: number }[] {
    return this.disk.map((f) => ({ path: f.path, fd: f.fd, bytes: f.bytes, usedBytes: f.used }));
  }

  /** The disk tier's files: the store's, then the spill files (by the names they had). */
  get files(): string[] {
    return [...this.inner.files, ...this.disk.map((f) => f.path)];
  }

  /** Bytes in files of the disk tier: the store's and the spill files' reserved. */
  get diskBytes(): number {
    return this.inner.diskBytes + this.disk.reduce((n, f) => n + f.bytes, 0);
  }

  verify(samplePages?: number): SegmentCheck[] {
    return this.inner.verify(samplePages);
  }

  /** Unmaps the store (the spilled units with it) and closes the spill files, which frees them. Idempotent. */
  release(): void {
    if (this.released) return;
    this.released = true;
    try {
      this.inner.release();
    } finally {
      this.closeFiles();
    }
  }

  private closeFiles(): void {
    for (const f of this.disk.splice(0)) closeSync(f.fd);
    this.runs.length = 0;
  }

  [Symbol.dispose](): void {
    this.release();
  }
}
