/**
 * Device checks of the page index ranked on the GPU (issue 33): Backend.indexRank against the
 * definition (spec page-index.ts: the flat choice over every page's f64 bound, ties to the lower
 * page; a page may differ only where bounds tie within f32 rounding), for both forms, headDim 64
 * and 128, GQA groups 1/4/8, counts below the capacity and wants up to the kernel's limit; then hybrid
 * decode of a tiny model with the index ranked on the device against the same selector ranked by the
 * CPU stage (placement "host"): the same tokens and logits within f32 rounding. Then the ranking's
 * device time a layer at the 8B shape (timeIndexRank: 32 rankings recorded as one step, what the
 * planner charges) beside its bytes at the D2D copy rate. --decode-only: the hybrid decode checks alone
 * (the rankings' path through the step, side stream included, in a few seconds of a device call).
 *   ./bun apps/bench/src/cuda/index-check.ts [--decode-only]
 */
import { dummyModelFiles, indexFold, indexPageBounds, loadModel, pageIndex, PAGE_INDEX_FORM_CODE, seededRandom, type DeviceIndexShape, type PageIndexForm } from "@hybridgen/core";
import { createCpuBackend, storeKeys, type CpuTensor } from "@hybridgen/kernels-cpu";
import { createCudaBackend } from "@hybridgen/kernels-cuda";
import { createSelector } from "@hybridgen/selectors";
import { createHybridAttention, deviceIndexShape, timeIndexRank } from "@hybridgen/runtime";

using cuda = createCudaBackend({});
using cpu = createCpuBackend({ threads: 4 });
const rnd = seededRandom(33);
let failed = 0;
const decodeOnly = process.argv.includes("--decode-only");

function rankCase(form: PageIndexForm, kvHeads: number, group: number, d: number, cap: number, page: number, n: number, want: number): string {
  const K = cpu.alloc([kvHeads, cap, d], "bf16") as CpuTensor;
  const keys = new Float32Array(kvHeads * cap * d);
  for (let i = 0; i < keys.length; i++) keys[i] = (rnd() * 2 - 1) * (i % d % 7 === 0 ? 5 : 1) * (1 + (Math.floor(i / d / 5) % 3));
  cpu.write(K, keys);
  const x = pageIndex(kvHeads, d, cap, page, 1, form);
  indexFold(storeKeys(K), 0, n, x);
  cpu.free(K);
  const P = x.pageCapacity, cb = x.codeBytes, codes = new Uint8Array(P * kvHeads * cb), scales = new Float32Array(P * kvHeads);
  const hostScales = new Float32Array(x.data.buffer, x.pageScales, kvHeads * P);
  for (let g = 0; g < kvHeads; g++) {
    for (let p = 0; p < P; p++) {
      codes.set(x.data.subarray(x.pageCodes + (g * P + p) * cb, x.pageCodes + (g * P + p + 1) * cb), (p * kvHeads + g) * cb);
      scales[p * kvHeads + g] = hostScales[g * P + p]!;
    }
  }
  const shape: DeviceIndexShape = { form: PAGE_INDEX_FORM_CODE[form], kvHeads, group, headDim: d, pageCapacity: P, scalesOffset: codes.length };
  const dev = cuda.alloc([(codes.length + scales.length * 4) / 4]);
  cuda.write(dev, new Float32Array(codes.buffer));
  cuda.write(dev, scales, codes.length / 4);
  const q = Float32Array.from({ length: kvHeads * group * d }, () => rnd() * 2 - 1);
  const qt = cuda.alloc([1, q.length]);
  cuda.write(qt, q);
  const out = cuda.alloc([1, kvHeads * want + 4]), scratch = cuda.alloc([Math.ceil(cuda.indexRankScratch(shape, want) / 4) + 1]);
  const count = Math.ceil(n / page);
  cuda.indexRank(out, 16, dev, shape, qt, count, want, scratch);
  const got = new Int32Array(cuda.read(out, 4, kvHeads * want).buffer);
  for (const t of [dev, qt, out, scratch]) cuda.free(t);
  const bounds = indexPageBounds(q, group, x, n);
  let bad = 0, worst = 0;
  for (let g = 0; g < kvHeads; g++) {
    const b = (p: number) => bounds[g * count + p]!;
    const order = Array.from({ length: count }, (_, p) => p).sort((a, c) => b(c) - b(a) || a - c);
    const mine = got.subarray(g * want, (g + 1) * want), w = Math.min(want, count), tol = 1e-5 * Math.max(1, ...order.slice(0, w).map((p) => Math.abs(b(p))));
    const seen = new Set<number>();
    for (let i = 0; i < want; i++) {
      if (i >= w) {
        if (mine[i] !== -1) bad++;
        continue;
      }
      const p = mine[i]!;
      if (!(p >= 0 && p < count) || seen.has(p)) {
        bad++;
        continue;
      }
      seen.add(p);
      worst = Math.max(worst, Math.abs(b(p) - b(order[i]!)) / tol);
      if (Math.abs(b(p) - b(order[i]!)) > tol) bad++;
    }
  }
  failed += bad > 0 ? 1 : 0;
  return `${bad ? "FAIL" : "PASS"} indexRank ${form} kv ${kvHeads} × group ${group} × d ${d}, ${count}/${P} pages, want ${want}: ${bad} pages off (worst bound gap ${worst.toFixed(3)} of the tolerance)`;
}


