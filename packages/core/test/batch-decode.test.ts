// Batched decode: B sequences of different prompt lengths decoded together (one forward pass
// per step, every matmul with n = B rows) against each sequence decoded alone, for Llama,
// Qwen2 and OPT, with a windowed (offloading) cache too; continuous batching in generateBatch;
// the recorded-step key per batch size; bad input.
import { describe, expect, it } from "vitest";
import {
  BatchDecoder, ByteTokenizer, ReferenceBackend, generateBatch, generateText, loadModel,
  LlamaModel, type Backend, type BatchAttnRow, type CausalLM, type DecodeAttention, type LlamaLoadOptions, type ModelFiles, type Tensor,
} from "../src/index.js";
import { charTokenizer, makeRng, testSeed, tinyModel, withMethods } from "../src/testing/index.js";
import { errorMessage } from "./error-helpers.js";
import { PARITY_CASES, parityCheckpoint } from "./parity/cases.js";
import { relError } from "./parity/run-parity.js";

/** Batched and alone differ only in summation order of f32 matmuls over B rows: ≤ 1e-5 relative. */
const REL_TOL = 1e-5;
const STEPS = 6;

function caseFiles(name: string): ModelFiles {
  const c = PARITY_CASES.find((x) => x.name === name)!;
  const { config, shape, weights } = parityCheckpoint(c);
  return { dir: name, config, shape, weights, tokenizer: new ByteTokenizer(shape.vocabSize), close() {}, [Symbol.dispose]() {} };
}

function randomPrompts(seed: number, lengths: number[], vocab: number): Int32Array[] {
  const rng = makeRng(seed);
  // Ids from 3 up: clear of BOS/EOS so no sequence ends early.
  return lengths.map((n) => Int32Array.from({ length: n }, () => 3 + Math.floor(rng() * (vocab - 3))));
}

/** Greedy decode of one prompt alone: the logits before each generated token. */
function decodeAlone(model: CausalLM, prompt: Int32Array, steps: number): { tokens: number[]; logits: Float32Array[] } {
  model.reset();
  let logits = model.forward(prompt, 0);
  const tokens: number[] = [], all: Float32Array[] = [];
  for (let s = 0; s < steps; s++) {
    all.push(logits);
    const id = argmax(logits);
    tokens.push(id);
    logits = model.forward(Int32Array.of(id), prompt.length + s);
  }
  return { tokens, logits: all };
}

function argmax(x: Float32Array): number {
  let b = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[b]) b = i;
  return b;
}

/** Every prompt prefilled into its slot, then `steps` greedy steps of all slots together. */
function decodeBatched(model: CausalLM, prompts: Int32Array[], steps: number): { tokens: number[][]; logits: Float32Array[][] } {
  using dec = new BatchDecoder(model, prompts.length);
  const B = prompts.length;
  const tokens: number[][] = prompts.map(() => []), logits: Float32Array[][] = prompts.map(() => []);
  const next = new Int32Array(B);
  prompts.forEach((p, slot) => {
    dec.prefill(slot, p, 0);
    logits[slot].push(dec.logits(slot));
    next[slot] = dec.argmax(slot);
    tokens[slot].push(next[slot]);
  });
  const slots = prompts.map((_, i) => i);
  for (let s = 1; s < steps; s++) {
    dec.step(slots, next);
    for (let i = 0; i < B; i++) {
      logits[i].push(dec.logits(i));
      next[i] = dec.argmax(i);
      tokens[i].push(next[i]);
    }
  }
  return { tokens, logits };
}

function expectBatchedEqualsAlone(files: ModelFiles, opts: LlamaLoadOptions, lengths: number[], seed: number, backend: Backend = new ReferenceBackend()): void {
  using model = loadModel(files, backend, { maxContext: 64, ...opts });
  const prompts = randomPrompts(testSeed(seed), lengths, files.shape.vocabSize);
  const alone = prompts.map((p) => decodeAlone(model, p, STEPS));
  const batched = decodeBatched(model, prompts, STEPS);
  prompts.forEach((_, i) => {
    expect(batched.tokens[i]).toEqual(alone[i].tokens);
    for (let s = 0; s < STEPS; s++) expect(relError(batched.logits[i][s], alone[i].logits[s])).toBeLessThanOrEqual(REL_TOL);
  });
}

