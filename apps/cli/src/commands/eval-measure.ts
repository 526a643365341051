/**
 * The measurements of `hybridgen eval`. Every run is one configuration at one K (configurations
 * whose result cannot depend on K — full, flexgen, moe-lightning, all-tokens — run once) on the
 * windowed model, compared with full attention on a model holding every KV row.
 *
 * Text: a prefix prefilled, then each next token fed as a decode step (teacher forcing); per
 * predicted position the run's log-softmax against full attention's. Tasks: the context
 * prefilled but its last `tail` tokens, which are fed as decode steps with the configuration
 * attached, then each choice's tokens (their summed log-probability) or the greedy continuation.
 */
import { HybridgenError, argmax, logSoftmax64, type Backend, type CausalLM, type Tokenizer } from "@hybridgen/core";
import { attachAttentionConfig, attentionConfig, type AttentionConfig } from "@hybridgen/runtime";
import type { EvalOptions } from "./eval-args.js";
import type { TaskItem } from "./eval-tasks-file.js";

export interface EvalRun {
  readonly config: string;
  readonly family: AttentionConfig["family"];
  /** null: the configuration does not use K. */
  readonly k: number | null;
}

export interface TextResult extends EvalRun {
  readonly predictions: number;
  readonly perplexity: number;
  /** Share of positions whose argmax equals full attention's. */
  readonly top1: number;
  /** Mean KL(full ‖ run) in nats. */
  readonly kl: number;
}

export interface TaskResult extends EvalRun {
  readonly task: string;
  readonly items: number;
  readonly correct: number;
  readonly accuracy: number;
  /** Hybrid configurations: the mean K of the items' last decode steps, and the share of items whose last step ran pre-QKᵀ. */
  readonly meanLastK?: number;
  readonly preShare?: number;
}

/** The runs of `o`: K-independent configurations once, the others at every K of --ks. */
export function evalRuns(o: Pick<EvalOptions, "configs" | "ks">): { run: EvalRun; config: AttentionConfig | null }[] {
  const out: { run: EvalRun; config: AttentionConfig | null }[] = [];
  for (const name of o.configs) {
    const c = attentionConfig(name, o.ks[0]!);
    if (c.kind === "full") out.push({ run: { config: name, family: c.family, k: null }, config: null });
    else if (c.kind !== "hybrid" || c.hybrid?.selector === "all") out.push({ run: { config: name, family: c.family, k: null }, config: c });
    else for (const k of o.ks) out.push({ run: { config: name, family: c.family, k }, config: attentionConfig(name, k) });
  }
  return out;
}

/** Teacher forcing: calls `see(i, logits)` for the prediction of ids[prefix + i]. */
function teacherForce(model: CausalLM, ids: Int32Array, prefix: number, see: (i: number, logits: Float32Array) => void): void {
  model.reset();
  see(0, model.forward(ids.subarray(0, prefix), 0));
  for (let t = prefix; t < ids.length - 1; t++) see(t - prefix + 1, model.forward(ids.subarray(t, t + 1), t));
}

export interface EvalModels {
  readonly full: CausalLM;
  readonly windowed: CausalLM;
  readonly backend: Backend;
  readonly progress: (line: string) => void;
}

/** Perplexity, top-1 agreement and KL of every run over `ids` (the reference is full attention, k null, config "full"). */
export async function evalText(m: EvalModels, ids: Int32Array, o: EvalOptions): Promise<TextResult[]> {
  const n = ids.length - o.prefix;
  const ref: { lp: Float64Array; top: number }[] = [];
  let refNll = 0;
  teacherForce(m.full, ids, o.prefix, (i, l) => {
    const lp = logSoftmax64(l);
    ref.push({ lp, top: argmax(l) });
    refNll -= lp[ids[o.prefix + i]!]!;
  });
  const results: TextResult[] = [];
  for (const { run, config } of evalRuns(o)) {
    if (!config) {
      results.push({ ...run, predictions: n, perplexity: Math.exp(refNll / n), top1: 1, kl: 0 });
      continue;
    }
    m.windowed.reset();
    using _a = await attachAttentionConfig(m.windowed, m.backend, config);
    let nll = 0, agree = 0, kl = 0;
    teacherForce(m.windowed, ids, o.prefix, (i, l) => {
      const lp = logSoftmax64(l), r = ref[i]!;
      nll -= lp[ids[o.prefix + i]!]!;
      if (argmax(l) === r.top) agree++;
      let d = 0;
      for (let j = 0; j < lp.length; j++) d += Math.exp(r.lp[j]!) * (r.lp[j]! - lp[j]!);
      kl += d;
    });
    const res = { ...run, predictions: n, perplexity: Math.exp(nll / n), top1: agree / n, kl: kl / n };
    results.push(res);
    m.progress(`text: ${run.config}${run.k === null ? "" : ` K ${run.k}`}: perplexity ${res.perplexity.toFixed(3)}, top-1 ${(res.top1 * 100).toFixed(1)}%, KL ${res.kl.toExponential(2)}`);
  }
  return results;
}

