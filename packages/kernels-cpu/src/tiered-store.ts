/**
 * TieredStore: core's KvStoreAllocator for the CPU backend, applying a StoreLayout (from
 * @hybridgen/memtier's layoutStore). Each region is one anonymous mapping, untouched, whose
 * segments are then bound to their NUMA nodes (mbind, before any page faults in, so pinning
 * and the first writes land where the layout says) or replaced by a preallocated file of the
 * disk tier mapped shared at the same addresses. verify() reads back what the kernel did.
 */
import { readFileSync } from "node:fs";
import { SPEC_VERSION, HybridgenError, StoreLayoutSchema, type Backend, type DType, type KvStoreAllocator, type StoreLayout, type StoreSegment, type Tensor } from "@hybridgen/spec";
import type { Pointer } from "bun:ffi";
import { CpuBackend, createCpuBackend } from "./cpu-backend.js";
import { CpuTensor } from "./tensor.js";
import { cPath, maskNodes, MASK_WORDS, MPOL, nodeMask, tierNative } from "./tier-native.js";
import { diskFileName, removeDiskFile, sweepStaleDiskFiles, trackDiskFile } from "./disk-files.js";

const ERRNO: Record<number, string> = { 1: "EPERM", 2: "ENOENT", 12: "ENOMEM", 13: "EACCES", 17: "EEXIST", 22: "EINVAL", 27: "EFBIG", 28: "ENOSPC", 30: "EROFS", 38: "ENOSYS", 122: "EDQUOT" };
const errnoName = (e: number) => ERRNO[Math.abs(e)] ?? `errno ${Math.abs(e)}`;

export interface TieredStoreOptions {
  /** Tests: every file reservation fails with this errno (28 = ENOSPC: a full disk). */
  failFileErrno?: number;
}

interface Region {
  readonly pool: "k" | "v";
  readonly layer: number;
  readonly address: number;
  readonly bytes: number;
  readonly segments: readonly StoreSegment[];
  readonly files: { path: string; fd: number; offset: number; bytes: number }[];
  tensor: CpuTensor | null;
}

/** What verify() found for one segment. */
export interface SegmentCheck {
  readonly pool: "k" | "v";
  readonly layer: number;
  readonly tier: string;
  readonly mode: StoreSegment["mode"];
  readonly bytes: number;
  /** NUMA segments: the policy the kernel reports at the segment's first page, and its nodes. */
  readonly policy?: string;
  readonly policyNodes?: number[];
  /** NUMA segments: sampled resident pages by node (pages not faulted in yet are not counted). */
  readonly pageNodes?: Record<number, number>;
  /** File segments: the file /proc/self/numa_maps shows mapped at the segment. */
  readonly mappedFile?: string;
  readonly ok: boolean;
}

const POLICY_NAME = ["default", "preferred", "bind", "interleave", "local"];

function numaMapsFiles(): Map<number, string> {
  const out = new Map<number, string>();
  let text = "";
  try {
    text = readFileSync("/proc/self/numa_maps", "utf8");
  } catch {
    return out;
  }
  for (const line of text.split("\n")) {
    const m = /^([0-9a-f]+) \S+ file=(\S+)/.exec(line);
    if (m) out.set(parseInt(m[1]!, 16), m[2]!);
  }
  return out;
}

export class TieredStore implements KvStoreAllocator {
  readonly spec = SPEC_VERSION;
  readonly layout: StoreLayout;
  private readonly regions: Region[] = [];
  private readonly failFileErrno: number;
  private released = false;
  /** Read-ahead requests made (page ranges) and the bytes they cover. */
  readonly readAheadStats = { requests: 0, bytes: 0 };
  /** readAhead's runs (address, bytes) for one call into the library. */
  private runs: Float64Array<ArrayBuffer> = new Float64Array(0);

  constructor(layout: StoreLayout, options: TieredStoreOptions = {}) {
    const r = StoreLayoutSchema.safeParse(layout);
    if (!r.success) throw new HybridgenError(`tiered store: invalid layout: ${r.error.issues[0]?.path.join(".")}: ${r.error.issues[0]?.message}`);
    this.layout = r.data;
    this.failFileErrno = options.failFileErrno ?? 0;
    for (const pool of ["k", "v"] as const) {
      for (const [layer, segs] of this.layout[pool].entries()) {
        let at = 0;
        for (const s of segs) {
          if (s.offset !== at || s.offset % this.layout.pageBytes !== 0) {
            throw new HybridgenError(`tiered store: ${pool}${layer} segment at ${s.offset} is not page-aligned and contiguous (expected ${at})`);
          }
          if (s.mode === "file" && !s.dir) throw new HybridgenError(`tiered store: ${pool}${layer} file segment has no directory`);
          at += s.bytes;
        }
        if (at !== this.layout.regionBytes) throw new HybridgenError(`tiered store: ${pool}${layer} segments cover ${at} of ${this.layout.regionBytes} bytes`);
      }
    }
    for (const dir of new Set(this.allSegments().filter((s) => s.mode === "file").map((s) => s.dir!))) sweepStaleDiskFiles(dir);
  }

