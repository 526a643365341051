/**
 * Device checks of the stage hand-off on the device (HostTransfers stageSignal, awaitSignal,
 * readMapped, gatherRowsAt, padColumnsAt on the CUDA backend), with the CPU stage's side played
 * by a timer that writes the output into pinned host memory and then the signal word (a raw
 * Uint32Array over it):
 *   1. awaitSignal holds the compute stream until the word is raised; a readMapped queued behind
 *      it reads what was written meanwhile — eager, then one recorded step captured once and
 *      replayed twice with new signal values;
 *   2. a wait past the timeout gives up: times() throws naming the value and the word, a wait
 *      queued behind it returns at once, fence() reports a later one, and a wait after that works;
 *   3. times().gpuMs leaves out the waited time, waitMs reports it;
 *   4. readMapped in 4- and 16-byte pieces, gatherRowsAt (gatherRows's bytes) and padColumnsAt
 *      (against a TypeScript computation), eager and recorded, with the table rewritten between;
 *   5. rowFetch: a side-stream fetch waits for its signal (the table is written just before it is
 *      raised), the compute stream's ready() waits for the fetch, and the next fetch into the slot
 *      waits for release() (the compute stream still reads the rows after a later wait) — eager and recorded.
 *   6. sendSignalled (the word reaches each value once the bytes are in host memory), and pinned
 *      round trips through the copy stream with T_tx from its events.
 * hybrid-bench.ts runs them with its checks (--skip-bench); gatherRows itself: mapped-rows-checks.ts.
 */
import { toArrayBuffer } from "bun:ffi";
import { keptColumns, type HostRegion, type HostSignal } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import type { CudaBackend, CudaHostLink } from "@hybridgen/kernels-cuda";
import { cudaLab } from "@hybridgen/kernels-cuda/lab";

type Check = (ok: boolean, what: string) => void;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const sameBits = (a: Float32Array, b: Float32Array) => {
  if (a.length !== b.length) return false;
  const bb = new Uint32Array(b.buffer, b.byteOffset, b.length);
  return new Uint32Array(a.buffer, a.byteOffset, a.length).every((x, i) => x === bb[i]);
};
const wordOf = (s: HostSignal) => new Uint32Array(toArrayBuffer(s.address as never, 0, 4));

/** The CPU stage's side: after `ms`, `write()` its output, then raise the signal's word. */
function raiseLater(s: HostSignal, ms: number, write?: () => void): void {
  const word = wordOf(s);
  setTimeout(() => {
    write?.();
    Atomics.store(word, 0, s.value);
  }, ms);
}

interface Rig {
  cuda: CudaBackend;
  link: CudaHostLink;
  region: HostRegion;
  f32: Float32Array;
  i32: Int32Array;
}

async function releaseChecks({ cuda, link, region, f32 }: Rig, check: Check): Promise<void> {
  const n = 4096;
  const dst = cuda.alloc([1, n]);
  try {
    const before = cudaLab(cuda).graphStats();
    for (let step = 0; step < 4; step++) {
      const recorded = step > 0;
      f32.fill(-1, 0, n); // what the device would read without the wait
      const s = link.stageSignal();
      if (recorded) cuda.beginStep("stage-handoff-check");
      link.awaitSignal(s);
      link.readMapped({ host: region, hostOffset: 0, tensor: dst, tensorOffset: 0, width: n * 4, rows: 1 });
      if (recorded) cuda.endStep();
      const want = Float32Array.from({ length: n }, (_, i) => i * 0.25 + step);
      raiseLater(s, 30, () => f32.set(want));
      await sleep(100);
      const t = link.times();
      check(sameBits(cuda.read(dst), want) && t.waitMs > 15, `awaitSignal ${recorded ? `recorded (step ${step})` : "eager"}: the device waited ${t.waitMs.toFixed(1)} ms for the word (value ${s.value}), then read what the host wrote meanwhile`);
    }
    const after = cudaLab(cuda).graphStats();
    const d = [after.captures - before.captures, after.replays - before.replays, after.drained - before.drained];
    check(d[0] === 1 && d[1] === 2 && d[2] === 0, `awaitSignal recorded: 1 capture and 2 replays with new values, no drain (captures ${d[0]}, replays ${d[1]}, drained ${d[2]})`);
  } finally {
    cuda.free(dst);
  }
}

