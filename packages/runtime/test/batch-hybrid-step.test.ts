// Batched decode with a decode attention per sequence (hybrid attention at batch > 1): the model's
// setSequenceSetup gives every BatchDecoder slot its own; each batched layer calls every row's
// prepareAttend before any row's attend; B hybrid sequences decoded together equal each alone
// (ReferenceBackend, the synchronous BackendCpuStage). A slot without one: core's batch-decode test.
import { describe, expect, it } from "vitest";
import { BackendCpuStage, BatchDecoder, LlamaModel, ReferenceBackend, relError, type Attention, type DecodeAttention, type DecodeBatchStep, type Tensor, type TokenSelector } from "@hybridgen/core";
import { makeRng, testSeed, tinyModel } from "@hybridgen/core/testing";
import { HybridAttention, type LogitsMode } from "../src/index.js";
import { allSelector, fixedScheduler, topKSelector } from "./hybrid-helpers.js";

const CONTEXT = 48;
/** Batched and alone differ only in the f32 summation order of B-row matmuls. */
const REL_TOL = 1e-5;

const { files } = tinyModel({ seed: testSeed(61), layers: 3, hidden: 32, heads: 4, kvHeads: 2, vocab: 64, maxPositions: 64 });

function load(be: ReferenceBackend): LlamaModel {
  return LlamaModel.load(files, be, { maxContext: CONTEXT, prefillBlock: 8, gpuKvBudget: 8, sinkTokens: 2, kvEvictBlock: 2 });
}

function prompts(lengths: number[]): Int32Array[] {
  const rng = makeRng(testSeed(62));
  return lengths.map((n) => Int32Array.from({ length: n }, () => 3 + Math.floor(rng() * 60)));
}

const argmax = (x: Float32Array) => x.reduce((b, v, i) => (v > x[b] ? i : b), 0);

/** A HybridAttention on `attention` (its model projects the queries). */
function hybrid(model: LlamaModel, attention: Attention, selector: TokenSelector, logits: LogitsMode): HybridAttention {
  return HybridAttention.attach(
    { attention, projector: model, stage: new BackendCpuStage(model.backend), selector, scheduler: fixedScheduler(3, "post") }, { logits },
  );
}

/** Each prompt alone (prefill, then `steps` greedy steps): the logits before every token. */
function alone(model: LlamaModel, ps: Int32Array[], steps: number): Float32Array[][] {
  return ps.map((p) => {
    model.reset();
    const out = [model.forward(p, 0)];
    for (let s = 0; s < steps; s++) out.push(model.forward(Int32Array.of(argmax(out[s])), p.length + s));
    return out;
  });
}

/** The prompts in slots 0..B−1, then `steps` batched greedy steps; slot `early` leaves after `leave` of them. */
function batched(dec: BatchDecoder, ps: Int32Array[], steps: number, early = -1, leave = steps): Float32Array[][] {
  const out = ps.map((p, slot) => {
    dec.prefill(slot, p, 0);
    return [dec.logits(slot)];
  });
  for (let s = 0; s < steps; s++) {
    const slots = ps.map((_, i) => i).filter((i) => i !== early || s < leave);
    dec.step(slots, Int32Array.from(slots, (i) => argmax(out[i][s])));
    for (const i of slots) out[i].push(dec.logits(i));
  }
  return out;
}

function expectClose(got: Float32Array[][], want: Float32Array[][]): void {
  got.forEach((rows, i) => rows.forEach((g, s) => {
    expect(argmax(g), `sequence ${i} step ${s}`).toBe(argmax(want[i][s]));
    expect(relError(g, want[i][s]), `sequence ${i} step ${s}`).toBeLessThanOrEqual(REL_TOL);
  }));
}

