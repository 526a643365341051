import { describe, expect, it } from "vitest";
import { HybridgenError, LlamaModel, ReferenceBackend, generate, generateText, type GeneratedToken, type GenerativeModel } from "../src/index.js";
import { charTokenizer, testSeed, tinyModel, withMethods } from "../src/testing/index.js";

/** The reference backend without the token-feed ops: generate takes the host round trip. */
const withoutFeed = (be: ReferenceBackend) => withMethods(be, { argmaxToFeed: undefined, embeddingFromFeed: undefined, feedResult: undefined });

const VOCAB = 259; // BOS/EOS/unk + every byte
const EOS = 2;
const tok = charTokenizer(VOCAB);
const bytesOf = (s: string) => Array.from(new TextEncoder().encode(s), (b) => b + 3);

/** A model whose greedy output follows a script; it checks that positions are contiguous
 * and never pass the context. */
class ScriptedModel implements GenerativeModel {
  readonly shape = { vocabSize: VOCAB, eosTokenIds: [EOS] };
  readonly prefillBlock = 4;
  length = 0;
  steps: { n: number; start: number }[] = [];
  private logits = new Float32Array(VOCAB);
  constructor(private script: number[], readonly maxContext = 256) {}
  reset() { this.length = 0; this.steps = []; }
  step(ids: Int32Array, startPos: number) {
    if (startPos !== this.length) throw new Error(`non-contiguous step at ${startPos}, length ${this.length}`);
    if (startPos + ids.length > this.maxContext) throw new Error("stepped past the context");
    this.steps.push({ n: ids.length, start: startPos });
    this.length += ids.length;
  }
  readLogits() {
    this.logits.fill(0);
    this.logits[this.nextId()] = 20;
    return this.logits.slice();
  }
  argmaxLogits() { return this.nextId(); }
  /** The script entry due next: tokens generated so far = positions past the prompt. */
  promptLength = 0;
  private nextId(): number {
    return this.script[this.length - this.promptLength] ?? 3 + 0x2e;
  }
}

function scripted(script: number[], promptLength: number, maxContext?: number) {
  const m = new ScriptedModel(script, maxContext);
  m.promptLength = promptLength;
  return m;
}

async function collect(gen: AsyncIterable<GeneratedToken>) {
  const items: GeneratedToken[] = [];
  for await (const t of gen) items.push(t);
  return items;
}

describe("generate: stop conditions", () => {
  const prompt = [1, ...bytesOf("Hi")]; // 3 tokens

  it("stops at EOS without emitting it; positions are contiguous; prompt is prefilled in blocks", async () => {
    const model = scripted([...bytesOf("ok"), EOS, ...bytesOf("zz")], 3);
    const gen = generate(model, tok, prompt, { maxTokens: 10, sampling: { temperature: 0 } });
    const items = await collect(gen);
    const r = await gen.result();
    expect(r.finishReason).toBe("eos");
    expect(r.tokens).toEqual(bytesOf("ok"));
    expect(r.text).toBe("ok");
    expect(items.map((t) => t.text).join("")).toBe("ok");
    expect(items.map((t) => t.index)).toEqual([0, 1]);
    expect(r.promptTokens).toBe(3);
    expect(model.steps[0]).toEqual({ n: 3, start: 0 });
    expect(model.steps.slice(1).map((s) => s.start)).toEqual([3, 4]);
  });

  it("stops at maxTokens (finishReason length) without a forward for the last token", async () => {
    const model = scripted(bytesOf("abcdefgh"), 3);
    const r = await generateText(model, tok, prompt, { maxTokens: 5, sampling: { temperature: 0 } });
    expect(r).toMatchObject({ finishReason: "length", text: "abcde", tokens: bytesOf("abcde") });
    expect(model.length).toBe(3 + 4);
  });

  it("stops at the end of the context (finishReason context)", async () => {
    const model = scripted(bytesOf("abcdefgh"), 3, 6);
    const r = await generateText(model, tok, prompt, { maxTokens: 50, sampling: { temperature: 0 } });
    expect(r.finishReason).toBe("context");
    expect(r.text).toBe("abcd"); // positions 3,4,5 stepped; the 4th token needs none
    expect(model.length).toBe(6);
  });

  it("a prompt longer than the context is an error before any work", () => {
    const model = scripted([], 0, 2);
    expect(() => generate(model, tok, prompt)).toThrow(HybridgenError);
    expect(() => generate(model, tok, prompt)).toThrow("the prompt has 3 tokens but the context holds 2");
    expect(() => generate(model, tok, [])).toThrow("the prompt is empty");
    expect(() => generate(model, tok, [1, 400])).toThrow("prompt token id 400 out of range [0, 259)");
    expect(() => generate(model, tok, [1], { maxTokens: 0 })).toThrow(/invalid generate option maxTokens/);
    expect(() => generate(model, tok, [1], { sampling: { topP: 2 } })).toThrow(/invalid generate option sampling.topP/);
    expect(model.steps).toEqual([]);
  });
});