async function timeoutChecks({ link }: Rig, check: Check): Promise<void> {
  const thrown = (f: () => unknown) => {
    try {
      f();
      return "";
    } catch (e) {
      return (e as Error).message;
    }
  };
  const s = link.stageSignal();
  const word = wordOf(s);
  const held = word[0];
  try {
    link.setWaitTimeout(50);
    link.awaitSignal(s); // never raised
    await sleep(10); // that wait runs with 50 ms
    link.setWaitTimeout(60_000);
    link.awaitSignal(link.stageSignal()); // behind a give-up: returns at once
    const t0 = performance.now();
    const msg = thrown(() => link.times());
    const ms = performance.now() - t0;
    const want = `the device gave up waiting for the CPU stage (signal value ${s.value}; the word held ${held})`;
    check(msg === want && ms < 5000, `a wait past its 50 ms timeout: times() throws "${msg}" after ${ms.toFixed(0)} ms (the wait queued behind it did not wait a minute)`);
    check(thrown(() => link.times()) === "", "the give-up is reported once: the next times() returns");
    link.setWaitTimeout(20);
    const s2 = link.stageSignal();
    link.awaitSignal(s2);
    await sleep(200);
    const fenced = thrown(() => link.fence());
    check(fenced.includes(`(signal value ${s2.value}; the word held ${held})`), `fence() reports a later give-up: "${fenced}"`);
    link.setWaitTimeout(10_000);
    const s3 = link.stageSignal();
    Atomics.store(word, 0, s3.value);
    link.awaitSignal(s3);
    const t = link.times();
    check(t.waitMs < 1000, `after the give-ups, a raised signal's wait returns (${t.waitMs.toFixed(2)} ms waited since the fence)`);
  } finally {
    link.setWaitTimeout(10_000);
  }
}

async function timingChecks({ cuda, link }: Rig, check: Check): Promise<void> {
  const x = cuda.alloc([64, 1024]);
  try {
    link.times();
    link.mark("resume");
    cuda.add(x, x, x, 64);
    const s = link.stageSignal();
    link.awaitSignal(s);
    cuda.add(x, x, x, 64);
    link.mark("pause");
    raiseLater(s, 60);
    await sleep(150);
    const t = link.times();
    check(t.waitMs > 40 && t.gpuMs >= 0 && t.gpuMs < 10, `times(): a 60 ms wait inside resume..pause is left out of gpuMs (gpuMs ${t.gpuMs.toFixed(3)}, waitMs ${t.waitMs.toFixed(1)})`);
  } finally {
    cuda.free(x);
  }
}

function readMappedChecks({ cuda, link, region, f32 }: Rig, check: Check): void {
  const rows = 5, tw = 40;
  const src = Float32Array.from({ length: 1024 }, (_, i) => Math.sin(i * 0.7) * 10);
  f32.set(src);
  const cases = [
    { what: "4-byte pieces", hostOffset: 4, tensorOffset: 12, width: 7 * 4, hostPitch: 37 * 4, tensorPitch: tw * 4 },
    { what: "16-byte pieces", hostOffset: 64, tensorOffset: 0, width: 32 * 4, hostPitch: 48 * 4, tensorPitch: tw * 4 },
  ];
  for (const [i, { what, ...c }] of cases.entries()) {
    const want = new Float32Array(rows * tw).fill(7);
    for (let row = 0; row < rows; row++) {
      for (let j = 0; j < c.width / 4; j++) want[c.tensorOffset / 4 + row * tw + j] = src[c.hostOffset / 4 + (row * c.hostPitch) / 4 + j];
    }
    for (const recorded of [false, true]) {
      const t = cuda.alloc([rows, tw]);
      try {
        cuda.write(t, new Float32Array(rows * tw).fill(7));
        if (recorded) cuda.beginStep(`stage-handoff-read-${i}`);
        link.readMapped({ host: region, tensor: t, rows, ...c });
        if (recorded) cuda.endStep();
        check(sameBits(cuda.read(t), want), `readMapped ${what} ${recorded ? "recorded" : "eager"}: ${rows} pitched rows of ${c.width} bytes equal the host rows`);
      } finally {
        cuda.free(t);
      }
    }
  }
}