describe("batched decode with hybrid attention per sequence", () => {
  for (const [name, selector, logits] of [
    ["'all' + exact", () => allSelector(true), "exact"],
    ["top-K + verified (q̃ from each row's residual)", () => topKSelector(true), "verified"],
    ["top-K chosen in JS after the stage scores, exact", () => topKSelector(false), "exact"],
  ] as const) {
    it(`${name}: 3 sequences of 5, 18 and 29 prompt tokens, one leaving early, equal each alone`, () => {
      const be = new ReferenceBackend();
      const ps = prompts([5, 18, 29]);
      const want = (() => {
        using model = load(be);
        using _h = hybrid(model, model.attention, selector(), logits);
        return alone(model, ps, 10);
      })();
      using model = load(be);
      const made: HybridAttention[] = [hybrid(model, model.attention, selector(), logits)];
      model.setSequenceSetup((s) => {
        made.push(hybrid(model, s.attention, selector(), logits));
        return made[made.length - 1];
      });
      const got = (() => {
        using dec = new BatchDecoder(model, 3);
        return batched(dec, ps, 10, 0, 4);
      })();
      expectClose(got.map((rows, i) => (i === 0 ? rows.slice(0, 5) : rows)), want.map((rows, i) => (i === 0 ? rows.slice(0, 5) : rows)));
      // Sequence 1 offloads from its prompt on: every step ran the hybrid path.
      expect(made).toHaveLength(3);
      expect(made[1].stats.steps).toBe(10);
      made[0].close();
    });
  }

  it("hooks: every row's layerInput, then every row's prepareAttend before any attend; one step object shared by the rows", () => {
    const be = new ReferenceBackend();
    using model = load(be);
    const log: string[] = [];
    const steps = new Set<DecodeBatchStep | undefined>();
    const logging = (attention: Attention, row: number): DecodeAttention & Disposable => {
      let at = 0;
      return {
      newSequence: () => log.push(`new ${row}`),
      beginStep: (pos, batch) => {
        at = pos;
        steps.add(batch);
      },
      layerInput: (l) => void (l === 1 && log.push(`input ${row}`)),
      prepareAttend: (l) => void (l === 1 && log.push(`prepare ${row}`)),
      attend: (l: number, q: Tensor, out: Tensor) => {
        if (l === 1) log.push(`attend ${row}`);
        attention.attendFull(l, q, 0, at, out);
      },
      endStep: () => log.push(`end ${row}`),
      [Symbol.dispose]: () => log.push(`closed ${row}`),
      };
    };
    model.attention.setDecodeAttention(logging(model.attention, 0));
    let n = 0;
    model.setSequenceSetup((s) => {
      const d = logging(s.attention, ++n);
      s.attention.setDecodeAttention(d);
      return d;
    });
    const dec = new BatchDecoder(model, 3);
    const ps = prompts([4, 6, 9]);
    ps.forEach((p, slot) => dec.prefill(slot, p, 0));
    log.length = 0;
    steps.clear();
    dec.step([0, 1, 2], Int32Array.of(5, 6, 7));
    expect(log).toEqual(["input 0", "input 1", "input 2", "prepare 0", "prepare 1", "prepare 2", "attend 0", "attend 1", "attend 2", "end 0", "end 1", "end 2"]);
    expect(steps.size).toBe(1);
    expect([...steps][0]?.rows).toBe(3);
    log.length = 0;
    dec.close();
    expect(log.sort()).toEqual(["closed 1", "closed 2"]);
  });

  it("the step's query(): every row's q̃ of a layer from one batched projection, equal to the row's own projection", () => {
    const be = new ReferenceBackend();
    using model = load(be);
    const seen: { row: number; layer: number; batched: Float32Array; own: Float32Array }[] = [];
    const rows = (attention: Attention, row: number): DecodeAttention => {
      let at = 0, step: DecodeBatchStep | undefined;
      const own = be.alloc([1, 4 * 8]);
      return {
        newSequence: () => {},
        beginStep: (pos, batch) => {
          at = pos;
          step = batch;
        },
        layerInput: (l, x) => {
          if (l + 1 >= 3) return;
          const q = step?.query?.(l + 1, x);
          if (!q) throw new Error("no batched query");
          model.projectQuery(l + 1, x, at, own);
          seen.push({ row, layer: l + 1, batched: be.read(q), own: be.read(own) });
        },
        attend: (l: number, q: Tensor, out: Tensor) => attention.attendFull(l, q, 0, at, out),
        endStep: () => {},
      };
    };
    model.attention.setDecodeAttention(rows(model.attention, 0));
    let n = 0;
    model.setSequenceSetup((s) => {
      s.attention.setDecodeAttention(rows(s.attention, ++n));
      return { [Symbol.dispose]: () => {} };
    });
    using dec = new BatchDecoder(model, 3);
    prompts([4, 7, 11]).forEach((p, slot) => dec.prefill(slot, p, 0));
    dec.step([0, 1, 2], Int32Array.of(5, 6, 7));
    expect(seen.map((x) => `${x.row}:${x.layer}`)).toEqual(["0:1", "1:1", "2:1", "0:2", "1:2", "2:2"]);
    for (const x of seen) expect(relError(x.batched, x.own), `row ${x.row} layer ${x.layer}`).toBeLessThanOrEqual(1e-6);
    // Rows of different positions: their queries differ (RoPE at each row's own position).
    expect(relError(seen[0]!.batched, seen[1]!.batched)).toBeGreaterThan(1e-3);
  });

  it("a backend that records steps gets one segment a layer for the whole batch when every row is handed off, the same keys every step, run before the rows end; none when a row waits on the host", () => {
    const log: string[] = [];
    class Recording extends ReferenceBackend {
      beginStep(key: string): void {
        log.push(`record ${key}`);
      }
      endStep(): void {
        log.push("run");
      }
    }
    const be = new Recording();
    using model = load(be);
    const handedOff = [true, true];
    const rows = (attention: Attention, row: number): DecodeAttention => {
      let at = 0;
      return {
        newSequence: () => {},
        beginStep: (pos) => void (at = pos),
        layerInput: (l) => void log.push(`input ${row} ${l}`),
        attend: (l: number, q: Tensor, out: Tensor) => attention.attendFull(l, q, 0, at, out),
        endStep: () => log.push(`end ${row}`),
        get batchRecordable() {
          return handedOff[row];
        },
      };
    };
    model.attention.setDecodeAttention(rows(model.attention, 0));
    model.setSequenceSetup((s) => {
      s.attention.setDecodeAttention(rows(s.attention, 1));
      return { [Symbol.dispose]: () => {} };
    });
    using dec = new BatchDecoder(model, 2);
    prompts([4, 6]).forEach((p, slot) => dec.prefill(slot, p, 0));
    const steps: string[][] = [];
    for (const ids of [Int32Array.of(5, 6), Int32Array.of(7, 8)]) {
      log.length = 0;
      dec.step([0, 1], ids);
      steps.push([...log]);
    }
    const keys = steps[0]!.filter((x) => x.startsWith("record ")).map((x) => x.slice(7));
    expect(keys).toHaveLength(3);
    expect(keys.map((k) => k.replace(/^batch-rows-\d+-/, ""))).toEqual(["2-0", "2-1", "2-2"]);
    expect(steps[0]).toEqual([
      `record ${keys[0]}`, "input 0 0", "input 1 0",
      "run", `record ${keys[1]}`, "input 0 1", "input 1 1",
      "run", `record ${keys[2]}`, "input 0 2", "input 1 2",
      "run", "end 0", "end 1",
    ]);
    expect(steps[1]).toEqual(steps[0]);
    // A row that waits on the host (not handed off): the step runs eagerly.
    handedOff[1] = false;
    log.length = 0;
    dec.step([0, 1], Int32Array.of(9, 10));
    expect(log).toEqual(["input 0 0", "input 1 0", "input 0 1", "input 1 1", "input 0 2", "input 1 2", "end 0", "end 1"]);
  });
});
