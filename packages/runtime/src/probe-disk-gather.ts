/**
 * probeDiskGather: what one disk-tier row costs the CPU stage, measured on the stage's own path — a
 * NativeCpuStage gathering random rows of a V region that a TieredStore keeps in a file of `dir`,
 * the file dropped from the page cache before every timed job. The planner charges a gather of n
 * disk rows n ÷ in flight × this latency (@hybridgen/memtier's diskRowsMs).
 */
import { HybridgenError, type CpuStageJob, type StoreLayout } from "@hybridgen/core";

export interface DiskGatherProbe {
  /** One read's latency in µs with `readDepth` reads in flight: the median cold gather × in flight ÷ reads issued. */
  readonly latencyUs: number;
  /** Reads in flight: the stage's threads × reads in flight each (one a thread for page faults). */
  readonly readDepth: number;
  /** Reads the timed gathers issued (adjacent rows share one; a page fault a row), and the rows they brought. */
  readonly reads: number;
  readonly rows: number;
}

const KV_HEADS = 8, HEAD_DIM = 128, ROW_BYTES = HEAD_DIM * 2, PAGE = 4096;

/**
 * Cold gathers of `rows` random rows (256-byte bf16 rows of 8 KV heads, Llama-3.1-8B's: one layer's
 * verified top-256 at 4 candidates is 8 192) from a `fileBytes` V file in `dir`, on `threads` stage
 * threads, for each of `readDepths` reads in flight each (0: page faults on the mapping, each with
 * its read-around: NativeCpuStage's readDepth 0), `rounds` timed after one that opens the stage's readers.
 */
export async function probeDiskGather(
  dir: string, o: { threads: number; readDepths: readonly number[]; rows?: number; fileBytes?: number; rounds?: number },
): Promise<DiskGatherProbe[]> {
  const rows = o.rows ?? 8192, rounds = o.rounds ?? 3, perHead = Math.ceil(rows / KV_HEADS);
  for (const d of o.readDepths) {
    if (!(Number.isInteger(o.threads) && o.threads >= 1 && Number.isInteger(d) && d >= 0)) {
      throw new HybridgenError(`disk gather probe: threads must be a positive integer and readDepth a non-negative one, got ${o.threads} × ${d}`);
    }
  }
  const n = Math.floor((o.fileBytes ?? 256 * 2 ** 20) / (KV_HEADS * ROW_BYTES)); // slots a KV head
  if (n < 4 * perHead) throw new HybridgenError(`disk gather probe: ${o.fileBytes} bytes hold too few rows for ${rows} distinct ones`);
  const { createCpuBackend, NativeCpuStage, TieredStore } = await import("@hybridgen/kernels-cpu");
  const region = Math.ceil((KV_HEADS * n * ROW_BYTES) / PAGE) * PAGE;
  const layout: StoreLayout = {
    regionBytes: region, pageBytes: PAGE,
    k: [[{ offset: 0, bytes: region, mode: "local", tier: "memory", nodes: [] }]],
    v: [[{ offset: 0, bytes: region, mode: "file", tier: `file:${dir}`, nodes: [], dir }]],
  };
  using be = createCpuBackend({ threads: 1 });
  using store = new TieredStore(layout);
  const k = store.alloc(be, "k", 0, [KV_HEADS, n, HEAD_DIM], "bf16"); // never written: the selected K rows read as zeros
  const v = store.alloc(be, "v", 0, [KV_HEADS, n, HEAD_DIM], "bf16");
  try {
    const chunk = new Float32Array(1 << 20).fill(0.25);
    for (let off = 0; off < KV_HEADS * n * HEAD_DIM; off += chunk.length) be.write(v, chunk.subarray(0, Math.min(chunk.length, KV_HEADS * n * HEAD_DIM - off)), off);
    let seed = 0x2545f491;
    const draw = () => Array.from({ length: KV_HEADS }, () => {
      const s = new Set<number>();
      while (s.size < perHead) s.add((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) % n);
      return Int32Array.from([...s].sort((a, b) => a - b));
    });
    return o.readDepths.map((depth) => {
      using stage = new NativeCpuStage(be, { threads: o.threads, readDepth: depth });
      stage.prepare({ heads: KV_HEADS, kvHeads: KV_HEADS, headDim: HEAD_DIM, storeCapacity: n, dtype: "bf16" });
      stage.query(0).fill(0.01);
      const times: number[] = [];
      let reads = 0;
      for (let r = 0; r <= rounds; r++) {
        const job: CpuStageJob = { slot: 0, k, v, offloaded: n, kmax: perHead, scale: 0.088, work: { kind: "selected", selection: { kind: "perKvHead", ids: draw() } } };
        store.dropFileCache();
        stage.submit(job);
        stage.wait();
        if (r === 0) continue; // the first job opens the stage's readers, which a running stage keeps
        const issued = depth === 0 ? perHead * KV_HEADS : stage.lastReads().reads;
        times.push(stage.lastSplit().gatherMs / issued);
        reads += issued;
      }
      const perRead = [...times].sort((a, b) => a - b)[times.length >> 1]!, inFlight = o.threads * Math.max(1, depth);
      return { latencyUs: perRead * 1e3 * inFlight, readDepth: inFlight, reads, rows: rounds * perHead * KV_HEADS };
    });
  } finally {
    be.free(k);
    be.free(v);
  }
}