function gatherAtChecks({ cuda, link, region, i32 }: Rig, check: Check): void {
  using host = createCpuBackend({ threads: 1 });
  const groups = 2, cap = 4096, width = 128, kmax = 100;
  const store = host.alloc([groups, cap, width]); // 4 MiB: pinned and mapped
  host.write(store, Float32Array.from({ length: groups * cap * width }, (_, i) => Math.sin(i * 0.013) * 50));
  const storeRegion = host.hostRegion(store);
  link.pin(storeRegion);
  try {
    const rows = { groups, cap, rowBytes: width * 4, kmax };
    const table = { address: region.address, byteLength: groups * (1 + kmax) * 4 };
    for (const [step, recorded] of [false, true, true].entries()) {
      const counts = Int32Array.of(kmax - step, 61 + step);
      const ids = Int32Array.from({ length: groups * kmax }, (_, i) => ((i % kmax) * (37 + step) + 5) % cap);
      ids[kmax + 3] = cap + 7; // outside the store: a zero row
      const want = cuda.alloc([groups * kmax, width]), got = cuda.alloc([groups * kmax, width]);
      try {
        for (const t of [want, got]) cuda.write(t, new Float32Array(groups * kmax * width).fill(NaN));
        link.gatherRows!(want, storeRegion, rows, ids, counts);
        i32.set(counts, 0);
        i32.set(ids, groups);
        if (recorded) cuda.beginStep("stage-handoff-gather");
        link.gatherRowsAt(got, storeRegion, rows, table);
        if (recorded) cuda.endStep();
        check(sameBits(cuda.read(got), cuda.read(want)), `gatherRowsAt ${recorded ? `recorded (step ${step})` : "eager"}: the table read from mapped memory gives gatherRows's bytes`);
      } finally {
        cuda.free(want);
        cuda.free(got);
      }
    }
  } finally {
    link.unpin(storeRegion);
  }
}

function padChecks({ cuda, link, region, i32 }: Rig, check: Check): void {
  const heads = 8, width = 50, group = 2, col = 10, kmax = 20;
  const table = { address: region.address + 8192, byteLength: (heads / group) * 4 };
  const values = Float32Array.from({ length: heads * width }, (_, i) => i * 0.5 - 30);
  for (const [step, counts] of [[3, -1, 99, 20], [0, 7, 20, 1], [19, 2, -5, 40]].entries()) {
    i32.set(counts, 8192 / 4);
    const want = values.slice();
    for (let h = 0; h < heads; h++) {
      const n = Math.min(Math.max(counts[Math.floor(h / group)], 0), kmax);
      for (let j = n; j < kmax; j++) want[h * width + col + j] = -Infinity;
    }
    const scores = cuda.alloc([heads, width]);
    try {
      cuda.write(scores, values);
      if (step > 0) cuda.beginStep("stage-handoff-pad");
      link.padColumnsAt(scores, col, kmax, group, table);
      if (step > 0) cuda.endStep();
      check(sameBits(cuda.read(scores), want), `padColumnsAt ${step > 0 ? `recorded (step ${step})` : "eager"}: counts [${counts}] (clamped to [0, ${kmax}]) give the −∞ columns a host computation gives`);
    } finally {
      cuda.free(scores);
    }
  }
}

