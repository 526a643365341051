/**
 * Device checks of the mapped row path — the device reads the selected V (and K) rows from the
 * pinned host store by the stage's ids (HostTransfers.gatherRows) — against the staged path (the
 * stage copies the rows, the copy stream uploads them), on the CUDA backend:
 *   1. the op: gatherRows from a pinned f32 and a bf16 store, eager and inside a recorded step,
 *      equals a host gather byte for byte (rows past a head's count and ids outside the store zero);
 *   2. hybrid decode with top-K 8 in exact, speculative and verified logits, the same tokens fed:
 *      every layer takes the mapped path, its logits equal the staged path's (the same rows and
 *      kernels: bit for bit expected, held to 1e-6 of the largest logit since the aggregation's
 *      atomics may order sums differently), the greedy tokens are equal, and the recorded segments
 *      drain no more often than the staged path's;
 *   3. "all" + verified logits on the mapped path equals full attention on CUDA within 1e-5.
 * hybrid-bench.ts runs them with its checks (--skip-bench).
 */
import { STORIES15M_SHAPE, argmax, dummyModelFiles, loadModel, relError } from "@hybridgen/core";
import { type HybridAttention, type LogitsMode, type RowPath, type RowPathRequest } from "@hybridgen/runtime";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { createHybridAttention } from "@hybridgen/runtime";
import type { CudaBackend } from "@hybridgen/kernels-cuda";
import { cudaLab } from "@hybridgen/kernels-cuda/lab";

type Check = (ok: boolean, what: string) => void;

// A 2400-token store (over 2 MiB a layer in f32): the host link pins it, so the device maps it.
const CONTEXT = 2400, PROMPT = 40, STEPS = 40;
const SHAPE = { ...STORIES15M_SHAPE, max_position_embeddings: 4096 };
const prompt = Int32Array.from({ length: PROMPT }, (_, i) => (i * 7919 + 17) % 32000);

/** Bit patterns of two float arrays equal. */
const sameBits = (a: Float32Array, b: Float32Array) => {
  if (a.length !== b.length) return false;
  const bb = new Uint32Array(b.buffer, b.byteOffset, b.length);
  return new Uint32Array(a.buffer, a.byteOffset, a.length).every((x, i) => x === bb[i]);
};

function gatherOpChecks(cuda: CudaBackend, check: Check): void {
  const link = cuda.hostTransfers();
  using host = createCpuBackend({ threads: 1 });
  const groups = 2, cap = 4096, width = 128, kmax = 300;
  for (const dtype of ["f32", "bf16"] as const) {
    const store = host.alloc([groups, cap, width], dtype); // 4 MiB / 2 MiB: pinned and mapped
    host.write(store, Float32Array.from({ length: groups * cap * width }, (_, i) => Math.sin(i * 0.0131) * 40));
    const region = host.hostRegion(store);
    link.pin(region);
    try {
      const all = host.read(store);
      const counts = Int32Array.of(kmax, 187);
      const ids = Int32Array.from({ length: groups * kmax }, (_, i) => ((i % kmax) * 13 + 3) % cap).sort();
      ids[kmax + 5] = cap + 2; // outside the store: a zero row
      const want = new Float32Array(groups * kmax * width);
      for (let g = 0; g < groups; g++) {
        for (let i = 0; i < counts[g]; i++) {
          const id = ids[g * kmax + i];
          if (id < cap) want.set(all.subarray((g * cap + id) * width, (g * cap + id + 1) * width), (g * kmax + i) * width);
        }
      }
      for (const recorded of [false, true]) {
        const dst = cuda.alloc([groups * kmax, width], dtype);
        cuda.write(dst, new Float32Array(groups * kmax * width).fill(NaN));
        if (recorded) cuda.beginStep("mapped-rows-check");
        const idsCopy = ids.slice();
        link.gatherRows!(dst, region, { groups, cap, rowBytes: width * (dtype === "f32" ? 4 : 2), kmax }, idsCopy, counts.slice());
        idsCopy.fill(0); // read during the call: rewriting them now changes nothing
        if (recorded) cuda.endStep();
        const got = cuda.read(dst);
        cuda.free(dst);
        check(link.mapped!(region) && sameBits(got, want), `gatherRows ${dtype} ${recorded ? "in a recorded step" : "eager"}: ${groups} × ${kmax} rows from a pinned ${cap}-row store equal a host gather byte for byte`);
      }
    } finally {
      link.unpin(region);
      host.free(store);
    }
  }
}

