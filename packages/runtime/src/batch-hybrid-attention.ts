/**
 * Hybrid attention at batch > 1: the batch-1 HybridAttention once per sequence. The model's own
 * sequence gets one now, and every sequence the model makes while this is open (BatchDecoder's
 * slots, so generateBatch's) gets one as it is made, each over its own KV window and offloaded
 * store, with its own CPU stage and scheduler (K per step from that sequence's stage times); the
 * stages are lanes of one native stage, so a batched step's layer goes to it as one group of every
 * row's job, run at once over its pool, before any row waits (core's BatchRows flushes it once a
 * pass over the rows; a step's lanes alone complete a group, so idle slots hold nothing back); on a device whose link hands off, the device does the waiting and the host waits once a step.
 * A storeAllocator function places each sequence's store (TieredStore, KSpill: memtier's tiers, the
 * disk tier), sequence 0 the model's own; a store goes when its sequence's cache closes (released,
 * a BatchDecoder's slots when it closes; the own sequence's with the model).
 *
 *   using batch = await createBatchHybridAttention(model, backend, { selector: "topk", k: 16 });
 *   const res = await generateBatch(model, tokenizer, requests, { batch: 4 }).result();
 */
import { HybridgenError, type Backend, type DecoderModel, type SequenceState } from "@hybridgen/core";
import { type HybridAttention } from "./hybrid/index.js";
import { hybridBuilder, type HybridModel } from "./create-hybrid-attention.js";
import { isAllocator, type HybridRuntimeOptions } from "./options.js";

/** A model that makes sequences (core's DecoderModel: LlamaModel, OptModel). */
export type SequenceModel = HybridModel & Pick<DecoderModel, "setSequenceSetup">;

/** Decode attentions of every sequence of a model, made by `attach`; close() detaches them all. */
export interface PerSequence<T extends Disposable> extends Disposable {
  /** The model's own sequence's. */
  readonly own: T;
  /** Every live one, the own first (a released sequence's is closed and leaves the list). */
  readonly all: readonly T[];
  /** Drops released sequences' (closed) attentions from `all`: a server that renews slots keeps only the live ones. */
  prune(): void;
  close(): void;
}

/** A sequence as `attach` sees it: its attention and cache, the model's query projection. */
export function sequenceModel(model: HybridModel, s: SequenceState): HybridModel {
  return { attention: s.attention, cache: s.cache, maxContext: model.maxContext, projectQuery: (l, x, p, out) => model.projectQuery(l, x, p, out) };
}

/** Runs `attach` on the model's own sequence (0) now and on every sequence it makes (1, 2, …) until close(). */
export function attachPerSequence<T extends Disposable>(model: SequenceModel, attach: (target: HybridModel, sequence: number) => T): PerSequence<T> {
  const all: T[] = [attach(model, 0)];
  const released = new Set<T>();
  let made = 1;
  model.setSequenceSetup((s) => {
    const d = attach(sequenceModel(model, s), made++);
    all.push(d);
    return {
      [Symbol.dispose]: () => {
        released.add(d);
        d[Symbol.dispose]();
      },
    };
  });
  let closed = false;
  const close = () => {
    if (closed) return;
    closed = true;
    model.setSequenceSetup(null);
    for (const d of all) d[Symbol.dispose]();
  };
  const prune = () => {
    for (let i = all.length - 1; i > 0; i--) if (released.has(all[i]!)) all.splice(i, 1);
    released.clear();
  };
  return { own: all[0]!, all, close, prune, [Symbol.dispose]: close };
}

/**
 * createHybridAttention for batched decode: the same options, one HybridAttention per sequence
 * (see above); the sequences' stages share one native stage of the plan's threads. A Scheduler object
 * and a storeAllocator object are refused: each schedules or places one sequence.
 */
export async function createBatchHybridAttention(
  model: SequenceModel, backend: Backend, options: HybridRuntimeOptions = {}, batch = 1,
): Promise<PerSequence<HybridAttention>> {
  if (typeof options.scheduler === "object") {
    throw new HybridgenError('a Scheduler object serves one sequence; batched hybrid attention needs scheduler "fixed" or "feedback" (one per sequence)');
  }
  if (isAllocator(options.storeAllocator)) {
    throw new HybridgenError("a storeAllocator object places one sequence's store; give batched hybrid attention a function (sequence) => KvStoreAllocator, a store for each sequence");
  }
  const build = await hybridBuilder(backend, options, { first: model, sequences: batch });
  return attachPerSequence(model, build);
}