/** keepRows against spec's keptColumns and a host gather: ties across a chunk of 256 columns, counts clamped, fewer than keep, none; eager and recorded. */
function keepChecks({ cuda, link, region, i32 }: Rig, check: Check): void {
  using host = createCpuBackend({ threads: 1 });
  const groups = 2, group = 4, heads = groups * group, cap = 4096, dim = 128, col = 10;
  const store = host.alloc([groups, cap, dim]);
  const storeData = Float32Array.from({ length: groups * cap * dim }, (_, i) => Math.cos(i * 0.011) * 20);
  host.write(store, storeData);
  const storeRegion = host.hostRegion(store);
  link.pin(storeRegion);
  const at = 16384;
  try {
    // 300 columns: one span of the kernel's 1 024; 1 300: two, the tie ranks and kept rows carried into the second.
    for (const [kmax, keep, cases] of [[300, 70, [[300, 250], [120, 999], [60, 0], [-3, 299]]], [1300, 500, [[1300, 1200], [1100, 40]]]] as const) {
    const width = kmax + 20, table = { address: region.address + at, byteLength: groups * (1 + kmax) * 4 };
    for (const [step, counts] of cases.entries()) {
      // Few distinct values: many ties, some across the chunk boundary at column 256.
      const values = Float32Array.from({ length: heads * width }, (_, i) => Math.round(Math.sin(i * 0.37 + step) * 6) / 2);
      const ids = Int32Array.from({ length: groups * kmax }, (_, i) => ((i % kmax) * (41 + step) + 3) % cap);
      ids[5] = cap + 9; // outside the store: a zero row
      i32.set(Int32Array.from(counts), at / 4);
      i32.set(ids, at / 4 + groups);
      const kept = keptColumns(values, width, col, group, kmax, Int32Array.from(counts), keep);
      const wantScores = values.slice(), wantV = new Float32Array(groups * kmax * dim);
      for (let g = 0; g < groups; g++) {
        for (let j = 0; j < kmax; j++) {
          if (!kept[g * kmax + j]) {
            for (let h = g * group; h < (g + 1) * group; h++) wantScores[h * width + col + j] = -Infinity;
            continue;
          }
          const id = ids[g * kmax + j]!;
          if (id >= 0 && id < cap) wantV.set(storeData.subarray((g * cap + id) * dim, (g * cap + id + 1) * dim), (g * kmax + j) * dim);
        }
      }
      const scores = cuda.alloc([heads, width]), v = cuda.alloc([groups * kmax, dim]);
      try {
        cuda.write(scores, values);
        cuda.write(v, new Float32Array(groups * kmax * dim).fill(NaN));
        if (step > 0) cuda.beginStep("stage-handoff-keep");
        link.keepRows!([{ scores, col, group, keep, values: v, src: storeRegion, rows: { groups, cap, rowBytes: dim * 4, kmax }, table }]);
        if (step > 0) cuda.endStep();
        const n = Array.from(counts, (c) => Math.min(Math.max(c, 0), kmax)), keptN = [0, 1].map((g) => kept.subarray(g * kmax, (g + 1) * kmax).reduce((a, b) => a + b, 0));
        check(sameBits(cuda.read(scores), wantScores) && sameBits(cuda.read(v), wantV),
          `keepRows ${step > 0 ? `recorded (step ${step})` : "eager"}: kmax ${kmax}, counts [${counts}] (n ${n}), keep ${keep} → ${keptN} kept a KV head: keptColumns' −∞ columns and the kept V rows (zero rows elsewhere)`);
      } finally {
        cuda.free(scores);
        cuda.free(v);
      }
    }
    }
  } finally {
    link.unpin(storeRegion);
  }
}