interface Encoded {
  readonly item: TaskItem;
  readonly head: Int32Array;
  readonly tail: Int32Array;
  readonly choices: Int32Array[];
  readonly answerTokens: number;
}

function encodeItems(items: readonly TaskItem[], tok: Tokenizer, maxContext: number, tail: number, source: string): Encoded[] {
  return items.map((item) => {
    const ctx = Int32Array.from(tok.encode(item.context, { addBos: true }));
    const t = Math.min(tail, ctx.length - 1);
    const choices = item.kind === "choice" ? item.choices.map((c) => Int32Array.from(tok.encode(c, { addBos: false }))) : [];
    const answerTokens = item.kind === "exact" ? Math.max(1, tok.encode(item.answer, { addBos: false }).length) : 0;
    const longest = Math.max(answerTokens, ...choices.map((c) => c.length));
    if (ctx.length + longest > maxContext) {
      throw new HybridgenError(`${source} line ${item.line}: ${ctx.length} context tokens + ${longest} to decode exceed the model's context (${maxContext})`, "ECONTEXT");
    }
    if (choices.some((c) => c.length === 0)) throw new HybridgenError(`${source} line ${item.line}: a choice encodes to no tokens`, "EUSAGE");
    return { item, head: ctx.subarray(0, ctx.length - t), tail: ctx.subarray(ctx.length - t), choices, answerTokens };
  });
}

/** Whether `model` (prefilled with e.head, at checkpoint `restore`) answers e right. */
function answer(model: CausalLM, e: Encoded, tok: Tokenizer, restore: () => void): boolean {
  const feed = (ids: Int32Array, pos: number): Float32Array => {
    let l: Float32Array | null = null;
    for (let i = 0; i < ids.length; i++) l = model.forward(ids.subarray(i, i + 1), pos + i);
    return l!;
  };
  const start = e.head.length, after = start + e.tail.length;
  if (e.item.kind === "choice") {
    let best = -Infinity, pick = -1;
    e.choices.forEach((c, ci) => {
      restore();
      let l = feed(e.tail, start), ll = 0;
      for (let j = 0; j < c.length; j++) {
        ll += logSoftmax64(l)[c[j]!]!;
        if (j + 1 < c.length) l = model.forward(c.subarray(j, j + 1), after + j);
      }
      if (ll > best) [best, pick] = [ll, ci];
    });
    return pick === e.item.answer;
  }
  restore();
  let l = feed(e.tail, start);
  const out: number[] = [];
  for (let j = 0; j < e.answerTokens; j++) {
    out.push(argmax(l));
    if (j + 1 < e.answerTokens) l = model.forward(Int32Array.of(out[j]!), after + j);
  }
  return tok.decode(out).trim() === e.item.answer.trim();
}

/** Accuracy of every run (and of full attention: config "full", k null) on one task file. */
export async function evalTasks(m: EvalModels, tok: Tokenizer, items: readonly TaskItem[], task: string, o: EvalOptions): Promise<TaskResult[]> {
  const enc = encodeItems(items, tok, Math.min(m.full.maxContext, m.windowed.maxContext), o.tail, task);
  const runs = evalRuns(o);
  const correct = new Array<number>(runs.length).fill(0);
  const lastK = new Array<number>(runs.length).fill(0), pre = new Array<number>(runs.length).fill(0), traced = new Array<number>(runs.length).fill(0);
  for (const [idx, e] of enc.entries()) {
    // Each model prefills the item once; every run starts from that checkpoint.
    m.full.reset();
    m.full.forward(e.head, 0);
    let fullRight: boolean;
    {
      using cp = m.full.cache.checkpoint();
      fullRight = answer(m.full, e, tok, () => m.full.cache.restore(cp));
    }
    m.windowed.reset();
    m.windowed.forward(e.head, 0);
    using cp = m.windowed.cache.checkpoint();
    for (const [ri, { config }] of runs.entries()) {
      if (!config) {
        if (fullRight) correct[ri]!++;
        continue;
      }
      const a = await attachAttentionConfig(m.windowed, m.backend, config);
      try {
        if (answer(m.windowed, e, tok, () => m.windowed.cache.restore(cp))) correct[ri]!++;
        const last = a.trace().at(-1);
        if (last) {
          traced[ri]!++;
          lastK[ri]! += last.k;
          if (last.timing === "pre") pre[ri]!++;
        }
      } finally {
        a.close();
        m.windowed.cache.restore(cp);
      }
    }
    if ((idx + 1) % 10 === 0 || idx + 1 === enc.length) m.progress(`${task}: ${idx + 1}/${enc.length} items`);
  }
  return runs.map(({ run }, i) => ({
    ...run, task, items: enc.length, correct: correct[i]!, accuracy: correct[i]! / enc.length,
    ...(traced[i] ? { meanLastK: lastK[i]! / traced[i]!, preShare: pre[i]! / traced[i]! } : {}),
  }));
}
