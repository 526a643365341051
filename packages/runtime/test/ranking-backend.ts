/** A CPU backend standing in for a device that ranks page indexes (Backend.indexRank, indexRankRows). */
import { indexPageBounds, pageIndex, type Backend, type DeviceIndexShape, type Tensor } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";

/**
 * A CPU backend that "ranks on the device" the way Backend.indexRank is defined: the page-major
 * page level read back into the definition's index, the flat choice over every page's bound (ties to the lower page),
 * the pages written after the query; indexRankRows ranks its rows so, one after the other. `calls`
 * counts the rankings, `rowCalls` the indexRankRows calls and `rows` their rows.
 */
export function rankingBackend(): { backend: Backend; calls: { n: number; rowCalls: number; rows: number } } {
  const backend: Backend = createCpuBackend({ threads: 1 });
  return { backend, calls: addRanking(backend) };
}

/** `backend` given indexRank, indexRankScratch and indexRankRows by the definition (rankingBackend's); returns its counts. */
export function addRanking(backend: Backend): { n: number; rowCalls: number; rows: number } {
  const calls = { n: 0, rowCalls: 0, rows: 0 };
  backend.indexRankScratch = (x: DeviceIndexShape, want: number) => (want <= x.pageCapacity ? 64 : 0);
  backend.indexRank = (out: Tensor, outOffset: number, index: Tensor, x: DeviceIndexShape, q: Tensor, count: number, want: number) => {
    calls.n++;
    const form = x.form === 1 ? "int8" : "int4", cb = form === "int8" ? 2 * x.headDim : x.headDim, pageSize = 1;
    const raw = backend.read(index), bytes = new Uint8Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength)), ix = pageIndex(x.kvHeads, x.headDim, x.pageCapacity * pageSize, pageSize, 1, form);
    const scales = new Float32Array(ix.data.buffer, ix.pageScales, x.kvHeads * x.pageCapacity), dev = new Float32Array(bytes.buffer, x.scalesOffset, x.pageCapacity * x.kvHeads);
    for (let p = 0; p < x.pageCapacity; p++) {
      for (let g = 0; g < x.kvHeads; g++) {
        ix.data.set(bytes.subarray((p * x.kvHeads + g) * cb, (p * x.kvHeads + g + 1) * cb), ix.pageCodes + (g * x.pageCapacity + p) * cb);
        scales[g * x.pageCapacity + p] = dev[p * x.kvHeads + g]!;
      }
    }
    const bounds = indexPageBounds(backend.read(q, 0, x.kvHeads * x.group * x.headDim), x.group, ix, count * pageSize), pages = new Int32Array(x.kvHeads * want);
    for (let g = 0; g < x.kvHeads; g++) {
      const order = Array.from({ length: count }, (_, p) => p).sort((a, b) => bounds[g * count + b]! - bounds[g * count + a]! || a - b);
      pages.set(order.slice(0, want), g * want);
    }
    backend.write(out, new Float32Array(pages.buffer), outOffset / 4);
  };
  backend.indexRankRows = (rows, x) => {
    calls.rowCalls++;
    calls.rows += rows.length;
    for (const r of rows) backend.indexRank!(r.out, r.outOffset, r.index, x, r.q, r.count, r.want, r.scratch);
  };
  return calls;
}