async function fetchChecks({ cuda, link, region, i32 }: Rig, check: Check): Promise<void> {
  using host = createCpuBackend({ threads: 1 });
  const groups = 2, cap = 4096, width = 128, kmax = 100; // 200 rows: a chunk of the gather left partly empty
  const store = host.alloc([groups, cap, width]);
  host.write(store, Float32Array.from({ length: groups * cap * width }, (_, i) => Math.cos(i * 0.011) * 40));
  const storeRegion = host.hostRegion(store);
  link.pin(storeRegion);
  const rows = { groups, cap, rowBytes: width * 4, kmax }, n = groups * kmax;
  const tableA = { address: region.address + 16384, byteLength: groups * (1 + kmax) * 4 }, tableB = { ...tableA, address: tableA.address + 4096 };
  const selection = (seed: number) => ({
    counts: Int32Array.of(kmax - seed, 50 + seed),
    ids: Int32Array.from({ length: n }, (_, i) => ((i % kmax) * (29 + seed) + 3 * seed) % cap),
  });
  const setTable = (t: HostRegion, sel: { counts: Int32Array; ids: Int32Array } | null) => {
    const at = (t.address - region.address) / 4;
    if (!sel) i32.fill(-1, at, at + groups * (1 + kmax)); // what a fetch that did not wait would read: zero rows
    else {
      i32.set(sel.counts, at);
      i32.set(sel.ids, at + groups);
    }
  };
  i32.fill(0, 32768 / 4, 32768 / 4 + 48); // the signal words below start at 0
  const f = link.rowFetch();
  const bufs = [cuda.alloc([n, width]), cuda.alloc([n, width]), cuda.alloc([n, width]), cuda.alloc([n, width]), cuda.alloc([n, width])];
  const [got, wantA, wantB, snapA, snapB] = bufs;
  try {
    for (const [step, recorded] of [false, true, true].entries()) {
      const a = selection(step), b = selection(step + 7);
      link.gatherRows!(wantA, storeRegion, rows, a.ids, a.counts);
      link.gatherRows!(wantB, storeRegion, rows, b.ids, b.counts);
      for (const t of [got, snapA, snapB]) cuda.write(t, new Float32Array(n * width).fill(NaN));
      setTable(tableA, null);
      setTable(tableB, b);
      // Three words of their own (one stage word's successive values would raise one another).
      const word = (line: number): HostSignal => ({ address: region.address + 32768 + 64 * line, value: step + 1 });
      const sa = word(0), hold = word(1), sb = word(2);
      f.fetch(0, sa, [{ dst: got, src: storeRegion, rows, table: tableA }]);
      if (recorded) cuda.beginStep("stage-handoff-fetch");
      link.awaitSignal(sa);
      f.ready(0);
      link.awaitSignal(hold); // the rows are read after this wait: a fetch that ignored release() would have replaced them
      cuda.copyRows(snapA, 0, got, 0, n);
      f.release(0);
      if (recorded) cuda.endStep();
      f.fetch(0, sb, [{ dst: got, src: storeRegion, rows, table: tableB }]);
      wordOf(sb)[0] = sb.value; // B may run at once, once the release has
      raiseLater(sa, 20, () => setTable(tableA, a));
      raiseLater(hold, 60);
      link.awaitSignal(sb);
      f.ready(0);
      cuda.copyRows(snapB, 0, got, 0, n);
      f.release(0);
      await sleep(100); // the timers raise the words while the device waits (a read now would block them)
      const what = recorded ? `recorded (step ${step})` : "eager";
      check(sameBits(cuda.read(snapA), cuda.read(wantA)), `rowFetch ${what}: the fetch waited for its signal and ready() for the fetch (gatherRows's bytes)`);
      check(sameBits(cuda.read(snapB), cuda.read(wantB)), `rowFetch ${what}: the next fetch into the slot waited for release(), and ready() for it`);
    }
  } finally {
    f.close();
    for (const t of bufs) cuda.free(t);
    link.unpin(storeRegion);
  }
}

/** sendSignalled, eager and recorded twice: the word reaches each value once the bytes are in host memory. */
async function sendChecks({ cuda, link, region, f32 }: Rig, check: Check): Promise<void> {
  const q = cuda.alloc([1, 4096]);
  try {
    let last: number | undefined;
    for (const recorded of [false, true, true]) {
      const data = Float32Array.from({ length: 4096 }, (_, i) => Math.cos(i + (last ?? 0)));
      cuda.write(q, data);
      if (recorded) cuda.beginStep("signalled-send-check");
      const s = link.sendSignalled!(region, q, 4096 * 4);
      if (recorded) cuda.endStep();
      const word = wordOf(s), t0 = performance.now();
      while (word[0] !== s.value && performance.now() - t0 < 5000) await sleep(1);
      const next = last === undefined || s.value === last + 1;
      last = s.value;
      check(next && word[0] === s.value && sameBits(f32.slice(0, 4096), data), `sendSignalled ${recorded ? "recorded" : "eager"}: the word reached ${s.value} and the 16 KiB before it are in host memory`);
    }
  } finally {
    cuda.free(q);
  }
}