describe("batched decode = each sequence alone (f32 weights, ReferenceBackend)", () => {
  it("Llama GQA, 4 sequences of 3, 11, 6 and 17 prompt tokens", () => {
    expectBatchedEqualsAlone(caseFiles("llama-gqa"), {}, [3, 11, 6, 17], 101);
  });

  it("Llama-3 rope scaling with biases, tied; prefill blocks shorter than the prompts", () => {
    expectBatchedEqualsAlone(caseFiles("llama3-scaled-bias-tied"), { prefillBlock: 4 }, [9, 2, 13], 102);
  });

  it("Qwen2 (q/k/v biases)", () => {
    expectBatchedEqualsAlone(caseFiles("qwen2-untied"), {}, [5, 14, 8, 1, 10], 103);
  });

  it("OPT pre-norm and post-norm with project_in/out", () => {
    expectBatchedEqualsAlone(caseFiles("opt-prenorm"), {}, [7, 3, 12], 104);
    expectBatchedEqualsAlone(caseFiles("opt-350m-style"), {}, [4, 15], 105);
  });

  it("a windowed KV cache (old positions offloaded, sinks pinned) per sequence", () => {
    expectBatchedEqualsAlone(caseFiles("llama-gqa"), { gpuKvBudget: 8, sinkTokens: 2, kvEvictBlock: 2, prefillBlock: 4 }, [6, 19, 10], 106);
  });

  it("one row runs the ordinary decode step (identical logits)", () => {
    const files = caseFiles("llama-gqa");
    using model = loadModel(files, new ReferenceBackend(), { maxContext: 64 });
    const [p] = randomPrompts(testSeed(107), [9], files.shape.vocabSize);
    const alone = decodeAlone(model, p, STEPS);
    const batched = decodeBatched(model, [p], STEPS);
    expect(batched.tokens[0]).toEqual(alone.tokens);
    for (let s = 0; s < STEPS; s++) expect(batched.logits[0][s]).toEqual(alone.logits[s]);
  });
});

describe("a batched step is one recorded step per batch size", () => {
  it("brackets the B-row step with beginStep/endStep keyed by B", () => {
    const inner = new ReferenceBackend();
    const keys: string[] = [];
    let open = 0;
    const be = withMethods<Backend>(inner, { beginStep: (key: string) => { keys.push(key); open++; }, endStep: () => { open--; } });
    const files = caseFiles("llama-gqa");
    using model = loadModel(files, be, { maxContext: 64 });
    using dec = new BatchDecoder(model, 3);
    const prompts = randomPrompts(testSeed(108), [4, 7, 2], files.shape.vocabSize);
    prompts.forEach((p, slot) => dec.prefill(slot, p, 0));
    keys.length = 0;
    dec.step([0, 1, 2], Int32Array.of(5, 6, 7));
    dec.step([2, 0], Int32Array.of(8, 9));
    dec.step([1, 0, 2], Int32Array.of(10, 11, 12));
    expect(open).toBe(0);
    expect(keys).toHaveLength(3);
    expect(keys[0]).toMatch(/^batch-\d+-3$/);
    expect(keys[1]).toMatch(/^batch-\d+-2$/);
    expect(keys[2]).toBe(keys[0]);
    expect([dec.length(0), dec.length(1), dec.length(2)]).toEqual([7, 9, 5]);
  });
});

/**
 * A backend with the optional attnDecodeBatch: a ReferenceBackend plus a plain TypeScript version
 * of the op (f64 softmax over the row's own cache, read back through the backend), counting calls.
 */
