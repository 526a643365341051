/**
 * A plugin's private copy of a selection input: logits, query, positions and accumulated scores
 * go into buffers the wrapper owns (reused call to call), so a plugin that writes into its input
 * cannot change what the engine attends. Typed arrays cannot be frozen and a Proxy over one is
 * neither readable at native speed nor passable to the native primitives: a copy is the cheap
 * way (apps/bench/notes/selectors.md has the measurement). The layer's keys (`input.keys`, the
 * host store itself) are the one input handed as is: copying them would cost a layer's K rows.
 */
import type { AccumulatedScores, HeadLayout, SelectionInput, SelectorPrimitives } from "@hybridgen/spec";

/** Grows a buffer geometrically and returns its first `n` elements. */
function view<T extends Float32Array | Int32Array>(buf: T, n: number, make: (n: number) => T): T {
  return (buf.length >= n ? buf : make(Math.max(n, Math.ceil(buf.length * 1.5)))) as T;
}

const frozenPrimitives = new WeakMap<SelectorPrimitives, SelectorPrimitives>();
const frozenLayouts = new WeakMap<HeadLayout, HeadLayout>();

function frozenCopy<T extends object>(cache: WeakMap<T, T>, o: T): T {
  let f = cache.get(o);
  if (!f) cache.set(o, (f = Object.freeze({ ...o })));
  return f;
}

export class InputCopier {
  private rows: Float32Array[] = [];
  private scoreRows: Float32Array[] = [];
  private query = new Float32Array(0);
  private positions = new Int32Array(0);

  /** The input with every array a fresh copy of its first `offloaded` values; valid until the next call. */
  copy<S>(input: SelectionInput<S>): SelectionInput<S> {
    const n = input.offloaded;
    this.query = view(this.query, input.query.length, (m) => new Float32Array(m));
    const query = this.query.subarray(0, input.query.length);
    query.set(input.query);
    this.positions = view(this.positions, n, (m) => new Int32Array(m));
    const positions = this.positions.subarray(0, n);
    positions.set(input.positions.subarray(0, n));
    const scores = input.scores ? this.copyScores(input.scores, n) : undefined;
    const common = {
      ...input, query, positions, scores,
      layout: frozenCopy(frozenLayouts, input.layout),
      primitives: frozenCopy(frozenPrimitives, input.primitives),
    };
    if (input.timing === "pre") return Object.freeze(common) as SelectionInput<S>;
    const logits = Object.freeze(this.copyRows(this.rows, input.logits, n));
    return Object.freeze({ ...common, timing: "post" as const, logits }) as SelectionInput<S>;
  }

  private copyScores(s: AccumulatedScores, n: number): AccumulatedScores {
    return Object.freeze({ steps: s.steps, perKvHead: Object.freeze(this.copyRows(this.scoreRows, s.perKvHead, n)) });
  }

  private copyRows(bufs: Float32Array[], rows: readonly Float32Array[], n: number): Float32Array[] {
    return rows.map((row, i) => {
      bufs[i] = view(bufs[i] ?? new Float32Array(0), n, (m) => new Float32Array(m));
      const out = bufs[i]!.subarray(0, n);
      out.set(row.subarray(0, n));
      return out;
    });
  }
}