describe("generate: stop strings and streaming text", () => {
  it("a stop string spanning tokens ends generation and is not emitted; false starts are released", async () => {
    const model = scripted(bytesOf("a Usb User: hidden"), 1);
    const gen = generate(model, tok, [1], { maxTokens: 50, stop: ["User:", "zzz"], sampling: { temperature: 0 } });
    const items = await collect(gen);
    const r = await gen.result();
    expect(r.finishReason).toBe("stop");
    expect(r.text).toBe("a Usb ");
    expect(items.map((t) => t.text).join("")).toBe("a Usb ");
    // "U" and "Us" were held back while they could start "User:", released at "b".
    const at = (i: number) => items[i].text;
    expect([at(2), at(3), at(4)]).toEqual(["", "", "Usb"]);
    expect(r.tokens.length).toBe("a Usb User:".length);
  });

  it("held-back text is flushed at EOS as a final id −1 item", async () => {
    const model = scripted([...bytesOf("abzz"), EOS], 1);
    const gen = generate(model, tok, [1], { stop: ["zzz"], sampling: { temperature: 0 } });
    const items = await collect(gen);
    expect(items.at(-1)).toEqual({ id: -1, text: "zz", index: 4 });
    expect((await gen.result()).text).toBe("abzz");
  });

  it("multi-byte UTF-8 split across byte tokens streams whole characters", async () => {
    const s = "héllo ✓ 😀!";
    const model = scripted(bytesOf(s), 1);
    const gen = generate(model, tok, [1], { maxTokens: bytesOf(s).length, sampling: { temperature: 0 } });
    const items = await collect(gen);
    expect(items.map((t) => t.text).join("")).toBe(s);
    for (const t of items) expect(t.text).not.toContain("\uFFFD");
    expect(items[1].text).toBe(""); // first byte of é
    expect(items[2].text).toBe("é");
    expect((await gen.result()).text).toBe(s);
  });
});

describe("generate: abort", () => {
  it("an AbortSignal stops generation, keeping what was produced", async () => {
    const model = scripted(bytesOf("abcdefghij"), 1);
    const ac = new AbortController();
    const gen = generate(model, tok, [1], { maxTokens: 50, signal: ac.signal, sampling: { temperature: 0 } });
    const seen: string[] = [];
    for await (const t of gen) {
      seen.push(t.text);
      if (seen.length === 3) ac.abort();
    }
    const r = await gen.result();
    expect(r.finishReason).toBe("abort");
    expect(r.text).toBe("abc");
    expect(seen).toEqual(["a", "b", "c"]);
    const pre = new AbortController();
    pre.abort();
    const r2 = await generateText(model, tok, [1], { signal: pre.signal });
    expect(r2).toMatchObject({ finishReason: "abort", tokens: [] });
  });

  it("breaking out of the loop ends the generation (abort) and frees the model for the next one", async () => {
    const model = scripted(bytesOf("abcdef"), 1);
    const gen = generate(model, tok, [1], { sampling: { temperature: 0 } });
    for await (const t of gen) if (t.index === 1) break;
    expect((await gen.result()).finishReason).toBe("abort");
    const again = await generateText(model, tok, [1], { maxTokens: 2, sampling: { temperature: 0 } });
    expect(again.text).toBe("ab");
  });
});

describe("generate with a LlamaModel", () => {
  it("greedy output equals the argmax chain of forward(); seeded sampling is reproducible", async () => {
    const { files } = tinyModel({ seed: testSeed(31), eos: 9999 });
    const be = new ReferenceBackend();
    using model = LlamaModel.load(files, be, { prefillBlock: 4 });
    const tokenizer = files.tokenizer;
    const prompt = [1, 7, 12, 30, 4, 18];
    const r = await generateText(model, tokenizer, prompt, { maxTokens: 12, sampling: { temperature: 0 } });
    expect(r.finishReason).toBe("length");
    model.reset();
    let logits = model.forward(Int32Array.from(prompt), 0);
    const chain: number[] = [];
    for (let i = 0; i < 12; i++) {
      const id = logits.indexOf(Math.max(...logits));
      chain.push(id);
      if (i < 11) logits = model.forward(Int32Array.of(id), prompt.length + i);
    }
    expect(r.tokens).toEqual(chain);
    expect(r.timings.tokensPerSec).toBeGreaterThan(0);
    expect(r.timings.promptTokensPerSec).toBeGreaterThan(0);

    const opts = { maxTokens: 10, sampling: { temperature: 1, topK: 10, topP: 0.95, seed: 1234 } };
    const a = await generateText(model, tokenizer, prompt, opts);
    const b = await generateText(model, tokenizer, prompt, opts);
    expect(a.tokens).toEqual(b.tokens);
    expect(a.seed).toBe(1234);
  });
});