function withBatchAttention(inner: ReferenceBackend, calls: number[]): Backend {
  const attnDecodeBatch = (out: Tensor, q: Tensor, k: Tensor, v: Tensor, rows: readonly BatchAttnRow[], scale: number): void => {
    calls.push(rows.length);
    const qw = q.shape[q.shape.length - 1];
    rows.forEach((r, i) => {
      const [kvHeads, cap, hd] = r.kCache.shape;
      const heads = qw / hd, group = heads / kvHeads, kvw = kvHeads * hd;
      const kNew = inner.read(k, i * kvw, kvw), vNew = inner.read(v, i * kvw, kvw);
      for (let g = 0; g < kvHeads; g++) {
        inner.write(r.kCache, kNew.subarray(g * hd, (g + 1) * hd), (g * cap + r.slot) * hd);
        inner.write(r.vCache, vNew.subarray(g * hd, (g + 1) * hd), (g * cap + r.slot) * hd);
      }
      const K = inner.read(r.kCache), V = inner.read(r.vCache), qr = inner.read(q, i * qw, qw);
      const o = new Float32Array(qw), n = r.firstPos + 1;
      for (let h = 0; h < heads; h++) {
        const base = Math.floor(h / group) * cap;
        const s = Array.from({ length: n }, (_, j) => {
          let d = 0;
          for (let e = 0; e < hd; e++) d += qr[h * hd + e] * K[(base + r.start + j) * hd + e];
          return d * scale;
        });
        const mx = Math.max(...s), p = s.map((x) => Math.exp(x - mx)), sum = p.reduce((a, b) => a + b, 0);
        for (let e = 0; e < hd; e++) {
          let acc = 0;
          for (let j = 0; j < n; j++) acc += p[j] * V[(base + r.start + j) * hd + e];
          o[h * hd + e] = acc / sum;
        }
      }
      inner.write(out, o, i * qw);
    });
  };
  return withMethods<Backend>(inner, { attnDecodeBatch });
}

describe("Backend.attnDecodeBatch: one call a layer for all rows", () => {
  it("Llama GQA and OPT: batched = alone, one call per layer and step with every row", () => {
    for (const [name, lengths, seed] of [["llama-gqa", [3, 11, 6, 17], 111], ["opt-prenorm", [7, 3, 12], 112]] as const) {
      const calls: number[] = [];
      const files = caseFiles(name);
      expectBatchedEqualsAlone(files, {}, [...lengths], seed, withBatchAttention(new ReferenceBackend(), calls));
      const layers = files.shape.layers;
      expect(calls).toHaveLength(layers * (STEPS - 1));
      expect(calls.every((b) => b === lengths.length)).toBe(true);
    }
  });

  it("a windowed cache whose span is no longer one run from position 0 takes the per-row path", () => {
    const calls: number[] = [];
    const opts = { gpuKvBudget: 8, sinkTokens: 2, kvEvictBlock: 2, prefillBlock: 4 };
    expectBatchedEqualsAlone(caseFiles("llama-gqa"), opts, [6, 19, 10], 113, withBatchAttention(new ReferenceBackend(), calls));
    expect(calls).toHaveLength(0);
  });
});