  private allSegments(): StoreSegment[] {
    return [...this.layout.k.flat(), ...this.layout.v.flat()];
  }

  alloc(backend: Backend, pool: "k" | "v", layer: number, shape: readonly number[], dtype: DType): Tensor {
    if (this.released) throw new HybridgenError("tiered store: released");
    if (!(backend instanceof CpuBackend)) throw new HybridgenError(`tiered store: the store must be on the CPU backend, not ${backend.name}`);
    const segments = this.layout[pool][layer];
    if (!segments) throw new HybridgenError(`tiered store: the layout has no ${pool.toUpperCase()} region for layer ${layer}`);
    const bytes = shape.reduce((a, b) => a * b, 1) * ({ f32: 4, f16: 2, bf16: 2 } as Record<DType, number>)[dtype];
    if (bytes > this.layout.regionBytes) throw new HybridgenError(`tiered store: a ${bytes}-byte region does not fit the layout's ${this.layout.regionBytes}`);
    const lib = tierNative();
    const address = Number(lib.hg_tier_map_anon(this.layout.regionBytes));
    if (!address) throw new HybridgenError(`tiered store: out of memory mapping ${this.layout.regionBytes} bytes for ${pool.toUpperCase()} of layer ${layer}`);
    const region: Region = { pool, layer, address, bytes: this.layout.regionBytes, segments, files: [], tensor: null };
    this.regions.push(region);
    for (const s of segments) this.applySegment(region, s);
    region.tensor = new CpuTensor(backend, dtype, [...shape], address as Pointer, bytes, false);
    return region.tensor;
  }

  private applySegment(r: Region, s: StoreSegment): void {
    const lib = tierNative();
    const at = r.address + s.offset;
    if (s.mode === "local") return;
    if (s.mode === "file") {
      const path = diskFileName(s.dir!, `${r.pool}${r.layer}`);
      const fd = new Int32Array(1), err = new Int32Array(1);
      const p = Number(lib.hg_tier_map_file(cPath(path), s.bytes, at as Pointer, this.failFileErrno, fd, err));
      if (!p) throw new HybridgenError(`disk tier: cannot create ${s.bytes}-byte file ${path}: ${errnoName(err[0]!)}`);
      trackDiskFile(path);
      r.files.push({ path, fd: fd[0]!, offset: s.offset, bytes: s.bytes });
      // The CPU stage reads rows of this segment with explicit reads (file_rows.c), not page faults.
      const rc = lib.hg_tier_register_file(at as Pointer, s.bytes, cPath(path), 0);
      if (rc !== 0) throw new HybridgenError(`disk tier: cannot open ${path} for the stage's reads: ${errnoName(rc)}`);
      return;
    }
    const mask = nodeMask(s.nodes);
    const rc = lib.hg_tier_mbind(at as Pointer, s.bytes, MPOL[s.mode], mask, MASK_WORDS, 0);
    if (rc !== 0) throw new HybridgenError(`placement: mbind(${s.mode} ${s.nodes.join(",")}) of ${r.pool.toUpperCase()} layer ${r.layer} failed: ${errnoName(rc)}`);
  }

  pinnable(t: Tensor): boolean {
    const r = this.regions.find((x) => x.tensor === t);
    return !r || r.files.length === 0;
  }

  /** Bytes in files of the disk tier. */
  get diskBytes(): number {
    return this.regions.reduce((n, r) => n + r.files.reduce((m, f) => m + f.bytes, 0), 0);
  }

  /** The disk tier's files (paths) of this store. */
  get files(): string[] {
    return this.regions.flatMap((r) => r.files.map((f) => f.path));
  }

  /**
   * Starts reading the file-backed rows a CPU stage is about to gather: for each KV head
   * (`heads` runs of `capacity` rows of `rowBytes`), rows [0, rows) of `pool`'s region of `layer`.
   */
  prefetch(pool: "k" | "v", layer: number, rows: number, rowBytes: number, capacity: number, heads: number): void {
    const r = this.regions.find((x) => x.pool === pool && x.layer === layer);
    if (!r || r.files.length === 0 || rows <= 0) return;
    const lib = tierNative();
    for (const f of r.files) {
      for (let g = 0; g < heads; g++) {
        const lo = Math.max(f.offset, g * capacity * rowBytes), hi = Math.min(f.offset + f.bytes, (g * capacity + rows) * rowBytes);
        if (hi > lo) lib.hg_tier_prefetch((r.address + lo) as Pointer, hi - lo);
      }
    }
  }

