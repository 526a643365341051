/**
 * Where a decode layer's weight stream stops: per-block timestamps
 * (%globaltimer) of the stream GEMVs' events, from a library built with -DHG_TRACE
 * (native/trace.cuh), for one replayed step graph of 8 layers in the 8B shapes — o_proj +=,
 * norm + gate/up, down +=, norm + qkv, then split-K attention over 2 048 tokens — as single
 * launches. Prints, a GEMV a row, each event's
 * earliest / median / latest block in µs from the step's first event, the step's µs a layer, and
 * the DRAM-idle estimate (gaps between one GEMV's last landed slot and the next one's first).
 * Usage: HYBRIDGEN_KERNELS_CUDA_LIB=<trace build> bun trace-bench.js [--layers 8] [--no-attn]
 *   (the trace build: `node scripts/build-native.mjs --trace` in packages/kernels-cuda →
 *   lib/libhgcuda-trace.so)
 */
import { dlopen, FFIType, ptr } from "bun:ffi";
import { createCudaBackend, cudaAvailability, describeCudaAvailability } from "@hybridgen/kernels-cuda";
import { writeRepeating } from "./fill.js";
import { LAYER_GEMV_NAMES, layerGemvs } from "./layer-gemvs.js";
import { arg } from "../args.js";
import { cudaLab } from "@hybridgen/kernels-cuda/lab";

const a = cudaAvailability();
console.log(describeCudaAvailability(a));
if (!a.available) process.exit(1);
const lib = dlopen(process.env.HYBRIDGEN_KERNELS_CUDA_LIB ?? "", {
  hg_trace_set: { args: [FFIType.i32], returns: FFIType.i32 },
  hg_trace_read: { args: [FFIType.ptr, FFIType.i32], returns: FFIType.i32 },
});
const L = Number(arg("layers", "8")), withAttn = !process.argv.includes("--no-attn");
const cuda = createCudaBackend({ arenaBytes: 12 * 2 ** 30 });
const chunk = Float32Array.from({ length: 1 << 20 }, (_, i) => Math.sin(i * 0.37) * 0.02);
const layer = layerGemvs(cuda, chunk, L);
const kvH = 8, hd = 128, span = 2048;
const kv = Array.from({ length: 2 * L }, () => {
  const t = cuda.alloc([kvH, span + 1, hd], "bf16");
  writeRepeating(cuda, t, chunk, kvH * (span + 1) * hd);
  return t;
});
const q = cuda.view(layer.qkv, 0, [1, 4096]);
cudaLab(cuda).setMatvecFusion({ norm: true, siluMul: true, accumulate: true });

const tagName = new Map<bigint, string>();
layer.ws.forEach((set, l) => set.forEach((w, j) => tagName.set(BigInt(cuda.address(w)), `L${l} ${LAYER_GEMV_NAMES[j]}`)));

function step(): void {
  cuda.beginStep("trace-bench");
  for (let l = 0; l < L; l++) {
    layer.run(l);
    if (withAttn) cuda.attnCausal(layer.att, q, 1, kv[2 * l], kv[2 * l + 1], 0, span - 1, 0.088);
  }
  cuda.endStep();
}

const EVENTS = ["block in", "1st copy", "ring issued", "last copy", "x readable", "x ready", "1st slot", "warp done"];
const REC = 24;  // bytes: t u64, tag ptr, block i32, ev i32 (native/trace.cuh's TraceRec)
const buf = new ArrayBuffer(REC * (1 << 20));
{
  step();
  step();
  using t = cuda.timer();
  t.mark();
  for (let r = 0; r < 10; r++) step();
  t.mark();
  const usLayer = (t.ms() / 10 / L) * 1e3;
  lib.symbols.hg_trace_set(1);
  using tt = cuda.timer();
  tt.mark();
  step();
  tt.mark();
  const traceUs = (tt.ms() / L) * 1e3;  // µs a layer with the records on: what tracing costs
  cuda.synchronize();
  const n = lib.symbols.hg_trace_read(ptr(buf), 1 << 20);
  lib.symbols.hg_trace_set(0);
  if (n < 0) {
    console.log("this library has no trace (build it with -DHG_TRACE)");
    process.exit(1);
  }
  const dv = new DataView(buf);
  // Every record slot comes back; unwritten ones have t = 0. Events 7–14 are warps 0–7 done (one
  // column, "warp done").
  const recs: { t: bigint; tag: bigint; block: number; ev: number }[] = [];
  for (let i = 0; i < n; i++) {
    const t = dv.getBigUint64(i * REC, true);
    if (t === 0n) continue;
    const ev = dv.getInt32(i * REC + 20, true);
    recs.push({ t, tag: dv.getBigUint64(i * REC + 8, true), block: dv.getInt32(i * REC + 16, true), ev: ev >= 7 && ev <= 14 ? 7 : ev });
  }
  if (!recs.length) {
    console.log("no events recorded");
    process.exit(1);
  }
  const t0 = recs.reduce((m, r) => (r.t < m ? r.t : m), recs[0].t);
  const ts = [...new Set(recs.map((r) => r.t))].sort((x, y) => (x < y ? -1 : 1));
  let res = Infinity;
  for (let i = 1; i < ts.length; i++) res = Math.min(res, Number(ts[i] - ts[i - 1]));
  const byTag = new Map<bigint, Map<number, number[]>>();
  for (const r of recs) {
    const m = byTag.get(r.tag) ?? new Map<number, number[]>();
    byTag.set(r.tag, m);
    const l = m.get(r.ev) ?? [];
    m.set(r.ev, l);
    l.push(Number(r.t - t0) / 1e3);
  }
  const order = [...byTag.entries()].sort((x, y) => Math.min(...x[1].get(0) ?? x[1].get(1) ?? [Infinity]) - Math.min(...y[1].get(0) ?? y[1].get(1) ?? [Infinity]));
  console.log(`\n## single launches${withAttn ? ", attention 2K after qkv" : ""}: ${usLayer.toFixed(1)} µs a layer in a graph (the traced step: ${traceUs.toFixed(1)}); ${recs.length} events, timer steps ≥ ${res} ns`);
  console.log(`| GEMV | ${EVENTS.join(" | ")} |\n| --- |${EVENTS.map(() => " --- |").join("")}`);
  const cell = (v?: number[]) => {
    if (!v || !v.length) return "";
    const s = [...v].sort((x, y) => x - y);
    return `${s[0].toFixed(1)} / ${s[s.length >> 1].toFixed(1)} / ${s[s.length - 1].toFixed(1)}`;
  };
  for (const [tag, m] of order.slice(0, 12)) console.log(`| ${tagName.get(tag) ?? tag.toString(16)} | ${EVENTS.map((_, e) => cell(m.get(e))).join(" | ")} |`);
}
cuda.close();