describe("generateBatch: continuous batching", () => {
  const { files } = tinyModel({ seed: testSeed(21), layers: 2, hidden: 32, heads: 4, kvHeads: 2, vocab: 259, maxPositions: 96 });
  const tok = charTokenizer(259);
  const prompts = ["Once upon", "a", "time there was a", "dog named Rex who", "liked", "to run in the park"];

  it("7 prompts through 3 slots give each prompt's text alone (greedy, per-prompt budgets and stops)", async () => {
    using model = loadModel(files, new ReferenceBackend(), { maxContext: 96 });
    const requests = prompts.map((prompt, i) => ({ prompt, maxTokens: 22 - 3 * i }));
    requests.push({ prompt: "stop here", maxTokens: 30, stop: ["e"] } as never);
    const alone: Awaited<ReturnType<typeof generateText>>[] = [];
    for (const r of requests) {
      alone.push(await generateText(model, tok, r.prompt, { maxTokens: r.maxTokens, stop: (r as { stop?: string[] }).stop ?? [], sampling: { temperature: 0 } }));
    }
    const gen = generateBatch(model, tok, requests, { batch: 3, sampling: { temperature: 0 } });
    const order: number[] = [];
    const streamed = requests.map(() => "");
    for await (const e of gen) {
      if (e.type === "token") streamed[e.index] += e.token.text;
      else order.push(e.index);
    }
    const res = await gen.result();
    expect(res.batch).toBe(3);
    expect(res.results).toHaveLength(requests.length);
    res.results.forEach((r, i) => {
      expect(r.tokens).toEqual(alone[i].tokens);
      expect(r.text).toBe(alone[i].text);
      expect(streamed[i]).toBe(r.text);
      expect(r.finishReason).toBe(alone[i].finishReason);
    });
    // Slots were refilled: all finished, not in input order (short budgets end first).
    expect([...order].sort((a, b) => a - b)).toEqual(requests.map((_, i) => i));
    expect(order).not.toEqual(requests.map((_, i) => i));
    expect(res.generatedTokens).toBe(res.results.reduce((a, r) => a + r.tokens.length, 0));
    expect(res.steps).toBeGreaterThan(0);
  });

  it("sampled sequences keep their own seeds (equal to each alone)", async () => {
    using model = loadModel(files, new ReferenceBackend(), { maxContext: 96 });
    const requests = prompts.slice(0, 4).map((prompt, i) => ({ prompt, maxTokens: 12, sampling: { seed: 100 + i, temperature: 0.9 } }));
    const res = await generateBatch(model, tok, requests, { batch: 4, sampling: { topK: 20, topP: 0.95 } }).result();
    for (const [i, r] of requests.entries()) {
      const alone = await generateText(model, tok, r.prompt, { maxTokens: 12, sampling: { seed: 100 + i, temperature: 0.9, topK: 20, topP: 0.95 } });
      expect(res.results[i].tokens).toEqual(alone.tokens);
      expect(res.results[i].seed).toBe(100 + i);
    }
  });

  it("batch 1 is the ordinary generate path, one prompt after another", async () => {
    using model = loadModel(files, new ReferenceBackend(), { maxContext: 96 });
    const res = await generateBatch(model, tok, prompts.slice(0, 2).map((prompt) => ({ prompt })), { batch: 1, maxTokens: 10, sampling: { temperature: 0 } }).result();
    for (const [i, p] of prompts.slice(0, 2).entries()) {
      expect(res.results[i].tokens).toEqual((await generateText(model, tok, p, { maxTokens: 10, sampling: { temperature: 0 } })).tokens);
    }
    expect(res.steps).toBe(18);
  });

  it("an abort ends every sequence in flight or queued with 'abort'", async () => {
    using model = loadModel(files, new ReferenceBackend(), { maxContext: 96 });
    const ac = new AbortController();
    const gen = generateBatch(model, tok, prompts.map((prompt) => ({ prompt })), { batch: 2, maxTokens: 50, signal: ac.signal, sampling: { temperature: 0 } });
    let n = 0;
    for await (const e of gen) if (e.type === "token" && ++n === 5) ac.abort();
    const res = await gen.result();
    expect(res.results.map((r) => r.finishReason)).toEqual(prompts.map(() => "abort"));
    expect(res.results.slice(2).every((r) => r.tokens.length === 0)).toBe(true);
    // The model is free again.
    expect((await generateText(model, tok, "x", { maxTokens: 2 })).tokens).toHaveLength(2);
  });
});