/** Pinned round trips through the copy stream (pitched both ways, compute between) keep the data; events give T_tx; the link's bandwidth probe runs. */
function roundTripChecks({ cuda, link, region, f32 }: Rig, check: Check): void {
  const rows = 64, cols = 96, n = rows * cols;
  const src = Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37) * 100);
  f32.set(src, 0);
  const d = cuda.alloc([rows, 2 * cols]); // wider rows: a pitched copy into the left half
  try {
    link.mark("resume");
    link.toDevice([{ host: region, hostOffset: 0, tensor: d, tensorOffset: 0, width: cols * 4, rows, hostPitch: cols * 4, tensorPitch: 2 * cols * 4 }]);
    cuda.add(d, d, d, rows); // compute after the upload: doubles the left half
    link.toHost([{ host: region, hostOffset: n * 4, tensor: d, tensorOffset: 0, width: cols * 4, rows, hostPitch: cols * 4, tensorPitch: 2 * cols * 4 }]);
    link.mark("pause");
    link.fence();
    const back = f32.subarray(n, 2 * n);
    check(back.every((x, i) => x === src[i]! * 2), "pinned round trip: up (pitched), doubled on the device, down (pitched): every value kept");
    const t = link.times();
    check(t.txMs > 0 && t.gpuMs >= 0, `pinned round trip: events give T_tx ${t.txMs.toFixed(3)} ms and T_gpu ${t.gpuMs.toFixed(3)} ms`);
    const bw = link.bandwidth!(16 * 2 ** 20, 2);
    check(bw.h2d > 1e8 && bw.d2h > 1e8, `the link's bandwidth probe: ${(bw.h2d / 1e9).toFixed(1)} GB/s up, ${(bw.d2h / 1e9).toFixed(1)} GB/s down`);
  } finally {
    cuda.free(d);
  }
}

/** keepRows alone (hybrid-bench's "keep" checks), on a pinned 2 MiB block of its own. */
export function keepRowsChecks(cuda: CudaBackend, check: Check): void {
  const link = cuda.hostTransfers() as CudaHostLink;
  using host = createCpuBackend({ threads: 1 });
  const buf = host.alloc([1, 1 << 19]);
  const region = host.hostRegion(buf);
  link.pin(region);
  try {
    const bytes = toArrayBuffer(region.address as never, 0, region.byteLength);
    keepChecks({ cuda, link, region, f32: new Float32Array(bytes), i32: new Int32Array(bytes) }, check);
  } finally {
    link.unpin(region);
  }
}

export async function stageHandoffChecks(cuda: CudaBackend, check: Check): Promise<void> {
  const link = cuda.hostTransfers() as CudaHostLink;
  using host = createCpuBackend({ threads: 1 });
  const buf = host.alloc([1, 1 << 19]); // 2 MiB: pinned and mapped
  const region = host.hostRegion(buf);
  link.pin(region);
  const bytes = toArrayBuffer(region.address as never, 0, region.byteLength);
  const rig: Rig = { cuda, link, region, f32: new Float32Array(bytes), i32: new Int32Array(bytes) };
  const attempt = async (what: string, f: () => void | Promise<void>) => {
    try {
      await f();
    } catch (e) {
      check(false, `${what}: ${(e as Error).message}`);
    }
  };
  try {
    check(link.mapped!(region), "stage hand-off: a pinned 2 MiB host block is mapped");
    await attempt("sendSignalled", () => sendChecks(rig, check));
    await attempt("pinned round trips", () => roundTripChecks(rig, check));
    await attempt("awaitSignal releases", () => releaseChecks(rig, check));
    await attempt("awaitSignal timeout", () => timeoutChecks(rig, check));
    await attempt("times() without the wait", () => timingChecks(rig, check));
    await attempt("readMapped", () => readMappedChecks(rig, check));
    await attempt("gatherRowsAt", () => gatherAtChecks(rig, check));
    await attempt("padColumnsAt", () => padChecks(rig, check));
    await attempt("rowFetch", () => fetchChecks(rig, check));
  } finally {
    link.unpin(region);
  }
}