for (const form of decodeOnly ? [] : (["int8", "int4"] as const)) {
  for (const [kvHeads, group, d, cap, page, n, want] of [
    [8, 4, 128, 200_000, 16, 131_000, 17], [8, 4, 128, 200_000, 16, 200_000, 65], [2, 8, 64, 5000, 8, 4321, 100], [4, 1, 128, 3000, 16, 50, 10], [8, 4, 128, 40_000, 16, 39_999, 256],
  ] as const) console.log(rankCase(form, kvHeads, group, d, cap, page, n, want));
}

// Hybrid decode: the index ranked on the device against the stage's own search.
const TINY = {
  architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 512, intermediate_size: 1024, num_hidden_layers: 3, num_attention_heads: 8,
  num_key_value_heads: 2, vocab_size: 512, max_position_embeddings: 2048, rms_norm_eps: 1e-5, rope_theta: 10000, tie_word_embeddings: false,
};
async function decode(placement: "host" | "device", logits: "exact" | "verified", form: PageIndexForm) {
  using files = dummyModelFiles(TINY, "f32", 5, undefined, "tiny");
  using model = loadModel(files, cuda, { maxContext: 1200, gpuKvBudget: 64, sinkTokens: 4, kvDtype: "bf16" });
  model.cache.attachHostStore(createCpuBackend({ threads: 1 }), cuda.hostTransfers(), true);
  using ha = await createHybridAttention(model, cuda, { selector: createSelector("index", { form, pageSize: 8, placement }), scheduler: "fixed", k: 24, timing: "pre", logits, cpuStageThreads: 2 });
  if ((ha.deviceIndex !== null) !== (placement === "device")) throw new Error(`placement ${placement}: device index ${ha.deviceIndex ? "made" : "not made"}`);
  const prompt = Int32Array.from({ length: 1000 }, (_, i) => (i * 37 + 11) % 512);
  const out = [Float32Array.from(model.forward(prompt, 0))], tokens: number[] = [];
  for (let s = 0; s < 16; s++) {
    const last = out[out.length - 1]!;
    tokens.push(last.indexOf(Math.max(...last)));
    out.push(Float32Array.from(model.forward(Int32Array.of(tokens[s]!), 1000 + s)));
  }
  return { tokens, out };
}
for (const form of ["int8", "int4"] as const) {
  for (const logits of ["exact", "verified"] as const) {
    const host = await decode("host", logits, form), device = await decode("device", logits, form);
    let worst = 0;
    device.out.forEach((l, i) => l.forEach((v, j) => (worst = Math.max(worst, Math.abs(v - host.out[i]![j]!)))));
    const ok = device.tokens.join() === host.tokens.join() && worst <= 1e-3;
    failed += ok ? 0 : 1;
    console.log(`${ok ? "PASS" : "FAIL"} hybrid decode, index ${form} ranked on the device vs by the stage, ${logits}: tokens ${device.tokens.join() === host.tokens.join() ? "equal" : "differ"}, max |Δ logit| ${worst.toExponential(2)}`);
  }
}
console.log(failed ? `index checks: ${failed} FAILED` : "index checks: ALL PASS");
if (decodeOnly) process.exit(failed ? 1 : 0);

// The ranking's device time at the 8B shape (8 KV heads × 4, headDim 128, pages of 16) for the offloaded rows of 32K, 131K and 1M.
const copyRate = cuda.copyBandwidth(2 ** 30, 10);
console.log(`\nranking a layer, recorded as a step of 32 (D2D copy ${(copyRate / 1e9).toFixed(0)} GB/s)\n| offloaded | pages a head | form | want | index MB | floor µs | µs a layer | × floor | ms a step (32 layers) |\n| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |`);
for (const offloaded of [28_672, 126_912, 1_000_000]) {
  for (const form of ["int8", "int4"] as const) {
    for (const want of [17, 65]) {
      const shape = deviceIndexShape(form, 8, 4, 128, Math.ceil(offloaded / 16)), bytes = shape.scalesOffset + shape.pageCapacity * 8 * 4;
      const ms = timeIndexRank(cuda, shape, want, 32), floor = (bytes / copyRate) * 1e6;
      console.log(`| ${offloaded} | ${shape.pageCapacity} | ${form} | ${want} | ${(bytes / 1e6).toFixed(1)} | ${floor.toFixed(1)} | ${(ms * 1e3).toFixed(1)} | ${((ms * 1e3) / floor).toFixed(1)} | ${(ms * 32).toFixed(2)} |`);
    }
  }
}
process.exit(failed ? 1 : 0);