interface Run { logits: Float32Array[]; tokens: number[]; paths: readonly RowPath[]; summary: string; drained: number }

/** Prompt, then STEPS greedy steps (or the tokens fed), on a hybrid model with `rowPath` (null: full attention). */
async function decode(cuda: CudaBackend, hybrid: { logits: LogitsMode; rowPath: RowPathRequest; selector: string } | null, feed?: number[]): Promise<Run> {
  using files = dummyModelFiles(SHAPE, "f32", 7);
  using model = loadModel(files, cuda, { maxContext: CONTEXT, prefillBlock: 64, ...(hybrid ? { gpuKvBudget: 32, sinkTokens: 4 } : {}) });
  let ha: HybridAttention | null = null;
  if (hybrid) {
    ha = await createHybridAttention(model, cuda, {
      selector: hybrid.selector, scheduler: "fixed", k: 8, timing: "post", logits: hybrid.logits, rowPath: hybrid.rowPath, cpuStageThreads: 4,
    });
  }
  try {
    const before = cudaLab(cuda).graphStats().drained;
    const logits = [model.forward(prompt, 0)];
    const tokens: number[] = [];
    for (let s = 0; s < STEPS; s++) {
      const last = logits[logits.length - 1];
      const tok = feed ? feed[s] : argmax(last);
      tokens.push(tok);
      logits.push(model.forward(Int32Array.of(tok), PROMPT + s));
    }
    return { logits, tokens, paths: ha ? [...ha.rowPaths] : [], summary: ha ? ha.stats.summary() : "", drained: cudaLab(cuda).graphStats().drained - before };
  } finally {
    ha?.close();
  }
}

export async function mappedRowChecks(cuda: CudaBackend, check: Check): Promise<void> {
  const attempt = async (what: string, f: () => void | Promise<void>) => {
    try {
      await f();
    } catch (e) {
      check(false, `${what}: ${(e as Error).message}`);
    }
  };
  await attempt("gatherRows op", () => gatherOpChecks(cuda, check));
  for (const logits of ["exact", "speculative", "verified"] as LogitsMode[]) {
    await attempt(`mapped vs staged ${logits}`, async () => {
      const staged = await decode(cuda, { logits, rowPath: "staged", selector: "topk" });
      const mapped = await decode(cuda, { logits, rowPath: "auto", selector: "topk" }, staged.tokens);
      const worst = Math.max(...mapped.logits.map((l, i) => relError(l, staged.logits[i])));
      const identical = mapped.logits.every((l, i) => sameBits(l, staged.logits[i]));
      const allMapped = mapped.paths.length > 0 && mapped.paths.every((p) => p === "mapped");
      check(allMapped, `top-K 8 ${logits}: every layer reads its rows from the mapped host store (${mapped.paths.join(",")})`);
      check(worst <= 1e-6, `top-K 8 ${logits}: mapped rows give the staged rows' logits, ${STEPS + 1} forwards: ${identical ? "bit-identical" : `worst max|Δ|/max|logit| ${worst.toExponential(2)} (≤ 1e-6)`}`);
      const own = await decode(cuda, { logits, rowPath: "auto", selector: "topk" });
      const same = own.tokens.filter((t, i) => t === staged.tokens[i]).length;
      check(same === STEPS, `top-K 8 ${logits}: greedy tokens on the mapped path equal the staged path's (${same}/${STEPS})`);
      check(mapped.drained <= staged.drained, `top-K 8 ${logits}: recorded segments drained ${mapped.drained} times on the mapped path, ${staged.drained} on the staged one (the gather is recorded)`);
      console.log(`  mapped: ${mapped.summary}`);
    });
  }
  await attempt("all + verified, mapped", async () => {
    const full = await decode(cuda, null);
    const all = await decode(cuda, { logits: "verified", rowPath: "mapped", selector: "all" }, full.tokens);
    const worst = Math.max(...all.logits.map((l, i) => relError(l, full.logits[i])));
    check(worst < 1e-5, `"all" + verified on the mapped path vs full attention on CUDA: worst max|Δ|/max|logit| ${worst.toExponential(2)} (< 1e-5)`);
  });
}