  /**
   * With `ahead`, the next layer's V rows at the slots a stage just gathered from `v` (per KV head g,
   * `counts[g]` ids from g·kmax): read-ahead of the pages holding them, where that layer's
   * region is file-backed (adjacent rows of one page are one request), advised by the library's
   * background thread so the caller does not wait for the reads' submission. Memory regions, or
   * picks that do not predict the next layer's (the page index's): nothing.
   */
  readAhead(v: Tensor, ids: Int32Array, counts: Int32Array, kmax: number, ahead: boolean): void {
    if (!ahead) return;
    const r = this.regions.find((x) => x.tensor === v);
    if (!r) return;
    const next = this.regions.find((x) => x.pool === r.pool && x.layer === r.layer + 1);
    if (!next || next.files.length === 0 || !next.tensor) return;
    const [heads, cap, hd] = next.tensor.shape as [number, number, number];
    const row = hd * next.tensor.elementBytes, page = this.layout.pageBytes;
    const inFile = (off: number) => next.files.some((f) => off >= f.offset && off < f.offset + f.bytes);
    let runs = 0, most = 0;
    for (let g = 0; g < Math.min(heads, counts.length); g++) most += Math.max(0, counts[g]!);
    if (this.runs.length < 2 * most) this.runs = new Float64Array(2 * most); // a run a row at most
    for (let g = 0; g < Math.min(heads, counts.length); g++) {
      let runStart = -1, runEnd = -1;
      const flush = () => {
        if (runStart < 0) return;
        this.runs[2 * runs] = next.address + runStart;
        this.runs[2 * runs + 1] = runEnd - runStart;
        runs++;
        this.readAheadStats.requests++;
        this.readAheadStats.bytes += runEnd - runStart;
      };
      for (let i = 0; i < counts[g]!; i++) {
        const off = (g * cap + ids[g * kmax + i]!) * row;
        if (!inFile(off)) continue;
        const p0 = Math.floor(off / page) * page, p1 = Math.ceil((off + row) / page) * page;
        if (runStart >= 0 && p0 <= runEnd) runEnd = Math.max(runEnd, p1);
        else {
          flush();
          runStart = p0;
          runEnd = p1;
        }
      }
      flush();
    }
    if (runs > 0) tierNative().hg_tier_prefetch_runs(this.runs, runs);
  }

  /** Benches: writes the disk tier's pages back and drops them from the page cache, so the next reads go to the disk. */
  dropFileCache(): void {
    const lib = tierNative();
    for (const r of this.regions) {
      for (const f of r.files) {
        const rc = lib.hg_tier_drop_cache((r.address + f.offset) as Pointer, f.bytes, f.fd, 0);
        if (rc !== 0) throw new HybridgenError(`disk tier: cannot drop ${f.path} from the page cache: ${errnoName(rc)}`);
      }
    }
  }

  /** Bytes of the disk tier's files in the page cache now (mincore), whole pages. */
  cachedFileBytes(): number {
    const lib = tierNative();
    let pages = 0;
    for (const r of this.regions) for (const f of r.files) pages += Math.max(0, Number(lib.hg_tier_resident((r.address + f.offset) as Pointer, f.bytes)));
    return pages * this.layout.pageBytes;
  }

  /** What the kernel did with every segment: policies and resident pages (NUMA), the mapped file (disk). */
  verify(samplePages = 64): SegmentCheck[] {
    const lib = tierNative();
    const mapped = numaMapsFiles();
    const out: SegmentCheck[] = [];
    for (const r of this.regions) {
      for (const s of r.segments) {
        const at = r.address + s.offset;
        const base = { pool: r.pool, layer: r.layer, tier: s.tier, mode: s.mode, bytes: s.bytes };
        if (s.mode === "file") {
          const want = r.files.find((f) => f.offset === s.offset)?.path;
          const got = mapped.get(at);
          out.push({ ...base, mappedFile: got, ok: got !== undefined && got === want });
          continue;
        }
        const mask = new BigUint64Array(MASK_WORDS);
        const mode = lib.hg_tier_policy(at as Pointer, mask, MASK_WORDS);
        const status = new Int32Array(Math.max(1, Math.min(samplePages, Math.ceil(s.bytes / this.layout.pageBytes))));
        lib.hg_tier_page_nodes(at as Pointer, s.bytes, status.length, status);
        const pageNodes: Record<number, number> = {};
        for (const n of status) if (n >= 0) pageNodes[n] = (pageNodes[n] ?? 0) + 1;
        const policy = mode < 0 ? `error ${errnoName(mode)}` : POLICY_NAME[mode] ?? `mode ${mode}`;
        const policyNodes = mode < 0 ? [] : maskNodes(mask);
        const wantPolicy = s.mode === "local" ? "default" : s.mode;
        const nodesOk = s.mode === "local" || policyNodes.join() === [...s.nodes].sort((a, b) => a - b).join();
        // bind/interleave: every resident page on a listed node; preferred may fall back when the node is full.
        const pagesOk = s.mode !== "bind" && s.mode !== "interleave" ? true : Object.keys(pageNodes).every((n) => s.nodes.includes(Number(n)));
        out.push({ ...base, policy, policyNodes, pageNodes, ok: policy === wantPolicy && nodesOk && pagesOk });
      }
    }
    return out;
  }