describe("batched decode: bad input", () => {
  const files = caseFiles("llama-gqa");

  it("one-line errors, checked before any work", () => {
    using model = loadModel(files, new ReferenceBackend(), { maxContext: 16 });
    const m = model;
    const tok = new ByteTokenizer(files.shape.vocabSize);
    expect(errorMessage(() => generateBatch(model, tok, []))).toBe("generateBatch: no prompts");
    expect(errorMessage(() => generateBatch(model, tok, [{ prompt: [5] }, { prompt: Array(17).fill(5) }]))).toBe("prompt 1 has 17 tokens but the context holds 16");
    expect(errorMessage(() => generateBatch(model, tok, [{ prompt: [5] }], { batch: 33 }))).toMatch(/^invalid generate option batch: /);
    expect(errorMessage(() => generateBatch(model, tok, [{ prompt: [5], maxTokens: 0 }]))).toMatch(/^prompt 0: invalid maxTokens: /);
    expect(errorMessage(() => new BatchDecoder(m, 0))).toBe("batch size 0 out of range [1, 32]");
    const s1 = m.createSequence();
    expect(errorMessage(() => m.stepBatch(Int32Array.of(5, 6), [s1, m.createSequence()]))).toBe("stepBatch: 2 sequences but no batch buffers (call reserveBatch first)");
    m.reserveBatch(2);
    expect(errorMessage(() => m.reserveBatch(33))).toBe("batch size 33 out of range [1, 32]");
    expect(errorMessage(() => m.stepBatch(Int32Array.of(5, 6), [s1, s1]))).toBe("stepBatch: sequence 1 is also row 0");
    expect(errorMessage(() => m.stepBatch(Int32Array.of(5), [s1, s1]))).toBe("stepBatch: 1 token ids for 2 sequences");
    expect(errorMessage(() => m.stepBatch(Int32Array.of(5, 6, 7), [s1, m.createSequence(), m.createSequence()]))).toBe("batched decode: 3 rows, the batch holds 1..2");
    m.reserveBatch(3); // grows
    m.stepBatch(Int32Array.of(5, 6, 7), [s1, m.createSequence(), m.createSequence()]);
    expect(m.readBatchLogits(2)).toHaveLength(files.shape.vocabSize);
    expect(errorMessage(() => m.stepBatch(Int32Array.of(5, 999), [s1, m.createSequence()]))).toBe("stepBatch: token id 999 of row 1 out of range [0, 128)");
    m.releaseSequence(s1);
    expect(errorMessage(() => m.stepBatch(Int32Array.of(5, 6), [s1, m.createSequence()]))).toMatch(/^sequence is not one of this model's/);
    using other = loadModel(files, new ReferenceBackend(), { maxContext: 16 });
    const foreign = other.createSequence();
    expect(errorMessage(() => m.withSequence(foreign, () => 0))).toMatch(/^sequence is not one of this model's/);
  });

  it("a full context is an error naming the row; slots are checked", () => {
    using model = loadModel(files, new ReferenceBackend(), { maxContext: 8 });
    using dec = new BatchDecoder(model, 2);
    dec.prefill(0, Int32Array.of(5, 6, 7), 0);
    dec.prefill(1, Int32Array.from({ length: 8 }, (_, i) => 3 + i), 0);
    expect(errorMessage(() => dec.logits(0))).toBe("batch decoder: slot 0 has no logits (it was not in the last prefill or step)");
    expect(errorMessage(() => dec.step([0, 1], Int32Array.of(5, 6)))).toBe("context overflow: row 1 holds 8 tokens, the context is 8");
    expect(errorMessage(() => dec.step([0, 2], Int32Array.of(5, 6)))).toBe("batch decoder: slot 2 out of range [0, 2)");
  });

  it("freeing: a closed decoder releases its sequences' KV storage", () => {
    const be = new ReferenceBackend();
    using model = loadModel(files, be, { maxContext: 16 });
    const before = be.liveTensors();
    const dec = new BatchDecoder(model, 4);
    const during = be.liveTensors();
    dec.close();
    // Batch buffers stay with the model (reused by the next decoder); the 3 extra caches go.
    expect(during).toBeGreaterThan(before);
    const caches = 3 * (2 * files.shape.layers + 1); // K and V per layer + attention scores
    expect(be.liveTensors()).toBe(during - caches);
    expect(errorMessage(() => dec.step([0], Int32Array.of(5)))).toBe("batch decoder used after close()");
  });

  it("renew: a slot's sequence is released and made anew (same live tensors, a fresh cache), slot 0 refused", () => {
    const be = new ReferenceBackend();
    using model = loadModel(files, be, { maxContext: 16 });
    using dec = new BatchDecoder(model, 3);
    const prompt = Int32Array.of(5, 6, 7);
    dec.prefill(2, prompt, 0);
    const first = dec.argmax(2), old = dec.sequence(2);
    const live = be.liveTensors();
    dec.renew(2);
    expect(be.liveTensors()).toBeLessThanOrEqual(live); // the old cache is gone (its scores tensor comes back with a prefill)
    expect(dec.sequence(2)).not.toBe(old);
    expect(dec.length(2)).toBe(0);
    expect(errorMessage(() => dec.logits(2))).toBe("batch decoder: slot 2 has no logits (it was not in the last prefill or step)");
    dec.prefill(2, prompt, 0);
    expect(dec.argmax(2)).toBe(first);
    expect(be.liveTensors()).toBe(live);
    expect(errorMessage(() => dec.renew(0))).toBe("batch decoder: slot 0 is the model's own sequence and cannot be renewed");
  });
});

/**
 * A backend with the optional matmulSplit: a ReferenceBackend plus a plain TypeScript (f64) version
 * of the op, recording each call's output count and accumulate flag; `take` false declines every
 * call (the caller must then run matmul and add itself).
 */
function withMatmulSplit(inner: ReferenceBackend, calls: string[], take: boolean): Backend {
  const matmulSplit = (outs: readonly Tensor[], x: Tensor, w: Tensor, n: number, bias: Tensor | undefined, accumulate: boolean): boolean => {
    calls.push(`${outs.length}${accumulate ? "+" : ""}`);
    if (!take) return false;
    const [m, k] = w.shape, W = inner.read(w), X = inner.read(x, 0, n * k), b = bias ? inner.read(bias) : null;
    expect(outs.reduce((acc, o) => acc + o.shape[1], 0)).toBe(m);
    let off = 0;
    for (const out of outs) {
      const mj = out.shape[1], O = inner.read(out, 0, n * mj);
      for (let r = 0; r < n; r++)
        for (let c = 0; c < mj; c++) {
          let s = b ? b[off + c] : 0;
          for (let i = 0; i < k; i++) s += X[r * k + i] * W[(off + c) * k + i];
          O[r * mj + c] = accumulate ? O[r * mj + c] + s : s;
        }
      inner.write(out, O, 0);
      off += mj;
    }
    return true;
  };
  return withMethods<Backend>(inner, { matmulSplit });
}

describe("Backend.matmulSplit: fused q/k/v and gate/up, residual adds in the epilogue", () => {
  it("Llama GQA and Qwen2 (q/k/v biases): batched = alone, 4 calls a layer and step", () => {
    for (const [name, lengths, seed] of [["llama-gqa", [3, 11, 6, 17], 121], ["qwen2-untied", [5, 14, 8], 122]] as const) {
      const calls: string[] = [];
      const files = caseFiles(name);
      expectBatchedEqualsAlone(files, {}, [...lengths], seed, withMatmulSplit(new ReferenceBackend(), calls, true));
      // Per layer: [q, k, v], [x] += o, [gate, up], [x] += down.
      const perLayer = ["3", "1+", "2", "1+"];
      expect(calls).toEqual(Array.from({ length: files.shape.layers * (STEPS - 1) }, () => perLayer).flat());
    }
  });

  it("a backend that declines every call gets the plain matmuls (same results)", () => {
    const calls: string[] = [];
    const files = caseFiles("llama3-scaled-bias-tied");
    expectBatchedEqualsAlone(files, { prefillBlock: 4 }, [9, 2, 13], 123, withMatmulSplit(new ReferenceBackend(), calls, false));
    expect(calls).toHaveLength(files.shape.layers * (STEPS - 1) * 4);
  });
});

describe("Backend.argmaxRows: a step's greedy picks in one call", () => {
  it("BatchDecoder.argmaxSlots = argmax of each slot, one backend call a step; without argmaxRows, row by row", () => {
    const files = caseFiles("llama-gqa");
    const calls: number[] = [];
    const inner = new ReferenceBackend();
    const backend = withMethods<Backend>(inner, {
      argmaxRows: (x: Tensor, n: number, out: Int32Array) => {
        calls.push(n);
        for (let i = 0; i < n; i++) out[i] = inner.argmax(x, i);
      },
    });
    for (const be of [backend, new ReferenceBackend()]) {
      using model = loadModel(files, be, { maxContext: 64 });
      using dec = new BatchDecoder(model, 4);
      const prompts = randomPrompts(testSeed(131), [3, 9, 5, 12], files.shape.vocabSize);
      const next = new Int32Array(4), picks = new Int32Array(4);
      prompts.forEach((p, slot) => {
        dec.prefill(slot, p, 0);
        next[slot] = dec.argmax(slot);
      });
      dec.argmaxSlots([3], picks); // after a prefill: its one row
      expect(picks[0]).toBe(next[3]);
      calls.length = 0;
      const slots = [2, 0, 3, 1];
      for (let s = 0; s < 3; s++) {
        dec.step(slots, Int32Array.from(slots, (i) => next[i]));
        dec.argmaxSlots(slots, picks);
        slots.forEach((slot, i) => {
          expect(picks[i]).toBe(dec.argmax(slot));
          next[slot] = picks[i];
        });
      }
      expect(calls).toEqual(be === backend ? [4, 4, 4] : []);
      expect(errorMessage(() => dec.argmaxSlots([0, 1], new Int32Array(1)))).toMatch(/out must be an Int32Array of at least 2 values/);
    }
  });
});

describe("batched decode with a decode attention per sequence", () => {
  const { files } = tinyModel({ seed: testSeed(61), layers: 2, hidden: 32, heads: 4, kvHeads: 2, vocab: 64, maxPositions: 64 });
  it("every slot needs a decode attention of its own: one-line errors", () => {
    using model = LlamaModel.load(files, new ReferenceBackend(), { maxContext: 48, prefillBlock: 8, gpuKvBudget: 8, sinkTokens: 2, kvEvictBlock: 2 });
    const noop = () => {};
    const d: DecodeAttention = { newSequence: noop, beginStep: noop, layerInput: noop, attend: noop, endStep: noop };
    model.attention.setDecodeAttention(d);
    expect(errorMessage(() => new BatchDecoder(model, 2))).toBe(
      "batched decode: slot 1 has no decode attention and slot 0 has one (attach hybrid attention to every sequence: @hybridgen/runtime's createBatchHybridAttention)",
    );
    model.setSequenceSetup((s) => {
      s.attention.setDecodeAttention(d);
      return { [Symbol.dispose]: noop };
    });
    expect(errorMessage(() => new BatchDecoder(model, 2))).toBe("batched decode: slot 1 shares its decode attention with another slot (each sequence needs its own)");
    model.setSequenceSetup(null);
    model.attention.setDecodeAttention(null);
    using dec = new BatchDecoder(model, 2); // full attention everywhere: fine
    expect(dec.capacity).toBe(2);
  });

  it("a batched step flushes each stage group its rows share once after each pass over the rows, not once a row", () => {
    using model = LlamaModel.load(files, new ReferenceBackend(), { maxContext: 48, prefillBlock: 8, gpuKvBudget: 8, sinkTokens: 2, kvEvictBlock: 2 });
    const noop = () => {};
    const flushes = [0, 0];
    const groups = flushes.map((_, g) => ({ flush: () => void flushes[g]!++ }));
    // Rows 0 and 1 share group 0, row 2 has group 1 to itself; row 3 has none (a stage of its own).
    const rowGroup = [groups[0], groups[0], groups[1], null];
    const made: DecodeAttention[] = rowGroup.map((stageGroup) => ({ newSequence: noop, beginStep: noop, layerInput: noop, attend: noop, endStep: noop, stageGroup }));
    model.attention.setDecodeAttention(made[0]!);
    let next = 1;
    model.setSequenceSetup((s) => {
      s.attention.setDecodeAttention(made[next++]!);
      return { [Symbol.dispose]: noop };
    });
    using dec = new BatchDecoder(model, 4);
    model.setSequenceSetup(null);
    for (let slot = 0; slot < 4; slot++) dec.prefill(slot, Int32Array.of(5, 6, 7), 0);
    const layers = model.shape.layers, passes = 3; // layer inputs, prepareAttend, attend
    dec.step([0, 1, 2, 3], Int32Array.of(8, 9, 10, 11));
    expect(flushes).toEqual([passes * layers, passes * layers]);
    dec.step([0, 3], Int32Array.of(12, 13));
    expect(flushes, "a step whose rows share group 0 only").toEqual([2 * passes * layers, passes * layers]);
    dec.step([3], Int32Array.of(14));
    expect(flushes, "no row of the step shares a group").toEqual([2 * passes * layers, passes * layers]);
  });
});