describe("generate fed on the device (Backend.argmaxToFeed)", () => {
  it("gives the host round trip's tokens and finish reasons (length, eos, context); each step is launched before its token is read", async () => {
    const seed = testSeed(37);
    const prompt = [1, 7, 12, 30, 4, 18];
    const host = tinyModel({ seed, eos: 9999 });
    using plain = LlamaModel.load(host.files, withoutFeed(new ReferenceBackend()), { prefillBlock: 4 });
    expect(plain.feedsOnDevice).toBe(false);
    const want = await generateText(plain, host.files.tokenizer, prompt, { maxTokens: 12, sampling: { temperature: 0 } });
    const calls: string[] = [];
    const be = new ReferenceBackend();
    const spy = new Proxy(be, {
      get(target, prop, recv) {
        const v = Reflect.get(target, prop, recv);
        if (typeof v !== "function") return v;
        return (...args: unknown[]) => {
          if (prop === "argmaxToFeed" || prop === "embeddingFromFeed" || prop === "feedResult") calls.push(`${String(prop)}(${prop === "embeddingFromFeed" ? "" : String(args.at(-1))})`);
          return (v as (...a: unknown[]) => unknown).apply(target, args);
        };
      },
    });
    using fed = LlamaModel.load(host.files, spy, { prefillBlock: 4 });
    expect(fed.feedsOnDevice).toBe(true);
    const got = await generateText(fed, host.files.tokenizer, prompt, { maxTokens: 12, sampling: { temperature: 0 } });
    expect(got.tokens).toEqual(want.tokens);
    expect(got.finishReason).toBe("length");
    // pick 0; then per token: the next step (embedding from the feed), its pick, this token's result
    expect(calls.slice(0, 7)).toEqual(["argmaxToFeed(0)", "embeddingFromFeed()", "argmaxToFeed(1)", "feedResult(0)", "embeddingFromFeed()", "argmaxToFeed(0)", "feedResult(1)"]);
    expect(calls.filter((c) => c.startsWith("embeddingFromFeed")).length).toBe(11); // none after the last token

    // EOS: the 5th greedy token as EOS ends both the same way (the fed run stepped once more, unseen)
    const eosTok = want.tokens[4];
    const withEos = tinyModel({ seed, eos: eosTok });
    using plainEos = LlamaModel.load(withEos.files, withoutFeed(new ReferenceBackend()), { prefillBlock: 4 });
    using fedEos = LlamaModel.load(withEos.files, new ReferenceBackend(), { prefillBlock: 4 });
    const a = await generateText(plainEos, withEos.files.tokenizer, prompt, { maxTokens: 12, sampling: { temperature: 0 } });
    const b = await generateText(fedEos, withEos.files.tokenizer, prompt, { maxTokens: 12, sampling: { temperature: 0 } });
    expect(b.finishReason).toBe("eos");
    expect(b.tokens).toEqual(a.tokens);
    expect(b.tokens).toEqual(want.tokens.slice(0, want.tokens.indexOf(eosTok)));

    // the context ends first: no step past it
    using small = LlamaModel.load(host.files, new ReferenceBackend(), { prefillBlock: 4, maxContext: 10 });
    using smallPlain = LlamaModel.load(host.files, withoutFeed(new ReferenceBackend()), { prefillBlock: 4, maxContext: 10 });
    const c = await generateText(small, host.files.tokenizer, prompt, { maxTokens: 12, sampling: { temperature: 0 } });
    const d = await generateText(smallPlain, host.files.tokenizer, prompt, { maxTokens: 12, sampling: { temperature: 0 } });
    expect(c.finishReason).toBe("context");
    expect(c.tokens).toEqual(d.tokens);
  });

  it("sampling keeps the host round trip; bad feed calls are one-line errors", async () => {
    const { files } = tinyModel({ seed: testSeed(38), eos: 9999 });
    const be = new ReferenceBackend();
    let fedCalls = 0;
    const counting = withMethods(be, { argmaxToFeed: (...a: Parameters<ReferenceBackend["argmaxToFeed"]>) => (fedCalls++, be.argmaxToFeed(...a)) });
    using model = LlamaModel.load(files, counting, { prefillBlock: 4 });
    await generateText(model, files.tokenizer, [1, 5, 9], { maxTokens: 5, sampling: { temperature: 0.8, seed: 7 } });
    expect(fedCalls).toBe(0);
    model.reset();
    model.forward(Int32Array.of(1, 5), 0);
    expect(() => model.pickToFeed(2)).toThrow(/slot must be 0 or 1, got 2/);
    expect(() => model.stepFed(5)).toThrow(/startPos 5 must equal the cached length 2/);
    using plain = LlamaModel.load(files, withoutFeed(new ReferenceBackend()), { prefillBlock: 4 });
    expect(() => plain.stepFed(0)).toThrow(HybridgenError);
    expect(() => plain.pickToFeed(0)).toThrow(/cannot feed tokens on the device/);
  });
});