  /** Unmaps every region and removes the disk tier's files (the cache has freed the tensors). Idempotent. */
  release(): void {
    if (this.released) return;
    this.released = true;
    const lib = tierNative();
    lib.hg_tier_prefetch_wait(); // no queued read-ahead may advise a range after it is unmapped
    for (const r of this.regions) {
      for (const f of r.files) lib.hg_tier_unregister_file((r.address + f.offset) as Pointer);
      lib.hg_tier_unmap(r.address as Pointer, r.bytes);
      for (const f of r.files) {
        lib.hg_tier_close_fd(f.fd);
        removeDiskFile(f.path);
      }
    }
    this.regions.length = 0;
  }

  [Symbol.dispose](): void {
    this.release();
  }
}

/**
 * Streaming read bandwidth (bytes/s) of `bytes` of memory bound to NUMA `node` (undefined:
 * unbound) on `threads` threads (the CPU backend's streamSum, as the CPU stage reads K): best of `passes`.
 */
export function probeMemoryReadBandwidth(bytes = 256 * 2 ** 20, node?: number, threads?: number, passes = 3): number {
  const region = Math.ceil(bytes / 4096) * 4096;
  using be = createCpuBackend(threads === undefined ? {} : { threads });
  using store = new TieredStore({
    regionBytes: region, pageBytes: 4096, v: [],
    k: [[{ offset: 0, bytes: region, tier: "probe", mode: node === undefined ? "local" : "bind", nodes: node === undefined ? [] : [node] }]],
  });
  const t = store.alloc(be, "k", 0, [region / 4], "f32");
  tierNative().hg_tier_touch(be.address(t), region); // fault every page in on its node
  be.streamSum(t);
  let best = 0;
  for (let i = 0; i < passes; i++) {
    const t0 = performance.now();
    be.streamSum(t);
    best = Math.max(best, region / ((performance.now() - t0) / 1e3));
  }
  be.free(t);
  return best;
}

/** Read bandwidth (bytes/s) of a file in `dir`: `bytes` written, then read back in `block`-byte aligned reads (O_DIRECT where allowed). */
export function probeFileReadBandwidth(dir: string, bytes = 64 * 2 ** 20, block = 2 ** 20): number {
  const path = diskFileName(dir, "probe");
  const r = tierNative().hg_tier_file_read_bw(cPath(path), bytes, block);
  if (r < 0) throw new HybridgenError(`disk probe: reading a file in ${dir} failed: ${errnoName(r)}`);
  return r;
}

/** Reads in flight while probing one latency: `threads` pool threads, `depth` reads in flight each. */
export interface ReadDepth {
  readonly threads: number;
  readonly depth: number;
}

/**
 * Latency (µs) of one random 4 KiB read of a cold file in `dir`, read as the CPU stage reads disk-tier
 * rows, at each of `depths` (pread at depth 1, io_uring above): elapsed × reads in flight ÷ reads, so
 * rows ÷ in flight × latency is the time a gather of that many rows takes.
 */
export function probeFileReadLatency(dir: string, depths: readonly ReadDepth[], bytes = 64 * 2 ** 20, reads = 1024): number[] {
  const path = diskFileName(dir, "probe");
  for (const d of depths) {
    if (!(Number.isInteger(d.threads) && d.threads >= 1 && d.threads <= 256 && Number.isInteger(d.depth) && d.depth >= 1 && d.depth <= 256)) {
      throw new HybridgenError(`disk probe: threads and depth must be integers in [1, 256], got ${d.threads} × ${d.depth}`);
    }
  }
  const out = new Float64Array(depths.length);
  const rc = tierNative().hg_tier_file_read_latency(cPath(path), bytes, reads, Int32Array.from(depths, (d) => d.threads), Int32Array.from(depths, (d) => d.depth), depths.length, out);
  if (rc !== 0) throw new HybridgenError(`disk probe: random reads of a file in ${dir} failed: ${errnoName(rc)}`);
  return Array.from(out);
}
