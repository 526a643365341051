/**
 * Pre-QKᵀ selectors on stories15M (./bun apps/bench/src/eval/selector-eval.ts [--budget 32] [--tokens 256]
 * [--selectors topk,streaming,quest,infinigen] [--modes exact,verified:1,verified:4]): teacher-forced over
 * hybrid-eval's text (the runtime's DEFAULT_PROFILE_TEXT), top-1 next-token agreement and mean KL(full ‖ hybrid) for K ∈ {8, 16, 32}
 * with a 32-token device window, and what each selector reads of the host store per decode step
 * (all layers): the selector's own reads through the key primitives (page summaries, partial
 * keys, the rows it folds in) plus the stage's K rows scored and V rows gathered.
 * Run `bun run build` first (this imports the built packages).
 */
import { argmax, ensureStories15M, LlamaModel, logSoftmax64, openModelDir, type CpuStage, type CpuStageJob, type OffloadedKeys, type SelectionTiming, type SelectorPrimitives } from "@hybridgen/core";
import { DEFAULT_PROFILE_TEXT } from "@hybridgen/runtime";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { createHybridAttention, type HybridRuntimeOptions } from "@hybridgen/runtime";

type HybridOptions = Pick<HybridRuntimeOptions, "logits" | "candidates">;

const arg = (name: string, def: string) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1]! : def;
};
const BUDGET = Number(arg("budget", "32")), TOKENS = Number(arg("tokens", "256")), PROMPT = 16;
const SELECTORS = arg("selectors", "topk,streaming,quest,infinigen").split(",");
/** Logits modes, verified with its candidates multiplier (verified:4 = the device scores 4·K chosen tokens). */
const MODES = arg("modes", "exact,verified:1,verified:4").split(",").map((m): { label: string; options: HybridOptions } => {
  const [logits, c] = m.split(":");
  return { label: m, options: logits === "verified" ? { logits, candidates: Number(c ?? 1) } : { logits: logits as HybridOptions["logits"] } };
});
const KS = arg("ks", "8,16,32").split(",").map(Number);

const dir = await ensureStories15M({ onProgress: (m) => console.error(m) });
using files = openModelDir(dir);
using be = createCpuBackend({ threads: 1 });
const ids = files.tokenizer.encode(DEFAULT_PROFILE_TEXT).slice(0, TOKENS);
if (ids.length < TOKENS) throw new Error(`the text is only ${ids.length} tokens`);
using full = LlamaModel.load(files, be, { maxContext: TOKENS });
using hyb = LlamaModel.load(files, be, { maxContext: TOKENS, gpuKvBudget: BUDGET, kvEvictBlock: Math.min(16, BUDGET) });
const { kvHeads, headDim } = hyb.attention.layout;
const KV_BYTES = 4; // the models' KV cache is f32 here

function forced(model: LlamaModel): Float32Array[] {
  model.reset();
  const out = [model.forward(Int32Array.from(ids.slice(0, PROMPT)), 0).slice()];
  for (let t = PROMPT; t < ids.length - 1; t++) out.push(model.forward(Int32Array.of(ids[t]!), t).slice());
  return out;
}

const elt = (k: OffloadedKeys) => (k.dtype === "f32" ? 4 : 2);

/** Counts the bytes of keys and summaries the key primitives read (nominal: elements touched). */
function metered(P: SelectorPrimitives, m: { bytes: number }): SelectorPrimitives {
  return {
    ...P,
    summarizePages: (keys, from, to, pages) => {
      m.bytes += (to - from) * keys.kvHeads * keys.headDim * elt(keys);
      P.summarizePages(keys, from, to, pages);
    },
    pageBounds: (q, g, pages, count, out) => {
      m.bytes += count * pages.kvHeads * pages.headDim * 2 * pages.min.BYTES_PER_ELEMENT;
      return P.pageBounds(q, g, pages, count, out);
    },
    keyScores: (q, g, keys, from, to, out) => {
      m.bytes += (to - from) * keys.kvHeads * keys.headDim * elt(keys);
      return P.keyScores(q, g, keys, from, to, out);
    },
    gatherChannels: (keys, ch, from, to, out) => {
      m.bytes += (to - from) * ch.length * elt(keys);
      P.gatherChannels(keys, ch, from, to, out);
    },
  };
}

/** The stage the runtime built, with metered primitives, counting the K rows it scores and V rows it gathers. */
function meteredStage(stage: CpuStage, m: { bytes: number }): CpuStage {
  if (!stage.primitives) throw new Error(`stage ${stage.name} has no native primitives to meter`);
  const primitives = metered(stage.primitives, m);
  const row = kvHeads * headDim * KV_BYTES;
  return new Proxy(stage, {
    get(target, prop, receiver) {
      if (prop === "primitives") return primitives;
      if (prop === "submit") {
        return (job: CpuStageJob) => {
          const w = job.work;
          const scored = w.kind === "selected" ? (w.selection.kind === "shared" ? w.selection.ids.length : Math.max(...w.selection.ids.map((a) => a.length))) : job.offloaded;
          m.bytes += (scored + job.kmax) * row; // K rows scored (or staged), V rows gathered
          target.submit(job);
        };
      }
      const v = Reflect.get(target, prop, receiver);
      return typeof v === "function" ? v.bind(target) : v;
    },
  }) as CpuStage;
}


const ref = forced(full).map((l) => ({ top: argmax(l), logp: logSoftmax64(l) }));
const rows: string[][] = [];
for (const mode of MODES) {
  for (const name of SELECTORS) {
    const timing: SelectionTiming = name === "topk" ? "post" : "pre";
    for (const k of KS) {
      const meter = { bytes: 0 };
      using h = await createHybridAttention(hyb, be, {
        selector: name, scheduler: "fixed", k, timing, cpuStageThreads: 1, ...mode.options,
        cpuStage: (stage) => meteredStage(stage, meter),
      });
      const got = forced(hyb);
      let agree = 0, kl = 0;
      got.forEach((l, i) => {
        const lp = logSoftmax64(l), r = ref[i]!;
        if (argmax(l) === r.top) agree++;
        let d = 0;
        for (let j = 0; j < lp.length; j++) d += Math.exp(r.logp[j]!) * (r.logp[j]! - lp[j]!);
        kl += d;
      });
      const s = h.stats;
      rows.push([name, String(k), timing, mode.label, `${((agree / got.length) * 100).toFixed(1)}%`, (kl / got.length).toExponential(2),
        (meter.bytes / Math.max(1, s.steps) / 1024).toFixed(1), s.layerSteps ? ((s.cpuJsMs / s.layerSteps) * 1000).toFixed(1) : "0"]);
    }
  }
}
const head = ["selector", "K", "timing", "logits", "top-1 agree", "mean KL", "KiB read/step", "select µs/layer"];
const w = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
console.log(`stories15M, ${ids.length} tokens (prompt ${PROMPT}, then teacher-forced), device window ${BUDGET}, ` +
  `${kvHeads} KV heads × headDim ${headDim}, f32 KV, vs full attention:`);
console.log(head.map((h, i) => h.padStart(w[i]!)).join("  "));
for (const r of rows) console.log(r.map((c, i) => c.padStart(w[i]!)).join("  "));
